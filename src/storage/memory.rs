//! The embedded store: every limiter in process memory, for a single replica
//! or a laptop. Same semantics as the Redis scripts in `lua/`, on an injected
//! clock.
//!
//! Limiters live in a fixed number of shards, each a `std::sync::Mutex` over a
//! map. A std mutex is right here: it is held only for a few arithmetic steps
//! and never across an `.await`, so the decision and the record are one atomic
//! step per limiter. Expired limiters are swept from a shard every
//! [`SWEEP_EVERY`] operations on it, so memory follows the live windows.
//!
//! Memory is bounded too: each shard holds at most its share of the store's
//! capacity (the capacity divided by the shard count, rounded down, so the
//! total never exceeds it) and, when full, forgets its least recently used
//! limiter to make room. A forgotten limiter starts again from zero, so under
//! pressure the store errs towards admitting, never towards refusing; the
//! eviction count says how often that happened.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hashlink::LinkedHashMap;
use hashlink::linked_hash_map::Entry;

use crate::clock::{Clock, SystemClock};
use crate::limit::{Algorithm, DEFAULT_BUCKETS, MAX_BUCKETS};
use crate::storage::keys::KeyBuilder;
use crate::storage::{BoxFuture, Decision, Hit, Store, StoreError, StoreGauges};

const SHARDS: usize = 32;
const SWEEP_EVERY: u64 = 1024;

#[derive(Debug)]
enum State {
    Fixed {
        window: u64,
        count: u64,
    },
    Counter {
        /// Index of the current bucket.
        window: u64,
        /// Bucket counts by age: `[0]` is the current bucket.
        counts: Vec<u64>,
    },
    Log {
        /// (timestamp in microseconds, cost), oldest first.
        entries: VecDeque<(u64, u64)>,
        sum: u64,
    },
}

#[derive(Debug)]
struct Slot {
    state: State,
    /// After this instant the state holds nothing that still counts.
    expires_at: u64,
}

#[derive(Debug, Default)]
struct Shard {
    /// Least recently used first.
    slots: LinkedHashMap<String, Slot>,
    ops: u64,
}

/// In-process store. Cheap to clone; clones share counters.
#[derive(Clone)]
pub struct MemoryStore {
    shards: Arc<[Mutex<Shard>]>,
    /// Limiters one shard may hold.
    per_shard: usize,
    evictions: Arc<AtomicU64>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    keys: KeyBuilder,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

impl MemoryStore {
    /// A store without a limit on the number of limiters.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_max_limiters(clock, usize::MAX)
    }

    /// A store holding at most `max_limiters` limiters (at least one).
    pub fn with_max_limiters(clock: Arc<dyn Clock>, max_limiters: usize) -> Self {
        let max_limiters = max_limiters.max(1);
        // A small cap gets fewer shards, so that every shard has room for
        // at least one limiter.
        let count = SHARDS.min(max_limiters);
        let shards: Vec<Mutex<Shard>> = (0..count).map(|_| Mutex::default()).collect();
        Self {
            shards: shards.into(),
            per_shard: max_limiters / count,
            evictions: Arc::new(AtomicU64::new(0)),
            hasher: RandomState::new(),
            clock,
            keys: KeyBuilder::default(),
        }
    }

    /// The most limiters held at once: the cap given, rounded down to a
    /// multiple of the shard count.
    pub fn capacity(&self) -> usize {
        self.per_shard.saturating_mul(self.shards.len())
    }

    /// Limiters forgotten to stay within [`MemoryStore::capacity`] since the
    /// store was built (expired ones swept away are not counted).
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Number of limiters held (expired ones included until swept).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| lock(s).slots.len())
            .sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every expired limiter now.
    pub fn sweep(&self) {
        let now = self.clock.now_micros();
        for shard in self.shards.iter() {
            lock(shard).slots.retain(|_, slot| slot.expires_at > now);
        }
    }

    fn decide(&self, hit: &Hit<'_>) -> Decision {
        let key = self.keys.local(hit);
        let now = self.clock.now_micros();
        let index = (self.hasher.hash_one(&key) as usize) % self.shards.len();
        let mut shard = lock(&self.shards[index]);
        shard.ops += 1;
        if shard.ops.is_multiple_of(SWEEP_EVERY) {
            shard.slots.retain(|_, slot| slot.expires_at > now);
        }
        if shard.slots.len() >= self.per_shard && !shard.slots.contains_key(&key) {
            shard.slots.pop_front();
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        let slot = match shard.slots.entry(key) {
            Entry::Occupied(mut e) => {
                e.to_back();
                e.into_mut()
            }
            Entry::Vacant(e) => e.insert(new_slot(hit.algorithm)),
        };
        let w = hit.unit.micros();
        match &mut slot.state {
            State::Fixed { window, count } => {
                let (d, exp) = fixed_window(now, w, hit, window, count);
                slot.expires_at = slot.expires_at.max(exp);
                d
            }
            State::Counter { window, counts } => {
                let (d, exp) = sliding_counter(now, w, hit, window, counts);
                slot.expires_at = slot.expires_at.max(exp);
                d
            }
            State::Log { entries, sum } => {
                let (d, exp) = sliding_log(now, w, hit, entries, sum);
                slot.expires_at = exp;
                d
            }
        }
    }
}

