//! The heaviest limiters of this replica, in bounded memory: what an
//! operator reads at `GET /debug/hotkeys` to decide which rule to shard.
//!
//! Each window (a minute by default) has a Space-Saving summary of `K`
//! counters: a limiter already tracked adds to its counter; a new one takes
//! over the smallest counter and starts from its value, remembering that
//! value as its possible overcount. Any limiter with more than `1/K` of a
//! window's calls is certain to be tracked, and a tracked count exceeds the
//! true one by at most its recorded overcount. Memory is `2K` counters
//! whatever the number of limiters.
//!
//! "Recent" is the trailing window: the current window's counts plus the
//! previous window's weighted by the share of it still inside the trailing
//! window, as the sliding window counter estimates.
//!
//! Calls are counted (one per limiter per request), not costs: a call is
//! what a store serves. Refused calls are counted apart for the over-limit
//! share; a limiter's refused calls are counted only while it is tracked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::Clock;
use crate::storage::cache::{Limiter, LimiterId};
use crate::storage::{BoxFuture, Decision, Hit, Store, StoreError};

/// Counters per window by default.
pub const DEFAULT_CAPACITY: usize = 64;
/// The trailing window by default.
pub const DEFAULT_WINDOW_MICROS: u64 = 60_000_000;

#[derive(Debug, Clone)]
struct Counter {
    id: LimiterId,
    count: u64,
    /// What `count` may exceed the true count by.
    error: u64,
    over: u64,
}

/// One window's Space-Saving summary.
#[derive(Debug, Default)]
struct Summary {
    counters: Vec<Counter>,
    /// By [`Limiter::fingerprint`], so a tracked limiter is found without
    /// building an owned id.
    index: HashMap<u64, usize>,
    total: u64,
}

impl Summary {
    fn record(&mut self, id: &impl Limiter, over: bool, capacity: usize) {
        self.total += 1;
        let fingerprint = id.fingerprint();
        if let Some(&i) = self.index.get(&fingerprint)
            && id.is(&self.counters[i].id)
        {
            let c = &mut self.counters[i];
            c.count += 1;
            c.over += u64::from(over);
            return;
        }
        let counter = |count: u64| Counter {
            id: id.to_id(),
            count: count + 1,
            error: count,
            over: u64::from(over),
        };
        if self.counters.len() < capacity {
            // A fingerprint shared with another tracked limiter points at
            // the newer one; the older keeps its counter, unreachable until
            // replaced as the minimum.
            self.index.insert(fingerprint, self.counters.len());
            self.counters.push(counter(0));
            return;
        }
        // A linear scan: K is small, and it only runs for an untracked
        // limiter.
        let Some((i, min)) = self
            .counters
            .iter()
            .enumerate()
            .min_by_key(|(_, c)| c.count)
            .map(|(i, c)| (i, c.count))
        else {
            return;
        };
        let evicted = self.counters[i].id.fingerprint();
        if self.index.get(&evicted) == Some(&i) {
            self.index.remove(&evicted);
        }
        self.index.insert(fingerprint, i);
        self.counters[i] = counter(min);
    }
}

/// One limiter in a [`Report`].
#[derive(Debug, Clone, PartialEq)]
pub struct HotKey {
    pub limiter: LimiterId,
    /// Calls per second over the trailing window.
    pub rate: f64,
    /// Share of this replica's calls over the trailing window.
    pub share: f64,
    /// Share of this limiter's calls that were refused.
    pub over_limit_share: f64,
    /// Calls per second the rate may overstate (Space-Saving's bound).
    pub rate_error: f64,
}

/// The heaviest limiters, heaviest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub window_seconds: f64,
    /// Calls per second over the trailing window, every limiter.
    pub total_rate: f64,
    pub hot_keys: Vec<HotKey>,
}

#[derive(Debug)]
struct Windows {
    /// Start of the current window (a multiple of the window length).
    start: u64,
    current: Summary,
    previous: Summary,
}

/// The tracker: two windows of `capacity` counters each.
#[derive(Debug)]
pub struct HotKeys {
    capacity: usize,
    window: u64,
    /// A std mutex: held for one counter update, never across an `.await`.
    windows: Mutex<Windows>,
}

impl HotKeys {
    pub fn new(capacity: usize, window_micros: u64) -> Self {
        Self {
            capacity: capacity.max(1),
            window: window_micros.max(1),
            windows: Mutex::new(Windows {
                start: 0,
                current: Summary::default(),
                previous: Summary::default(),
            }),
        }
    }

