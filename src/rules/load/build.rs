//! Building rules from the walk: the keys each mapping may have, the
//! descriptor tree with its duplicates refused, and each `rate_limit`
//! checked against itself and the settings (`LoadOptions`).

use std::collections::HashMap;
use std::sync::Arc;

use super::tree::{MarkedMappingNode, MarkedScalarNode, Yaml};
use super::yaml::{Fields, Walker, join, key_line, kind, line_of};
use crate::limit::{Algorithm, DEFAULT_BUCKETS, FailurePolicy, MAX_BUCKETS, MAX_SHARDS};
use crate::rules::{Level, LimitSpec, Node, Rule, Source};

pub(super) const ROOT_KEYS: &[&str] = &["domain", "descriptors"];
pub(super) const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];
pub(super) const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unit_multiplier",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "buckets",
    "burst",
    "shards",
    "on_store_error",
    "usage_reports",
    "count_refused",
    "timezone",
    "lease",
    "max_duration",
];

impl Walker<'_> {
    /// The domain name, the line of its value, and the root level.
    pub(super) fn root(&mut self, map: &MarkedMappingNode) -> (Option<String>, usize, Level) {
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
        // Wildcards by (key, value) -> line, for duplicate errors (the
        // other two kinds are found in their maps).
        let mut wildcards: HashMap<(Arc<str>, Arc<str>), u32> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            let Some(node) = self.descriptor(item, &item_path) else {
                continue;
            };
            let line = line_of(item).unwrap_or(0);
            let id = (node.key.clone(), node.value.clone());
            let first = if node.value.is_empty() {
                level.default.get(&node.key).map(|n| n.line)
            } else if node.value.contains('*') {
                wildcards.get(&id).copied()
            } else {
                level.exact.get(&id).map(|n| n.line)
            };
            if let Some(first) = first {
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
            if node.value.is_empty() {
                level.default.insert(node.key.clone(), node);
            } else if node.value.contains('*') {
                wildcards.insert(id, node.line);
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

        let key = self.descriptor_key(&fields, path, line);
        let value = match fields.get("value") {
            Some((_, v)) => self.string(v, &join(path, "value")),
            None => Some(String::new()),
        };
        let shadow_mode = self.flag(&fields, path, "shadow_mode").unwrap_or(false);
        let quota_mode = self.flag(&fields, path, "quota_mode").unwrap_or(false);
        let detailed_metric = self.flag(&fields, path, "detailed_metric").unwrap_or(false);
        let value_to_metric = self.flag(&fields, path, "value_to_metric").unwrap_or(false);
        let share_threshold = self.flag(&fields, path, "share_threshold").unwrap_or(false);
        self.check_share_threshold(&fields, path, share_threshold, value.as_deref());
        let metadata = fields
            .get("metadata")
            .and_then(|(_, v)| self.metadata(v, &join(path, "metadata")));
        let flags = Flags {
            shadow_mode,
            quota_mode,
            detailed_metric,
            metadata,
            line,
        };
        let rule = self.descriptor_rule(&fields, path, &flags, line);
        let children = match fields.get("descriptors") {
            Some((_, list)) => self.level(list, &join(path, "descriptors")),
            None => Level::default(),
        };
        if self.errors.len() > errors_before {
            return None;
        }
        Some(Node {
            key: self.intern(key?),
            value: value?.into(),
            rule: rule.map(Box::new),
            children,
            share_threshold,
            value_to_metric,
            line: u32::try_from(line).unwrap_or(u32::MAX),
        })
    }

    /// A descriptor's `key`: required and not empty.
    fn descriptor_key(&mut self, fields: &Fields<'_>, path: &str, line: usize) -> Option<String> {
        match fields.get("key") {
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
        }
    }

    /// Refuses `share_threshold` on a descriptor whose value has no `*`.
    fn check_share_threshold(
        &mut self,
        fields: &Fields<'_>,
        path: &str,
        share_threshold: bool,
        value: Option<&str>,
    ) {
        if share_threshold
            && let Some(v) = value
            && !v.contains('*')
        {
            let at = fields.get("share_threshold").and_then(|(k, _)| key_line(k));
            self.error(
                at,
                &join(path, "share_threshold"),
                format!(
                    "share_threshold applies only to a wildcard value (one with `*`, such as \"files/*\"), not {}",
                    if v.is_empty() {
                        "a descriptor without a value".to_string()
                    } else {
                        format!("{v:?}")
                    }
                ),
            );
        }
    }

    /// A descriptor's rule: its `rate_limit` or its `rate_limits` list,
    /// not both; `line` is where the descriptor was written.
    fn descriptor_rule(
        &mut self,
        fields: &Fields<'_>,
        path: &str,
        flags: &Flags,
        line: usize,
    ) -> Option<Rule> {
        match (fields.get("rate_limit"), fields.get("rate_limits")) {
            (Some(_), Some((k, _))) => {
                self.error(
                    key_line(k),
                    &join(path, "rate_limits"),
                    "rate_limit and rate_limits together: give one limit as rate_limit, \
                     or every limit in the rate_limits list",
                );
                None
            }
            (Some((k, v)), None) => self
                .rate_limit(key_line(k), v, &join(path, "rate_limit"))
                .map(|limit| self.rule(limit, flags, line)),
            (None, Some((k, v))) => self.rate_limits(k, v, &join(path, "rate_limits"), flags),
            (None, None) => None,
        }
    }

    /// A rule from a checked `rate_limit` block and its descriptor's flags;
    /// `line` is where it was written.
    pub(super) fn rule(&self, limit: RateLimit, flags: &Flags, line: usize) -> Rule {
        Rule {
            limit: limit.limit,
            name: limit.name,
            replaces: limit.replaces,
            algorithm: limit.algorithm,
            buckets: limit.buckets,
            burst: limit.burst,
            max_duration: limit.max_duration,
            shards: limit.shards,
            on_store_error: limit.on_store_error,
            usage_reports: limit.usage_reports,
            count_refused: limit.count_refused,
            lease: limit.lease,
            shadow_mode: flags.shadow_mode,
            quota_mode: flags.quota_mode,
            detailed_metric: flags.detailed_metric,
            value_to_metric: false,
            share_threshold: false,
            metadata: flags.metadata.clone(),
            source: Source {
                file: self.short.clone(),
                line: u32::try_from(line).unwrap_or(u32::MAX),
            },
            path: String::new(),
            stats: Default::default(),
            more: Vec::new(),
        }
    }

    /// A `rate_limit` block (or one limit of a `rate_limits` list);
    /// `owner_line` is where a missing key is reported. Its keys are read
    /// in a fixed order, so its errors come in that order; `None` when any
    /// is refused.
    pub(super) fn rate_limit(
        &mut self,
        owner_line: Option<usize>,
        node: &Yaml,
        path: &str,
    ) -> Option<RateLimit> {
        let Some(map) = node.as_mapping() else {
            self.error(
                line_of(node),
                path,
                format!("expected a rate_limit mapping, found {}", kind(node)),
            );
            return None;
        };
        let errors_before = self.errors.len();
        let fields = self.fields(map, path, RATE_LIMIT_KEYS);
        let limit = self.limit_spec(&fields, owner_line, path);
        let (name, replaces) = self.naming(&fields, path);
        let (limit, algorithm) = self.algorithm_and_zone(&fields, limit, path);
        let on_store_error = fields
            .get("on_store_error")
            .and_then(|(_, v)| self.parsed::<FailurePolicy>(v, &join(path, "on_store_error")));
        self.log_limit_of(&fields, limit.as_ref(), algorithm, path);
        let rpu = fields.get("requests_per_unit");
        let buckets = fields
            .get("buckets")
            .and_then(|(k, v)| self.buckets(k, v, algorithm, path));
        let rpu_line = rpu.and_then(|(_, v)| line_of(v)).or(owner_line);
        let burst = self.burst(
            fields.get("burst"),
            algorithm,
            limit.as_ref(),
            rpu_line,
            path,
        );
        let max_duration = self.max_duration(&fields, algorithm, limit.as_ref(), owner_line, path);
        let shards = fields
            .get("shards")
            .and_then(|(_, v)| self.shards(v, limit.as_ref(), burst, path));
        let usage_reports = match fields.get("usage_reports") {
            Some(_) => self.flag(&fields, path, "usage_reports"),
            None => None,
        };
        let count_refused = self.count_refused(&fields, usage_reports, path);
        let window = match &limit {
            Some(LimitSpec::PerUnit { window, .. }) => Some(*window),
            _ => None,
        };
        let leasable = super::lease::Leasable {
            algorithm,
            window,
            shards,
            usage_reports,
            count_refused,
            in_list: false,
        };
        let lease = self.lease(&fields, leasable, path);

        if self.errors.len() > errors_before {
            return None;
        }
        Some(RateLimit {
            limit: limit?,
            name,
            replaces,
            algorithm,
            buckets,
            burst,
            max_duration,
            shards,
            on_store_error,
            usage_reports,
            count_refused: count_refused?,
            lease,
        })
    }

    /// Checks a block's `requests_per_unit` against `max_log_limit` (see
    /// `log_limit`), when it has one.
    fn log_limit_of(
        &mut self,
        fields: &Fields<'_>,
        limit: Option<&LimitSpec>,
        algorithm: Option<Algorithm>,
        path: &str,
    ) {
        if let (
            Some(LimitSpec::PerUnit {
                requests_per_unit, ..
            }),
            Some((_, rpu_node)),
        ) = (limit, fields.get("requests_per_unit"))
        {
            self.log_limit(*requests_per_unit, algorithm, rpu_node, path);
        }
    }

    /// A block's `name` (an empty one is none) and the names it
    /// `replaces`.
    fn naming(&mut self, fields: &Fields<'_>, path: &str) -> (Option<String>, Vec<String>) {
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
        (name, replaces)
    }

    /// A block's `algorithm`, and its limit and algorithm once its
    /// `timezone` is read (a calendar window; see `timezone`).
    fn algorithm_and_zone(
        &mut self,
        fields: &Fields<'_>,
        limit: Option<LimitSpec>,
        path: &str,
    ) -> (Option<LimitSpec>, Option<Algorithm>) {
        let algorithm = fields
            .get("algorithm")
            .and_then(|(_, v)| self.parsed::<Algorithm>(v, &join(path, "algorithm")));
        self.timezone(
            fields.get("timezone"),
            limit,
            algorithm,
            fields.get("unit_multiplier").is_some(),
            path,
        )
    }

    /// `shards`: a whole number in 1..=64, no more than a positive
    /// `requests_per_unit` (every shard needs a share of at least 1), nor
    /// than a token bucket's `burst` (each shard's bucket holds a share of
    /// it, at least 1: more shards would admit more at once than `burst`).
    fn shards(
        &mut self,
        node: &Yaml,
        limit: Option<&LimitSpec>,
        burst: Option<u64>,
        path: &str,
    ) -> Option<u16> {
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
        if let Some(burst) = burst
            && burst < u64::from(shards)
        {
            self.error(
                line_of(node),
                &path,
                format!(
                    "shards ({shards}) must not exceed burst ({burst}): every shard's bucket \
                     holds a share of the burst, at least 1"
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
        if let Some(reason) = self.not_its_own("buckets", algorithm) {
            self.error(key_line(key), &path, reason);
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

    /// Why `key` has no place on a limit of `algorithm` (the rule's, or
    /// the `default_algorithm` when it names none): the key belongs to
    /// other algorithms ([`Spec::own_keys`](crate::limit::algorithms::Spec)).
    pub(super) fn not_its_own(&self, key: &str, algorithm: Option<Algorithm>) -> Option<String> {
        let effective = algorithm.unwrap_or(self.options.default_algorithm);
        if effective.spec().own_keys.contains(&key) {
            return None;
        }
        let inherited = if algorithm.is_none() {
            " (the default_algorithm, as the rule names none)"
        } else {
            ""
        };
        let owners: Vec<&str> = Algorithm::owning(key).map(Algorithm::as_str).collect();
        Some(format!(
            "{key} applies only to {}, not {effective}{inherited}",
            owners.join(" and ")
        ))
    }

    /// Refuses a log limit above `max_log_limit`, whether the rule names the
    /// log or inherits it from `default_algorithm`.
    fn log_limit(&mut self, limit: u32, algorithm: Option<Algorithm>, node: &Yaml, path: &str) {
        let max = self.options.max_log_limit;
        let effective = algorithm.unwrap_or(self.options.default_algorithm);
        let Some((why, instead)) = effective.spec().entry_per_hit else {
            return;
        };
        if limit <= max {
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
                "{effective} limit {limit}{inherited} is above max_log_limit {max} \
                 ({why}); {instead}"
            ),
        );
    }
}

/// What a descriptor gives each of its limits.
pub(super) struct Flags {
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
    metadata: Option<Arc<serde_json::Map<String, serde_json::Value>>>,
    /// The descriptor's line.
    pub(super) line: usize,
}

/// A `rate_limit` block before the descriptor's flags are added.
pub(super) struct RateLimit {
    pub(super) limit: LimitSpec,
    pub(super) name: Option<String>,
    pub(super) replaces: Vec<String>,
    pub(super) algorithm: Option<Algorithm>,
    pub(super) buckets: Option<u8>,
    pub(super) burst: Option<u64>,
    pub(super) max_duration: Option<u64>,
    pub(super) shards: Option<u16>,
    pub(super) on_store_error: Option<FailurePolicy>,
    pub(super) usage_reports: Option<bool>,
    pub(super) count_refused: bool,
    pub(super) lease: Option<bool>,
}
