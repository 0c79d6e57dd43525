//! Resetting limiters: the descriptors of a request resolved exactly as a
//! decision resolves them (`plan`: overrides, `replaces`, digested long
//! values, `share_threshold` marks), then every limiter they count on
//! forgotten by the store ([`crate::storage::Store::reset`]: every shard,
//! the lease ledger, the over-limit caches). Nothing is reset unless every
//! descriptor names a limiter.

use crate::rules::Rule;
use crate::storage::StoreError;

use super::plan::{Limited, Plan};
use super::{AppliedLimit, Engine, EngineError, Request, hit_of, limiter_identity};

/// One limiter a reset forgot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetLimiter {
    /// The descriptor's place in the request.
    pub descriptor: usize,
    /// The rule whose limiter it is; `None` for a caller's override.
    pub rule: Option<ResetRule>,
    pub limit: AppliedLimit,
}

/// The rule of a limiter that was reset, as `/rlconfig` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetRule {
    pub path: String,
    pub name: Option<String>,
    /// Where it was written: `file.yaml:12`.
    pub source: String,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ResetError {
    /// The request itself is malformed (no domain, no descriptors, an
    /// empty descriptor).
    #[error(transparent)]
    Invalid(EngineError),
    #[error("no rule file names domain {0:?}")]
    UnknownDomain(String),
    /// The descriptor counts on no limiter: no rule matches it, or the
    /// rule is a whitelist, unlimited, a ban or replaced.
    #[error("descriptor {index} matches no rule with a limit")]
    NoLimit { index: usize },
    #[error("descriptor {index}: {source}")]
    Store { index: usize, source: StoreError },
}

/// The limiters a descriptor's plan counts on, through which a reset goes:
/// its limit, and every further limit of a `rate_limits:` list, each with
/// its rule.
fn limits<'p, 'r>(
    limited: &'p Limited<'r>,
) -> impl Iterator<Item = (Option<&'r Rule>, &'p AppliedLimit)> {
    (0..=limited.also.len()).map(|i| limited.part(i))
}

impl Engine {
    /// Forgets every limiter `req`'s descriptors count on, so each has its
    /// whole limit back; the others keep their state. Checks every
    /// descriptor before resetting any. Counted per domain and rule
    /// ([`super::EngineStats::resets`]).
    pub async fn reset(&self, req: &Request) -> Result<Vec<ResetLimiter>, ResetError> {
        if req.domain.is_empty() {
            return Err(ResetError::Invalid(EngineError::EmptyDomain));
        }
        if req.descriptors.is_empty() {
            return Err(ResetError::Invalid(EngineError::NoDescriptors));
        }
        if let Some(index) = req.descriptors.iter().position(|d| d.entries.is_empty()) {
            return Err(ResetError::Invalid(EngineError::BadDescriptor {
                index,
                reason: "a descriptor needs at least one entry".into(),
            }));
        }
        let rules = self.rules.current();
        if !rules.has_domain(&req.domain) {
            return Err(ResetError::UnknownDomain(req.domain.clone()));
        }
        let plans = self.plan(&rules, req);
        let mut limited = Vec::with_capacity(plans.len());
        for (index, plan) in plans.iter().enumerate() {
            match plan {
                Plan::Limited(l) if l.limit.requests_per_unit > 0 => limited.push((index, l)),
                _ => return Err(ResetError::NoLimit { index }),
            }
        }
        let mut done = Vec::new();
        for (index, l) in limited {
            let d = &req.descriptors[index];
            let entries = limiter_identity(&d.entries, &l.steps, self.options.max_value_bytes);
            for (rule, limit) in limits(l) {
                let hit = hit_of(&req.domain, &entries, d, limit, 0);
                self.store
                    .reset(hit)
                    .await
                    .map_err(|source| ResetError::Store { index, source })?;
                let rule = rule.map(reset_rule);
                let label = rule.as_ref().map_or("", |r| r.path.as_str());
                self.stats.record_reset(&req.domain, label);
                done.push(ResetLimiter {
                    descriptor: index,
                    rule,
                    limit: limit.clone(),
                });
            }
        }
        Ok(done)
    }
}

fn reset_rule(rule: &Rule) -> ResetRule {
    ResetRule {
        path: rule.path.clone(),
        name: rule.name.clone(),
        source: rule.source.to_string(),
    }
}
