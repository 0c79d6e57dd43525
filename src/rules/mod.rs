//! Which limit applies? Rule files in the reference service's YAML format are
//! parsed once into an immutable [`RuleSet`]; matching a descriptor is a pure
//! function over it. This module does no I/O except reading the rules
//! directory ([`load_dir`]; [`walk`], which the reload watcher's fingerprint
//! shares), and knows nothing of Envoy's protocol or of stores. Both the
//! files and the directory are read with bounds ([`MAX_DEPTH`] on nesting
//! in a file, [`MAX_DIR_DEPTH`] and [`MAX_ENTRIES`] on the walk, which
//! enters each directory once), so no rules directory can exhaust the
//! stack, the CPU or the memory of whoever loads it.

mod describe;
mod load;
mod matcher;
mod stats;
mod walk;

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::limit::{Algorithm, FailurePolicy, Window};

pub use describe::Defaults;
pub use load::keys::{Place, REFUSED, RULE_KEYS, Refused, RuleKey};
pub use load::{LoadOptions, MAX_DEPTH, load_dir, load_texts, parse_file};
pub use matcher::Step;
pub use stats::{Counts, CountsSnapshot, OVERFLOW, RuleStats};
pub use walk::{Found, MAX_DIR_DEPTH, MAX_ENTRIES, WalkOptions, walk};

/// The limit a rule gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitSpec {
    /// `unlimited: true`: always OK, never counted.
    Unlimited,
    /// `requests_per_unit` per window (`unit` times `unit_multiplier`);
    /// 0 always rejects.
    PerUnit {
        requests_per_unit: u32,
        window: Window,
    },
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
    /// `rate_limit.max_duration` (concurrency only), in microseconds: how
    /// long a slot is held at most.
    pub max_duration: Option<u64>,
    /// `rate_limit.shards` (1..=64): sub-limiters the limit is split over;
    /// `None` means 1.
    pub shards: Option<u16>,
    /// `rate_limit.on_store_error`; `None` means the configured default.
    pub on_store_error: Option<FailurePolicy>,
    /// `rate_limit.usage_reports`: record every positive cost, also one
    /// that takes the limiter over (costs reported after the response);
    /// `None` means the configured default.
    pub usage_reports: Option<bool>,
    /// `rate_limit.count_refused` (resolved with the setting at load):
    /// `false` keeps nothing of a request whose overall answer is
    /// OVER_LIMIT; what it charged is taken back.
    pub count_refused: bool,
    /// `rate_limit.lease`: decided from quota leased from the store;
    /// `None` means the `lease` setting (for the limits that may be).
    pub lease: Option<bool>,
    /// `shadow_mode`: counted, but the descriptor always answers OK.
    pub shadow_mode: bool,
    /// `quota_mode`: over only matters when every quota descriptor is over.
    pub quota_mode: bool,
    /// `detailed_metric`: metrics name the full descriptor values.
    pub detailed_metric: bool,
    /// Some node on the rule's path has `value_to_metric`: its metrics
    /// name the runtime values where that node has no value of its own
    /// (capped like `detailed_metric`, which wins when both are set).
    pub value_to_metric: bool,
    /// Some node on the rule's path has `share_threshold`: every value its
    /// wildcard matches counts on one limiter, named by the pattern.
    pub share_threshold: bool,
    /// The descriptor's `metadata` mapping, as JSON: shown on `/rlconfig`
    /// and, when `response_dynamic_metadata` is on, returned with answers.
    pub metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// Where the rule was written, for logs: `file.yaml:12`.
    pub source: Source,
    /// The rule's place in its tree, `key_value.key2` (a value only where
    /// the node has one): its metric label, bounded by the rule files.
    pub path: String,
    /// What the rule met; kept across reloads for the same domain and path.
    pub stats: RuleStats,
    /// A `rate_limits:` list: its further limits (this rule is the
    /// first), each a rule of its own (its limit, name, `replaces`,
    /// algorithm, line, path and counters; the descriptor's flags), all
    /// decided together. Empty for a `rate_limit` block.
    pub more: Vec<Rule>,
}

/// Where a rule was written: its file's name, shared by every rule of the
/// file, and its line. Shows as `file.yaml:12`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub file: Arc<str>,
    pub line: u32,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