    fn lock(&self, now: u64) -> MutexGuard<'_, Windows> {
        let mut w = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let start = now - now % self.window;
        if start > w.start {
            let current = std::mem::take(&mut w.current);
            w.previous = if start == w.start + self.window {
                current
            } else {
                Summary::default()
            };
            w.start = start;
        }
        w
    }

    pub fn record(&self, id: &impl Limiter, over: bool, now: u64) {
        self.lock(now).current.record(id, over, self.capacity);
    }

    /// The `top` heaviest limiters over the trailing window ending at `now`.
    pub fn report(&self, now: u64, top: usize) -> Report {
        let w = self.lock(now);
        let elapsed = (now - w.start) as f64;
        let window = self.window as f64;
        let weight = (window - elapsed) / window;
        let seconds = window / 1e6;
        // (count, error, over), the previous window weighted.
        let mut merged: HashMap<&LimiterId, (f64, f64, f64)> = HashMap::new();
        for (summary, k) in [(&w.current, 1.0), (&w.previous, weight)] {
            for c in &summary.counters {
                let m = merged.entry(&c.id).or_default();
                m.0 += c.count as f64 * k;
                m.1 += c.error as f64 * k;
                m.2 += c.over as f64 * k;
            }
        }
        let total = w.current.total as f64 + w.previous.total as f64 * weight;
        let mut hot: Vec<HotKey> = merged
            .into_iter()
            .filter(|(_, (count, _, _))| *count > 0.0)
            .map(|(id, (count, error, over))| HotKey {
                limiter: id.clone(),
                rate: count / seconds,
                share: if total > 0.0 { count / total } else { 0.0 },
                over_limit_share: (over / count).min(1.0),
                rate_error: error / seconds,
            })
            .collect();
        hot.sort_by(|a, b| b.rate.total_cmp(&a.rate));
        hot.truncate(top);
        Report {
            window_seconds: seconds,
            total_rate: total / seconds,
            hot_keys: hot,
        }
    }
}

/// A [`Store`] layer that feeds every decided hit to a [`HotKeys`] tracker,
/// whoever answered it (the store or the over-limit cache below).
pub struct HotKeyStore {
    inner: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    tracker: HotKeys,
}

impl HotKeyStore {
    pub fn new(inner: Arc<dyn Store>, clock: Arc<dyn Clock>, tracker: HotKeys) -> Self {
        Self {
            inner,
            clock,
            tracker,
        }
    }
}

/// Limiters a report lists.
const REPORT_TOP: usize = 20;

impl Store for HotKeyStore {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            let result = self.inner.hit(hit).await;
            if let Ok(d) = &result {
                self.tracker
                    .record(&hit, !d.admitted, self.clock.now_micros());
            }
            result
        })
    }

    fn hot_keys(&self) -> Option<Report> {
        Some(self.tracker.report(self.clock.now_micros(), REPORT_TOP))
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, Unit};

    fn id(name: &str) -> LimiterId {
        LimiterId {
            domain: "api".into(),
            entries: vec![("user".to_string(), name.to_string())].into(),
            algorithm: Algorithm::FixedWindow,
            limit: 10,
            window: Unit::Second.into(),
            buckets: crate::limit::DEFAULT_BUCKETS,
            burst: 0,
            shard: crate::storage::Shard::NONE,
            usage_reports: false,
            receipt: false,
            also: Box::default(),
        }
    }

    /// A deterministic stream: "hot" half the calls, "warm" a tenth, and the
    /// rest spread over 10,000 cold limiters, far more than the counters.
    fn skewed(t: &HotKeys, calls: u64, now: u64) {
        for i in 0..calls {
            let name = match i % 10 {
                0 | 2 | 4 | 6 | 8 => "hot".to_string(),
                1 => "warm".to_string(),
                _ => format!("cold{}", (i * 7919) % 10_000),
            };
            t.record(&id(&name), name == "hot" && i % 4 == 0, now);
        }
    }

    #[test]
    fn heavy_limiters_come_first_with_their_share() {
        let t = HotKeys::new(16, 60_000_000);
        skewed(&t, 100_000, 30_000_000);
        let r = t.report(30_000_000, 5);
        assert_eq!(r.hot_keys.len(), 5);
        let hot = &r.hot_keys[0];
        assert_eq!(hot.limiter, id("hot"));
        // Its counter was never taken over: the count is exact.
        assert_eq!(hot.rate_error, 0.0);
        assert!((hot.share - 0.5).abs() < 1e-9, "{hot:?}");
        assert!((hot.over_limit_share - 0.5).abs() < 1e-9, "{hot:?}");
        assert!((hot.rate - 100_000.0 / 2.0 / 60.0).abs() < 1e-6, "{hot:?}");
        let warm = &r.hot_keys[1];
        assert_eq!(warm.limiter, id("warm"));
        // Space-Saving: the true share lies within [share - error, share].
        let seconds = r.window_seconds;
        let true_rate = 10_000.0 / seconds;
        assert!(warm.rate >= true_rate && warm.rate - warm.rate_error <= true_rate);
        assert!((r.total_rate - 100_000.0 / seconds).abs() < 1e-6);
    }

    #[test]
    fn memory_stays_within_the_counters() {
        let t = HotKeys::new(16, 60_000_000);
        skewed(&t, 50_000, 1);
        let w = t.lock(1);
        assert_eq!(w.current.counters.len(), 16);
        assert_eq!(w.current.index.len(), 16);
    }

    #[test]
    fn old_traffic_fades_out() {
        let t = HotKeys::new(8, 60_000_000);
        for _ in 0..600 {
            t.record(&id("old"), false, 10_000_000);
        }
        // Half of the previous window still counts, half as much.
        for _ in 0..100 {
            t.record(&id("new"), false, 90_000_000);
        }
        let r = t.report(90_000_000, 10);
        assert_eq!(r.hot_keys[0].limiter, id("old"));
        assert!((r.hot_keys[0].rate - 300.0 / 60.0).abs() < 1e-9);
        assert!((r.hot_keys[1].share - 100.0 / 400.0).abs() < 1e-9);
        // Two windows later nothing of it is left.
        let r = t.report(185_000_000, 10);
        assert!(r.hot_keys.is_empty(), "{r:?}");
        assert_eq!(r.total_rate, 0.0);
    }
}
