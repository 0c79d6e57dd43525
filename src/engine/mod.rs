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

use answer::Failure;
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

    pub async fn should_rate_limit(&self, req: &Request) -> Result<Response, EngineError> {
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
            if let Some(o) = d.limit_override
                && self.options.default_algorithm.spec().entry_per_hit
                && o.requests_per_unit > self.options.max_log_limit
            {
                return Err(EngineError::BadDescriptor {
                    index,
                    reason: format!(
                        "limit override of {} per {} is above max_log_limit={} for sliding_window_log (one stored entry per hit); use sliding_window_counter for large limits",
                        o.requests_per_unit,
                        o.unit.as_str(),
                        self.options.max_log_limit
                    ),
                });
            }
        }
        let rules = self.rules.current();
        let plans = self.plan(&rules, req);
        let request_hits = if req.hits == 0 { 1 } else { req.hits };

        // Matching saw the values whole; limiters see them as
        // `limiter_identity` gives them (as RLQS's buckets do).
        let identities: Vec<_> = req
            .descriptors
            .iter()
            .zip(&plans)
            .map(|(d, plan)| {
                let steps = match plan {
                    Plan::Limited(l) => l.steps.as_slice(),
                    _ => &[],
                };
                limiter_identity(&d.entries, steps, self.options.max_value_bytes)
            })
            .collect();
        // The further limits of each descriptor with a `rate_limits:` list
        // (no allocation when the request has none).
        let listed = |p: &Plan<'_>| matches!(p, Plan::Limited(l) if !l.also.is_empty());
        let also: Vec<Vec<Also>> = if plans.iter().any(listed) {
            plans
                .iter()
                .map(|plan| match plan {
                    Plan::Limited(l) => l.also.iter().map(|(_, a)| also_of(a)).collect(),
                    _ => Vec::new(),
                })
                .collect()
        } else {
            Vec::new()
        };
        // One descriptor's store call; `check` asks with a cost of 0 (see
        // `undo::Engine::outcomes`).
        let call = |i: usize, check: bool| {
            let (entries, d, plan) = (&identities[i], &req.descriptors[i], &plans[i]);
            let also = also.get(i).map_or(&[][..], Vec::as_slice);
            async move {
                let Plan::Limited(Limited { limit, .. }) = plan else {
                    return None;
                };
                if limit.requests_per_unit == 0 {
                    return None;
                }
                let mut hit = hit_of(&req.domain, entries, d, limit, request_hits);
                hit.also = also;
                if check {
                    hit.hits = 0;
                }
                let Some(deadline) = req.deadline else {
                    return Some(self.store.hit(hit).await.map_err(Failure::from));
                };
                // Past the deadline nobody waits for the answer: do not
                // spend a store call on it. Cut off at the deadline, the
                // store call is dropped; the breaker does not count that
                // against the store (the caller's budget ran out, not the
                // store's).
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
        };
        // Descriptors of one request go to the store concurrently: on a
        // cluster they usually live on different nodes. Most requests have
        // one, which needs no joining.
        let n = req.descriptors.len();
        // Descriptors only checked (see `undo::Engine::outcomes`); empty,
        // without an allocation, unless some limiter takes receipts.
        let mut checked = Vec::new();
        let outcomes = if n == 1 {
            vec![call(0, false).await]
        } else if plans.iter().any(Plan::takes_receipts) {
            checked = vec![false; n];
            self.outcomes(&plans, req, &mut checked, call).await
        } else {
            join_all((0..n).map(|i| call(i, false))).await
        };

        let mut statuses = Vec::with_capacity(plans.len());
        let mut charges = Vec::new();
        let mut metadata = Vec::new();
        let mut any_over = false;
        let mut failed = None;
        let mut quota_total = 0;
        let mut quota_over = 0;
        let answers = req
            .descriptors
            .iter()
            .zip(&identities)
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
                    let rule = limited.rule;
                    let rule_metadata = rule.and_then(|r| r.metadata.clone());
                    // A `count_refused: false` limiter's charge waits for
                    // the overall answer, and so does its rule's count.
                    let charge = match &outcome {
                        Some(Ok(d)) if !limited.limit.count_refused => {
                            undo::Charge::of(index, &limited, d)
                        }
                        _ => None,
                    };
                    let only_checked = checked.get(index) == Some(&true);
                    let counted =
                        !only_checked && !charge.as_ref().is_some_and(|c| c.defers_count());
                    if only_checked {
                        let hits = descriptor.hits.unwrap_or(request_hits);
                        for i in 0..=limited.also.len() {
                            if let (Some(rule), _) = limited.part(i) {
                                self.count_taken_back(rule, entries, &limited.steps, hits);
                            }
                        }
                    }
                    let decided = self.decided(
                        index,
                        descriptor,
                        entries,
                        request_hits,
                        limited,
                        outcome,
                        counted,
                    );
                    let mut status = match decided {
                        Ok(status) => status,
                        Err(e) => {
                            // The request fails: what the other
                            // descriptors charged is taken back below.
                            failed.get_or_insert(e);
                            statuses.push(Status::no_limit());
                            continue;
                        }
                    };
                    charges.extend(charge);
                    let shadow = rule.is_some_and(|r| r.shadow_mode);
                    let quota = rule.is_some_and(|r| r.quota_mode);
                    if shadow {
                        status.code = Code::Ok;
                    } else if quota {
                        quota_total += 1;
                        if status.code == Code::OverLimit {
                            quota_over += 1;
                        }
                    } else if status.code == Code::OverLimit {
                        any_over = true;
                    }
                    if status.code == Code::Ok
                        && let Some(m) = rule_metadata
                    {
                        metadata.push(m);
                    }
                    status
                }
            };
            statuses.push(status);
        }
        if let Some(e) = failed {
            // As a refusal: the caller gets no OK for this request.
            if !charges.is_empty() {
                self.settle(charges, true, req, &identities, &statuses)
                    .await;
            }
            return Err(e);
        }
        let over = any_over || (quota_total > 0 && quota_over == quota_total);
        // By the answer enforcement gives: under global shadow mode too,
        // so that its counts preview enforcement's.
        if !charges.is_empty() {
            self.settle(charges, over, req, &identities, &statuses)
                .await;
        }
        let overall = if over && !self.options.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(Response {
            overall,
            statuses,
            metadata,
        })
    }
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
