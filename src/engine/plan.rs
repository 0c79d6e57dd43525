//! Which limit each descriptor of a request gets, before anything is
//! counted: the rule found by matching, a caller's override, and
//! `replaces` across the request.

use crate::limit::{DEFAULT_BUCKETS, FailurePolicy, Window};
use crate::rules::{LimitSpec, Rule, RuleSet, Step};

use super::{AppliedLimit, Descriptor, Engine, LimitOverride, Request};

/// What one descriptor resolved to before counting.
pub(super) enum Plan<'r> {
    NoLimit,
    Unlimited,
    Limited(Limited<'r>),
}

impl Plan<'_> {
    /// A limiter that does not count refused requests (and is not a ban,
    /// which counts nothing): its hits take receipts.
    pub(super) fn takes_receipts(&self) -> bool {
        matches!(self, Plan::Limited(l) if !l.limit.count_refused && l.limit.requests_per_unit > 0)
    }
}

/// A descriptor that is counted: its rule (none for an override), the
/// limit applied and the failure policy of its store calls.
pub(super) struct Limited<'r> {
    pub rule: Option<&'r Rule>,
    /// How each entry matched, for a rule that shares its limiter or names
    /// runtime values in metrics; empty (no allocation) otherwise.
    pub steps: Vec<Step<'r>>,
    pub limit: AppliedLimit,
    pub policy: FailurePolicy,
}

impl Engine {
    /// Resolves every descriptor to a limit, applying overrides and
    /// `replaces` across the request.
    pub(super) fn plan<'r>(&self, rules: &'r RuleSet, req: &Request) -> Vec<Plan<'r>> {
        if !rules.has_domain(&req.domain) {
            return req.descriptors.iter().map(|_| Plan::NoLimit).collect();
        }
        let found: Vec<(Option<&Rule>, Option<LimitOverride>)> = req
            .descriptors
            .iter()
            .map(|d| match d.limit_override {
                Some(o) => (None, Some(o)),
                None => (rules.find(&req.domain, &d.entries), None),
            })
            .collect();
        let replaced: Vec<&str> = found
            .iter()
            .filter_map(|(r, _)| *r)
            .flat_map(|r| r.replaces.iter().map(String::as_str))
            .collect();
        found
            .into_iter()
            .zip(&req.descriptors)
            .map(|((rule, over), d)| {
                if let Some(o) = over {
                    return Plan::Limited(Limited {
                        rule: None,
                        steps: Vec::new(),
                        limit: AppliedLimit {
                            requests_per_unit: o.requests_per_unit,
                            window: Window::of(o.unit),
                            name: None,
                            algorithm: self.options.default_algorithm,
                            buckets: DEFAULT_BUCKETS,
                            burst: 0,
                            shards: 1,
                            // Names no algorithm. Settings never ask for
                            // both usage reports and count_refused=false.
                            usage_reports: is_report(d)
                                && self.options.count_refused
                                && self.options.usage_reports.unwrap_or(true),
                            count_refused: self.options.count_refused,
                        },
                        policy: self.options.on_store_error,
                    });
                }
                let Some(rule) = rule else {
                    return Plan::NoLimit;
                };
                if rule.name.as_deref().is_some_and(|n| replaced.contains(&n)) {
                    return Plan::NoLimit;
                }
                match rule.limit {
                    LimitSpec::Unlimited => Plan::Unlimited,
                    LimitSpec::PerUnit {
                        requests_per_unit,
                        window,
                    } => Plan::Limited(Limited {
                        rule: Some(rule),
                        steps: if rule.share_threshold || rule.value_to_metric {
                            rules.steps(&req.domain, &d.entries)
                        } else {
                            Vec::new()
                        },
                        limit: AppliedLimit {
                            requests_per_unit,
                            window,
                            name: rule.name.clone(),
                            algorithm: rule.algorithm.unwrap_or(self.options.default_algorithm),
                            buckets: rule.buckets.unwrap_or(DEFAULT_BUCKETS),
                            burst: rule.burst.unwrap_or(0),
                            shards: rule.shards.unwrap_or(1),
                            // A rule that does not count refused requests
                            // takes no usage reports (load refuses a rule
                            // that says both).
                            usage_reports: is_report(d)
                                && rule.count_refused
                                && rule
                                    .usage_reports
                                    .or(self.options.usage_reports)
                                    .unwrap_or(rule.algorithm.is_none()),
                            count_refused: rule.count_refused,
                        },
                        policy: rule.on_store_error.unwrap_or(self.options.on_store_error),
                    }),
                }
            })
            .collect()
    }
}

/// Whether a descriptor is a usage report rather than a request: it
/// carries its own cost (`hits_addend` on the descriptor, even 0). Envoy
/// sets it only for a rate-limit policy with `hits_addend` (costs known
/// before or after the response: Envoy Gateway's `cost`, token budgets);
/// its ordinary rate limits never do, and a gRPC client that weighs a
/// request sets the request's `hits_addend`. On a limiter that takes usage
/// reports, a report's positive cost is recorded whatever the answer (a
/// budget charged after the response must close); a request is admitted
/// or refused by the algorithm's own rules, so a client that keeps sending
/// over its limit still gets its limit.
fn is_report(d: &Descriptor) -> bool {
    d.hits.is_some()
}
