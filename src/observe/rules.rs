//! The rules' instruments, read at collection time: each rule's counts,
//! per descriptor value for the rules that ask, how many rules are in
//! force and how many reloads were loaded or refused.

use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use super::catalog;
use crate::engine::RulesHandle;
use crate::reload::ReloadCounts;
use crate::rules::{CountsSnapshot, OVERFLOW};

/// A rule's count, picked from its snapshot.
type Pick = fn(&CountsSnapshot) -> u64;

/// The per-rule counters, each once per rule and once per detailed
/// descriptor value, in the order of `catalog::PER_RULE`, which names and
/// describes them.
pub(super) fn register_counts(meter: &Meter, rules: &RulesHandle) {
    let picks: [Pick; catalog::PER_RULE.len()] = [
        |c| c.total_hits,
        |c| c.within_limit,
        |c| c.near_limit,
        |c| c.over_limit,
        |c| c.shadow_mode,
        |c| c.recorded_over,
        |c| c.taken_back,
    ];
    for (&(name, help), pick) in catalog::PER_RULE.iter().zip(picks) {
        register_count(meter, rules, name, help, pick);
        register_detailed_count(meter, rules, name, help, pick);
    }
}

/// `tollgate.rule.<name>`: one count of every rule in force, labelled by
/// domain and rule.
fn register_count(meter: &Meter, rules: &RulesHandle, name: &str, help: &'static str, pick: Pick) {
    let rules = rules.clone();
    meter
        .u64_observable_counter(format!("tollgate.rule.{name}"))
        .with_description(help)
        .with_callback(move |o| {
            for (domain, rule) in rules.current().rules() {
                let attrs = [
                    KeyValue::new("domain", domain.to_string()),
                    KeyValue::new("rule", rule.path.clone()),
                ];
                o.observe(pick(&rule.stats.counts().snapshot()), &attrs);
            }
        })
        .build();
}

/// `tollgate.rule.detailed.<name>`: one count per descriptor value of the
/// rules that name their values, plus the overflow series past the cap.
fn register_detailed_count(
    meter: &Meter,
    rules: &RulesHandle,
    name: &str,
    help: &'static str,
    pick: Pick,
) {
    let rules = rules.clone();
    meter
        .u64_observable_counter(format!("tollgate.rule.detailed.{name}"))
        .with_description(catalog::detailed_meaning(help))
        .with_callback(move |o| {
            for (domain, rule) in rules.current().rules() {
                let named = rule.detailed_metric || rule.value_to_metric;
                if !named || !rule.stats.has_detailed() {
                    continue;
                }
                let overflow = (Arc::from(OVERFLOW), rule.stats.overflow().snapshot());
                for (value, counts) in rule
                    .stats
                    .detailed_snapshot()
                    .into_iter()
                    .chain(std::iter::once(overflow))
                {
                    let attrs = [
                        KeyValue::new("domain", domain.to_string()),
                        KeyValue::new("rule", rule.path.clone()),
                        KeyValue::new("descriptor", value.to_string()),
                    ];
                    o.observe(pick(&counts), &attrs);
                }
            }
        })
        .build();
}

/// How many rules are in force and how many rule directories were loaded
/// or refused.
pub(super) fn register_set(meter: &Meter, rules: &RulesHandle, reloads: &ReloadCounts) {
    let rules = rules.clone();
    meter
        .u64_observable_gauge("tollgate.rules.loaded")
        .with_description("Rules in force")
        .with_callback(move |o| o.observe(rules.current().rules().len() as u64, &[]))
        .build();
    let reloads = reloads.clone();
    meter
        .u64_observable_counter("tollgate.rules.reloads")
        .with_description("Changed rule directories loaded (success) or refused (failure)")
        .with_callback(move |o| {
            o.observe(reloads.loaded(), &[KeyValue::new("result", "success")]);
            o.observe(reloads.refused(), &[KeyValue::new("result", "failure")]);
        })
        .build();
}
