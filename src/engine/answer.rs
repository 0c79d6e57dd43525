//! From a store's answer (or its failure) to a descriptor's status: the
//! failure policies, and the rule's counters.
//!
//! A refused cost above the limit ([`AppliedLimit::capacity`]: a token
//! bucket's burst; each limit of a `rate_limits:` list on its own) can
//! never pass, whenever it is retried. Its status stays OVER_LIMIT (never
//! failing open) and keeps `limit`, so Envoy's headers still say the
//! limit, but it carries no reset: a client that honours the reset would
//! otherwise retry forever. A usage report is not such a call: its cost
//! was spent already, and the reset says when the debt it left is paid.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::limit::FailurePolicy;
use crate::rules::{Rule, Step};
use crate::storage::{Decision, StoreError};

use super::plan::Limited;
use super::{AppliedLimit, Code, Descriptor, Engine, EngineError, Status};

/// Why a store call gave no decision.
pub(super) enum Failure {
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

/// What a store call for one counted descriptor came to: `None` when no
/// call was made (a zero limit).
pub(super) type Outcome = Option<Result<Decision, Failure>>;

impl Engine {
    /// The status of counted descriptor `index` (before shadow and quota
    /// modes), its rule's counters updated (unless not `counted` yet: an
    /// admission that may be taken back); an error when its store call
    /// failed and the policy says error.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decided(
        &self,
        index: usize,
        descriptor: &Descriptor,
        entries: &[(String, String)],
        request_hits: u64,
        limited: Limited<'_>,
        outcome: Outcome,
        counted: bool,
    ) -> Result<Status, EngineError> {
        let hits = descriptor.hits.unwrap_or(request_hits);
        Ok(match outcome {
            // A zero limit is a ban: no store needed.
            None => self.zero_limit_status(entries, hits, limited),
            Some(Ok(decision)) if !limited.also.is_empty() => {
                self.list_status(descriptor, entries, hits, limited, decision, counted)
            }
            Some(Ok(decision)) => {
                self.single_status(descriptor, entries, hits, limited, decision, counted)
            }
            Some(Err(failure)) => self.failure_status(index, limited, failure)?,
        })
    }

    /// The status of a zero limit, a ban decided without the store: over
    /// the limit until the window ends, counted on its rule as a refusal.
    fn zero_limit_status(
        &self,
        entries: &[(String, String)],
        hits: u64,
        limited: Limited<'_>,
    ) -> Status {
        let Limited {
            rule, steps, limit, ..
        } = limited;
        if let Some(rule) = rule {
            let refused = Decision {
                admitted: false,
                remaining: 0,
                reset_micros: 0,
                receipt: None,
                group: None,
            };
            self.count(rule, entries, &steps, hits, &limit, &refused);
        }
        let now = self.clock.now_micros();
        let end = limit.window.span(now).end;
        Status {
            code: Code::OverLimit,
            reset: Some(Duration::from_micros(end.saturating_sub(now))),
            limit: Some(limit),
            remaining: 0,
        }
    }

    /// The status of a `rate_limits:` list: each limit's rule counts its
    /// own answer; the status names the limit the answer describes, or the
    /// first the cost is above (it never passes).
    fn list_status(
        &self,
        descriptor: &Descriptor,
        entries: &[(String, String)],
        hits: u64,
        limited: Limited<'_>,
        decision: Decision,
        counted: bool,
    ) -> Status {
        let Limited {
            rule,
            steps,
            limit,
            also,
            ..
        } = limited;
        if !descriptor.negative && counted {
            self.count_parts(entries, &steps, hits, (rule, &limit), &also, &decision);
        }
        let never = (0..=also.len()).find(|&i| {
            let part = match i.checked_sub(1) {
                Some(i) => &also[i].1,
                None => &limit,
            };
            never_passes(part, hits, descriptor, &decision)
        });
        let which = never.unwrap_or_else(|| decision.which());
        // What that limit has left, when the answer says it.
        let own = never
            .and_then(|i| decision.group.as_ref()?.parts.get(i))
            .map(|part| part.remaining);
        let (rule, limit) = match which.checked_sub(1).and_then(|i| also.into_iter().nth(i)) {
            Some((rule, limit)) => (Some(rule), limit),
            None => (rule, limit),
        };
        let mut status = limited_status(limit, decision, descriptor.negative);
        if never.is_some() {
            self.cannot_pass(rule, &mut status);
        }
        if let Some(remaining) = own {
            status.remaining = u32::try_from(remaining).unwrap_or(u32::MAX);
        }
        status
    }

