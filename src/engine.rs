//! The decision: for one request, which limit applies to each descriptor and
//! is it over? The engine coordinates the rules (which limit?) and the store
//! (what count?); it knows nothing of gRPC or of Envoy's message types.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::clock::Clock;
use crate::limit::{Algorithm, DEFAULT_BUCKETS, FailurePolicy, Unit};
use crate::rules::{LimitSpec, Rule, RuleSet};
use crate::storage::keys::identity_entries;
use crate::storage::{Decision, Hit, Store, StoreError};

/// One descriptor of a request, protocol-neutral.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    pub entries: Vec<(String, String)>,
    /// A caller-supplied limit that replaces the configured one.
    pub limit_override: Option<LimitOverride>,
    /// Per-descriptor cost; wins over the request's when present (0 checks).
    pub hits: Option<u64>,
    /// Give the hits back instead of taking them.
    pub negative: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

/// A request, protocol-neutral.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub domain: String,
    pub descriptors: Vec<Descriptor>,
    /// The request-wide cost; 0 means 1.
    pub hits: u64,
    /// When the caller stops waiting (its `grpc-timeout`, less a margin):
    /// store calls are cut off there, and none starts after it.
    pub deadline: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The limit that was applied to a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedLimit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub name: Option<String>,
    pub algorithm: Algorithm,
    /// Buckets of a `sliding_window_counter` (the rule's, or the default).
    pub buckets: u8,
    /// Sub-limiters the limit is split over (`rate_limit.shards`; 1 when
    /// not sharded).
    pub shards: u16,
    /// Every positive cost is recorded (see `storage::Hit::usage_reports`).
    pub usage_reports: bool,
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    /// `None` when no limit applies (no rule, whitelist, unlimited).
    pub limit: Option<AppliedLimit>,
    /// `u32::MAX` for unlimited descriptors, 0 when no limit applies.
    pub remaining: u32,
    pub reset: Option<Duration>,
}

impl Status {
    fn no_limit() -> Self {
        Status {
            code: Code::Ok,
            limit: None,
            remaining: 0,
            reset: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub overall: Code,
    pub statuses: Vec<Status>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error("domain must not be empty")]
    EmptyDomain,
    #[error("descriptors must not be empty")]
    NoDescriptors,
    #[error("descriptor {index}: {reason}")]
    BadDescriptor { index: usize, reason: String },
    #[error("descriptor {index}: {source}")]
    Store { index: usize, source: StoreError },
    /// The caller's deadline passed before the store answered (or before
    /// the call was made: such calls are not sent at all).
    #[error("descriptor {index}: the caller's deadline passed before the store answered")]
    DeadlineExceeded { index: usize },
    /// Too many store calls were waiting and `on_overload` says error.
    #[error("descriptor {index}: over max_in_flight={max}: too many store calls in flight")]
    Overloaded { index: usize, max: usize },
}

/// Settings the engine applies where a rule is silent.
#[derive(Debug, Clone, Copy)]
pub struct EngineOptions {
    pub default_algorithm: Algorithm,
    pub on_store_error: FailurePolicy,
    /// What a store call refused by the in-flight gate answers
    /// (`storage::gate`); rules' own `on_store_error` does not apply.
    pub on_overload: FailurePolicy,
    /// Global shadow mode: count everything, always answer OK overall.
    pub shadow_mode: bool,
    /// Largest `requests_per_unit` a `sliding_window_log` limit may have
    /// (one stored member per admitted hit); request overrides above it are
    /// refused.
    pub max_log_limit: u32,
    /// Hits past this share of a limit count as near it, in rule stats.
    pub near_limit_ratio: f64,
    /// Distinct descriptor values a `detailed_metric` rule counts apart;
    /// the rest share one overflow series.
    pub detailed_metric_max_series: usize,
    /// Longest value kept as it is in a limiter's identity; longer ones
    /// enter it as a digest (`storage::keys::identity_value`).
    pub max_value_bytes: usize,
    /// `usage_reports` of rules that do not say. `None`: rules that name
    /// no algorithm record every positive cost, as the reference's fixed
    /// window does (Envoy Gateway's rules name none, and its cost reports
    /// must close a budget); rules that name one record admitted hits.
    pub usage_reports: Option<bool>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            default_algorithm: Algorithm::SlidingWindowCounter,
            on_store_error: FailurePolicy::Error,
            on_overload: FailurePolicy::Error,
            shadow_mode: false,
            max_log_limit: 10_000,
            near_limit_ratio: 0.8,
            detailed_metric_max_series: 100,
            max_value_bytes: crate::storage::keys::DEFAULT_MAX_VALUE_BYTES,
            usage_reports: None,
        }
    }
}

