//! The engine's instruments, read at collection time from its counters
//! ([`EngineStats`]): store failures and overloads by the answer given,
//! deadlines, the charges of `count_refused: false` limiters taken back or
//! lost, and the calls whose cost is above the limit.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use crate::engine::{EngineStats, RulesHandle};

pub(super) fn register(meter: &Meter, stats: Arc<EngineStats>) {
    let engine = stats.clone();
    meter
        .u64_observable_counter("tollgate.store.failures_answered")
        .with_description(
            "Store failures by the answer given: the policy failed the call, allowed or denied",
        )
        .with_callback(move |o| {
            for (policy, n) in [
                ("error", &engine.store_errors_failed),
                ("allow", &engine.store_errors_allowed),
                ("deny", &engine.store_errors_denied),
            ] {
                o.observe(n.load(Relaxed), &[KeyValue::new("policy", policy)]);
            }
        })
        .build();
    let engine = stats.clone();
    meter
        .u64_observable_counter("tollgate.overload.answered")
        .with_description(
            "Store calls past max_in_flight by the answer on_overload gave: failed, allowed or denied",
        )
        .with_callback(move |o| {
            for (policy, n) in [
                ("error", &engine.overloaded_failed),
                ("allow", &engine.overloaded_allowed),
                ("deny", &engine.overloaded_denied),
            ] {
                o.observe(n.load(Relaxed), &[KeyValue::new("policy", policy)]);
            }
        })
        .build();
    let engine = stats.clone();
    meter
        .u64_observable_counter("tollgate.deadline_exceeded")
        .with_description("Store calls cut off, or not made, because the caller's deadline passed")
        .with_callback(move |o| o.observe(engine.deadline_exceeded.load(Relaxed), &[]))
        .build();
    let engine = stats.clone();
    meter
        .u64_observable_counter("tollgate.undos")
        .with_description(
            "Charges of count_refused: false limiters taken back because another descriptor refused the request",
        )
        .with_callback(move |o| o.observe(engine.undos.load(Relaxed), &[]))
        .build();
    let engine = stats.clone();
    meter
        .u64_observable_counter("tollgate.resets")
        .with_description(
            "Limiters reset through the debug listener (POST /reset), by rule (empty for a caller's override)",
        )
        .with_callback(move |o| {
            for ((domain, rule), n) in engine.resets() {
                o.observe(
                    n,
                    &[KeyValue::new("domain", domain), KeyValue::new("rule", rule)],
                );
            }
        })
        .build();
    meter
        .u64_observable_counter("tollgate.undos_lost")
        .with_description(
            "Charges of count_refused: false limiters that could not be taken back (the store failed or was overloaded): they stay counted",
        )
        .with_callback(move |o| o.observe(stats.undos_lost.load(Relaxed), &[]))
        .build();
}

/// `tollgate_cost_above_limit_total{domain,rule}`: per rule in force, as
/// the rule counters are, so a rule dropped by a reload is no longer
/// exported and one kept (same file and path) keeps its count.
pub(super) fn register_cost_above_limit(
    meter: &Meter,
    stats: Arc<EngineStats>,
    rules: RulesHandle,
) {
    meter
        .u64_observable_counter("tollgate.cost_above_limit")
        .with_description(
            "Calls refused because their cost is above the rule's limit (a token bucket's burst; each limit of a rate_limits list): they can never pass, and their answer carries no duration_until_reset",
        )
        .with_callback(move |o| {
            for (domain, rule) in rules.current().rules() {
                let attrs = [
                    KeyValue::new("domain", domain.to_string()),
                    KeyValue::new("rule", rule.path.clone()),
                ];
                o.observe(stats.cost_above_limit(&rule.source.file, &rule.path), &attrs);
            }
        })
        .build();
}
