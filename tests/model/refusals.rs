//! The oracle's other half: a refusal needs a reason. The bounds catch a
//! limit passed; they cannot see a store that counts more than it
//! admitted (a take-back lost, a hit charged twice), which only refuses
//! too much. Where the model can tell exactly what the store recorded,
//! a descriptor refused while those hits leave room for its cost is such
//! a defect.
//!
//! The model can tell on the sliding log and the token bucket (which
//! record admitted hits only), decided one call at a time, on a limiter no
//! fault, lease, shard, usage report, hit given back, shadow mode or
//! concurrent caller has touched since its last reset: a descriptor
//! answered OK recorded its cost (with `count_refused: false`, only in an
//! answer OK overall), one refused recorded nothing.
//!
//! A limit in flight (`concurrency`) is not followed: what its refused
//! takes owe and which slot a release frees are the store's state, which
//! the model does not rebuild. Its refused combinations at load are drawn
//! by the grammar (`grammar::refuse_in_flight`) and must name their file
//! and line as every other refusal (`draw_case`).

use std::collections::BTreeMap;

use tollgate::engine::{Code, Response};
use tollgate::limit::Algorithm;

use super::grammar::{Limit, Rules};
use super::oracle::LimiterKey;
use super::world::Req;

#[derive(Default)]
struct History {
    /// What the store recorded since the last reset: (time, cost).
    recorded: Vec<(u64, u64)>,
    /// Something the model cannot follow touched it: its refusals are
    /// not checked until its next reset.
    blind: bool,
    /// The replica the last reset went through: another replica's
    /// over-limit cache may still hold a refusal from before it (it
    /// learns of the reset when it reads the store's reset generation,
    /// which a store no other process shares never moves).
    reset_by: Option<usize>,
}

#[derive(Default)]
pub struct Refusals {
    limiters: BTreeMap<LimiterKey, History>,
    /// Store faults are in force on some replica: every limiter touched
    /// meanwhile goes blind.
    pub blind: bool,
    pub checked: u64,
}

/// Whether `limit` admits `cost` at `now` after `recorded`, allowing the
/// store a microsecond and a token of rounding either way: `Some(true)`
/// surely, `Some(false)` surely not, `None` too close to tell.
fn room(limit: &Limit, recorded: &[(u64, u64)], now: u64, cost: u64) -> Option<bool> {
    match limit.algorithm {
        Algorithm::SlidingWindowLog => {
            let w = limit.window_micros();
            let wide: u64 = recorded
                .iter()
                .filter(|(t, _)| *t + w + 1 > now)
                .map(|(_, c)| c)
                .sum();
            let narrow: u64 = recorded
                .iter()
                .filter(|(t, _)| *t + w > now + 1)
                .map(|(_, c)| c)
                .sum();
            if wide + cost <= limit.limit {
                Some(true)
            } else if narrow + cost > limit.limit {
                Some(false)
            } else {
                None
            }
        }
        Algorithm::TokenBucket => {
            let burst = limit.burst() as f64;
            let per_micro = limit.limit as f64 / limit.window_micros() as f64;
            let mut tokens = burst;
            let mut at = recorded.first().map_or(now, |(t, _)| *t);
            for (t, c) in recorded {
                tokens = (tokens + (*t - at) as f64 * per_micro).min(burst) - *c as f64;
                at = *t;
            }
            tokens = (tokens + (now - at) as f64 * per_micro).min(burst);
            if tokens >= cost as f64 + 1.0 {
                Some(true)
            } else if tokens + 1.0 < cost as f64 {
                Some(false)
            } else {
                None
            }
        }
        _ => None,
    }
}

impl Refusals {
    /// `blind`: no refusal is checked (the real clock, where a call's
    /// moment is not exact).
    pub fn new(blind: bool) -> Refusals {
        Refusals {
            blind,
            ..Refusals::default()
        }
    }

    fn history(&mut self, key: &LimiterKey) -> &mut History {
        self.limiters.entry(key.clone()).or_default()
    }

