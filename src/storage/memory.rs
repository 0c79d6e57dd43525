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
//! Memory is bounded twice, per shard: each shard holds at most its share of
//! the store's limiters (`memory.max_limiters`) and of its bytes
//! (`memory.max_bytes`), each share the total divided by the shard count,
//! rounded down, so the totals are never exceeded. Past either, a shard
//! forgets its least recently used limiters until it fits. A forgotten
//! limiter starts again from zero, so under pressure the store errs towards
//! admitting, never towards refusing; the eviction count says how often
//! that happened.
//!
//! Bytes are an estimate kept as limiters change, not a measurement: each
//! limiter is charged its map node, the heap copy of its key (a long
//! identity is hashed, so at most a few hundred bytes), and the heap its
//! algorithm keeps (a counter's buckets, a log's members), each allocation
//! rounded as glibc's malloc rounds it; each shard adds its hash table and
//! the nodes the map keeps for reuse. Against the process's resident memory
//! the estimate was exact to 1% for limiters held, and conservative for
//! logs (see [`NODE_BYTES`] and [`LOG_MEMBER_BYTES`]); under constant
//! eviction the allocator's fragmentation adds about a tenth, which
//! `tests/memory.rs` bounds.
//!
//! One limiter may take at most a quarter of its shard's bytes
//! ([`LIMITER_SHARE`]), so one heavy limiter never pushes out a whole shard
//! of light ones. A sliding log that would need more members than that
//! room holds (its limit is above the room) keeps its hits at a coarser
//! time: each hit's time is rounded up to a multiple of
//! `window / (members - 1)` and hits of one instant share a member, which
//! bounds the members within a window. A rounded hit counts up to that
//! granule longer than it would (never shorter), so the log still never
//! admits more than its limit in any trailing window; only its reset times
//! can be that much later. With the default budget (128 MiB, so 1 MiB a
//! limiter) the room is about 65,000 members, above the default
//! `max_log_limit`, and every log is exact; at the smallest budget settings
//! accept (1 MiB, 16 KiB a limiter) it is about 1,000.
//!
//! A budget too small for even one limiter's key (only a store built with
//! a few kilobytes) holds nothing: each hit is decided as a limiter seen for
//! the first time and counted as an eviction.

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::mem::size_of;
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

/// The smallest byte budget worth a shard of its own: a small
/// `memory.max_bytes` gets fewer shards rather than shards too small for a
/// long log.
const MIN_SHARD_BYTES: usize = 64 * 1024;

/// One limiter may take at most `1 / LIMITER_SHARE` of its shard's bytes.
const LIMITER_SHARE: usize = 4;

/// What glibc's malloc takes from the heap for a request of `n` bytes: `n`
/// plus its 8-byte chunk header, rounded up to 16, never under 32.
const fn heap(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let chunk = n.saturating_add(8 + 15) & !15;
    if chunk < 32 { 32 } else { chunk }
}

/// One limiter's node in the map: hashlink boxes the key's `String`, the
/// [`Slot`] and two list links together (88 bytes, a 96-byte chunk on
/// x86_64). Measured once, `VmRSS` before and after a million fixed-window
/// limiters with 24-byte keys on an unbounded store: 163.0 bytes each of
/// resident memory against 162.9 estimated (96 node, 48 key, 18.9 table).
const NODE_BYTES: usize = heap(size_of::<(String, Slot)>() + 2 * size_of::<usize>());

/// One member of a sliding log: its time and cost, two `u64`s in the
/// log's ring buffer, whose capacity the store grows and shrinks itself
/// (so it is charged, not guessed). Measured the same way, a log of a
/// million members took 16.3 bytes each of resident memory against 16.8
/// estimated: the buffer's whole capacity (1,048,576) is charged, touched
/// or not.
const LOG_MEMBER_BYTES: usize = size_of::<(u64, u64)>();

/// A map node and the heap copy of an identity of `capacity` bytes.
fn entry_bytes(capacity: usize) -> usize {
    NODE_BYTES + heap(capacity)
}