/// Counts of what requests met, for logs and metrics: per-request failures
/// are counted here instead of being logged one by one.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Store calls that failed, by the answer given: the policy said error
    /// (the request failed), allow, or deny.
    pub store_errors_failed: AtomicU64,
    pub store_errors_allowed: AtomicU64,
    pub store_errors_denied: AtomicU64,
    /// Store calls cut off, or never made, because the caller's deadline
    /// passed.
    pub deadline_exceeded: AtomicU64,
    /// Store calls refused by the in-flight gate, by the answer given
    /// (`on_overload`).
    pub overloaded_failed: AtomicU64,
    pub overloaded_allowed: AtomicU64,
    pub overloaded_denied: AtomicU64,
}

impl EngineStats {
    /// Every store failure answered so far, whatever the policy.
    pub fn store_errors(&self) -> u64 {
        self.store_errors_failed.load(Ordering::Relaxed)
            + self.store_errors_allowed.load(Ordering::Relaxed)
            + self.store_errors_denied.load(Ordering::Relaxed)
    }
}

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

/// Why a store call gave no decision.
enum Failure {
    Store(StoreError),
    Deadline,
    /// Refused by the in-flight gate (never reached the store).
    Overloaded(usize),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Overloaded(max) => Failure::Overloaded(max),
            e => Failure::Store(e),
        }
    }
}