impl PartialEq<&str> for Source {
    fn eq(&self, other: &&str) -> bool {
        other
            .rsplit_once(':')
            .is_some_and(|(file, line)| *file == *self.file && line.parse() == Ok(self.line))
    }
}

/// `file.yaml:12`; a text without a line is a file at line 0.
impl From<&str> for Source {
    fn from(text: &str) -> Self {
        match text.rsplit_once(':').map(|(f, l)| (f, l.parse())) {
            Some((file, Ok(line))) => Source {
                file: file.into(),
                line,
            },
            _ => Source {
                file: text.into(),
                line: 0,
            },
        }
    }
}

/// One descriptor node of a rule tree. Keys are shared by every node of
/// a file that has them, and an exact node's key and value by the index
/// of its level: a rule set may hold a million nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Node {
    pub key: Arc<str>,
    /// Empty for the key-only default node.
    pub value: Arc<str>,
    /// Boxed: most nodes of a large rule set sit in a level's hash map,
    /// whose empty buckets then cost a pointer rather than a rule.
    pub rule: Option<Box<Rule>>,
    pub children: Level,
    /// `share_threshold`: a wildcard whose matches share one limiter.
    pub share_threshold: bool,
    /// `value_to_metric`: metrics name the runtime value matched here.
    pub value_to_metric: bool,
    /// The line of the node in its file (`Rule::source` says the same for
    /// a node with a limit; a whitelist has only this).
    pub line: u32,
}

/// The nodes of one level of a rule tree: a pointer, and nothing more
/// for the level under a leaf (most nodes of a large rule set). Reads see
/// [`Nodes`] through `Deref`, empty when there are none; writing through
/// `DerefMut` makes the nodes, so walks that may meet empty levels change
/// them through [`Level::nodes_mut`].
#[derive(Debug, Clone, Default)]
pub struct Level(Option<Box<Nodes>>);

/// The nodes of one level of a rule tree, indexed for matching.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nodes {
    /// `(key, value)` with a value free of `*`.
    pub exact: HashMap<(Arc<str>, Arc<str>), Node>,
    /// Values containing `*`, in file order (the first match wins).
    pub wildcard: Vec<Node>,
    /// Key-only nodes (no `value`).
    pub default: HashMap<Arc<str>, Node>,
}

impl Level {
    /// The nodes, when there are any to change.
    pub fn nodes_mut(&mut self) -> Option<&mut Nodes> {
        self.0.as_deref_mut()
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty() && self.default.is_empty()
    }

    /// The nodes, taken out of the level.
    pub fn into_nodes(self) -> Nodes {
        self.0.map(|nodes| *nodes).unwrap_or_default()
    }
}

impl std::ops::Deref for Level {
    type Target = Nodes;

    fn deref(&self) -> &Nodes {
        static EMPTY: std::sync::OnceLock<Nodes> = std::sync::OnceLock::new();
        self.0
            .as_deref()
            .unwrap_or_else(|| EMPTY.get_or_init(Nodes::default))
    }
}

impl std::ops::DerefMut for Level {
    fn deref_mut(&mut self) -> &mut Nodes {
        self.0.get_or_insert_with(Box::default)
    }
}

impl PartialEq for Level {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Level {}

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

