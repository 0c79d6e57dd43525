//! The decision: for one request, which limit applies to each descriptor and
//! is it over? The engine coordinates the rules (which limit?) and the store
//! (what count?); it knows nothing of gRPC or of Envoy's message types.
//!
//! `request` holds what it is asked and answers, `options` its settings and
//! counters, `plan` the resolution of descriptors to limits, `answer` the
//! turn from a store's answer (or failure) to a status; this file runs a
//! request through them.

mod answer;
mod options;
mod plan;
mod request;
mod reset;
mod undo;

use std::sync::{Arc, RwLock};

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::clock::Clock;
use crate::rules::{RuleSet, Step};
use crate::storage::keys::{identity_entries, shared_value};
use crate::storage::{Also, Hit, Store};

use answer::{Failure, Outcome};
use plan::{Limited, Plan};

pub use options::{EngineOptions, EngineStats};
pub use request::{
    AppliedLimit, Code, Descriptor, EngineError, LimitOverride, Request, Response, Status,
};
pub use reset::{ResetError, ResetLimiter, ResetRule};

/// The current rules, swapped whole on reload. Readers clone the inner
/// `Arc` and release the lock at once, so a std lock never waits on I/O.
#[derive(Debug, Clone, Default)]
pub struct RulesHandle(Arc<RwLock<Arc<RuleSet>>>);

impl RulesHandle {
    pub fn new(rules: RuleSet) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(rules))))
    }

    pub fn current(&self) -> Arc<RuleSet> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether a rule file names `domain`, without taking a handle on
    /// the rules.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .has_domain(domain)
    }

    pub fn replace(&self, rules: RuleSet) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(rules);
    }
}

/// Cheap to clone; clones share rules, store and clock.
#[derive(Clone)]
pub struct Engine {
    rules: RulesHandle,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    options: EngineOptions,
    stats: Arc<EngineStats>,
}

impl Engine {
    pub fn new(
        rules: RulesHandle,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        options: EngineOptions,
    ) -> Self {
        Self {
            rules,
            store,
            clock,
            options,
            stats: Arc::default(),
        }
    }

    pub fn stats(&self) -> &Arc<EngineStats> {
        &self.stats
    }

