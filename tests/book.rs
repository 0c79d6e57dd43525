//! The book under docs/ holds together: every relative link of its pages
//! and of README (to a page, a heading of a page, or a file of the
//! repository) resolves, and every YAML block that is a rule file (it has
//! `domain:` and `descriptors:`) is accepted by `tollgate validate`, so an
//! example a reader copies loads. (Envoy configurations the book shows are
//! included from examples/, which tests/envoy.rs runs in a real Envoy.)

#[path = "support/markdown.rs"]
mod markdown;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const BOOK: &str = "docs/src";

/// Every Markdown file of the book, and README.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![PathBuf::from("README.md")];
    walk(Path::new(BOOK), &mut out);
    out.sort();
    out
}

/// The lines of a Markdown text outside fenced blocks.
fn prose(markdown: &str) -> Vec<&str> {
    let mut fenced = false;
    markdown
        .lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// `[label](target)` links of a line: the targets.
fn links(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(end) => {
                let target = &after[..end];
                if !target.contains(char::is_whitespace) {
                    out.push(target.to_string());
                }
                rest = &after[end..];
            }
            None => break,
        }
    }
    out
}

/// A heading's id as mdBook makes it (GitHub's rule too): the text without
/// markup, lower-cased, spaces as `-`, only letters, digits, `-` and `_`
/// kept; a repeated id gets `-1`, `-2`...
fn heading_ids(markdown: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for line in prose(markdown) {
        let Some(text) = line.strip_prefix('#') else {
            continue;
        };
        let text = text.trim_start_matches('#');
        if !text.starts_with(' ') {
            continue;
        }
        // Link labels stay, their targets go.
        let mut plain = String::new();
        let mut rest = text.trim();
        while let Some(i) = rest.find("](") {
            plain.push_str(&rest[..i]);
            rest = rest[i..].split_once(')').map_or("", |(_, r)| r);
        }
        plain.push_str(rest);
        let id: String = plain
            .chars()
            .filter_map(|c| {
                if c.is_alphanumeric() || c == '_' || c == '-' {
                    Some(c.to_ascii_lowercase())
                } else if c.is_whitespace() {
                    Some('-')
                } else {
                    None
                }
            })
            .collect();
        let mut unique = id.clone();
        let mut n = 0;
        while ids.contains(&unique) {
            n += 1;
            unique = format!("{id}-{n}");
        }
        ids.insert(unique);
    }
    ids
}

#[test]
fn every_link_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for line in prose(&text) {
            for target in links(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                if target.is_empty() {
                    broken.push(format!("{}: a link with no target", page.display()));
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    page.clone()
                } else {
                    dir.join(path)
                };
                if !file.exists() {
                    broken.push(format!("{}: {target}: no such file", page.display()));
                    continue;
                }
                if let Some(anchor) = anchor
                    && file.extension().is_some_and(|e| e == "md")
                {
                    let ids = heading_ids(&std::fs::read_to_string(&file).unwrap());
                    if !ids.contains(anchor) {
                        broken.push(format!(
                            "{}: {target}: no heading #{anchor} in {}",
                            page.display(),
                            file.display()
                        ));
                    }
                }
            }
        }
    }
    assert!(checked > 200, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Every page SUMMARY.md names exists, and every page of the book is in
/// SUMMARY.md (a page left out is never rendered).
#[test]
fn summary_lists_every_page() {
    let summary = std::fs::read_to_string(format!("{BOOK}/SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> = prose(&summary)
        .into_iter()
        .flat_map(links)
        .map(|l| Path::new(BOOK).join(l))
        .collect();
    for page in &listed {
        assert!(
            page.exists(),
            "SUMMARY.md lists {}, which is missing",
            page.display()
        );
    }
    for page in pages() {
        if page.starts_with(BOOK) && !page.ends_with("SUMMARY.md") {
            assert!(
                listed.contains(&page),
                "{} is not in SUMMARY.md",
                page.display()
            );
        }
    }
}

/// No page is longer than a reader keeps in mind: about 400 lines (the
/// generated reference pages are as long as what they list).
#[test]
fn pages_stay_short() {
    for page in pages() {
        if page.starts_with(format!("{BOOK}/reference")) {
            continue;
        }
        let lines = std::fs::read_to_string(&page).unwrap().lines().count();
        let most = if page.ends_with("README.md") {
            250
        } else {
            400
        };
        assert!(
            lines <= most,
            "{}: {lines} lines (at most {most})",
            page.display()
        );
    }
}

#[test]
fn rule_examples_validate() {
    let mut checked = 0;
    let mut refused = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (i, (lang, body)) in markdown::fenced(&text, true).into_iter().enumerate() {
            let is_rule_file = |key: &str| body.lines().any(|l| l.starts_with(key));
            if lang != "yaml" || !is_rule_file("domain:") || !is_rule_file("descriptors:") {
                continue;
            }
            checked += 1;
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("rules.yaml"), &body).unwrap();
            let o = Command::new(env!("CARGO_BIN_EXE_tollgate"))
                .arg("validate")
                .arg(dir.path())
                .env_clear()
                .output()
                .unwrap();
            if !o.status.success() {
                refused.push(format!(
                    "{}, block {i}:\n{body}{}",
                    page.display(),
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
        }
    }
    assert!(checked >= 10, "only {checked} rule examples found");
    assert!(refused.is_empty(), "{}", refused.join("\n"));
}
