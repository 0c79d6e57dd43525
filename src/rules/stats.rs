//! What each rule met: hits, and how they split between within, near and
//! over the limit. The counters live with the rule (one relaxed atomic add
//! each on the request path, no lookup by name) and are carried over to
//! the same rule of a reloaded set, so exported counts only grow.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// One set of counts, in hits (a call of cost 3 counts 3).
#[derive(Debug, Default)]
pub struct Counts {
    pub total_hits: AtomicU64,
    pub within_limit: AtomicU64,
    pub near_limit: AtomicU64,
    pub over_limit: AtomicU64,
    /// Over the limit, but answered OK because the rule is in shadow mode.
    pub shadow_mode: AtomicU64,
    /// Refused, but recorded all the same: usage reported past the limit
    /// of a rule that takes usage reports (also in `over_limit`).
    pub recorded_over: AtomicU64,
    /// Admitted, then taken back: another descriptor refused the request
    /// and the rule says `count_refused: false` (in `total_hits`, not in
    /// `within_limit` or `near_limit`).
    pub taken_back: AtomicU64,
}

/// A copy of [`Counts`] at one moment.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CountsSnapshot {
    pub total_hits: u64,
    pub within_limit: u64,
    pub near_limit: u64,
    pub over_limit: u64,
    pub shadow_mode: u64,
    pub recorded_over: u64,
    pub taken_back: u64,
}

impl Counts {
    pub fn snapshot(&self) -> CountsSnapshot {
        CountsSnapshot {
            total_hits: self.total_hits.load(Ordering::Relaxed),
            within_limit: self.within_limit.load(Ordering::Relaxed),
            near_limit: self.near_limit.load(Ordering::Relaxed),
            over_limit: self.over_limit.load(Ordering::Relaxed),
            shadow_mode: self.shadow_mode.load(Ordering::Relaxed),
            recorded_over: self.recorded_over.load(Ordering::Relaxed),
            taken_back: self.taken_back.load(Ordering::Relaxed),
        }
    }

    /// Splits one call's hits the way the reference service does, so
    /// dashboards built for it read the same. `threshold` is the near-limit
    /// mark (floor of limit times the ratio); `remaining` is what the store
    /// says is left after the call.
    pub fn record(
        &self,
        hits: u64,
        limit: u64,
        threshold: u64,
        admitted: bool,
        remaining: u64,
        shadow: bool,
    ) {
        if hits == 0 {
            return;
        }
        self.total_hits.fetch_add(hits, Ordering::Relaxed);
        let used = limit.saturating_sub(remaining);
        if admitted {
            self.within_limit.fetch_add(hits, Ordering::Relaxed);
            let before = used.saturating_sub(hits);
            let near = used.saturating_sub(before.max(threshold));
            if near > 0 {
                self.near_limit.fetch_add(near, Ordering::Relaxed);
            }
            return;
        }
        // A refused call is not recorded by the store: `used` is the count
        // before it.
        let (over, near) = if used >= limit {
            (hits, 0)
        } else {
            (
                (used + hits).saturating_sub(limit),
                limit.saturating_sub(used.max(threshold)),
            )
        };
        self.over_limit.fetch_add(over, Ordering::Relaxed);
        if near > 0 {
            self.near_limit.fetch_add(near, Ordering::Relaxed);
        }
        if shadow {
            self.shadow_mode.fetch_add(hits, Ordering::Relaxed);
        }
    }

    /// Hits of a refused call that the store recorded anyway (usage
    /// reports).
    pub fn record_reported_over(&self, hits: u64) {
        self.recorded_over.fetch_add(hits, Ordering::Relaxed);
    }

    /// Hits admitted, then taken back because another descriptor refused
    /// the request (`count_refused: false`): seen, but never counted.
    pub fn record_taken_back(&self, hits: u64) {
        self.total_hits.fetch_add(hits, Ordering::Relaxed);
        self.taken_back.fetch_add(hits, Ordering::Relaxed);
    }
}

/// The label of the series that takes every value past the cap of a
/// `detailed_metric` rule.
pub const OVERFLOW: &str = "_overflow";

