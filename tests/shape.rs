//! The shape of the code on the main paths: no function there is over
//! [`MAX_LINES`] lines.
//!
//! A function a reader can hold in mind is one whose steps they can see at
//! once; past about a screen, a reader scrolls back and forth and loses the
//! thread. So the engine, the service, the stores, RLQS, the servers, rule
//! loading, observability and the limiters keep each function within 80
//! lines (signature and closing brace included), and a longer one is split
//! into named steps. This test scans those directories and fails listing
//! every function over the bound; it always prints the ten longest, so
//! `cargo test --test shape -- --nocapture` shows how close the code is.
//!
//! The scan reads rustfmt-formatted code, not Rust: a function starts at a
//! line holding (after its indentation) an optional `pub` or `pub(...)`,
//! `const`, `async` and `unsafe`, then `fn name`; its body closes at the
//! first later line that is the same indentation and `}`. A declaration
//! without a body (ending in `;`, a trait's) is skipped. Each file is read
//! up to its first line starting with `#[cfg(test)]`, and files named
//! `tests.rs` are not read: tests may be as long as they need.

use std::fs;
use std::path::{Path, PathBuf};

/// The longest a function on the main paths may be, in lines.
const MAX_LINES: usize = 80;

/// The directories scanned, from the crate's root.
const ROOTS: &[&str] = &[
    "src/engine",
    "src/service",
    "src/storage",
    "src/rlqs",
    "src/server",
    "src/rules/load",
    "src/observe",
    "src/limit",
];

/// How many of the longest functions are always printed.
const SHOWN: usize = 10;

/// One function found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Function {
    name: String,
    /// Its first line, counting from 1.
    line: usize,
    /// Lines from its signature to its closing brace, both included.
    lines: usize,
}

/// The name of the function declared on `line`, if it declares one:
/// indentation, then optionally `pub` or `pub(...)`, `const`, `async`,
/// `unsafe`, then `fn name`.
fn declared(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        if let Some(scoped) = after.strip_prefix('(') {
            rest = scoped.split_once(')')?.1.strip_prefix(' ')?;
        } else if let Some(after) = after.strip_prefix(' ') {
            rest = after;
        }
    }
    for qualifier in ["const ", "async ", "unsafe "] {
        if let Some(after) = rest.strip_prefix(qualifier) {
            rest = after;
        }
    }
    let rest = rest.strip_prefix("fn ")?;
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// The functions with a body in `source`, read up to its first line
/// starting with `#[cfg(test)]`.
fn functions(source: &str) -> Vec<Function> {
    let lines: Vec<&str> = source
        .lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = declared(line) else {
            continue;
        };
        let indent = &line[..line.len() - line.trim_start().len()];
        // The signature ends at the first line ending in `{` (a body
        // follows), `}` (an empty body, `{}`) or `;` (no body).
        let Some(sig_end) = (start..lines.len()).find(|&j| {
            let l = lines[j].trim_end();
            l.ends_with('{') || l.ends_with('}') || l.ends_with(';')
        }) else {
            continue;
        };
        let sig = lines[sig_end].trim_end();
        if sig.ends_with(';') {
            continue;
        }
        let end = if sig.ends_with('}') {
            sig_end
        } else {
            let close = format!("{indent}}}");
            (sig_end + 1..lines.len())
                .find(|&j| lines[j] == close)
                .unwrap_or(lines.len() - 1)
        };
        found.push(Function {
            name: name.to_string(),
            line: start + 1,
            lines: end - start + 1,
        });
    }
    found
}

/// Every `.rs` file under `dir` but those named `tests.rs`, in order.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

#[test]
fn no_function_on_the_main_paths_is_over_80_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all: Vec<(String, Function)> = Vec::new();
    for dir in ROOTS {
        let dir = root.join(dir);
        assert!(dir.is_dir(), "{} is gone: update ROOTS", dir.display());
        let mut files = Vec::new();
        sources(&dir, &mut files);
        for file in files {
            let source = fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
            let shown = file
                .strip_prefix(root)
                .unwrap_or(&file)
                .display()
                .to_string();
            all.extend(functions(&source).into_iter().map(|f| (shown.clone(), f)));
        }
    }
    assert!(!all.is_empty(), "no function found: is the scan broken?");
    all.sort_by(|a, b| {
        b.1.lines
            .cmp(&a.1.lines)
            .then_with(|| (&a.0, a.1.line).cmp(&(&b.0, b.1.line)))
    });
    eprintln!("the {SHOWN} longest functions (at most {MAX_LINES} lines each):");
    for (file, f) in all.iter().take(SHOWN) {
        eprintln!("{:>4} {file}:{} {}", f.lines, f.line, f.name);
    }
    let over: Vec<String> = all
        .iter()
        .filter(|(_, f)| f.lines > MAX_LINES)
        .map(|(file, f)| format!("{file}:{} {} is {} lines", f.line, f.name, f.lines))
        .collect();
    assert!(
        over.is_empty(),
        "{} function(s) over {MAX_LINES} lines; split each into named steps:\n{}",
        over.len(),
        over.join("\n")
    );
}

#[test]
fn the_scanner_finds_a_function_and_measures_it() {
    let source = "\
/// A doc comment.
pub(crate) async fn three(x: u64) -> u64 {
    x + 1
}

trait Shape {
    fn declared(&self) -> u64;

    fn provided(&self) -> u64 {
        if true {
            1
        } else {
            2
        }
    }
}

pub const fn empty() {}

fn notfn_is_not_a_function() {
    let fn_name = 1;
}

#[cfg(test)]
mod tests {
    fn ignored() {
    }
}
";
    let found = functions(source);
    let named = |name: &str, line: usize, lines: usize| Function {
        name: name.to_string(),
        line,
        lines,
    };
    assert_eq!(
        found,
        vec![
            named("three", 2, 3),
            named("provided", 9, 7),
            named("empty", 18, 1),
            named("notfn_is_not_a_function", 20, 3),
        ]
    );
    assert_eq!(declared("    pub(super) fn a_b1<T>("), Some("a_b1"));
    assert_eq!(declared("pub unsafe fn raw() {"), Some("raw"));
    assert_eq!(declared("    let f = fn_ptr;"), None);
    assert_eq!(declared("// fn in a comment"), None);
    assert_eq!(declared("pubfn nope() {"), None);
}