/// What a limiter's state holds on the heap besides its node.
fn state_bytes(slot: &Slot) -> usize {
    match &slot.state {
        State::Fixed { .. } => 0,
        State::Counter { counts, .. } => heap(counts.capacity() * size_of::<u64>()),
        State::Log { entries, .. } => heap(entries.capacity() * LOG_MEMBER_BYTES),
    }
}

/// hashbrown's table for `capacity` entries: a pointer and a control byte
/// per bucket (capacity is 7/8 of the buckets, or one less under 8) and a
/// trailing group of 16 control bytes.
fn table_bytes(capacity: usize) -> usize {
    let buckets = match capacity {
        0 => return 0,
        c if c < 8 => c + 1,
        c => c / 7 * 8,
    };
    heap(buckets * (size_of::<usize>() + 1) + 16)
}

/// The most members a log can hold in `room` bytes: a ring buffer of `n`
/// members is one allocation of `n * 16` bytes, 16 more with its header.
fn log_capacity(room: usize) -> usize {
    room.saturating_sub(heap(LOG_MEMBER_BYTES) - LOG_MEMBER_BYTES) / LOG_MEMBER_BYTES
}

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
    /// Bytes of the limiters held: [`entry_bytes`] plus [`state_bytes`] of
    /// each, kept as they change.
    held: usize,
    /// Nodes of removed limiters: hashlink keeps them for the next insert
    /// and frees them only in `shrink_to_fit`, so they still take memory.
    spare_nodes: usize,
}

impl Shard {
    /// The shard's estimated memory: its limiters, spare nodes and table.
    fn bytes(&self) -> usize {
        self.held + self.spare_nodes * NODE_BYTES + table_bytes(self.slots.capacity())
    }

    /// Forgets the least recently used limiter; false when there is none.
    fn remove_lru(&mut self) -> bool {
        let Some((key, slot)) = self.slots.pop_front() else {
            return false;
        };
        self.held = self
            .held
            .saturating_sub(entry_bytes(key.capacity()) + state_bytes(&slot));
        self.spare_nodes += 1;
        true
    }

    /// Drops every limiter expired at `now`, and gives memory back when
    /// that left many spare nodes.
    fn sweep(&mut self, now: u64) {
        let mut freed = 0;
        let mut removed = 0;
        self.slots.retain(|key, slot| {
            let keep = slot.expires_at > now;
            if !keep {
                freed += entry_bytes(key.capacity()) + state_bytes(slot);
                removed += 1;
            }
            keep
        });
        self.held = self.held.saturating_sub(freed);
        self.spare_nodes += removed;
        if self.spare_nodes > self.slots.len() / 4 {
            self.compact();
        }
    }

    /// Frees the spare nodes and fits the table to the limiters held: one
    /// rehash, so done only when it gives back a fair share.
    fn compact(&mut self) {
        self.slots.shrink_to_fit();
        self.spare_nodes = 0;
    }
}

/// How much the embedded store may hold. Both bounds apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBounds {
    /// Limiters held at once.
    pub max_limiters: usize,
    /// Estimated bytes of the limiters held, the map's own structure
    /// included.
    pub max_bytes: usize,
}

impl MemoryBounds {
    /// No bound at all.
    pub const UNBOUNDED: MemoryBounds = MemoryBounds {
        max_limiters: usize::MAX,
        max_bytes: usize::MAX,
    };
}

