//! Reading rule files into [`Domain`]s.
//!
//! The YAML is parsed with `marked-yaml`, whose nodes keep their line, and
//! then walked by hand so that every problem of a file is reported at once
//! (serde's `deny_unknown_fields` would stop at the first). Scalars are read
//! as the reference service's `yaml.v2` reads them into Go fields: a plain
//! `null`, `~` or empty value is the same as an absent key, and numbers and
//! booleans are parsed from the scalar's text.
//!
//! Limits of the YAML subset: anchors, aliases and tags are refused, and a
//! duplicate mapping key stops the file at the parser (so it is the only
//! error reported for that file). Nesting is bounded ([`MAX_DEPTH`]) before
//! the parser runs, because the parser recurses once per level.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use marked_yaml::types::{MarkedMappingNode, MarkedScalarNode};
use marked_yaml::{LoadError, LoaderOptions, Node as Yaml};

use super::walk::{WalkOptions, walk};
use super::{Domain, Level, LimitSpec, Node, Rule, RuleError, RuleErrors, RuleSet};
use crate::limit::{Algorithm, DEFAULT_BUCKETS, FailurePolicy, MAX_BUCKETS, MAX_SHARDS, Unit};

/// Deepest nesting of mappings and lists a rule file may have, counting the
/// top-level mapping as 1. The YAML parser recurses once per level while it
/// builds its tree (and dropping the tree recurses again), so a file nested
/// a few thousand levels deep would overflow a thread's stack and take the
/// whole server down; `too_deep` checks this bound first. A real rule file
/// nests descriptors maybe ten deep, two levels each (a list, then its
/// mapping), plus the root, a `rate_limit` and a `replaces` list: about 25.
/// 64 allows 31 levels of descriptors with a `rate_limit` on the deepest.
/// Whatever else recurses over a rule tree (`Walker::level`, matching,
/// naming, describing) goes down one descriptor, two YAML levels, per call,
/// so this bounds it too.
pub const MAX_DEPTH: usize = 64;

const ROOT_KEYS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
];
const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "buckets",
    "shards",
    "on_store_error",
    "usage_reports",
];
const REPLACES_KEYS: &[&str] = &["name"];

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
}

