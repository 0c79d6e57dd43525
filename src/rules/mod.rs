//! Which limit applies? Rule files in the reference service's YAML format are
//! parsed once into an immutable [`RuleSet`]; matching a descriptor is a pure
//! function over it. This module does no I/O except reading the rules
//! directory ([`load_dir`]; [`walk`], which the reload watcher's fingerprint
//! shares), and knows nothing of Envoy's protocol or of stores. Both the
//! files and the directory are read with bounds ([`MAX_DEPTH`] on nesting
//! in a file, [`MAX_DIR_DEPTH`] and [`MAX_ENTRIES`] on the walk, which
//! enters each directory once), so no rules directory can exhaust the
//! stack, the CPU or the memory of whoever loads it.

mod load;
mod matcher;
mod stats;
mod walk;

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;

use crate::limit::{Algorithm, FailurePolicy, Unit};

pub use load::{LoadOptions, MAX_DEPTH, load_dir, parse_file};
pub use stats::{Counts, CountsSnapshot, OVERFLOW, RuleStats};
pub use walk::{Found, MAX_DIR_DEPTH, MAX_ENTRIES, WalkOptions, walk};

/// The limit a rule gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitSpec {
    /// `unlimited: true`: always OK, never counted.
    Unlimited,
    /// `requests_per_unit` per `unit`; 0 always rejects.
    PerUnit { requests_per_unit: u32, unit: Unit },
}

/// A `rate_limit` block and the flags of the descriptor node that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub limit: LimitSpec,
    /// `rate_limit.name`, used by `replaces` and reported in responses.
    pub name: Option<String>,
    /// Names of limits this one drops from the same request.
    pub replaces: Vec<String>,
    /// `rate_limit.algorithm`; `None` means the configured default.
    pub algorithm: Option<Algorithm>,
    /// `rate_limit.buckets` (counter only, 2..=60); `None` means 2.
    pub buckets: Option<u8>,
    /// `rate_limit.burst` (token bucket only): the bucket's size; `None`
    /// means `requests_per_unit`.
    pub burst: Option<u64>,
    /// `rate_limit.shards` (1..=64): sub-limiters the limit is split over;
    /// `None` means 1.
    pub shards: Option<u16>,
    /// `rate_limit.on_store_error`; `None` means the configured default.
    pub on_store_error: Option<FailurePolicy>,
    /// `rate_limit.usage_reports`: record every positive cost, also one
    /// that takes the limiter over (costs reported after the response);
    /// `None` means the configured default.
    pub usage_reports: Option<bool>,
    /// `shadow_mode`: counted, but the descriptor always answers OK.
    pub shadow_mode: bool,
    /// `quota_mode`: over only matters when every quota descriptor is over.
    pub quota_mode: bool,
    /// `detailed_metric`: metrics name the full descriptor values.
    pub detailed_metric: bool,
    /// Where the rule was written, for logs: `file.yaml:12`.
    pub source: String,
    /// The rule's place in its tree, `key_value.key2` (a value only where
    /// the node has one): its metric label, bounded by the rule files.
    pub path: String,
    /// What the rule met; kept across reloads for the same domain and path.
    pub stats: RuleStats,
}

/// One descriptor node of a rule tree.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    pub key: String,
    /// Empty for the key-only default node.
    pub value: String,
    pub rule: Option<Rule>,
    pub children: Level,
}

/// The nodes of one level of a rule tree, indexed for matching.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Level {
    /// `(key, value)` with a value free of `*`.
    pub exact: HashMap<(String, String), Node>,
    /// Values containing `*`, in file order (the first match wins).
    pub wildcard: Vec<Node>,
    /// Key-only nodes (no `value`).
    pub default: HashMap<String, Node>,
}

/// A domain: one rule file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Domain {
    pub name: String,
    pub root: Level,
    /// The file it came from.
    pub file: PathBuf,
}

/// Every loaded domain. Immutable; a reload builds a new one and swaps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet {
    pub domains: HashMap<String, Domain>,
}

