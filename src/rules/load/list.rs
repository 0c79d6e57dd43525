//! `rate_limits:`, several limits on one descriptor ("10 per second and
//! 10,000 per day for each API key"). Each item is checked as a
//! `rate_limit` block is; the list then holds what one limit alone cannot
//! say: no `unlimited` in it, no two limits counting the same window with
//! the same algorithm, and the keys that say how the descriptor is decided
//! as a whole (`shards`, `on_store_error`, `usage_reports`,
//! `count_refused`) the same on every limit, since the limits are decided
//! together in one store call, in one slot.

use super::build::{Flags, RateLimit};
use super::tree::{MarkedScalarNode, Yaml};
use super::yaml::{Walker, join, key_line, kind, line_of};
use crate::rules::{LimitSpec, Rule};

impl Walker<'_> {
    /// The descriptor's rule: the list's first limit, holding the others
    /// in [`Rule::more`]; `None` on any error.
    pub(super) fn rate_limits(
        &mut self,
        key: &MarkedScalarNode,
        node: &Yaml,
        path: &str,
        flags: &Flags,
    ) -> Option<Rule> {
        let Some(items) = node.as_sequence() else {
            self.error(
                line_of(node),
                path,
                format!("expected a list of rate limits, found {}", kind(node)),
            );
            return None;
        };
        let items: Vec<&Yaml> = items.iter().collect();
        if items.is_empty() {
            self.error(
                key_line(key),
                path,
                "an empty rate_limits list: give at least one limit",
            );
            return None;
        }
        let errors_before = self.errors.len();
        let mut limits: Vec<(RateLimit, usize, String)> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            let line = line_of(item).unwrap_or(flags.line);
            if let Some(map) = item.as_mapping()
                && let Some((k, _)) = map.iter().find(|(k, _)| k.as_str() == "unlimited")
            {
                self.error(
                    key_line(k),
                    &join(&item_path, "unlimited"),
                    "unlimited has no place in a rate_limits list: a descriptor is either \
                     unlimited (rate_limit: {unlimited: true}) or held to every limit of its list",
                );
                continue;
            }
            if let Some(limit) = self.rate_limit(Some(line), item, &item_path) {
                if limit.lease == Some(true) {
                    self.error(
                        Some(line),
                        &join(&item_path, "lease"),
                        "lease: true has no place in a rate_limits list: a list is decided \
                         in one store call",
                    );
                    continue;
                }
                limits.push((limit, line, item_path));
            }
        }
        if self.errors.len() > errors_before {
            return None;
        }
        self.same_across(&limits);
        self.distinct_windows(&limits);
        if self.errors.len() > errors_before {
            return None;
        }
        let mut rules = limits
            .into_iter()
            .map(|(limit, line, _)| self.rule(limit, flags, line));
        let mut first = rules.next()?;
        first.more = rules.collect();
        Some(first)
    }

    /// The keys that apply to the list as a whole, the same on every
    /// limit as on the first.
    fn same_across(&mut self, limits: &[(RateLimit, usize, String)]) {
        let Some(((first, ..), rest)) = limits.split_first() else {
            return;
        };
        let show = |v: Option<String>| v.unwrap_or_else(|| "not set".to_string());
        for (limit, line, path) in rest {
            let differing = [
                (
                    "shards",
                    first.shards != limit.shards,
                    show(limit.shards.map(|s| s.to_string())),
                    show(first.shards.map(|s| s.to_string())),
                ),
                (
                    "on_store_error",
                    first.on_store_error != limit.on_store_error,
                    show(limit.on_store_error.map(|p| p.to_string())),
                    show(first.on_store_error.map(|p| p.to_string())),
                ),
                (
                    "usage_reports",
                    first.usage_reports != limit.usage_reports,
                    show(limit.usage_reports.map(|b| b.to_string())),
                    show(first.usage_reports.map(|b| b.to_string())),
                ),
                (
                    "count_refused",
                    first.count_refused != limit.count_refused,
                    limit.count_refused.to_string(),
                    first.count_refused.to_string(),
                ),
            ];
            for (name, differs, here, there) in differing {
                if differs {
                    self.error(
                        Some(*line),
                        &join(path, name),
                        format!(
                            "{name} must be the same on every limit of a rate_limits list \
                             (they are decided together, in one store call): {here} here, \
                             {there} on the first"
                        ),
                    );
                }
            }
        }
    }

    /// No two limits counting the same window with the same algorithm (the
    /// smaller would make the other moot, and they would share keys).
    fn distinct_windows(&mut self, limits: &[(RateLimit, usize, String)]) {
        let default = self.options.default_algorithm;
        for (i, (limit, line, path)) in limits.iter().enumerate() {
            let LimitSpec::PerUnit { window, .. } = limit.limit else {
                continue;
            };
            let algorithm = limit.algorithm.unwrap_or(default);
            let earlier = limits[..i].iter().position(|(other, ..)| {
                matches!(other.limit, LimitSpec::PerUnit { window: w, .. } if w.seconds() == window.seconds() && w.zone() == window.zone())
                    && other.algorithm.unwrap_or(default) == algorithm
            });
            if let Some(j) = earlier {
                self.error(
                    Some(*line),
                    path,
                    format!(
                        "this limit counts the same window ({} seconds) with the same algorithm \
                         ({algorithm}) as limit {j} of the list: keep the smaller one",
                        window.seconds()
                    ),
                );
            }
        }
    }
}