    /// How each entry of a descriptor was matched, for a rule that shares
    /// its limiter or names runtime values in metrics (its
    /// `share_threshold` or `value_to_metric`); the same walk as [`find`].
    ///
    /// [`find`]: RuleSet::find
    pub fn steps<'a>(&'a self, domain: &str, entries: &[(String, String)]) -> Vec<Step<'a>> {
        match self.domains.get(domain) {
            Some(d) => matcher::steps(d, entries),
            None => Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.domains.len()
    }

    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Every whitelist (a node with neither limit nor children): its
    /// domain, path and position (`file:line`).
    pub fn whitelists(&self) -> Vec<(&str, String, String)> {
        fn walk<'a>(
            domain: &'a str,
            file: &str,
            prefix: &str,
            level: &'a Level,
            out: &mut Vec<(&'a str, String, String)>,
        ) {
            let nodes = level
                .exact
                .values()
                .chain(&level.wildcard)
                .chain(level.default.values());
            for node in nodes {
                let path = node.step(prefix);
                if node.rule.is_none() && node.is_leaf() {
                    out.push((domain, path.clone(), format!("{file}:{}", node.line)));
                }
                walk(domain, file, &path, &node.children, out);
            }
        }
        let mut out = Vec::new();
        for (name, domain) in &self.domains {
            walk(name, &domain.short_file(), "", &domain.root, &mut out);
        }
        out
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
                    out.extend(rule.more.iter().map(|r| (domain, r)));
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
            let Some(level) = level.nodes_mut() else {
                return;
            };
            let nodes = level
                .exact
                .values_mut()
                .chain(level.wildcard.iter_mut())
                .chain(level.default.values_mut());
            for node in nodes {
                if let Some(rule) = &mut node.rule {
                    let keep = |rule: &mut Rule| {
                        if let Some(stats) = old.get(&(domain, rule.path.as_str())) {
                            rule.stats = (*stats).clone();
                        }
                    };
                    keep(rule);
                    rule.more.iter_mut().for_each(keep);
                }
                walk(domain, &mut node.children, old);
            }
        }
        for (name, domain) in &mut self.domains {
            walk(name, &mut domain.root, &old);
        }
    }
}

impl Rule {
    /// Whether its limiter may be decided from leased quota (`default`
    /// being the algorithm of rules that name none): the one test load
    /// applies to `lease: true` and the engine to the `lease` setting.
    pub fn may_lease(&self, default: Algorithm) -> bool {
        load::lease::Leasable::of(self).obstacle(default).is_none()
    }

    /// Whether the rule's limiter is decided from leases, with `setting`
    /// the `lease` of rules that do not say (`in_list`: one limit of a
    /// `rate_limits:` list): `Ok(true)`, `Ok(false)` when leases are off
    /// for it, or why it cannot lease though the setting asks.
    pub fn lease_state(
        &self,
        default: Algorithm,
        setting: bool,
        in_list: bool,
    ) -> Result<bool, String> {
        if matches!(self.limit, LimitSpec::Unlimited) || !self.lease.unwrap_or(setting) {
            return Ok(false);
        }
        let leasable = load::lease::Leasable {
            in_list: in_list || !self.more.is_empty(),
            ..load::lease::Leasable::of(self)
        };
        match leasable.obstacle(default) {
            None => Ok(true),
            Some(why) => Err(why.to_string()),
        }
    }
}

impl Node {
    fn is_leaf(&self) -> bool {
        self.children.is_empty()
    }

    /// The node's path: `prefix.key_value` (`key` alone for a default).
    fn step(&self, prefix: &str) -> String {
        let step = if self.value.is_empty() {
            self.key.to_string()
        } else {
            format!("{}_{}", self.key, self.value)
        };
        if prefix.is_empty() {
            step
        } else {
            format!("{prefix}.{step}")
        }
    }
}

impl Domain {
    /// The file's name, as rules' `source` gives it.
    fn short_file(&self) -> String {
        self.file.file_name().map_or_else(
            || self.file.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }
}

/// Names every rule under `level` by its path from the root, and marks the
/// rules below a `share_threshold` or `value_to_metric` node.
fn name_rules(prefix: &str, level: &mut Level, shared: bool, by_value: bool) {
    let Some(level) = level.nodes_mut() else {
        return;
    };
    let nodes = level
        .exact
        .values_mut()
        .chain(level.wildcard.iter_mut())
        .chain(level.default.values_mut());
    for node in nodes {
        let path = node.step(prefix);
        let shared = shared || node.share_threshold;
        let by_value = by_value || node.value_to_metric;
        name_rules(&path, &mut node.children, shared, by_value);
        if let Some(rule) = &mut node.rule {
            // The limits of a `rate_limits:` list by their place in it.
            let list = !rule.more.is_empty();
            let name = |rule: &mut Rule, i: usize| {
                rule.path = if list {
                    format!("{path}[{i}]")
                } else {
                    path.clone()
                };
                rule.share_threshold = shared;
                rule.value_to_metric = by_value;
            };
            name(rule, 0);
            for (i, r) in rule.more.iter_mut().enumerate() {
                name(r, i + 1);
            }
        }
    }
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