impl RuleSet {
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The rule for one descriptor, by the reference service's matching.
    /// `None`: the domain is unknown, nothing matched, the request's depth
    /// differs from the rule's, or the matched node carries no limit.
    pub fn find(&self, domain: &str, entries: &[(String, String)]) -> Option<&Rule> {
        matcher::find(self.domains.get(domain)?, entries)
    }

    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// Every rule, one line each, sorted: `domain.key_value.key2: limit
    /// [flags] (file:line)`. Rules without an algorithm show `default`.
    pub fn describe(&self) -> String {
        fn walk(prefix: &str, level: &Level, out: &mut Vec<String>) {
            let nodes = level
                .exact
                .values()
                .chain(&level.wildcard)
                .chain(level.default.values());
            for node in nodes {
                let path = if node.value.is_empty() {
                    format!("{prefix}.{}", node.key)
                } else {
                    format!("{prefix}.{}_{}", node.key, node.value)
                };
                match &node.rule {
                    Some(rule) => out.push(format!("{path}: {}", describe_rule(rule))),
                    None if is_leaf(node) => out.push(format!("{path}: no limit (whitelist)")),
                    None => {}
                }
                walk(&path, &node.children, out);
            }
        }
        fn is_leaf(node: &Node) -> bool {
            node.children.exact.is_empty()
                && node.children.wildcard.is_empty()
                && node.children.default.is_empty()
        }
        let mut lines = Vec::new();
        for (name, domain) in &self.domains {
            walk(name, &domain.root, &mut lines);
        }
        lines.sort();
        let mut text = lines.join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        text
    }

    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Every rule with its domain.
    pub fn rules(&self) -> Vec<(&str, &Rule)> {
        fn walk<'a>(domain: &'a str, level: &'a Level, out: &mut Vec<(&'a str, &'a Rule)>) {
            let nodes = level
                .exact
                .values()
                .chain(&level.wildcard)
                .chain(level.default.values());
            for node in nodes {
                if let Some(rule) = &node.rule {
                    out.push((domain, rule));
                }
                walk(domain, &node.children, out);
            }
        }
        let mut out = Vec::new();
        for (name, domain) in &self.domains {
            walk(name, &domain.root, &mut out);
        }
        out
    }

    /// Gives each rule the counters of the rule at the same domain and
    /// path in `old`, so counts survive a reload that keeps the rule.
    pub fn keep_stats(&mut self, old: &RuleSet) {
        let old: HashMap<(&str, &str), &RuleStats> = old
            .rules()
            .into_iter()
            .map(|(d, r)| ((d, r.path.as_str()), &r.stats))
            .collect();
        fn walk(domain: &str, level: &mut Level, old: &HashMap<(&str, &str), &RuleStats>) {
            let nodes = level
                .exact
                .values_mut()
                .chain(level.wildcard.iter_mut())
                .chain(level.default.values_mut());
            for node in nodes {
                if let Some(rule) = &mut node.rule
                    && let Some(stats) = old.get(&(domain, rule.path.as_str()))
                {
                    rule.stats = (*stats).clone();
                }
                walk(domain, &mut node.children, old);
            }
        }
        for (name, domain) in &mut self.domains {
            walk(name, &mut domain.root, &old);
        }
    }
}

/// Names every rule under `level` by its path from the root.
fn name_rules(prefix: &str, level: &mut Level) {
    let nodes = level
        .exact
        .values_mut()
        .chain(level.wildcard.iter_mut())
        .chain(level.default.values_mut());
    for node in nodes {
        let step = if node.value.is_empty() {
            node.key.clone()
        } else {
            format!("{}_{}", node.key, node.value)
        };
        let path = if prefix.is_empty() {
            step
        } else {
            format!("{prefix}.{step}")
        };
        if let Some(rule) = &mut node.rule {
            rule.path = path.clone();
        }
        name_rules(&path, &mut node.children);
    }
}

fn describe_rule(rule: &Rule) -> String {
    let mut text = match &rule.limit {
        LimitSpec::Unlimited => "unlimited".to_string(),
        LimitSpec::PerUnit {
            requests_per_unit,
            unit,
        } => format!(
            "{requests_per_unit}/{unit} {}",
            rule.algorithm.map(|a| a.as_str()).unwrap_or("default")
        ),
    };
    if let Some(buckets) = rule.buckets {
        text.push_str(&format!(" buckets={buckets}"));
    }
    if let Some(burst) = rule.burst {
        text.push_str(&format!(" burst={burst}"));
    }
    if let Some(shards) = rule.shards {
        text.push_str(&format!(" shards={shards}"));
    }
    if let Some(name) = &rule.name {
        text.push_str(&format!(" name={name}"));
    }
    if !rule.replaces.is_empty() {
        text.push_str(&format!(" replaces={}", rule.replaces.join(",")));
    }
    if let Some(p) = rule.on_store_error {
        text.push_str(&format!(" on_store_error={p}"));
    }
    for (on, flag) in [
        (rule.shadow_mode, "shadow_mode"),
        (rule.quota_mode, "quota_mode"),
        (rule.detailed_metric, "detailed_metric"),
    ] {
        if on {
            text.push(' ');
            text.push_str(flag);
        }
    }
    text.push_str(&format!(" ({})", rule.source));
    text
}

/// One problem in one rule file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleError {
    pub file: PathBuf,
    /// 1-based line, when the problem has a position.
    pub line: Option<usize>,
    /// YAML path of the offending node, e.g. `descriptors[0].rate_limit.unit`.
    pub path: String,
    pub reason: String,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// Every problem found while loading rules. Never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleErrors(pub Vec<RuleError>);

impl fmt::Display for RuleErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RuleErrors {}