impl Default for LoadOptions {
    /// The settings' defaults.
    fn default() -> Self {
        LoadOptions {
            default_algorithm: Algorithm::SlidingWindowCounter,
            max_log_limit: 10_000,
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

    let mut set = RuleSet::default();
    // Domain name -> (file, line of its `domain` value), to name both files.
    let mut seen: HashMap<String, (PathBuf, usize)> = HashMap::new();
    for file in files {
        let text = match fs::read_to_string(&file) {
            Ok(text) => text,
            Err(e) => {
                errors.push(RuleError {
                    file: file.clone(),
                    line: None,
                    path: String::new(),
                    reason: format!("cannot read rule file: {e}"),
                });
                continue;
            }
        };
        match parse(&file, &text, options) {
            Ok((domain, line)) => {
                if let Some((first, first_line)) = seen.get(&domain.name) {
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
    if errors.is_empty() {
        Ok(set)
    } else {
        Err(RuleErrors(errors))
    }
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
    if let Some((line, path)) = too_deep(text) {
        w.error(
            Some(line),
            &path,
            format!("nested deeper than {MAX_DEPTH} levels"),
        );
        return Err(RuleErrors(w.errors));
    }
    let options = LoaderOptions::default()
        .error_on_duplicate_keys(true)
        // Keeps `may_coerce()` true only for plain scalars, so a quoted
        // "null" is a string and a plain `null` is absent.
        .prevent_coercion(true);
    let root = match marked_yaml::parse_yaml_with_options(0, text, options) {
        Ok(root) => root,
        Err(e) => {
            let (line, reason) = load_error(&e);
            w.error(Some(line), "", reason);
            return Err(RuleErrors(w.errors));
        }
    };
    let Some(map) = root.as_mapping() else {
        // parse_yaml refuses any other top level already.
        w.error(line_of(&root), "", "a rule file must be a mapping");
        return Err(RuleErrors(w.errors));
    };
    if map.is_empty() {
        w.error(
            None,
            "",
            "empty rule file (expected `domain` and `descriptors`)",
        );
        return Err(RuleErrors(w.errors));
    }
    let (domain, domain_line, mut root_level) = w.root(map);
    super::name_rules("", &mut root_level);
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

/// The line and YAML path of the first mapping or list nested deeper than
/// [`MAX_DEPTH`], if any. This reads the event stream of the parser that
/// marked-yaml builds on, which keeps its state on the heap and builds
/// nothing, so it is safe at any depth and sees the nesting exactly as the
/// real parse will, whatever the style (block, compact `- - -`, flow
/// `[[` / `{{`, or mixed). It stops at the first collection too deep. On a
/// YAML error it gives up: the real parse stops at the same error, after no
/// deeper nesting than was read here.
fn too_deep(text: &str) -> Option<(usize, String)> {
    use yaml_rust2::Event;
    use yaml_rust2::parser::Parser;

    /// An open collection and where in it the parser is.
    enum Open {
        /// `key` is the last key read; `in_value` while its value is read.
        Mapping { key: String, in_value: bool },
        /// The index of the item being read.
        List { index: usize },
    }

    /// A node ended inside the innermost collection: a mapping moves from
    /// key to value or back, a list to its next item.
    fn node_done(open: &mut [Open], scalar: Option<String>) {
        match open.last_mut() {
            Some(Open::Mapping { key, in_value }) => {
                if !*in_value {
                    // A key that is not a scalar is refused by the real parse.
                    *key = scalar.unwrap_or_else(|| "?".into());
                }
                *in_value = !*in_value;
            }
            Some(Open::List { index }) => *index += 1,
            None => {}
        }
    }

    /// The YAML path of the node being read.
    fn path_of(open: &[Open]) -> String {
        let mut path = String::new();
        for o in open {
            match o {
                Open::Mapping {
                    key,
                    in_value: true,
                } => path = join(&path, key),
                Open::Mapping { .. } => {}
                Open::List { index } => path = format!("{path}[{index}]"),
            }
        }
        path
    }

    let mut open: Vec<Open> = Vec::new();
    let mut parser = Parser::new(text.chars());
    loop {
        let (event, mark) = match parser.next_token() {
            Ok(next) => next,
            // The scanner reads a flow collection's brackets ahead of their
            // events, and stops past 255 of them with this error: far too
            // deep, but only its own position is known, and the path of
            // the collection that holds them.
            Err(e) if e.info() == "recursion limit exceeded" => {
                return Some((e.marker().line(), path_of(&open)));
            }
            Err(_) => return None,
        };
        match event {
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                if open.len() >= MAX_DEPTH {
                    return Some((mark.line(), path_of(&open)));
                }
                open.push(match event {
                    Event::MappingStart(..) => Open::Mapping {
                        key: String::new(),
                        in_value: false,
                    },
                    _ => Open::List { index: 0 },
                });
            }
            Event::MappingEnd | Event::SequenceEnd => {
                open.pop();
                node_done(&mut open, None);
            }
            Event::Scalar(value, ..) => node_done(&mut open, Some(value)),
            Event::Alias(_) => node_done(&mut open, None),
            // marked-yaml reads the first document only.
            Event::DocumentEnd | Event::StreamEnd => return None,
            Event::StreamStart | Event::DocumentStart | Event::Nothing => {}
        }
    }
}

fn load_error(e: &LoadError) -> (usize, String) {
    match e {
        LoadError::TopLevelMustBeMapping(m) | LoadError::TopLevelMustBeSequence(m) => (
            m.line(),
            "a rule file must be a mapping with `domain` and `descriptors`".into(),
        ),
        LoadError::UnexpectedAnchor(m) => (
            m.line(),
            "YAML anchors and aliases are not supported".into(),
        ),
        LoadError::MappingKeyMustBeScalar(m) => (m.line(), "mapping keys must be strings".into()),
        LoadError::UnexpectedTag(m) => (m.line(), "YAML tags are not supported".into()),
        LoadError::ScanError(m, e) => (m.line(), format!("invalid YAML: {}", e.info())),
        LoadError::DuplicateKey(inner) => {
            let first = inner.prev_key.span().start().map_or(0, |m| m.line());
            let line = inner.key.span().start().map_or(first, |m| m.line());
            (
                line,
                format!(
                    "duplicate key {:?} (first on line {first})",
                    inner.key.as_str()
                ),
            )
        }
    }
}

fn line_of(node: &Yaml) -> Option<usize> {
    node.span().start().map(|m| m.line())
}

fn key_line(key: &MarkedScalarNode) -> Option<usize> {
    key.span().start().map(|m| m.line())
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn kind(node: &Yaml) -> &'static str {
    match node {
        Yaml::Scalar(_) => "a scalar",
        Yaml::Mapping(_) => "a mapping",
        Yaml::Sequence(_) => "a list",
    }
}

/// A plain `null`, `~` or empty scalar: the key is treated as absent.
fn is_null(node: &Yaml) -> bool {
    matches!(node, Yaml::Scalar(s) if s.may_coerce()
        && matches!(s.as_str(), "" | "~" | "null" | "Null" | "NULL"))
}

/// A mapping's entries by name, with unknown keys already reported. Null
/// values are dropped, so `unit: ~` reads as no `unit`.
struct Fields<'y> {
    entries: Vec<(&'y str, &'y MarkedScalarNode, &'y Yaml)>,
}

impl<'y> Fields<'y> {
    fn get(&self, name: &str) -> Option<(&'y MarkedScalarNode, &'y Yaml)> {
        self.entries
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, k, v)| (*k, *v))
    }
}

struct Walker<'f> {
    file: &'f Path,
    options: &'f LoadOptions,
    /// `file_name` for `Rule::source`.
    short: String,
    errors: Vec<RuleError>,
}

impl<'f> Walker<'f> {
    fn new(file: &'f Path, options: &'f LoadOptions) -> Self {
        let short = file.file_name().map_or_else(
            || file.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Walker {
            file,
            options,
            short,
            errors: Vec::new(),
        }
    }

    fn error(&mut self, line: Option<usize>, path: &str, reason: impl Into<String>) {
        self.errors.push(RuleError {
            file: self.file.to_path_buf(),
            line,
            path: path.to_string(),
            reason: reason.into(),
        });
    }

    fn fields<'y>(
        &mut self,
        map: &'y MarkedMappingNode,
        path: &str,
        allowed: &[&str],
    ) -> Fields<'y> {
        let mut entries = Vec::new();
        for (key, value) in map.iter() {
            let name = key.as_str();
            if !allowed.contains(&name) {
                self.error(
                    key_line(key),
                    &join(path, name),
                    format!("unknown key {name:?} (allowed: {})", allowed.join(", ")),
                );
            } else if !is_null(value) {
                entries.push((name, key, value));
            }
        }
        Fields { entries }
    }

    /// The domain name, the line of its value, and the root level.
    fn root(&mut self, map: &MarkedMappingNode) -> (Option<String>, usize, Level) {
        let fields = self.fields(map, "", ROOT_KEYS);
        let top_line = map.span().start().map_or(1, |m| m.line());
        let (domain, domain_line) = match fields.get("domain") {
            None => {
                self.error(Some(top_line), "domain", "missing domain");
                (None, top_line)
            }
            Some((_, value)) => {
                let line = line_of(value).unwrap_or(top_line);
                match self.string(value, "domain") {
                    Some(name) if name.is_empty() => {
                        self.error(Some(line), "domain", "empty domain");
                        (None, line)
                    }
                    name => (name, line),
                }
            }
        };
        let level = match fields.get("descriptors") {
            Some((_, value)) => self.level(value, "descriptors"),
            None => Level::default(),
        };
        (domain, domain_line, level)
    }

    /// One level of descriptors (a YAML list).
    fn level(&mut self, list: &Yaml, path: &str) -> Level {
        let mut level = Level::default();
        let Some(items) = list.as_sequence() else {
            self.error(
                line_of(list),
                path,
                format!("expected a list of descriptors, found {}", kind(list)),
            );
            return level;
        };
        // (key, value) -> line of the first node, for duplicate errors.
        let mut seen: HashMap<(String, String), usize> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            let Some(node) = self.descriptor(item, &item_path) else {
                continue;
            };
            let line = line_of(item).unwrap_or(0);
            let id = (node.key.clone(), node.value.clone());
            if let Some(first) = seen.get(&id) {
                let what = if node.value.is_empty() {
                    format!("key {:?} without value", node.key)
                } else {
                    format!("key {:?} with value {:?}", node.key, node.value)
                };
                self.error(
                    Some(line),
                    &item_path,
                    format!("duplicate descriptor: {what} already defined on line {first}"),
                );
                continue;
            }
            seen.insert(id.clone(), line);
            if node.value.is_empty() {
                level.default.insert(node.key.clone(), node);
            } else if node.value.contains('*') {
                level.wildcard.push(node);
            } else {
                level.exact.insert(id, node);
            }
        }
        level
    }

    /// One descriptor node; `None` when it has an error (its children are
    /// still checked, for their errors).
    fn descriptor(&mut self, item: &Yaml, path: &str) -> Option<Node> {
        let Some(map) = item.as_mapping() else {
            self.error(
                line_of(item),
                path,
                format!("expected a descriptor mapping, found {}", kind(item)),
            );
            return None;
        };
        let errors_before = self.errors.len();
        let line = map.span().start().map_or(0, |m| m.line());
        let fields = self.fields(map, path, DESCRIPTOR_KEYS);

        let key = match fields.get("key") {
            None => {
                self.error(Some(line), &join(path, "key"), "missing key");
                None
            }
            Some((_, value)) => match self.string(value, &join(path, "key")) {
                Some(k) if k.is_empty() => {
                    self.error(line_of(value), &join(path, "key"), "empty key");
                    None
                }
                k => k,
            },
        };
        let value = match fields.get("value") {
            Some((_, v)) => self.string(v, &join(path, "value")),
            None => Some(String::new()),
        };
        let shadow_mode = self.flag(&fields, path, "shadow_mode").unwrap_or(false);
        let quota_mode = self.flag(&fields, path, "quota_mode").unwrap_or(false);
        let detailed_metric = self.flag(&fields, path, "detailed_metric").unwrap_or(false);
        let rule = fields.get("rate_limit").and_then(|(k, v)| {
            let limit = self.rate_limit(k, v, &join(path, "rate_limit"))?;
            Some(Rule {
                limit: limit.limit,
                name: limit.name,
                replaces: limit.replaces,
                algorithm: limit.algorithm,
                buckets: limit.buckets,
                shards: limit.shards,
                on_store_error: limit.on_store_error,
                usage_reports: limit.usage_reports,
                shadow_mode,
                quota_mode,
                detailed_metric,
                source: format!("{}:{line}", self.short),
                path: String::new(),
                stats: Default::default(),
            })
        });
        let children = match fields.get("descriptors") {
            Some((_, list)) => self.level(list, &join(path, "descriptors")),
            None => Level::default(),
        };
        if self.errors.len() > errors_before {
            return None;
        }
        Some(Node {
            key: key?,
            value: value?,
            rule,
            children,
        })
    }

    fn rate_limit(&mut self, key: &MarkedScalarNode, node: &Yaml, path: &str) -> Option<RateLimit> {
        let Some(map) = node.as_mapping() else {
            self.error(
                line_of(node),
                path,
                format!("expected a rate_limit mapping, found {}", kind(node)),
            );
            return None;
        };
        let errors_before = self.errors.len();
        let owner_line = key_line(key);
        let fields = self.fields(map, path, RATE_LIMIT_KEYS);

        let unlimited = self.flag(&fields, path, "unlimited").unwrap_or(false);
        let unit = fields.get("unit");
        let rpu = fields.get("requests_per_unit");
        let limit = if unlimited {
            for (name, field) in [("unit", unit), ("requests_per_unit", rpu)] {
                if let Some((k, _)) = field {
                    self.error(
                        key_line(k),
                        &join(path, name),
                        format!("{name} must not be set together with unlimited: true"),
                    );
                }
            }
            Some(LimitSpec::Unlimited)
        } else {
            let unit = match unit {
                None => {
                    self.error(
                        owner_line,
                        &join(path, "unit"),
                        "missing unit (required unless unlimited: true)",
                    );
                    None
                }
                Some((_, v)) => self.parsed::<Unit>(v, &join(path, "unit")),
            };
            let requests_per_unit = match rpu {
                None => {
                    self.error(
                        owner_line,
                        &join(path, "requests_per_unit"),
                        "missing requests_per_unit (required unless unlimited: true)",
                    );
                    None
                }
                Some((_, v)) => self.number(v, &join(path, "requests_per_unit")),
            };
            match (unit, requests_per_unit) {
                (Some(unit), Some(requests_per_unit)) => Some(LimitSpec::PerUnit {
                    requests_per_unit,
                    unit,
                }),
                _ => None,
            }
        };

        let name = match fields.get("name") {
            Some((_, v)) => self
                .string(v, &join(path, "name"))
                .filter(|n| !n.is_empty()),
            None => None,
        };
        let replaces = match fields.get("replaces") {
            Some((_, v)) => self.replaces(v, &join(path, "replaces"), name.as_deref()),
            None => Vec::new(),
        };
        let algorithm = fields
            .get("algorithm")
            .and_then(|(_, v)| self.parsed::<Algorithm>(v, &join(path, "algorithm")));
        let on_store_error = fields
            .get("on_store_error")
            .and_then(|(_, v)| self.parsed::<FailurePolicy>(v, &join(path, "on_store_error")));
        if let (
            Some(LimitSpec::PerUnit {
                requests_per_unit, ..
            }),
            Some((_, rpu_node)),
        ) = (&limit, rpu)
        {
            self.log_limit(*requests_per_unit, algorithm, rpu_node, path);
        }
        let buckets = fields
            .get("buckets")
            .and_then(|(k, v)| self.buckets(k, v, algorithm, path));
        let shards = fields
            .get("shards")
            .and_then(|(_, v)| self.shards(v, limit.as_ref(), path));
        let usage_reports = match fields.get("usage_reports") {
            Some(_) => self.flag(&fields, path, "usage_reports"),
            None => None,
        };

        if self.errors.len() > errors_before {
            return None;
        }
        Some(RateLimit {
            limit: limit?,
            name,
            replaces,
            algorithm,
            buckets,
            shards,
            on_store_error,
            usage_reports,
        })
    }

    /// `shards`: a whole number in 1..=64, no more than a positive
    /// `requests_per_unit` (every shard needs a share of at least 1).
    fn shards(&mut self, node: &Yaml, limit: Option<&LimitSpec>, path: &str) -> Option<u16> {
        let path = join(path, "shards");
        let n = self.number(node, &path)?;
        let shards = match u16::try_from(n) {
            Ok(s) if (1..=MAX_SHARDS).contains(&s) => s,
            _ => {
                self.error(
                    line_of(node),
                    &path,
                    format!("shards must be from 1 to {MAX_SHARDS}, found {n}"),
                );
                return None;
            }
        };
        if let Some(LimitSpec::PerUnit {
            requests_per_unit, ..
        }) = limit
            && *requests_per_unit > 0
            && *requests_per_unit < u32::from(shards)
        {
            self.error(
                line_of(node),
                &path,
                format!(
                    "shards ({shards}) must not exceed requests_per_unit ({requests_per_unit}): \
                     every shard needs a share of at least 1"
                ),
            );
            return None;
        }
        Some(shards)
    }

    /// `buckets`: a whole number in 2..=60, on a counter only (named by the
    /// rule or inherited from `default_algorithm`).
    fn buckets(
        &mut self,
        key: &MarkedScalarNode,
        node: &Yaml,
        algorithm: Option<Algorithm>,
        path: &str,
    ) -> Option<u8> {
        let path = join(path, "buckets");
        let n = self.number(node, &path)?;
        let effective = algorithm.unwrap_or(self.options.default_algorithm);
        if effective != Algorithm::SlidingWindowCounter {
            let inherited = if algorithm.is_none() {
                " (the default_algorithm, as the rule names none)"
            } else {
                ""
            };
            self.error(
                key_line(key),
                &path,
                format!(
                    "buckets applies only to sliding_window_counter, not {effective}{inherited}"
                ),
            );
            return None;
        }
        match u8::try_from(n) {
            Ok(b) if (DEFAULT_BUCKETS..=MAX_BUCKETS).contains(&b) => Some(b),
            _ => {
                self.error(
                    line_of(node),
                    &path,
                    format!("buckets must be from {DEFAULT_BUCKETS} to {MAX_BUCKETS}, found {n}"),
                );
                None
            }
        }
    }

    /// Refuses a log limit above `max_log_limit`, whether the rule names the
    /// log or inherits it from `default_algorithm`.
    fn log_limit(&mut self, limit: u32, algorithm: Option<Algorithm>, node: &Yaml, path: &str) {
        let max = self.options.max_log_limit;
        let effective = algorithm.unwrap_or(self.options.default_algorithm);
        if effective != Algorithm::SlidingWindowLog || limit <= max {
            return;
        }
        let inherited = if algorithm.is_none() {
            " (the default_algorithm, as the rule names none)"
        } else {
            ""
        };
        self.error(
            line_of(node),
            &join(path, "requests_per_unit"),
            format!(
                "sliding_window_log limit {limit}{inherited} is above max_log_limit {max} \
                 (a log keeps every admitted hit); use algorithm: sliding_window_counter, \
                 or raise max_log_limit"
            ),
        );
    }

    fn replaces(&mut self, node: &Yaml, path: &str, own: Option<&str>) -> Vec<String> {
        let Some(items) = node.as_sequence() else {
            self.error(
                line_of(node),
                path,
                format!("expected a list of {{name: ...}}, found {}", kind(node)),
            );
            return Vec::new();
        };
        let mut names = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            let Some(map) = item.as_mapping() else {
                self.error(
                    line_of(item),
                    &item_path,
                    format!("expected a mapping {{name: ...}}, found {}", kind(item)),
                );
                continue;
            };
            let fields = self.fields(map, &item_path, REPLACES_KEYS);
            let name_path = join(&item_path, "name");
            let name = match fields.get("name") {
                Some((_, v)) => self.string(v, &name_path).map(|n| (n, line_of(v))),
                None => Some((String::new(), line_of(item))),
            };
            match name {
                Some((n, line)) if n.is_empty() => {
                    self.error(line, &name_path, "empty replaces name");
                }
                Some((n, line)) if Some(n.as_str()) == own => {
                    self.error(
                        line,
                        &name_path,
                        format!("a rate limit cannot replace itself ({n:?} is its own name)"),
                    );
                }
                Some((n, _)) => names.push(n),
                None => {}
            }
        }
        names
    }

