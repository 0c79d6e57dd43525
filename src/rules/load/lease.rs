//! The `lease` key: a limiter a replica may decide from quota it leased
//! from the store (see `storage::lease`). Only where the bound holds as
//! built: a fixed window in plain (not calendar) windows, a sliding
//! counter, a sliding log or a token bucket, not sharded, counting
//! refused requests, not taking usage reports. Anything else
//! saying `lease: true` is an error naming why.

use super::yaml::{Fields, Walker, join, key_line};
use crate::limit::algorithms::Leasing;
use crate::limit::{Algorithm, Window};
use crate::rules::{LimitSpec, Rule};

/// What decides whether a limit may be leased.
pub(crate) struct Leasable {
    pub algorithm: Option<Algorithm>,
    pub window: Option<Window>,
    pub shards: Option<u16>,
    pub usage_reports: Option<bool>,
    pub count_refused: Option<bool>,
    /// One limit of a `rate_limits:` list.
    pub in_list: bool,
}

impl Leasable {
    /// What a rule's own keys say of it.
    pub(crate) fn of(rule: &Rule) -> Leasable {
        Leasable {
            algorithm: rule.algorithm,
            window: match rule.limit {
                LimitSpec::PerUnit { window, .. } => Some(window),
                LimitSpec::Unlimited => None,
            },
            shards: rule.shards,
            usage_reports: rule.usage_reports,
            count_refused: Some(rule.count_refused),
            in_list: !rule.more.is_empty(),
        }
    }

    /// Why such a limit may not be leased (`default` being the algorithm
    /// of rules that name none); `None` when it may. Nothing is formatted
    /// here: the request path asks this of every rule it decides.
    pub(crate) fn obstacle(&self, default: Algorithm) -> Option<Obstacle> {
        let effective = self.algorithm.unwrap_or(default);
        if let Leasing::Never(why) = effective.spec().leasing {
            Some(Obstacle::Algorithm {
                effective,
                inherited: self.algorithm.is_none(),
                why,
            })
        } else if self.in_list {
            Some(Obstacle::List)
        } else if self.window.is_some_and(|w| w.zone().is_some()) {
            Some(Obstacle::Calendar)
        } else if self.shards.is_some_and(|s| s > 1) {
            Some(Obstacle::Shards)
        } else if self.usage_reports == Some(true) {
            Some(Obstacle::UsageReports)
        } else if self.count_refused == Some(false) {
            Some(Obstacle::Uncounted)
        } else {
            None
        }
    }
}

/// Why a limit may not be leased; its text is validation's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Obstacle {
    /// Its algorithm cannot lease (`inherited`: from `default_algorithm`).
    Algorithm {
        effective: Algorithm,
        inherited: bool,
        why: &'static str,
    },
    List,
    Calendar,
    Shards,
    UsageReports,
    Uncounted,
}

impl std::fmt::Display for Obstacle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Obstacle::Algorithm {
                effective,
                inherited,
                why,
            } => {
                let leasable: Vec<&str> = Algorithm::leasable().map(Algorithm::as_str).collect();
                let inherited = if inherited {
                    " (the default_algorithm, as the rule names none)"
                } else {
                    ""
                };
                write!(
                    f,
                    "lease: true applies to {} only, not {effective}{inherited}: {why}",
                    leasable.join(", ")
                )
            }
            Obstacle::List => f.write_str(
                "lease: true has no place in a rate_limits list: a list is decided in one \
                 store call",
            ),
            Obstacle::Calendar => {
                f.write_str("lease: true does not apply to a calendar window (timezone)")
            }
            Obstacle::Shards => f.write_str(
                "lease: true with shards: a leased limiter needs none (its hits are decided \
                 from leased quota, not in its slot); drop shards",
            ),
            Obstacle::UsageReports => f.write_str(
                "lease: true cannot go with usage_reports: true (a reported cost is recorded \
                 whatever it answers, past any lease)",
            ),
            Obstacle::Uncounted => f.write_str("lease: true cannot go with count_refused: false"),
        }
    }
}

impl Walker<'_> {
    /// The rule's `lease`: `None` when it does not say.
    pub(super) fn lease(&mut self, fields: &Fields<'_>, l: Leasable, path: &str) -> Option<bool> {
        fields.get("lease")?;
        let own = self.flag(fields, path, "lease")?;
        if !own {
            return Some(false);
        }
        let line = fields.get("lease").and_then(|(k, _)| key_line(k));
        match l.obstacle(self.options.default_algorithm) {
            Some(reason) => {
                self.error(line, &join(path, "lease"), reason.to_string());
                None
            }
            None => Some(true),
        }
    }
}
