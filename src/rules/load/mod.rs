//! Reading rule files into [`Domain`]s.
//!
//! The YAML is parsed into a small tree whose nodes keep their line
//! (`tree`), then walked by hand so that every problem of a file is
//! reported at once (serde's `deny_unknown_fields` would stop at the
//! first). Scalars are read as the reference service's `yaml.v2` reads them
//! into Go fields: a plain `null`, `~` or empty value is the same as an
//! absent key, and numbers and booleans are parsed from the scalar's text.
//!
//! Limits of the YAML subset: anchors, aliases and tags are refused, and a
//! duplicate mapping key stops the file at the parser (so it is the only
//! error reported for that file). Nesting is bounded ([`MAX_DEPTH`]) while
//! the events are read, before any node deeper than that exists.
//!
//! `tree` parses (and bounds the nesting, `depth`), `yaml` walks the tree
//! with positions and reads scalars, `build` turns the walk into rules and
//! validates them; this file reads the directory and each file.

mod build;
mod burst;
mod depth;
mod fast;
pub mod keys;
pub(super) mod lease;
mod limit;
mod list;
mod metadata;
mod refused;
mod released;
mod replaces;
mod slots;
mod tree;
mod window;
mod yaml;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fs;
use std::path::{Path, PathBuf};

use super::walk::{WalkOptions, walk};
use super::{Domain, RuleError, RuleErrors, RuleSet};
use crate::limit::Algorithm;

use yaml::Walker;

pub use depth::MAX_DEPTH;

/// Settings that decide whether a rule is acceptable beyond its own text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// What a rule without `algorithm` runs (the `default_algorithm`
    /// setting), needed to know which rules are logs.
    pub default_algorithm: Algorithm,
    /// Largest `requests_per_unit` of a `sliding_window_log` limit (the
    /// `max_log_limit` setting): a log keeps one entry per admitted hit, so
    /// its memory grows with the limit.
    pub max_log_limit: u32,
    /// The `merge_domain_config` setting: files naming the same domain are
    /// merged into it (a descriptor defined in two of them is still an
    /// error); off, a domain defined twice is an error.
    pub merge_domains: bool,
    /// The `count_refused` setting: what a rule that does not say (and
    /// does not take usage reports) gets.
    pub count_refused: bool,
}

impl Default for LoadOptions {
    /// The settings' defaults.
    fn default() -> Self {
        LoadOptions {
            default_algorithm: Algorithm::SlidingWindowCounter,
            max_log_limit: 10_000,
            merge_domains: false,
            count_refused: true,
        }
    }
}

/// Loads every `*.yaml` / `*.yml` file under `dir` (recursively, skipping
/// names that start with `.`), one domain per file. All files are checked and
/// all their errors returned together; a domain defined twice is an error on
/// the later file (in path order). An empty directory gives an empty set.
///
/// Files may be symlinks (a Kubernetes ConfigMap mount links `x.yaml` to
/// `..data/x.yaml`); directories are entered only if they are real
/// directories, each once, and dot-names are skipped, which keeps `..data`
/// from giving every file twice. The walk is bounded (`rules::walk`).
pub fn load_dir(dir: &Path, options: &LoadOptions) -> Result<RuleSet, RuleErrors> {
    let mut errors = Vec::new();
    let walked = walk(
        dir,
        WalkOptions {
            hidden: false,
            linked_dirs: false,
        },
    )
    .map_err(|e| RuleErrors(vec![e]))?;
    let mut files: Vec<PathBuf> = walked
        .into_iter()
        .filter(|f| f.meta.is_file() && is_rule_file(&f.path))
        .map(|f| f.path)
        .collect();
    files.sort();

    let mut texts = Vec::with_capacity(files.len());
    for file in files {
        match fs::read_to_string(&file) {
            Ok(text) => texts.push((file, text)),
            Err(e) => errors.push(RuleError {
                file: file.clone(),
                line: None,
                path: String::new(),
                reason: format!("cannot read rule file: {e}"),
            }),
        }
    }
    match load_texts(texts, options) {
        Ok(set) if errors.is_empty() => Ok(set),
        Ok(_) => Err(RuleErrors(errors)),
        Err(RuleErrors(mut errs)) => {
            errors.append(&mut errs);
            Err(RuleErrors(errors))
        }
    }
}

/// Builds one rule set from rule texts, each named by a path (a file, or
/// where the text came from: an xDS resource), in the order given: the
/// same checks as [`load_dir`], every error of every text returned.
pub fn load_texts(
    texts: Vec<(PathBuf, String)>,
    options: &LoadOptions,
) -> Result<RuleSet, RuleErrors> {
    let mut errors = Vec::new();
    let mut set = RuleSet::default();
    // Domain name -> (file, line of its `domain` value), to name both files.
    let mut seen: HashMap<String, (PathBuf, usize)> = HashMap::new();
    let files: Vec<PathBuf> = texts.iter().map(|(f, _)| f.clone()).collect();
    for (file, text) in texts {
        match parse(&file, &text, options) {
            Ok((domain, line)) => {
                if let Some((first, first_line)) = seen.get(&domain.name) {
                    if options.merge_domains {
                        if let Some(into) = set.domains.get_mut(&domain.name) {
                            let mut merge_errors = merge(into, domain, &file, line, first);
                            errors.append(&mut merge_errors);
                        }
                        continue;
                    }
                    errors.push(RuleError {
                        file: file.clone(),
                        line: Some(line),
                        path: "domain".into(),
                        reason: format!(
                            "duplicate domain {:?}, already defined in {}:{first_line}",
                            domain.name,
                            first.display()
                        ),
                    });
                    continue;
                }
                seen.insert(domain.name.clone(), (file.clone(), line));
                set.domains.insert(domain.name.clone(), domain);
            }
            Err(RuleErrors(mut errs)) => errors.append(&mut errs),
        }
    }
    errors.extend(released::replaced_in_flight(&set, &files));
    if errors.is_empty() {
        Ok(set)
    } else {
        Err(RuleErrors(errors))
    }
}