    pub fn rules(&self) -> &RulesHandle {
        &self.rules
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The same engine over another store (sharing rules, clock and
    /// stats): how a wrapper such as a metrics layer is put in front.
    pub fn with_store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = store;
        self
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The answer to one request, in its steps: the request checked, each
    /// descriptor planned (which limit applies), the limiter identities
    /// they count on, the store calls decided, what `count_refused: false`
    /// limiters charged settled by the answer, and the answer.
    pub async fn should_rate_limit(&self, req: &Request) -> Result<Response, EngineError> {
        self.validate(req)?;
        let rules = self.rules.current();
        let plans = self.plan(&rules, req);
        let identities = self.identities(req, &plans);
        let mut decided = self.decide(req, plans, &identities).await;
        self.settle_charges(&mut decided, req, &identities).await;
        self.answer(decided)
    }

    /// Refuses what the engine cannot decide: no domain, no descriptors,
    /// a descriptor without entries, or a limit override above
    /// `max_log_limit` under `sliding_window_log` (one stored entry per
    /// hit).
    fn validate(&self, req: &Request) -> Result<(), EngineError> {
        if req.domain.is_empty() {
            return Err(EngineError::EmptyDomain);
        }
        if req.descriptors.is_empty() {
            return Err(EngineError::NoDescriptors);
        }
        for (index, d) in req.descriptors.iter().enumerate() {
            if d.entries.is_empty() {
                return Err(EngineError::BadDescriptor {
                    index,
                    reason: "a descriptor needs at least one entry".into(),
                });
            }
            let algorithm = self.options.default_algorithm;
            if let Some(o) = d.limit_override
                && let Some((why, instead)) = algorithm.spec().entry_per_hit
                && o.requests_per_unit > self.options.max_log_limit
            {
                return Err(EngineError::BadDescriptor {
                    index,
                    reason: format!(
                        "limit override of {} per {} is above max_log_limit={} for {algorithm} ({why}); {instead}",
                        o.requests_per_unit,
                        o.unit.as_str(),
                        self.options.max_log_limit
                    ),
                });
            }
        }
        Ok(())
    }

    /// The identity of the limiter each descriptor counts on. Matching saw
    /// the values whole; limiters see them as `limiter_identity` gives
    /// them (as RLQS's buckets do).
    fn identities<'a>(&self, req: &'a Request, plans: &[Plan<'_>]) -> Vec<Identity<'a>> {
        req.descriptors
            .iter()
            .zip(plans)
            .map(|(d, plan)| {
                let steps = match plan {
                    Plan::Limited(l) => l.steps.as_slice(),
                    _ => &[],
                };
                limiter_identity(&d.entries, steps, self.options.max_value_bytes)
            })
            .collect()
    }

    /// Every descriptor's store call, and each descriptor's status from
    /// what its call came to.
    async fn decide<'r>(
        &self,
        req: &Request,
        plans: Vec<Plan<'r>>,
        identities: &[Identity<'_>],
    ) -> Decided<'r> {
        let (outcomes, checked) = self.store_calls(req, &plans, identities).await;
        self.statuses(req, identities, plans, outcomes, &checked)
    }

    /// The store calls of a request's descriptors, made concurrently: on a
    /// cluster they usually live on different nodes. Most requests have
    /// one, which needs no joining. Also says which descriptors were only
    /// checked (see `undo::Engine::outcomes`): empty, without an
    /// allocation, unless some limiter takes receipts.
    async fn store_calls(
        &self,
        req: &Request,
        plans: &[Plan<'_>],
        identities: &[Identity<'_>],
    ) -> (Vec<Outcome>, Vec<bool>) {
        let also = also_lists(plans);
        let call = |i: usize, check: bool| {
            let also = also.get(i).map_or(&[][..], Vec::as_slice);
            self.store_call(req, i, &identities[i], &plans[i], also, check)
        };
        let n = req.descriptors.len();
        let mut checked = Vec::new();
        let outcomes = if n == 1 {
            vec![call(0, false).await]
        } else if plans.iter().any(Plan::takes_receipts) {
            checked = vec![false; n];
            self.outcomes(plans, req, &mut checked, call).await
        } else {
            join_all((0..n).map(|i| call(i, false))).await
        };
        (outcomes, checked)
    }

    /// Descriptor `index`'s store call: `None` when it needs none (no
    /// limit, or a zero limit). `check` asks with a cost of 0 (see
    /// `undo::Engine::outcomes`).
    async fn store_call(
        &self,
        req: &Request,
        index: usize,
        entries: &[(String, String)],
        plan: &Plan<'_>,
        also: &[Also],
        check: bool,
    ) -> Outcome {
        let Plan::Limited(Limited { limit, .. }) = plan else {
            return None;
        };
        if limit.requests_per_unit == 0 {
            return None;
        }
        let request_hits = if req.hits == 0 { 1 } else { req.hits };
        let d = &req.descriptors[index];
        let mut hit = hit_of(&req.domain, entries, d, limit, request_hits);
        hit.also = also;
        if check {
            hit.hits = 0;
        }
        let Some(deadline) = req.deadline else {
            return Some(self.store.hit(hit).await.map_err(Failure::from));
        };
        // Past the deadline nobody waits for the answer: do not spend a
        // store call on it. Cut off at the deadline, the store call is
        // dropped; the breaker does not count that against the store (the
        // caller's budget ran out, not the store's).
        if Instant::now() >= deadline {
            return Some(Err(Failure::Deadline));
        }
        Some(
            match tokio::time::timeout_at(deadline, self.store.hit(hit)).await {
                Ok(result) => result.map_err(Failure::from),
                Err(_) => Err(Failure::Deadline),
            },
        )
    }

    /// Each descriptor's status from its plan and its store call's
    /// outcome, gathered with what the answer and the settling need.
    fn statuses<'r>(
        &self,
        req: &Request,
        identities: &[Identity<'_>],
        plans: Vec<Plan<'r>>,
        outcomes: Vec<Outcome>,
        checked: &[bool],
    ) -> Decided<'r> {
        let request_hits = if req.hits == 0 { 1 } else { req.hits };
        let mut decided = Decided::with_capacity(plans.len());
        let answers = req
            .descriptors
            .iter()
            .zip(identities)
            .zip(plans)
            .zip(outcomes);
        for (index, (((descriptor, entries), plan), outcome)) in answers.enumerate() {
            let status = match plan {
                Plan::NoLimit => Status::no_limit(),
                Plan::Unlimited => Status {
                    code: Code::Ok,
                    limit: None,
                    remaining: u32::MAX,
                    reset: None,
                },
                Plan::Limited(limited) => {
                    let only_checked = checked.get(index) == Some(&true);
                    let call = Call {
                        index,
                        descriptor,
                        entries,
                        request_hits,
                        only_checked,
                    };
                    self.descriptor_status(call, limited, outcome, &mut decided)
                }
            };
            decided.statuses.push(status);
        }
        decided
    }

    /// The status of a descriptor under a limit, its charge and metadata
    /// kept in `decided` and its rule's mode applied. When its store call
    /// failed and the policy says error, the failure is kept instead and
    /// the status is `no_limit`: the request fails.
    fn descriptor_status<'r>(
        &self,
        call: Call<'_>,
        limited: Limited<'r>,
        outcome: Outcome,
        decided: &mut Decided<'r>,
    ) -> Status {
        let Call {
            index,
            descriptor,
            entries,
            request_hits,
            only_checked,
        } = call;
        let rule = limited.rule;
        let rule_metadata = rule.and_then(|r| r.metadata.clone());
        // A `count_refused: false` limiter's charge waits for the overall
        // answer, and so does its rule's count.
        let charge = match &outcome {
            Some(Ok(d)) if !limited.limit.count_refused => undo::Charge::of(index, &limited, d),
            _ => None,
        };
        let counted = !only_checked && !charge.as_ref().is_some_and(|c| c.defers_count());
        if only_checked {
            let hits = descriptor.hits.unwrap_or(request_hits);
            for i in 0..=limited.also.len() {
                if let (Some(rule), _) = limited.part(i) {
                    self.count_taken_back(rule, entries, &limited.steps, hits);
                }
            }
        }
        let decision = self.decided(
            index,
            descriptor,
            entries,
            request_hits,
            limited,
            outcome,
            counted,
        );
        let mut status = match decision {
            Ok(status) => status,
            Err(e) => {
                // The request fails: what the other descriptors charged is
                // taken back when it is settled.
                decided.failed.get_or_insert(e);
                return Status::no_limit();
            }
        };
        decided.charges.extend(charge);
        decided.apply_mode(rule, &mut status);
        if status.code == Code::Ok
            && let Some(m) = rule_metadata
        {
            decided.metadata.push(m);
        }
        status
    }

    /// Takes back or keeps what `count_refused: false` limiters charged. A
    /// failed request settles as a refusal: the caller gets no OK for it.
    /// Otherwise by the answer enforcement gives: under global shadow mode
    /// too, so that its counts preview enforcement's.
    async fn settle_charges(
        &self,
        decided: &mut Decided<'_>,
        req: &Request,
        identities: &[Identity<'_>],
    ) {
        if decided.charges.is_empty() {
            return;
        }
        let refused = decided.failed.is_some() || decided.over();
        let charges = std::mem::take(&mut decided.charges);
        self.settle(charges, refused, req, identities, &decided.statuses)
            .await;
    }

    /// The request's answer: its first failure, or every status with the
    /// overall code (OK under global shadow mode) and the metadata of the
    /// rules that answered OK.
    fn answer(&self, decided: Decided<'_>) -> Result<Response, EngineError> {
        if let Some(e) = decided.failed {
            return Err(e);
        }
        let overall = if decided.over() && !self.options.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(Response {
            overall,
            statuses: decided.statuses,
            metadata: decided.metadata,
        })
    }
}

/// The limiter identity of one descriptor (see [`limiter_identity`]).
type Identity<'a> = std::borrow::Cow<'a, [(String, String)]>;

/// One limited descriptor of a request, as its status needs it.
struct Call<'a> {
    /// The descriptor's position in the request.
    index: usize,
    descriptor: &'a Descriptor,
    /// Its limiter identity.
    entries: &'a [(String, String)],
    /// The request's cost, for a descriptor that names none.
    request_hits: u64,
    /// Only checked, not charged (see `undo::Engine::outcomes`).
    only_checked: bool,
}

/// What a request's descriptors came to, gathered for its answer: each
/// status, the charges to settle, the OK rules' metadata, whether any
/// enforced limit is over, how many quota-mode limits answered and were
/// over, and the first failure.
struct Decided<'r> {
    statuses: Vec<Status>,
    charges: Vec<undo::Charge<'r>>,
    metadata: Vec<Arc<serde_json::Map<String, serde_json::Value>>>,
    any_over: bool,
    quota_total: usize,
    quota_over: usize,
    failed: Option<EngineError>,
}

impl Decided<'_> {
    /// Nothing decided yet, with room for `n` statuses.
    fn with_capacity(n: usize) -> Self {
        Decided {
            statuses: Vec::with_capacity(n),
            charges: Vec::new(),
            metadata: Vec::new(),
            any_over: false,
            quota_total: 0,
            quota_over: 0,
            failed: None,
        }
    }

