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
    /// A `rate_limits:` list: its further limits, each with its rule,
    /// decided with `limit` in one store call ([`crate::storage::Hit::also`]);
    /// empty for a single limit.
    pub also: Vec<(&'r Rule, AppliedLimit)>,
}

impl<'r> Limited<'r> {
    /// Limit `i` of the descriptor's list (0: `limit`) and its rule.
    pub fn part(&self, i: usize) -> (Option<&'r Rule>, &AppliedLimit) {
        match i.checked_sub(1).and_then(|i| self.also.get(i)) {
            Some((rule, limit)) => (Some(*rule), limit),
            None => (self.rule, &self.limit),
        }
    }
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
            .flat_map(|r| std::iter::once(r).chain(&r.more))
            .flat_map(|r| r.replaces.iter().map(String::as_str))
            .collect();
        found
            .into_iter()
            .zip(&req.descriptors)
            .map(|((rule, over), d)| {
                if let Some(o) = over {
                    return Plan::Limited(self.overridden(o, d));
                }
                let Some(rule) = rule else {
                    return Plan::NoLimit;
                };
                let replaced = |r: &Rule| r.name.as_deref().is_some_and(|n| replaced.contains(&n));
                if rule.more.is_empty() {
                    if replaced(rule) {
                        return Plan::NoLimit;
                    }
                    return match self.applied(rule, d) {
                        None => Plan::Unlimited,
                        Some(limit) => Plan::Limited(self.limited(rules, req, d, rule, limit)),
                    };
                }
                self.listed(rules, req, d, rule, replaced)
            })
            .collect()
    }
}

impl Engine {
    /// The limit a caller's override `o` applies to descriptor `d`, with
    /// no rule.
    fn overridden<'r>(&self, o: LimitOverride, d: &Descriptor) -> Limited<'r> {
        Limited {
            rule: None,
            steps: Vec::new(),
            limit: AppliedLimit {
                requests_per_unit: o.requests_per_unit,
                window: placed(self.options.default_algorithm, Window::of(o.unit)),
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
                lease: false,
            },
            policy: self.options.on_store_error,
            also: Vec::new(),
        }
    }

    /// A `rate_limits:` list: the limits no other descriptor
    /// replaces, decided together; a zero limit among them
    /// refuses the descriptor alone, as a ban.
    fn listed<'r>(
        &self,
        rules: &'r RuleSet,
        req: &Request,
        d: &Descriptor,
        rule: &'r Rule,
        replaced: impl Fn(&Rule) -> bool,
    ) -> Plan<'r> {
        let algorithm = |r: &Rule| r.algorithm.unwrap_or(self.options.default_algorithm);
        // A release (a negative hit where the list counts requests in
        // flight) frees slots, and gives nothing back to the rates.
        let release = d.negative
            && std::iter::once(rule)
                .chain(&rule.more)
                .any(|r| algorithm(r).releases());
        let mut parts = std::iter::once(rule)
            .chain(&rule.more)
            .filter(|r| !replaced(r))
            .filter(|r| !release || algorithm(r).releases())
            .filter_map(|r| Some((r, self.applied(r, d)?)));
        let Some((first, limit)) = parts.next() else {
            return Plan::NoLimit;
        };
        let mut also: Vec<_> = parts.collect();
        let mut limited = self.limited(rules, req, d, first, limit);
        if let Some(ban) = also.iter().position(|(_, l)| l.requests_per_unit == 0) {
            let (rule, limit) = also.swap_remove(ban);
            limited.rule = Some(rule);
            limited.limit = limit;
            also.clear();
        }
        if limited.limit.requests_per_unit > 0 {
            limited.also = also;
        }
        Plan::Limited(limited)
    }
}

impl Engine {
    /// The limit `rule` applies to descriptor `d`; `None` for
    /// `unlimited: true`.
    fn applied(&self, rule: &Rule, d: &Descriptor) -> Option<AppliedLimit> {
        let LimitSpec::PerUnit {
            requests_per_unit,
            window,
        } = rule.limit
        else {
            return None;
        };
        let algorithm = rule.algorithm.unwrap_or(self.options.default_algorithm);
        Some(AppliedLimit {
            requests_per_unit,
            window: placed(algorithm, window),
            name: rule.name.clone(),
            algorithm,
            buckets: rule.buckets.unwrap_or(DEFAULT_BUCKETS),
            // The algorithm's own number ([`Param`]): a bucket's burst, or
            // how long a slot is held (load lets a rule have only its
            // algorithm's).
            burst: rule.burst.or(rule.max_duration).unwrap_or(0),
            shards: rule.shards.unwrap_or(1),
            // A rule that does not count refused requests takes no usage
            // reports (load refuses a rule that says both).
            usage_reports: is_report(d)
                && algorithm.spec().takes_reports
                && rule.count_refused
                && rule
                    .usage_reports
                    .or(self.options.usage_reports)
                    .unwrap_or(rule.algorithm.is_none()),
            count_refused: rule.count_refused,
            lease: self.leases(rule, d),
        })
    }

    /// Whether `rule`'s limiter is decided from leased quota for `d`: the
    /// rule's `lease`, else the setting where the rule may lease (load
    /// refuses `lease: true` elsewhere). A usage report never is.
    fn leases(&self, rule: &Rule, d: &Descriptor) -> bool {
        !is_report(d)
            && rule.lease.unwrap_or(self.options.lease)
            && rule.may_lease(self.options.default_algorithm)
    }

    /// A counted descriptor under `rule`'s `limit`.
    fn limited<'r>(
        &self,
        rules: &'r RuleSet,
        req: &Request,
        d: &Descriptor,
        rule: &'r Rule,
        limit: AppliedLimit,
    ) -> Limited<'r> {
        Limited {
            rule: Some(rule),
            steps: if rule.share_threshold || rule.value_to_metric {
                rules.steps(&req.domain, &d.entries)
            } else {
                Vec::new()
            },
            limit,
            policy: rule.on_store_error.unwrap_or(self.options.on_store_error),
            also: Vec::new(),
        }
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

/// `window` as `algorithm` counts it: staggered where its spec says so
/// ([`Window::staggered`]). A rule's limit and an override on the same
/// entries share a count, so both are placed here alike.
fn placed(algorithm: crate::limit::Algorithm, window: Window) -> Window {
    if algorithm.spec().staggered {
        window.staggered()
    } else {
        window
    }
}