/// Adds `other`'s top-level descriptors to `into` (the same domain from an
/// earlier file); a descriptor both define is an error on `other`'s file.
fn merge(
    into: &mut Domain,
    other: Domain,
    file: &Path,
    line: usize,
    first: &Path,
) -> Vec<RuleError> {
    let mut errors = Vec::new();
    let mut clash = |what: String| {
        errors.push(RuleError {
            file: file.to_path_buf(),
            line: Some(line),
            path: "descriptors".into(),
            reason: format!(
                "duplicate descriptor {what} in domain {:?}, already defined in {} (merge_domain_config merges files but not descriptors)",
                other.name,
                first.display()
            ),
        });
    };
    let root = &mut into.root;
    let other_root = other.root.into_nodes();
    for (id, node) in other_root.exact {
        match root.exact.entry(id) {
            Entry::Occupied(e) => clash(format!("key {:?} with value {:?}", e.key().0, e.key().1)),
            Entry::Vacant(e) => {
                e.insert(node);
            }
        }
    }
    for node in other_root.wildcard {
        if root
            .wildcard
            .iter()
            .any(|n| n.key == node.key && n.value == node.value)
        {
            clash(format!("key {:?} with value {:?}", node.key, node.value));
        } else {
            root.wildcard.push(node);
        }
    }
    for (key, node) in other_root.default {
        match root.default.entry(key) {
            Entry::Occupied(e) => clash(format!("key {:?} without value", e.key())),
            Entry::Vacant(e) => {
                e.insert(node);
            }
        }
    }
    errors
}

fn is_rule_file(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

/// Parses one rule file's text into its domain. `file` is only used in
/// errors and in each rule's `source`.
pub fn parse_file(file: &Path, text: &str, options: &LoadOptions) -> Result<Domain, RuleErrors> {
    parse(file, text, options).map(|(domain, _)| domain)
}

/// The domain and the line of its `domain` value.
fn parse(file: &Path, text: &str, options: &LoadOptions) -> Result<(Domain, usize), RuleErrors> {
    let mut w = Walker::new(file, options);
    let root = match parse_tree(text) {
        Ok(root) => root,
        Err(refused) => {
            w.error(Some(refused.line), &refused.path, refused.reason);
            return Err(RuleErrors(w.errors));
        }
    };
    let map = &root;
    if map.is_empty() {
        w.error(
            None,
            "",
            "empty rule file (expected `domain` and `descriptors`)",
        );
        return Err(RuleErrors(w.errors));
    }
    let (domain, domain_line, mut root_level) = w.root(map);
    super::name_rules("", &mut root_level, false, false);
    // A parent's "missing" error is found after its children's: read top down.
    w.errors.sort_by_key(|e| e.line);
    match domain {
        Some(name) if w.errors.is_empty() => Ok((
            Domain {
                name,
                root: root_level,
                file: file.to_path_buf(),
            },
            domain_line,
        )),
        _ => Err(RuleErrors(w.errors)),
    }
}

/// A file from this size on is parsed on a thread of its own.
const OWN_THREAD_BYTES: usize = 64 << 10;

/// The file's tree. A large one is built on a thread of its own: the
/// allocator serves a new thread from a heap of its own, so the tree, the
/// parser's garbage and nothing else live there, and once the tree is
/// dropped (after the rules are built from it, here) that heap is empty
/// and goes back to the system. Built here, their freed memory would stay
/// in the process between the rules, which outlive them: about 1 KB of
/// resident memory more per rule.
fn parse_tree(text: &str) -> Result<tree::MarkedMappingNode<'_>, tree::Refused> {
    // Straight from the lines when the file is in the plainest block
    // style, else from the YAML parser's events.
    let read = || fast::parse(text).map_or_else(|| tree::parse(text), Ok);
    if text.len() < OWN_THREAD_BYTES {
        return read();
    }
    std::thread::scope(|scope| {
        match std::thread::Builder::new()
            .name("rules-parse".into())
            .spawn_scoped(scope, read)
        {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had: here, then.
            Err(_) => read(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::LimitSpec;
    use std::sync::Arc;

    #[test]
    fn null_values_read_as_absent() {
        let text = "domain: d\ndescriptors:\n  - key: k\n    value: ~\n    rate_limit:\n      unlimited: true\n      unit:\n      name: null\n";
        let d = parse_file(Path::new("n.yaml"), text, &LoadOptions::default()).unwrap();
        let node = &d.root.default["k"];
        let rule = node.rule.as_ref().unwrap();
        assert_eq!(rule.limit, LimitSpec::Unlimited);
        assert_eq!(rule.name, None);
        assert_eq!(rule.source, "n.yaml:3");
    }

    #[test]
    fn quoted_null_is_a_value() {
        let text = "domain: d\ndescriptors:\n  - key: k\n    value: \"null\"\n";
        let d = parse_file(Path::new("q.yaml"), text, &LoadOptions::default()).unwrap();
        assert!(
            d.root
                .exact
                .contains_key(&(Arc::from("k"), Arc::from("null")))
        );
    }
}