    /// A reset: the limiter starts again with nothing recorded, and what
    /// made it blind is behind it (unless the reset came among
    /// concurrent callers: then it stays blind).
    pub fn reset(&mut self, key: LimiterKey, replica: usize, clean: bool) {
        let h = self.history(&key);
        h.recorded.clear();
        h.blind = !clean;
        h.reset_by = Some(replica);
    }

    /// One answer through `replica`, decided alone (`alone`) or among
    /// concurrent callers; its refusals are checked only through a known
    /// replica (`None`: one whose wall clock stepped, which times its
    /// cached refusals on it).
    /// `Err` with the refusal that had no reason.
    pub fn note(
        &mut self,
        replica: Option<usize>,
        rules: &Rules,
        req: &Req,
        answer: &Result<Response, String>,
        now: u64,
        alone: bool,
    ) -> Result<(), String> {
        let Ok(resp) = answer else {
            // An error: what was recorded is unknown.
            for d in &req.descriptors {
                if let Some(r) = rules.find(&d.key, &d.value) {
                    for k in 0..rules.rules[r].limits.len() {
                        self.history(&(r, k, rules.identity(r, &d.value))).blind = true;
                    }
                }
            }
            return Ok(());
        };
        // A descriptor with its own limit (an override) is not judged; it
        // may count on a rule's limiter of the same entries (same
        // algorithm and unit), which the check then cannot follow.
        for d in req.descriptors.iter().filter(|d| d.limit.is_some()) {
            if let Some(r) = rules.find(&d.key, &d.value) {
                for k in 0..rules.rules[r].limits.len() {
                    self.history(&(r, k, rules.identity(r, &d.value))).blind = true;
                }
            }
        }
        let (keys, replaced) = req.matched(rules);
        for (i, d) in req.descriptors.iter().enumerate() {
            let Some(r) = keys[i] else { continue };
            let rule = &rules.rules[r];
            let identity = rules.identity(r, &d.value);
            let cost = req.cost(d);
            // The same limiter twice in one request: their order is the
            // engine's.
            let twice = req.descriptors.iter().enumerate().any(|(j, o)| {
                j != i && keys[j] == Some(r) && rules.identity(r, &o.value) == identity
            });
            let unfollowable = self.blind
                || !alone
                || twice
                || d.negative
                || rule.leases()
                || rule.shards > 1
                || rule.shadow
                || rule.usage_reports
                || rule
                    .limits
                    .iter()
                    .any(|l| replaced.contains(&l.name.as_str()))
                || rule.limits.iter().any(|l| {
                    !matches!(
                        l.algorithm,
                        Algorithm::SlidingWindowLog | Algorithm::TokenBucket
                    )
                });
            let limiters: Vec<LimiterKey> = (0..rule.limits.len())
                .map(|k| (r, k, identity.clone()))
                .collect();
            if unfollowable {
                for key in &limiters {
                    self.history(key).blind = true;
                }
                continue;
            }
            let ok = resp.statuses[i].code == Code::Ok;
            if ok {
                let recorded = resp.overall == Code::Ok || rule.count_refused != Some(false);
                if recorded && cost > 0 {
                    for key in &limiters {
                        self.history(key).recorded.push((now, cost));
                    }
                }
                continue;
            }
            // Refused: wrong when every limit of the list surely had room.
            if limiters.iter().any(|k| {
                let h = self.history(k);
                h.blind || h.reset_by.is_some_and(|by| Some(by) != replica)
            }) || replica.is_none()
            {
                continue;
            }
            let mut all_room = true;
            for (k, key) in limiters.iter().enumerate() {
                let h = self.history(key);
                all_room &= room(&rule.limits[k], &h.recorded, now, cost) == Some(true);
            }
            self.checked += 1;
            if all_room {
                return Err(format!(
                    "descriptor {i} ({}={}) refused a cost of {cost} at {now} µs, though what the store recorded leaves room on every limit of rule {r}",
                    d.key, d.value
                ));
            }
        }
        Ok(())
    }
}
