//! The `lease` key: a limiter a replica may decide from quota it leased
//! from the store (see `storage::lease`). Only where the bound holds as
//! built: a fixed window in plain (not calendar) windows, not sharded,
//! counting refused requests, not taking usage reports. Anything else
//! saying `lease: true` is an error naming why.

use super::yaml::{Fields, Walker, join, key_line};
use crate::limit::{Algorithm, Window};

/// What decides whether a limit may be leased.
pub(super) struct Leasable {
    pub algorithm: Option<Algorithm>,
    pub window: Option<Window>,
    pub shards: Option<u16>,
    pub usage_reports: Option<bool>,
    pub count_refused: Option<bool>,
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
        let effective = l.algorithm.unwrap_or(self.options.default_algorithm);
        let why = if effective != Algorithm::FixedWindow {
            let inherited = if l.algorithm.is_none() {
                " (the default_algorithm, as the rule names none)"
            } else {
                ""
            };
            Some(format!(
                "lease: true applies to fixed_window only, not {effective}{inherited}: \
                 the other algorithms are decided in the store on every hit"
            ))
        } else if l.window.is_some_and(|w| w.zone().is_some()) {
            Some("lease: true does not apply to a calendar window (timezone)".to_string())
        } else if l.shards.is_some_and(|s| s > 1) {
            Some(
                "lease: true with shards: a leased limiter needs none (its hits are decided \
                 from leased quota, not in its slot); drop shards"
                    .to_string(),
            )
        } else if l.usage_reports == Some(true) {
            Some(
                "lease: true cannot go with usage_reports: true (a reported cost is recorded \
                 whatever it answers, past any lease)"
                    .to_string(),
            )
        } else if l.count_refused == Some(false) {
            Some("lease: true cannot go with count_refused: false".to_string())
        } else {
            None
        };
        match why {
            Some(reason) => {
                self.error(line, &join(path, "lease"), reason);
                None
            }
            None => Some(true),
        }
    }
}
