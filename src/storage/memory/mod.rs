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
//! logs (see `bytes::NODE_BYTES` and `bytes::LOG_MEMBER_BYTES`); under constant
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

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hashlink::LinkedHashMap;
use hashlink::linked_hash_map::Entry;

use crate::clock::{Clock, SystemClock};
use crate::limit::Algorithm;
use crate::limit::algorithms::{Reset, State, fixed_window};
use crate::storage::keys::KeyBuilder;
use crate::storage::{
    BoxFuture, Decision, Hit, LeaseCall, Receipt, Store, StoreError, StoreGauges,
};

pub(crate) mod bytes;
mod group;
pub(crate) mod heap;
mod lease;
mod undo;

use bytes::{NODE_BYTES, entry_bytes, log_capacity, state_bytes, table_bytes};
use undo::take_back_in;

const SHARDS: usize = 32;
const SWEEP_EVERY: u64 = 1024;

/// The smallest byte budget worth a shard of its own: a small
/// `memory.max_bytes` gets fewer shards rather than shards too small for a
/// long log.
const MIN_SHARD_BYTES: usize = 64 * 1024;

/// One limiter may take at most `1 / LIMITER_SHARE` of its shard's bytes.
const LIMITER_SHARE: usize = 4;

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
    /// Fixed windows and counters reset here, by key: when (microseconds),
    /// and until when that matters (the end of the eighth window after the
    /// reset's: a hit reserved before it may name the seventh, and a
    /// counter takes one back a bucket after its own). A give-back recorded
    /// before the reset finds its count gone: see [`undo::fixed_window`].
    /// Few (a reset is an operator's call) and swept with the limiters.
    resets: std::collections::HashMap<String, (u64, u64)>,
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
        self.resets.retain(|_, &mut (_, until)| until > now);
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
    leases: Arc<lease::Leases>,
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
            leases: Arc::new(lease::Leases::new(max_limiters)),
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
        if !hit.also.is_empty() {
            return group::decide(self, hit);
        }
        let key = self.keys.local(hit);
        let now = self.clock.now_micros();
        if self.too_long(entry_bytes(key.capacity())) {
            // Its key alone would leave its state too little room: decided
            // as new and forgotten at once (see the module docs).
            self.evictions.fetch_add(1, Ordering::Relaxed);
            return apply(&mut new_slot(hit.algorithm), now, hit, 1);
        }
        let mut guard = lock(&self.shards[self.shard_of(&key)]);
        self.decide_in(&mut guard, key, hit, now)
    }

    /// Whether a limiter's key (of `key_bytes`) alone would leave its
    /// state too little room.
    fn too_long(&self, key_bytes: usize) -> bool {
        key_bytes > self.limiter_bytes() / 2
    }

    /// The shard that holds the limiter of `key`.
    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % self.shards.len()
    }

    /// Decides `hit` on the limiter of `key`, in its shard (locked by the
    /// caller), and records it.
    fn decide_in(&self, shard: &mut Shard, key: String, hit: &Hit<'_>, now: u64) -> Decision {
        let key_bytes = entry_bytes(key.capacity());
        let max_members = log_capacity(self.limiter_bytes().saturating_sub(key_bytes));
        self.with_slot(shard, key, hit.algorithm, now, |slot| {
            apply(slot, now, hit, max_members)
        })
    }

    /// Runs `f` on the limiter of `key` in `shard` (locked by the caller),
    /// made new for `algorithm` if the shard holds none, and keeps the
    /// shard within its bounds after.
    fn with_slot<T>(
        &self,
        shard: &mut Shard,
        key: String,
        algorithm: Algorithm,
        now: u64,
        f: impl FnOnce(&mut Slot) -> T,
    ) -> T {
        let key_bytes = entry_bytes(key.capacity());
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
                e.insert(new_slot(algorithm))
            }
        };
        let before = state_bytes(slot);
        let out = f(slot);
        shard.held = shard.held.saturating_sub(before) + state_bytes(slot);
        self.trim(shard);
        out
    }

    /// Takes back what `r` recorded on `hit`'s limiter, under its shard's
    /// lock; a limiter no longer held has nothing to take back.
    fn take_back(&self, hit: &Hit<'_>, r: &Receipt) {
        let key = self.keys.local(hit);
        let now = self.clock.now_micros();
        let mut guard = lock(&self.shards[self.shard_of(&key)]);
        take_back_in(&mut guard, &key, hit, r, now);
    }

    /// Forgets `hit`'s limiter, under its shard's lock: the next hit finds
    /// it new. What was recorded before is not taken back from what comes
    /// after: a fixed window's reset is kept in [`Shard::resets`] (its
    /// script's `x`), and a token bucket's new state begins after this
    /// instant (its script's `b`), so that a lease or charge taken before
    /// the reset, in the same microsecond too, is not given back into it.
    fn forget(&self, hit: &Hit<'_>) {
        let key = self.keys.local(hit);
        let now = self.clock.now_micros();
        let index = (self.hasher.hash_one(&key) as usize) % self.shards.len();
        let mut shard = lock(&self.shards[index]);
        let mut removed = shard.slots.remove_entry(&key);
        // No earlier than the start of the window the state last wrote:
        // after `now` when the clock stepped back (the scripts' `x`).
        let at = removed
            .as_mut()
            .and_then(|(_, slot)| slot.state.ops().written_from(hit))
            .map_or(now, |from| from.max(now));
        if let Some((held, slot)) = &removed {
            shard.held = shard
                .held
                .saturating_sub(entry_bytes(held.capacity()) + state_bytes(slot));
            shard.spare_nodes += 1;
        }
        let reset = hit.algorithm.spec().reset;
        if reset == Reset::MarkWindow {
            let span = hit.window.span(at);
            // As the script's: until the eighth window after the reset's
            // ends (reservations reach the seventh; a counter's receipt
            // is taken back a bucket after its own).
            let ahead = match hit.window.zone() {
                None => (fixed_window::AHEAD as u64 + 1) * hit.window.micros(),
                Some(_) => 0,
            };
            shard
                .resets
                .insert(key, (at, span.end.saturating_add(ahead)));
        } else if reset == Reset::NewBucket {
            self.with_slot(&mut shard, key, hit.algorithm, now, |slot| {
                slot.state.ops().forget(now, hit);
                slot.expires_at = now + 1;
            });
        } else if reset == Reset::OweHeld
            && let Some((held, mut slot)) = removed
        {
            // Kept, with what it held now owed (until when it would have
            // been held, its expiry already).
            slot.state.ops().forget(now, hit);
            let bytes = entry_bytes(held.capacity()) + state_bytes(&slot);
            shard.held += bytes;
            shard.spare_nodes = shard.spare_nodes.saturating_sub(1);
            shard.slots.insert(held, slot);
        }
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
        state: State::of(algorithm),
        expires_at: 0,
    }
}

/// Decides `hit` on one limiter's state and records it; a log holds at
/// most `max_members` members.
fn apply(slot: &mut Slot, now: u64, hit: &Hit<'_>, max_members: usize) -> Decision {
    slot.state
        .ops()
        .decide(now, hit, max_members, &mut slot.expires_at)
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

    fn undo<'a>(&'a self, hit: Hit<'a>, receipt: Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        self.take_back(&hit, &receipt);
        Box::pin(async { Ok(()) })
    }

    fn lease<'a>(
        &'a self,
        call: LeaseCall<'a>,
    ) -> BoxFuture<'a, Result<crate::quota::Grant, StoreError>> {
        let now = self.clock.now_micros();
        let grant = match call.counted {
            Some(counted) => self.lease_counted(&call, counted, now),
            None => self.leases.lease(&self.keys, &call, now),
        };
        Box::pin(async move { grant })
    }

    fn reset<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        self.forget(&hit);
        self.leases.forget(&self.keys, &hit.ledger());
        Box::pin(async { Ok(()) })
    }

    fn maintain(&self) {
        self.sweep();
        self.leases.sweep(self.clock.now_micros());
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

#[cfg(test)]
mod tests;
