//! What a run met: cases, hits, and the combinations of features and
//! faults its cases drew, for its report.

use std::collections::BTreeMap;
use std::time::Duration;

use tollgate::guarantees;

use super::Case;
use super::envoy::EnvoyOp;
use super::grammar;
use super::record::override_limit;
use super::world::{Call, Op, Req};

/// Combinations a run met, for its report.
#[derive(Default)]
pub struct Coverage {
    pub cases: u64,
    pub ops: u64,
    pub admitted: u64,
    /// Decisions the replicas answered from leases, and hits admitted
    /// on leased rules.
    pub leased: u64,
    pub admitted_on_leased: u64,
    /// Hits leases reserved in the windows (buckets) after their own.
    pub reserved: u64,
    /// Requests Envoys' filters admitted, and their reports answered.
    pub envoy_admitted: u64,
    pub envoy_reports: u64,
    /// Of those, answered while Tokio's paused time moved (a slow store).
    pub envoy_moved: u64,
    pub refused_rule_files: u64,
    /// Takes admitted on limits in flight (`concurrency`).
    pub in_flight_admitted: u64,
    /// Refusals the refusal check could judge (`model/refusals.rs`).
    pub refusals_checked: u64,
    /// Cases that failed (`TOLLGATE_MODEL_KEEP_GOING`).
    pub failed: u64,
    pub features: BTreeMap<String, u64>,
}