    /// Applies the mode of a descriptor's rule to its status: a shadow
    /// rule answers OK; a quota-mode rule's answer counts among the quota
    /// answers; any other's OVER_LIMIT makes the request over.
    fn apply_mode(&mut self, rule: Option<&crate::rules::Rule>, status: &mut Status) {
        let shadow = rule.is_some_and(|r| r.shadow_mode);
        let quota = rule.is_some_and(|r| r.quota_mode);
        if shadow {
            status.code = Code::Ok;
        } else if quota {
            self.quota_total += 1;
            if status.code == Code::OverLimit {
                self.quota_over += 1;
            }
        } else if status.code == Code::OverLimit {
            self.any_over = true;
        }
    }

    /// Whether the request is over: an enforced limit is, or every
    /// quota-mode limit is.
    fn over(&self) -> bool {
        self.any_over || (self.quota_total > 0 && self.quota_over == self.quota_total)
    }
}

/// The further limits of each descriptor with a `rate_limits:` list, as
/// the store sees them; empty, without an allocation, when the request
/// has none.
fn also_lists(plans: &[Plan<'_>]) -> Vec<Vec<Also>> {
    let listed = |p: &Plan<'_>| matches!(p, Plan::Limited(l) if !l.also.is_empty());
    if !plans.iter().any(listed) {
        return Vec::new();
    }
    plans
        .iter()
        .map(|plan| match plan {
            Plan::Limited(l) => l.also.iter().map(|(_, a)| also_of(a)).collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// The store call for descriptor `d` under `limit`: one limiter, every
/// shard of it (the sharding layer picks one), a receipt asked for when it
/// does not count refused requests.
fn hit_of<'a>(
    domain: &'a str,
    entries: &'a [(String, String)],
    d: &Descriptor,
    limit: &AppliedLimit,
    request_hits: u64,
) -> Hit<'a> {
    Hit {
        domain,
        entries,
        algorithm: limit.algorithm,
        limit: u64::from(limit.requests_per_unit),
        window: limit.window,
        hits: d.hits.unwrap_or(request_hits),
        negative: d.negative,
        usage_reports: limit.usage_reports,
        buckets: limit.buckets,
        burst: limit.burst,
        shard: crate::storage::Shard {
            index: 0,
            count: limit.shards,
        },
        // A give-back is never taken back.
        receipt: !limit.count_refused && !d.negative,
        also: &[],
        lease: limit.lease,
        ahead: crate::storage::Ahead::NONE,
    }
}

/// A further limit of a `rate_limits:` list as the store sees it.
fn also_of(limit: &AppliedLimit) -> Also {
    Also {
        algorithm: limit.algorithm,
        limit: u64::from(limit.requests_per_unit),
        window: limit.window,
        buckets: limit.buckets,
        burst: limit.burst,
    }
}

/// The identity of the limiter a descriptor's `entries` count on, matched
/// as `steps` say (empty when the rule needs none: see
/// [`RuleSet::steps`]): each value a `share_threshold` wildcard matched
/// replaced by the pattern (marked, so no value a client sends equals it),
/// so every such value counts on one limiter; long values as digests. The
/// one function both faces use: RLS decisions and resets here, RLQS
/// buckets in `rlqs::stream`, so that they count on one limiter.
pub(crate) fn limiter_identity<'a>(
    entries: &'a [(String, String)],
    steps: &[Step<'_>],
    max_value_bytes: usize,
) -> std::borrow::Cow<'a, [(String, String)]> {
    let entries = identity_entries(entries, max_value_bytes);
    let shared = |s: &Step<'_>| matches!(s, Step::Wildcard { shared: true, .. });
    if !steps.iter().any(shared) {
        return entries;
    }
    let mut owned = entries.into_owned();
    for (entry, step) in owned.iter_mut().zip(steps) {
        if let Step::Wildcard {
            pattern,
            shared: true,
            ..
        } = step
        {
            entry.1 = shared_value(pattern);
        }
    }
    std::borrow::Cow::Owned(owned)
}