    fn string(&mut self, node: &Yaml, path: &str) -> Option<String> {
        match node {
            Yaml::Scalar(s) => Some(s.as_str().to_string()),
            other => {
                self.error(
                    line_of(other),
                    path,
                    format!("expected a string, found {}", kind(other)),
                );
                None
            }
        }
    }

    /// An optional boolean descriptor flag: `None` only on error.
    fn flag(&mut self, fields: &Fields<'_>, path: &str, name: &str) -> Option<bool> {
        let Some((_, node)) = fields.get(name) else {
            return Some(false);
        };
        let path = join(path, name);
        let text = self.string(node, &path)?;
        // The YAML 1.1 spellings that the reference's yaml.v2 accepts.
        match text.as_str() {
            "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
            "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
            _ => {
                self.error(
                    line_of(node),
                    &path,
                    format!("expected true or false, found {text:?}"),
                );
                None
            }
        }
    }

    fn number(&mut self, node: &Yaml, path: &str) -> Option<u32> {
        let text = self.string(node, path)?;
        match parse_u32(&text) {
            Ok(n) => Some(n),
            Err(reason) => {
                self.error(line_of(node), path, reason);
                None
            }
        }
    }

    fn parsed<T: std::str::FromStr<Err = String>>(&mut self, node: &Yaml, path: &str) -> Option<T> {
        let text = self.string(node, path)?;
        match text.parse::<T>() {
            Ok(v) => Some(v),
            Err(reason) => {
                self.error(line_of(node), path, reason);
                None
            }
        }
    }
}