pub fn note_features(case: &Case, coverage: &mut Coverage) {
    coverage.cases += 1;
    for rule in &case.rules.rules {
        for l in &rule.limits {
            let algorithm = l.algorithm.as_str();
            *coverage.features.entry(algorithm.to_string()).or_default() += 1;
            for (on, what) in [
                (rule.list, "in a list"),
                (rule.lease, "lease: true"),
                (rule.leases() && !rule.lease, "leased by default"),
                (rule.no_lease, "lease: false"),
                (rule.shards > 1, "shards"),
                (rule.shadow, "shadow_mode"),
                (rule.quota, "quota_mode"),
                (rule.count_refused == Some(false), "count_refused: false"),
                (rule.usage_reports, "usage_reports"),
                (l.zone.is_some(), "calendar"),
                (!rule.replaces.is_empty(), "replaces"),
                (
                    rule.on_store_error == Some("allow"),
                    "on_store_error: allow",
                ),
                (rule.on_store_error == Some("deny"), "on_store_error: deny"),
                (
                    matches!(rule.value, grammar::Value::Wildcard { shared: true, .. }),
                    "share_threshold",
                ),
            ] {
                if on {
                    *coverage
                        .features
                        .entry(format!("{algorithm} + {what}"))
                        .or_default() += 1;
                }
            }
        }
    }
    for spec in &case.envoys {
        *coverage
            .features
            .entry("RLQS: an Envoy".into())
            .or_default() += 1;
        for b in &spec.buckets {
            let Some(r) = case.rules.find(&b.key, &b.value) else {
                continue;
            };
            let rule = &case.rules.rules[r];
            for l in &rule.limits {
                let algorithm = l.algorithm.as_str();
                let one = guarantees::promise(&rule.features(l, true)).one_count;
                let what = if one {
                    "one count"
                } else {
                    "each its own bound"
                };
                *coverage
                    .features
                    .entry(format!("{algorithm} + RLQS ({what})"))
                    .or_default() += 1;
                for (on, what) in [
                    (rule.list, "in a list"),
                    (
                        matches!(rule.value, grammar::Value::Wildcard { shared: true, .. }),
                        "share_threshold",
                    ),
                ] {
                    if on {
                        *coverage
                            .features
                            .entry(format!("{algorithm} + RLQS + {what}"))
                            .or_default() += 1;
                    }
                }
            }
        }
    }
    for op in &case.ops {
        let reqs: Vec<&Req> = match op {
            Op::Ask(_, q) | Op::Flood(_, q, _) | Op::Take(_, q, _) | Op::Done(_, q, _) => vec![q],
            Op::Together(_, calls) => calls
                .iter()
                .filter_map(|c| match c {
                    Call::Ask(q) | Call::Later(_, q) => Some(q),
                    Call::Reset(..) | Call::Lag(..) => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        for d in reqs.iter().flat_map(|q| &q.descriptors) {
            let Some(own) = d.limit else { continue };
            let shares = case.rules.find(&d.key, &d.value).is_some_and(|r| {
                case.rules.rules[r]
                    .limits
                    .iter()
                    .any(|l| l.algorithm == override_limit(own).algorithm && l.unit == own.1)
            });
            let what = if shares {
                "a request's override, on a rule's count"
            } else {
                "a request's override"
            };
            *coverage.features.entry(what.into()).or_default() += 1;
        }
        if matches!(op, Op::Together(_, calls) if calls.iter().any(|c| matches!(c, Call::Later(..))))
        {
            *coverage
                .features
                .entry("fault: callers while calls are in flight".into())
                .or_default() += 1;
        }
        let what = match op {
            Op::Advance(_) | Op::Ask(..) => continue,
            Op::Take(..) => "a take whose release comes later (concurrency)",
            Op::Done(..) => "a take's release (concurrency)",
            Op::Together(_, calls) if calls.iter().any(|c| matches!(c, Call::Reset(..))) => {
                "fault: a reset among concurrent callers"
            }
            Op::Together(..) => "fault: concurrent callers",
            Op::Reset(..) => "fault: reset",
            Op::Reload(..) => "fault: reload",
            Op::Crash(..) => "fault: crash",
            Op::Step(..) => "fault: clock step",
            Op::Faults(..) => "fault: store errors",
            Op::Slow(..) => "fault: a slow store",
            Op::Flood(..) => "a client at its limit",
            Op::Envoy(_, EnvoyOp::Rate(..)) => "RLQS: an Envoy's demand changes",
            Op::Envoy(_, EnvoyOp::Close) => "RLQS: a stream closes",
            Op::Envoy(_, EnvoyOp::Move(..)) => "RLQS: an Envoy moves to another replica",
            Op::Envoy(_, EnvoyOp::Restart) => "RLQS: an Envoy restarts",
        };
        *coverage.features.entry(what.into()).or_default() += 1;
    }
}

/// What a run on the embedded store must have met: every algorithm, in
/// a list too, and limits in flight with their releases, admitting.
pub fn require(c: &Coverage) {
    for a in grammar::DRAWN {
        let name = a.as_str();
        for what in [name.to_string(), format!("{name} + in a list")] {
            assert!(
                c.features.get(&what).is_some_and(|n| *n > 0),
                "the run drew no case of {what}"
            );
        }
    }
    for what in [
        "a take whose release comes later (concurrency)",
        "a take's release (concurrency)",
        "concurrency + count_refused: false",
    ] {
        assert!(
            c.features.get(what).is_some_and(|n| *n > 0),
            "the run drew no case of {what}"
        );
    }
    assert!(
        c.in_flight_admitted > 0,
        "no take admitted on a limit in flight"
    );
}

pub fn print(store: &str, c: &Coverage, took: Duration) {
    println!(
        "model on {store}: {} cases ({:.1}/s), {} ops, {} hits admitted ({} decisions from leases), {} requests admitted by Envoys ({} reports answered, {} while a slow store moved Tokio's time), {} rule files refused at load, in {:.0?}",
        c.cases,
        c.cases as f64 / took.as_secs_f64(),
        c.ops,
        c.admitted,
        c.leased,
        c.envoy_admitted,
        c.envoy_reports,
        c.envoy_moved,
        c.refused_rule_files,
        took
    );
    println!("  refusals judged: {}", c.refusals_checked);
    println!("  hits admitted on leased rules: {}", c.admitted_on_leased);
    println!("  hits leases reserved ahead: {}", c.reserved);
    println!(
        "  takes admitted on limits in flight: {}",
        c.in_flight_admitted
    );
    for (what, n) in &c.features {
        println!("  {n:>6}  {what}");
    }
}