/// In-process store. Cheap to clone; clones share counters.
#[derive(Clone)]
pub struct MemoryStore {
    shards: Arc<[Mutex<Shard>]>,
    /// Limiters one shard may hold.
    per_shard: usize,
    /// Bytes one shard may hold.
    shard_bytes: usize,
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
    /// A store without bounds.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self::with_bounds(clock, MemoryBounds::UNBOUNDED)
    }

    /// A store holding at most `max_limiters` limiters (at least one), with
    /// no bound on bytes.
    pub fn with_max_limiters(clock: Arc<dyn Clock>, max_limiters: usize) -> Self {
        Self::with_bounds(
            clock,
            MemoryBounds {
                max_limiters,
                ..MemoryBounds::UNBOUNDED
            },
        )
    }

    /// A store within both `bounds` (at least one limiter).
    pub fn with_bounds(clock: Arc<dyn Clock>, bounds: MemoryBounds) -> Self {
        let max_limiters = bounds.max_limiters.max(1);
        // A small cap gets fewer shards, so that every shard has room for
        // at least one limiter, and a small byte budget fewer shards, so
        // that each has room for a long log.
        let count = SHARDS
            .min(max_limiters)
            .min((bounds.max_bytes / MIN_SHARD_BYTES).max(1));
        let shards: Vec<Mutex<Shard>> = (0..count).map(|_| Mutex::default()).collect();
        Self {
            shards: shards.into(),
            per_shard: max_limiters / count,
            shard_bytes: bounds.max_bytes / count,
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

    /// The most bytes held at once, by the store's estimate: the budget
    /// given, rounded down to a multiple of the shard count.
    pub fn max_bytes(&self) -> usize {
        self.shard_bytes.saturating_mul(self.shards.len())
    }

    /// Limiters forgotten to stay within [`MemoryStore::capacity`] or
    /// [`MemoryStore::max_bytes`] since the store was built (expired ones
    /// swept away are not counted).
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

    /// Estimated bytes held now, never above [`MemoryStore::max_bytes`]
    /// between calls.
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| lock(s).bytes()).sum::<usize>()
    }

    /// Drops every expired limiter now.
    pub fn sweep(&self) {
        let now = self.clock.now_micros();
        for shard in self.shards.iter() {
            lock(shard).sweep(now);
        }
    }

    /// Bytes one limiter may take.
    fn limiter_bytes(&self) -> usize {
        self.shard_bytes / LIMITER_SHARE
    }

    fn decide(&self, hit: &Hit<'_>) -> Decision {
        let key = self.keys.local(hit);
        let now = self.clock.now_micros();
        let key_bytes = entry_bytes(key.capacity());
        if key_bytes > self.limiter_bytes() / 2 {
            // Its key alone would leave its state too little room: decided
            // as new and forgotten at once (see the module docs).
            self.evictions.fetch_add(1, Ordering::Relaxed);
            return apply(&mut new_slot(hit.algorithm), now, hit, 1);
        }
        let max_members = log_capacity(self.limiter_bytes() - key_bytes);
        let index = (self.hasher.hash_one(&key) as usize) % self.shards.len();
        let mut guard = lock(&self.shards[index]);
        let shard = &mut *guard;
        shard.ops += 1;
        if shard.ops.is_multiple_of(SWEEP_EVERY) {
            shard.sweep(now);
        }
        if shard.slots.len() >= self.per_shard && !shard.slots.contains_key(&key) {
            shard.remove_lru();
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        let slot = match shard.slots.entry(key) {
            Entry::Occupied(mut e) => {
                e.to_back();
                e.into_mut()
            }
            Entry::Vacant(e) => {
                shard.held += key_bytes;
                shard.spare_nodes = shard.spare_nodes.saturating_sub(1);
                e.insert(new_slot(hit.algorithm))
            }
        };
        let before = state_bytes(slot);
        let decision = apply(slot, now, hit, max_members);
        shard.held = shard.held.saturating_sub(before) + state_bytes(slot);
        self.trim(shard);
        decision
    }

    /// Forgets least recently used limiters until `shard` is within its
    /// bytes. The limiter just used is the most recent, so it goes last,
    /// and only if it alone is too big.
    fn trim(&self, shard: &mut Shard) {
        let mut compacted = false;
        while shard.bytes() > self.shard_bytes {
            // Each limiter forgotten leaves its node behind for reuse; once
            // those add up, freeing them is worth a rehash.
            if !compacted
                && (shard.spare_nodes * NODE_BYTES > self.shard_bytes / 8 || shard.slots.len() <= 1)
            {
                shard.compact();
                compacted = true;
                continue;
            }
            if !shard.remove_lru() {
                shard.compact();
                break;
            }
            self.evictions.fetch_add(1, Ordering::Relaxed);
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

/// Decides `hit` on one limiter's state and records it; a log holds at
/// most `max_members` members.
fn apply(slot: &mut Slot, now: u64, hit: &Hit<'_>, max_members: usize) -> Decision {
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
            let (d, exp) = sliding_log(now, w, hit, entries, sum, max_members);
            slot.expires_at = exp;
            d
        }
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
            bytes: Some(self.bytes() as u64),
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
        // Exactly n: the default growth would round 2 buckets up to 4.
        counts.reserve_exact(n);
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

/// The exact trailing window: every admitted hit with its time and cost,
/// in at most `max_members` members. A limit above that keeps its hits at
/// a coarser time (see the module docs). A limiter that takes usage
/// reports also records the costs that take it over (or are over the limit
/// themselves); while the log is already at or past its limit such a cost
/// is added to the newest entry, which takes the report's time, so a log
/// never holds more entries than its limit.
fn sliding_log(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    entries: &mut VecDeque<(u64, u64)>,
    sum: &mut u64,
    max_members: usize,
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
    // Memory follows the log down as well as up; a quarter full, so that a
    // log hovering around one length does not reallocate back and forth.
    if entries.capacity() > 8 && entries.len() <= entries.capacity() / 4 {
        entries.shrink_to(entries.len() * 2);
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
            record(entries, now, w, hit.hits, limit, max_members);
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
            Some(last) if *sum >= limit => *last = (last.0.max(now), last.1 + add),
            _ if add == 0 => {}
            _ => record(entries, now, w, add, limit, max_members),
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

/// Adds an admitted hit of `cost` at `now` to a log of at most
/// `max_members` members.
///
/// Each member costs at least 1 and the members add up to at most `limit`,
/// so a limit within `max_members` never needs more and every hit keeps
/// its own time. Above it, times are rounded up to a granule of
/// `w / (max_members - 1)`: the members within a window then sit on
/// distinct multiples of the granule in `(now - w, now + granule)`, at most
/// `max_members` of them. Should a log still be full (its limit was raised
/// by a reload), the hit joins the newest member, whose time moves up to
/// the hit's. Either way a hit only ever counts longer, never shorter.
fn record(
    entries: &mut VecDeque<(u64, u64)>,
    now: u64,
    w: u64,
    cost: u64,
    limit: u64,
    max_members: usize,
) {
    let mut at = now;
    if limit > max_members as u64 {
        let granule = w.div_ceil((max_members as u64).saturating_sub(1).max(1));
        at = now.div_ceil(granule).saturating_mul(granule);
    }
    let full = entries.len() >= max_members;
    if let Some(last) = entries.back_mut() {
        // A rounded time may be ahead of now: members stay in time order.
        at = at.max(last.0);
        if last.0 == at || full {
            last.0 = at;
            last.1 += cost;
            return;
        }
    }
    if entries.len() == entries.capacity() {
        // Grown by hand, doubling up to the room and no further: the
        // default growth could allocate past it.
        let len = entries.len();
        let target = (len * 2).clamp(4, max_members.max(1));
        entries.reserve_exact(target.saturating_sub(len).max(1));
    }
    entries.push_back((at, cost));
}

fn decision(admitted: bool, remaining: u64, reset_micros: u64) -> Decision {
    Decision {
        admitted,
        remaining,
        reset_micros,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::limit::Unit;
    use crate::storage::Shard as SubLimiter;

    const MINUTE: u64 = 60_000_000;
    /// A whole number of minutes since the epoch.
    const T0: u64 = 1_800_000_000_000_000;

    fn store(max_bytes: usize) -> (ManualClock, MemoryStore) {
        let clock = ManualClock::at_micros(T0);
        let bounds = MemoryBounds {
            max_bytes,
            ..MemoryBounds::UNBOUNDED
        };
        (
            clock.clone(),
            MemoryStore::with_bounds(Arc::new(clock), bounds),
        )
    }

    fn hit<'a>(entries: &'a [(String, String)], algorithm: Algorithm, limit: u64) -> Hit<'a> {
        Hit {
            domain: "d",
            entries,
            algorithm,
            limit,
            unit: Unit::Minute,
            hits: 1,
            negative: false,
            usage_reports: false,
            buckets: DEFAULT_BUCKETS,
            shard: SubLimiter::NONE,
        }
    }

    fn user(name: &str) -> Vec<(String, String)> {
        vec![("user".to_owned(), name.to_owned())]
    }

    /// Members of the one log the store holds.
    fn members(store: &MemoryStore) -> usize {
        store
            .shards
            .iter()
            .flat_map(|s| {
                lock(s)
                    .slots
                    .values()
                    .map(|slot| match &slot.state {
                        State::Log { entries, .. } => entries.len(),
                        _ => 0,
                    })
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    #[test]
    fn allocation_sizes_follow_glibc() {
        assert_eq!(heap(0), 0);
        assert_eq!(heap(1), 32);
        assert_eq!(heap(24), 32);
        assert_eq!(heap(25), 48);
        assert_eq!(heap(88), 96);
        assert_eq!(heap(16 * 1000), 16 * 1000 + 16);
        // hashbrown: 7 entries fit 8 buckets, 14 fit 16.
        assert_eq!(table_bytes(7), heap(8 * 9 + 16));
        assert_eq!(table_bytes(14), heap(16 * 9 + 16));
        assert_eq!(log_capacity(16 * 1000 + 16), 1000);
    }

    /// Bytes grow with limiters and log members, and come back to nothing
    /// once every window has passed and the store is swept.
    #[test]
    fn bytes_follow_the_limiters_held() {
        let (clock, store) = store(usize::MAX);
        assert_eq!(store.bytes(), 0);
        for i in 0..100 {
            store.decide(&hit(&user(&format!("u{i}")), Algorithm::FixedWindow, 10));
        }
        let fixed = store.bytes();
        assert!(fixed >= 100 * NODE_BYTES, "{fixed}");
        let log = user("log");
        store.decide(&hit(&log, Algorithm::SlidingWindowLog, 5000));
        let one = store.bytes();
        assert!(one - fixed > NODE_BYTES, "{}", one - fixed);
        for _ in 1..1000 {
            clock.advance_micros(1);
            assert!(
                store
                    .decide(&hit(&log, Algorithm::SlidingWindowLog, 5000))
                    .admitted
            );
        }
        let grown = store.bytes() - one;
        assert!(
            (999 * LOG_MEMBER_BYTES..=1024 * LOG_MEMBER_BYTES).contains(&grown),
            "{grown}"
        );
        // The log's members leave with its window and its buffer follows.
        clock.advance_micros(MINUTE);
        store.decide(&hit(&log, Algorithm::SlidingWindowLog, 5000));
        assert_eq!(store.bytes(), one);
        clock.advance_micros(MINUTE);
        store.sweep();
        assert_eq!((store.len(), store.bytes()), (0, 0));
    }

    /// Past the byte budget the least recently used limiters go, and the
    /// estimate never exceeds the budget between calls.
    #[test]
    fn the_byte_budget_forgets_the_least_recently_used() {
        let (_, store) = store(1 << 20);
        let hot = user("hot");
        assert!(store.decide(&hit(&hot, Algorithm::FixedWindow, 1)).admitted);
        for i in 0..20_000 {
            store.decide(&hit(&user(&format!("u{i}")), Algorithm::FixedWindow, 1));
            if i % 100 == 0 {
                // Kept recent, so never the one forgotten.
                assert!(!store.decide(&hit(&hot, Algorithm::FixedWindow, 1)).admitted);
            }
            assert!(store.bytes() <= store.max_bytes(), "after {i}");
        }
        assert!(store.evictions() > 10_000, "{}", store.evictions());
        assert!(store.len() < 10_000, "{}", store.len());
        assert!(
            store.bytes() > store.max_bytes() * 3 / 4,
            "{}",
            store.bytes()
        );
    }

    /// A log whose limit needs more members than one limiter may hold keeps
    /// its hits in rounded times: never more members than fit, never more
    /// admitted than the limit in a window, again admitted once the window
    /// (and at most one granule more) has passed.
    #[test]
    fn a_log_above_its_room_keeps_its_limit_in_bounded_members() {
        let (clock, store) = store(1 << 20);
        let log = user("big");
        let key_bytes = entry_bytes(
            store
                .keys
                .local(&hit(&log, Algorithm::SlidingWindowLog, 1))
                .capacity(),
        );
        let room = log_capacity(store.limiter_bytes() - key_bytes);
        let limit = 5000;
        assert!(room < limit as usize / 4, "room {room}");
        let granule = MINUTE.div_ceil(room as u64 - 1);
        let mut admitted = 0;
        let mut refused = None;
        for _ in 0..6000 {
            clock.advance_micros(7_000);
            let d = store.decide(&hit(&log, Algorithm::SlidingWindowLog, limit));
            if d.admitted {
                admitted += 1;
            } else if refused.is_none() {
                refused = Some(d);
            }
            assert!(members(&store) <= room);
            assert!(store.bytes() <= store.max_bytes());
        }
        assert_eq!(admitted, limit);
        // The first hit was at T0 + 7 ms; a refusal at T0 + 35 s waits for
        // it to leave, at most one granule late.
        let refused = refused.expect("hits past the limit are refused");
        let exact = T0 + 7_000 + MINUTE - (T0 + 7_000 * (limit + 1));
        assert!(
            (exact..=exact + granule).contains(&refused.reset_micros),
            "reset {} exact {exact} granule {granule}",
            refused.reset_micros
        );
        assert_eq!(store.evictions(), 0);
        clock.advance_micros(MINUTE + granule);
        let d = store.decide(&hit(&log, Algorithm::SlidingWindowLog, limit));
        assert!(d.admitted);
        assert_eq!(d.remaining, limit - 1);
    }

    /// A log within its room is exact: each hit keeps its own time.
    #[test]
    fn a_log_within_its_room_keeps_every_time() {
        let (clock, store) = store(1 << 20);
        let log = user("small");
        for _ in 0..100 {
            clock.advance_micros(3);
            store.decide(&hit(&log, Algorithm::SlidingWindowLog, 100));
        }
        assert_eq!(members(&store), 100);
        let d = store.decide(&hit(&log, Algorithm::SlidingWindowLog, 100));
        assert!(!d.admitted);
        assert_eq!(d.reset_micros, MINUTE - 99 * 3);
    }

    /// A budget too small for even one limiter holds none: each hit is
    /// decided as new and counted as forgotten.
    #[test]
    fn a_budget_too_small_for_one_limiter_holds_none() {
        let (_, tiny) = store(512);
        let alice = user("alice");
        for _ in 0..3 {
            assert!(
                tiny.decide(&hit(&alice, Algorithm::FixedWindow, 1))
                    .admitted
            );
        }
        assert_eq!((tiny.len(), tiny.bytes(), tiny.evictions()), (0, 0, 3));
        // Long identities are hashed: the smallest budget settings accept
        // holds them.
        let (_, store) = store(1 << 20);
        let long = user(&"v".repeat(20_000));
        for admitted in [true, false] {
            let d = store.decide(&hit(&long, Algorithm::FixedWindow, 1));
            assert_eq!(d.admitted, admitted);
        }
        assert_eq!((store.len(), store.evictions()), (1, 0));
    }

    /// Both bounds apply: a tight limiter cap wins over a loose byte budget.
    #[test]
    fn the_limiter_cap_still_applies() {
        let clock = ManualClock::at_micros(T0);
        let bounds = MemoryBounds {
            max_limiters: 64,
            max_bytes: 1 << 30,
        };
        let store = MemoryStore::with_bounds(Arc::new(clock), bounds);
        for i in 0..1000 {
            store.decide(&hit(&user(&format!("u{i}")), Algorithm::FixedWindow, 1));
        }
        assert_eq!(store.len(), 64);
        assert_eq!(store.evictions(), 1000 - 64);
    }
}