/// A `rate_limit` block before the descriptor's flags are added.
struct RateLimit {
    limit: LimitSpec,
    name: Option<String>,
    replaces: Vec<String>,
    algorithm: Option<Algorithm>,
    buckets: Option<u8>,
    shards: Option<u16>,
    on_store_error: Option<FailurePolicy>,
    usage_reports: Option<bool>,
}

/// A whole number from 0 to `u32::MAX`; `_` may separate digits, as in YAML.
fn parse_u32(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let digits: String = digits.chars().filter(|&c| c != '_').collect();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected a whole number, found {text:?}"));
    }
    if negative && digits.bytes().any(|b| b != b'0') {
        return Err(format!("must not be negative, found {text}"));
    }
    digits
        .parse::<u32>()
        .map_err(|_| format!("too large, found {text} (at most {})", u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_u32("0"), Ok(0));
        assert_eq!(parse_u32("1_000"), Ok(1000));
        assert_eq!(parse_u32("+7"), Ok(7));
        assert_eq!(parse_u32("-0"), Ok(0));
        assert_eq!(parse_u32("4294967295"), Ok(u32::MAX));
        assert!(parse_u32("4294967296").unwrap_err().contains("too large"));
        assert!(
            parse_u32("99999999999999999999999")
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_u32("-1").unwrap_err().contains("negative"));
        assert!(parse_u32("lots").unwrap_err().contains("whole number"));
        assert!(parse_u32("1.5").unwrap_err().contains("whole number"));
        assert!(parse_u32("").unwrap_err().contains("whole number"));
    }

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
                .contains_key(&("k".to_string(), "null".to_string()))
        );
    }
}