/// A rule's counters. Cheap to clone; clones share the counts. Rules
/// compare equal whatever their counts: counts are not part of a rule.
#[derive(Debug, Default, Clone)]
pub struct RuleStats(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    counts: Counts,
    /// `detailed_metric` rules only, made on their first value: most rules
    /// never need it, and a rule set may hold a million rules.
    detailed: OnceLock<Box<Detailed>>,
}

#[derive(Debug, Default)]
struct Detailed {
    /// Counts per descriptor value, at most the cap, then [`OVERFLOW`].
    values: Mutex<HashMap<Arc<str>, Arc<Counts>>>,
    overflow: Arc<Counts>,
}

/// What an untouched rule's overflow reads: zero.
static NO_COUNTS: Counts = Counts {
    total_hits: AtomicU64::new(0),
    within_limit: AtomicU64::new(0),
    near_limit: AtomicU64::new(0),
    over_limit: AtomicU64::new(0),
    shadow_mode: AtomicU64::new(0),
    recorded_over: AtomicU64::new(0),
    taken_back: AtomicU64::new(0),
};

impl PartialEq for RuleStats {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for RuleStats {}

impl RuleStats {
    pub fn counts(&self) -> &Counts {
        &self.0.counts
    }

    /// The counts of one descriptor value of a `detailed_metric` rule: its
    /// own while fewer than `cap` values are known, else the overflow's.
    pub fn detailed(&self, value: &str, cap: usize) -> Arc<Counts> {
        let detailed = self.0.detailed.get_or_init(Box::default);
        // Never held across an await: a map lookup, then released.
        let mut map = detailed.values.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(value) {
            return c.clone();
        }
        if map.len() >= cap {
            return detailed.overflow.clone();
        }
        let c = Arc::new(Counts::default());
        map.insert(Arc::from(value), c.clone());
        c
    }

    pub fn overflow(&self) -> &Counts {
        self.0.detailed.get().map_or(&NO_COUNTS, |d| &d.overflow)
    }

    /// Every detailed value's counts, and the overflow's.
    pub fn detailed_snapshot(&self) -> Vec<(Arc<str>, CountsSnapshot)> {
        let Some(detailed) = self.0.detailed.get() else {
            return Vec::new();
        };
        let map = detailed.values.lock().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(k, c)| (k.clone(), c.snapshot())).collect()
    }

    pub fn has_detailed(&self) -> bool {
        self.0.detailed.get().is_some_and(|d| {
            !d.values
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_empty()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Limit 10, near mark 8: ten calls of 1 then two more.
    #[test]
    fn split_of_single_hits() {
        let c = Counts::default();
        for n in 1..=12u64 {
            let admitted = n <= 10;
            let remaining = if admitted { 10 - n } else { 0 };
            c.record(1, 10, 8, admitted, remaining, false);
        }
        assert_eq!(
            c.snapshot(),
            CountsSnapshot {
                total_hits: 12,
                within_limit: 10,
                near_limit: 2,
                over_limit: 2,
                shadow_mode: 0,
                recorded_over: 0,
                taken_back: 0,
            }
        );
    }

    /// A weighted call that crosses the near mark and one that crosses the
    /// limit: only the parts past each mark count.
    #[test]
    fn split_of_weighted_hits() {
        let c = Counts::default();
        // 0 -> 7: within.
        c.record(7, 10, 8, true, 3, false);
        // 7 -> 9: one hit past the mark.
        c.record(2, 10, 8, true, 1, false);
        // 9 + 4 refused: 1 near (9..10), 3 over.
        c.record(4, 10, 8, false, 1, true);
        assert_eq!(
            c.snapshot(),
            CountsSnapshot {
                total_hits: 13,
                within_limit: 9,
                near_limit: 2,
                over_limit: 3,
                shadow_mode: 4,
                recorded_over: 0,
                taken_back: 0,
            }
        );
    }

    #[test]
    fn detailed_values_are_capped() {
        let s = RuleStats::default();
        for i in 0..50 {
            s.detailed(&format!("v{i}"), 10)
                .total_hits
                .fetch_add(1, Ordering::Relaxed);
        }
        assert_eq!(s.detailed_snapshot().len(), 10);
        assert_eq!(s.overflow().snapshot().total_hits, 40);
        // A known value keeps its own series after the cap is reached.
        assert!(Arc::ptr_eq(&s.detailed("v3", 10), &s.detailed("v3", 10)));
    }
}
