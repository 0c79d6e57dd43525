//! `/rlconfig`'s text: every rule in force, one line each, with what it
//! takes from the settings (its algorithm, whether it leases, and why not).

use super::{Level, LimitSpec, Rule, RuleSet};
use crate::limit::Algorithm;
use crate::limit::algorithms::{Param, duration_text};

impl RuleSet {
    /// Every rule, one line each, sorted: `domain.key_value.key2: limit
    /// algorithm [flags] lease=... (file:line)`, with `defaults` what rules
    /// that do not say take (the algorithm, and the `lease` setting);
    /// whitelists too.
    pub fn describe(&self, defaults: Defaults) -> String {
        fn walk(prefix: &str, file: &str, default: Defaults, level: &Level, out: &mut Vec<String>) {
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
                    Some(rule) if rule.more.is_empty() => {
                        out.push(format!("{path}: {}", describe_rule(rule, default, false)));
                    }
                    // A `rate_limits:` list: every limit, by its place.
                    Some(rule) => {
                        let list = std::iter::once(&**rule).chain(&rule.more);
                        for (i, rule) in list.enumerate() {
                            out.push(format!(
                                "{path}[{i}]: {}",
                                describe_rule(rule, default, true)
                            ));
                        }
                    }
                    None if node.is_leaf() => out.push(format!(
                        "{path}: no limit (whitelist) ({file}:{})",
                        node.line
                    )),
                    None => {}
                }
                walk(&path, file, default, &node.children, out);
            }
        }
        let mut lines = Vec::new();
        for (name, domain) in &self.domains {
            walk(
                name,
                &domain.short_file(),
                defaults,
                &domain.root,
                &mut lines,
            );
        }
        lines.sort();
        let mut text = lines.join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        text
    }
}

/// What rules that do not say take: the algorithm (`default_algorithm`)
/// and whether they lease (the `lease` setting).
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    pub algorithm: Algorithm,
    pub lease: bool,
}

fn describe_rule(rule: &Rule, defaults: Defaults, in_list: bool) -> String {
    let default = defaults.algorithm;
    let mut text = match &rule.limit {
        LimitSpec::Unlimited => "unlimited".to_string(),
        LimitSpec::PerUnit {
            requests_per_unit,
            window,
        } => {
            let algorithm = rule.algorithm.unwrap_or(default);
            if algorithm.spec().param == Param::MaxDuration {
                format!("{requests_per_unit} in flight {algorithm}")
            } else {
                format!("{requests_per_unit}/{window} {algorithm}")
            }
        }
    };
    if let Some(buckets) = rule.buckets {
        text.push_str(&format!(" buckets={buckets}"));
    }
    if let Some(burst) = rule.burst {
        text.push_str(&format!(" burst={burst}"));
    }
    if let Some(d) = rule.max_duration {
        text.push_str(&format!(" max_duration={}", duration_text(d)));
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
    if !rule.count_refused {
        text.push_str(" count_refused=false");
    }
    for (on, flag) in [
        (rule.shadow_mode, "shadow_mode"),
        (rule.quota_mode, "quota_mode"),
        (rule.detailed_metric, "detailed_metric"),
        (rule.value_to_metric, "value_to_metric"),
        (rule.share_threshold, "share_threshold"),
        (rule.metadata.is_some(), "metadata"),
    ] {
        if on {
            text.push(' ');
            text.push_str(flag);
        }
    }
    if !matches!(rule.limit, LimitSpec::Unlimited) {
        match rule.lease_state(default, defaults.lease, in_list) {
            Ok(leased) => text.push_str(&format!(" lease={leased}")),
            Err(why) => text.push_str(&format!(" lease=false (decided in the store: {why})")),
        }
    }
    text.push_str(&format!(" ({})", rule.source));
    text
}