fn new_slot(algorithm: Algorithm) -> Slot {
    Slot {
        state: match algorithm {
            Algorithm::FixedWindow => State::Fixed {
                window: 0,
                count: 0,
            },
            Algorithm::SlidingWindowCounter => State::Counter {
                window: 0,
                counts: Vec::new(),
            },
            Algorithm::SlidingWindowLog => State::Log {
                entries: VecDeque::new(),
                sum: 0,
            },
        },
        expires_at: 0,
    }
}

fn lock(m: &Mutex<Shard>) -> std::sync::MutexGuard<'_, Shard> {
    // A poisoned shard only means another thread panicked mid-update of plain
    // integers; the numbers are still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store for MemoryStore {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        let decision = self.decide(&hit);
        Box::pin(async move { Ok(decision) })
    }

    fn maintain(&self) {
        self.sweep();
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn gauges(&self) -> StoreGauges {
        StoreGauges {
            limiters: Some(self.len() as u64),
            evictions: Some(self.evictions()),
            ..StoreGauges::default()
        }
    }
}

/// Recorded usage saturates here, as in the scripts (Redis Lua numbers are
/// doubles, exact below 2^53): a usage report may carry any cost, and a
/// limiter that far over its limit is refused for its whole window anyway.
const MAX_COUNT: u64 = 1 << 53;

/// Epoch-aligned fixed window. Every counted hit stays counted, admitted or
/// not (as the reference service does), except a cost above the limit, which
/// can never pass and is not recorded unless the limiter takes usage
/// reports.
fn fixed_window(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    window: &mut u64,
    count: &mut u64,
) -> (Decision, u64) {
    let idx = now / w;
    let end = (idx + 1) * w;
    if *window != idx {
        *window = idx;
        *count = 0;
    }
    let limit = hit.limit;
    let reset = end - now;
    if hit.negative {
        *count = count.saturating_sub(hit.hits);
        return (decision(true, limit.saturating_sub(*count), reset), end);
    }
    if hit.hits > limit && !hit.usage_reports {
        return (decision(false, limit.saturating_sub(*count), reset), end);
    }
    *count = count.saturating_add(hit.hits).min(MAX_COUNT);
    let admitted = *count <= limit;
    (decision(admitted, limit.saturating_sub(*count), reset), end)
}

/// `n` epoch-aligned buckets of `w / (n - 1)` each: the current one, `n - 2`
/// full ones, and the oldest, which weighs what is left of it in the
/// trailing window. With `n = 2` that is the classic previous-and-current
/// pair. Only admitted hits are recorded, unless the limiter takes usage
/// reports: then every positive cost is, and the answer is refused while
/// the estimate is over the limit.
///
/// Time is counted in units of `1 / (n - 1)` microsecond ("scaled"), so a
/// bucket is exactly `w` scaled units long whatever `n` is and no bucket
/// boundary is rounded; real durations are the scaled ones divided by
/// `n - 1`, rounded up.
fn sliding_counter(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    window: &mut u64,
    counts: &mut Vec<u64>,
) -> (Decision, u64) {
    let n = hit.buckets.clamp(DEFAULT_BUCKETS, MAX_BUCKETS) as usize;
    let spans = n as u64 - 1;
    let scaled = u128::from(now) * u128::from(spans);
    let idx = (scaled / u128::from(w)) as u64;
    let elapsed = (scaled - u128::from(idx) * u128::from(w)) as u64;
    let real = |scaled: u64| scaled.div_ceil(spans);
    if counts.len() != n {
        counts.clear();
        counts.resize(n, 0);
    } else if idx >= *window && idx - *window < n as u64 {
        let shift = (idx - *window) as usize;
        counts.rotate_right(shift);
        counts[..shift].fill(0);
    } else if idx != *window {
        counts.fill(0);
    }
    *window = idx;
    let expires = now + real(n as u64 * w - elapsed);
    let limit = hit.limit;
    // The same floating-point steps as lua/sliding_window_counter.lua.
    // Multiplying before dividing keeps the estimate exact while
    // oldest x window stays below 2^53.
    let wf = w as f64;
    let left = (w - elapsed) as f64;
    let estimate = |counts: &[u64]| {
        let full: u64 = counts[..n - 1].iter().sum();
        counts[n - 1] as f64 * left / wf + full as f64
    };
    let remaining = |est: f64| {
        let r = (limit as f64 - est).floor();
        if r > 0.0 { r as u64 } else { 0 }
    };
    // Until the oldest bucket holding hits has left the trailing window.
    let ok_reset = |counts: &[u64]| match counts.iter().rposition(|&c| c > 0) {
        Some(age) => real((n - age) as u64 * w - elapsed),
        None => 0,
    };
    if hit.negative {
        let mut back = hit.hits;
        for c in counts.iter_mut() {
            let take = back.min(*c);
            *c -= take;
            back -= take;
        }
        let est = estimate(counts);
        return (decision(true, remaining(est), ok_reset(counts)), expires);
    }
    // Refused: the first bucket (j buckets on) where the full ones fit a
    // hit of `cost`, then the moment in it when the oldest has lost enough
    // weight: oldest x (w - e) / w <= room  holds from
    // e = w - floor(w x room / oldest).
    let wait_for = |counts: &[u64], cost: u64| {
        let need = (limit - cost) as f64;
        for j in 0..n {
            let full: u64 = counts[..n - 1 - j].iter().sum();
            if full as f64 > need {
                continue;
            }
            let oldest = counts[n - 1 - j];
            let at = if oldest == 0 {
                0
            } else {
                w - ((wf * (need - full as f64) / oldest as f64).floor() as u64).min(w)
            };
            return if j == 0 {
                real(at.saturating_sub(elapsed)).max(1)
            } else {
                real(j as u64 * w + at - elapsed)
            };
        }
        w
    };
    let est = estimate(counts);
    if hit.hits > limit && !hit.usage_reports {
        return (decision(false, remaining(est), w), expires);
    }
    if est + hit.hits as f64 <= limit as f64 {
        counts[0] += hit.hits;
        let est = estimate(counts);
        return (decision(true, remaining(est), ok_reset(counts)), expires);
    }
    if hit.usage_reports {
        // Recorded all the same; refused until a check would pass.
        counts[0] = counts[0].saturating_add(hit.hits).min(MAX_COUNT);
        let d = decision(false, remaining(estimate(counts)), wait_for(counts, 0));
        return (d, expires);
    }
    (
        decision(false, remaining(est), wait_for(counts, hit.hits)),
        expires,
    )
}