/// What one descriptor resolved to before counting.
enum Plan<'r> {
    NoLimit,
    Unlimited,
    Limited {
        rule: Option<&'r Rule>,
        limit: AppliedLimit,
        policy: FailurePolicy,
    },
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
                && self.options.default_algorithm == Algorithm::SlidingWindowLog
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

        // Matching saw the values whole; limiters see long ones as digests.
        let identities: Vec<_> = req
            .descriptors
            .iter()
            .map(|d| identity_entries(&d.entries, self.options.max_value_bytes))
            .collect();
        let mut calls = identities.iter().zip(&req.descriptors).zip(&plans).map(
            |((entries, d), plan)| async move {
                let Plan::Limited { limit, .. } = plan else {
                    return None;
                };
                if limit.requests_per_unit == 0 {
                    return None;
                }
                let hit = Hit {
                    domain: &req.domain,
                    entries,
                    algorithm: limit.algorithm,
                    limit: u64::from(limit.requests_per_unit),
                    unit: limit.unit,
                    hits: d.hits.unwrap_or(request_hits),
                    negative: d.negative,
                    usage_reports: limit.usage_reports,
                    buckets: limit.buckets,
                    shard: crate::storage::Shard {
                        index: 0,
                        count: limit.shards,
                    },
                };
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
            },
        );
        // Descriptors of one request go to the store concurrently: on a
        // cluster they usually live on different nodes. Most requests have
        // one, which needs no joining.
        let outcomes = if req.descriptors.len() == 1 {
            match calls.next() {
                Some(call) => vec![call.await],
                None => Vec::new(),
            }
        } else {
            join_all(calls).await
        };

        let mut statuses = Vec::with_capacity(plans.len());
        let mut any_over = false;
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
                Plan::Limited {
                    rule,
                    limit,
                    policy,
                } => {
                    let mut status = match outcome {
                        // A zero limit is a ban: no store needed.
                        None => {
                            if let Some(rule) = rule {
                                let hits = descriptor.hits.unwrap_or(request_hits);
                                let refused = Decision {
                                    admitted: false,
                                    remaining: 0,
                                    reset_micros: 0,
                                };
                                self.count(rule, entries, hits, &limit, &refused);
                            }
                            let w = limit.unit.micros();
                            let now = self.clock.now_micros();
                            Status {
                                code: Code::OverLimit,
                                reset: Some(Duration::from_micros(w - now % w)),
                                limit: Some(limit),
                                remaining: 0,
                            }
                        }
                        Some(Ok(decision)) => {
                            if let Some(rule) = rule
                                && !descriptor.negative
                            {
                                let hits = descriptor.hits.unwrap_or(request_hits);
                                self.count(rule, entries, hits, &limit, &decision);
                            }
                            limited_status(limit, decision, descriptor.negative)
                        }
                        Some(Err(failure)) => {
                            let policy = match failure {
                                Failure::Overloaded(_) => self.options.on_overload,
                                _ => policy,
                            };
                            self.count_failure(&failure, policy);
                            match policy {
                                FailurePolicy::Error => {
                                    return Err(match failure {
                                        Failure::Deadline => {
                                            EngineError::DeadlineExceeded { index }
                                        }
                                        Failure::Store(source) => {
                                            EngineError::Store { index, source }
                                        }
                                        Failure::Overloaded(max) => {
                                            EngineError::Overloaded { index, max }
                                        }
                                    });
                                }
                                FailurePolicy::Allow => Status {
                                    code: Code::Ok,
                                    remaining: limit.requests_per_unit,
                                    reset: None,
                                    limit: Some(limit),
                                },
                                FailurePolicy::Deny => Status {
                                    code: Code::OverLimit,
                                    remaining: 0,
                                    reset: None,
                                    limit: Some(limit),
                                },
                            }
                        }
                    };
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
                    status
                }
            };
            statuses.push(status);
        }
        let over = any_over || (quota_total > 0 && quota_over == quota_total);
        let overall = if over && !self.options.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(Response { overall, statuses })
    }

    /// Adds one decided call to its rule's stats (and, for a
    /// `detailed_metric` rule, to its descriptor value's).
    fn count(
        &self,
        rule: &Rule,
        entries: &[(String, String)],
        hits: u64,
        limit: &AppliedLimit,
        d: &Decision,
    ) {
        let max = u64::from(limit.requests_per_unit);
        let threshold = (max as f64 * self.options.near_limit_ratio).floor() as u64;
        let shadow = rule.shadow_mode;
        rule.stats
            .counts()
            .record(hits, max, threshold, d.admitted, d.remaining, shadow);
        // A zero limit never reaches the store, which records nothing.
        let recorded_over = limit.usage_reports && !d.admitted && hits > 0 && max > 0;
        if recorded_over {
            rule.stats.counts().record_reported_over(hits);
        }
        if rule.detailed_metric {
            let value = detailed_value(entries);
            rule.stats
                .detailed(&value, self.options.detailed_metric_max_series)
                .record(hits, max, threshold, d.admitted, d.remaining, shadow);
        }
    }

    fn count_failure(&self, failure: &Failure, policy: FailurePolicy) {
        let s = &self.stats;
        let counter = match (failure, policy) {
            (Failure::Deadline, _) => &s.deadline_exceeded,
            (Failure::Store(_), FailurePolicy::Error) => &s.store_errors_failed,
            (Failure::Store(_), FailurePolicy::Allow) => &s.store_errors_allowed,
            (Failure::Store(_), FailurePolicy::Deny) => &s.store_errors_denied,
            (Failure::Overloaded(_), FailurePolicy::Error) => &s.overloaded_failed,
            (Failure::Overloaded(_), FailurePolicy::Allow) => &s.overloaded_allowed,
            (Failure::Overloaded(_), FailurePolicy::Deny) => &s.overloaded_denied,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Resolves every descriptor to a limit, applying overrides and
    /// `replaces` across the request.
    fn plan<'r>(&self, rules: &'r RuleSet, req: &Request) -> Vec<Plan<'r>> {
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
            .map(|(rule, over)| {
                if let Some(o) = over {
                    return Plan::Limited {
                        rule: None,
                        limit: AppliedLimit {
                            requests_per_unit: o.requests_per_unit,
                            unit: o.unit,
                            name: None,
                            algorithm: self.options.default_algorithm,
                            buckets: DEFAULT_BUCKETS,
                            shards: 1,
                            // Names no algorithm.
                            usage_reports: self.options.usage_reports.unwrap_or(true),
                        },
                        policy: self.options.on_store_error,
                    };
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
                        unit,
                    } => Plan::Limited {
                        rule: Some(rule),
                        limit: AppliedLimit {
                            requests_per_unit,
                            unit,
                            name: rule.name.clone(),
                            algorithm: rule.algorithm.unwrap_or(self.options.default_algorithm),
                            buckets: rule.buckets.unwrap_or(DEFAULT_BUCKETS),
                            shards: rule.shards.unwrap_or(1),
                            usage_reports: rule
                                .usage_reports
                                .or(self.options.usage_reports)
                                .unwrap_or(rule.algorithm.is_none()),
                        },
                        policy: rule.on_store_error.unwrap_or(self.options.on_store_error),
                    },
                }
            })
            .collect()
    }
}

/// A descriptor's runtime values as one label: `key_value.key2_value2`.
fn detailed_value(entries: &[(String, String)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(k);
        if !v.is_empty() {
            out.push('_');
            out.push_str(v);
        }
    }
    out
}

fn limited_status(limit: AppliedLimit, d: Decision, negative: bool) -> Status {
    Status {
        // Giving hits back always answers OK.
        code: if d.admitted || negative {
            Code::Ok
        } else {
            Code::OverLimit
        },
        remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        reset: Some(Duration::from_micros(d.reset_micros)),
        limit: Some(limit),
    }
}