    /// The status of a single limit's answer, counted on its rule.
    fn single_status(
        &self,
        descriptor: &Descriptor,
        entries: &[(String, String)],
        hits: u64,
        limited: Limited<'_>,
        decision: Decision,
        counted: bool,
    ) -> Status {
        let Limited {
            rule, steps, limit, ..
        } = limited;
        if let Some(rule) = rule
            && !descriptor.negative
            && counted
        {
            self.count(rule, entries, &steps, hits, &limit, &decision);
        }
        let never = never_passes(&limit, hits, descriptor, &decision);
        let mut status = limited_status(limit, decision, descriptor.negative);
        if never {
            self.cannot_pass(rule, &mut status);
        }
        status
    }

    /// The status of a failed store call, by its policy (`on_overload`
    /// for a call the in-flight gate refused), the failure counted; an
    /// error when the policy says error.
    fn failure_status(
        &self,
        index: usize,
        limited: Limited<'_>,
        failure: Failure,
    ) -> Result<Status, EngineError> {
        let limit = limited.limit;
        let policy = match failure {
            Failure::Overloaded(_) => self.options.on_overload,
            _ => limited.policy,
        };
        self.count_failure(&failure, policy);
        Ok(match policy {
            FailurePolicy::Error => {
                return Err(match failure {
                    Failure::Deadline => EngineError::DeadlineExceeded { index },
                    Failure::Store(source) => EngineError::Store { index, source },
                    Failure::Overloaded(max) => EngineError::Overloaded { index, max },
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
        })
    }

    /// Adds one decided call to its rule's stats (and, for a
    /// `detailed_metric` or `value_to_metric` rule, to its series named by
    /// the descriptor's values).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn count(
        &self,
        rule: &Rule,
        entries: &[(String, String)],
        steps: &[Step<'_>],
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
        if let Some(value) = metric_label(rule, entries, steps) {
            rule.stats
                .detailed(&value, self.options.detailed_metric_max_series)
                .record(hits, max, threshold, d.admitted, d.remaining, shadow);
        }
    }

    /// Adds one decided call on a `rate_limits:` list to each limit's
    /// rule: what that limit answered on its own.
    pub(super) fn count_parts(
        &self,
        entries: &[(String, String)],
        steps: &[Step<'_>],
        hits: u64,
        first: (Option<&Rule>, &AppliedLimit),
        also: &[(&Rule, AppliedLimit)],
        d: &Decision,
    ) {
        let parts = std::iter::once(first).chain(also.iter().map(|(r, l)| (Some(*r), l)));
        for (i, (rule, limit)) in parts.enumerate() {
            let own = d.group.as_ref().and_then(|g| g.parts.get(i)).unwrap_or(d);
            if let Some(rule) = rule {
                self.count(rule, entries, steps, hits, limit, own);
            }
        }
    }

    /// Marks a refused status whose cost can never pass: no reset (see
    /// the module's docs), and counted on its rule.
    fn cannot_pass(&self, rule: Option<&Rule>, status: &mut Status) {
        status.reset = None;
        if let Some(rule) = rule {
            self.stats
                .record_cost_above_limit(&rule.source.file, &rule.path);
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
}

/// The series a call of a `detailed_metric` or `value_to_metric` rule
/// counts on, named as the reference service names its metric keys
/// (`key_value.key2`): `detailed_metric` names every runtime value;
/// `value_to_metric` names the runtime value where the node matched has no
/// value of its own (the key alone) or a wildcard, and the configured
/// value elsewhere. A value a `share_threshold` wildcard matched is named
/// by the pattern either way. `None` for other rules.
pub(super) fn metric_label(
    rule: &Rule,
    entries: &[(String, String)],
    steps: &[Step<'_>],
) -> Option<String> {
    if !rule.detailed_metric && !rule.value_to_metric {
        return None;
    }
    let mut out = String::new();
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(k);
        let shown: &str = match steps.get(i) {
            Some(Step::Wildcard {
                pattern,
                shared: true,
                ..
            }) => pattern,
            _ if rule.detailed_metric => v,
            Some(Step::Wildcard {
                pattern,
                value_to_metric,
                ..
            }) => {
                if *value_to_metric {
                    v
                } else {
                    pattern
                }
            }
            Some(Step::Default { value_to_metric }) => {
                if *value_to_metric {
                    v
                } else {
                    ""
                }
            }
            Some(Step::Exact) | None => v,
        };
        if !shown.is_empty() {
            out.push('_');
            out.push_str(shown);
        }
    }
    Some(out)
}

/// Whether `d`, a refusal of a cost of `hits` under `limit`, refused what
/// no call can ever be admitted.
fn never_passes(limit: &AppliedLimit, hits: u64, descriptor: &Descriptor, d: &Decision) -> bool {
    !d.admitted && !descriptor.negative && !limit.usage_reports && hits > limit.capacity()
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