/// The exact trailing window: every admitted hit with its time and cost.
/// A limiter that takes usage reports also records the costs that take it
/// over (or are over the limit themselves); while the log is already at or
/// past its limit such a cost is added to the newest entry, which takes the
/// report's time, so a log never holds more entries than its limit.
fn sliding_log(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    entries: &mut VecDeque<(u64, u64)>,
    sum: &mut u64,
) -> (Decision, u64) {
    // A hit at time t counts while t > now - w.
    while let Some(&(ts, cost)) = entries.front() {
        if ts + w <= now {
            entries.pop_front();
            *sum -= cost;
        } else {
            break;
        }
    }
    let limit = hit.limit;
    let oldest_reset =
        |entries: &VecDeque<(u64, u64)>| entries.front().map(|&(ts, _)| ts + w - now).unwrap_or(0);
    let expires =
        |entries: &VecDeque<(u64, u64)>| entries.back().map(|&(ts, _)| ts + w).unwrap_or(now);
    if hit.negative {
        let mut back = hit.hits;
        while back > 0 {
            let Some(last) = entries.back_mut() else {
                break;
            };
            let take = back.min(last.1);
            last.1 -= take;
            *sum -= take;
            back -= take;
            if last.1 == 0 {
                entries.pop_back();
            }
        }
        let d = decision(true, limit.saturating_sub(*sum), oldest_reset(entries));
        return (d, expires(entries));
    }
    if hit.hits > limit && !hit.usage_reports {
        let d = decision(false, limit.saturating_sub(*sum), w);
        return (d, expires(entries));
    }
    if *sum + hit.hits <= limit {
        if hit.hits > 0 {
            entries.push_back((now, hit.hits));
            *sum += hit.hits;
        }
        let d = decision(true, limit - *sum, oldest_reset(entries));
        return (d, expires(entries));
    }
    // Refused: the first moment enough of the oldest hits have left for a
    // hit of `cost`.
    let wait_for = |entries: &VecDeque<(u64, u64)>, sum: u64, cost: u64| {
        let mut freed = 0;
        for &(ts, c) in entries.iter() {
            freed += c;
            if sum - freed + cost <= limit {
                return ts + w - now;
            }
        }
        w
    };
    if hit.usage_reports && hit.hits > 0 {
        let add = hit.hits.min(MAX_COUNT - *sum);
        match entries.back_mut() {
            Some(last) if *sum >= limit => *last = (now, last.1 + add),
            _ if add == 0 => {}
            _ => entries.push_back((now, add)),
        }
        *sum += add;
        let d = decision(false, 0, wait_for(entries, *sum, 0));
        return (d, expires(entries));
    }
    let d = decision(
        false,
        limit.saturating_sub(*sum),
        wait_for(entries, *sum, hit.hits),
    );
    (d, expires(entries))
}

fn decision(admitted: bool, remaining: u64, reset_micros: u64) -> Decision {
    Decision {
        admitted,
        remaining,
        reset_micros,
    }
}
