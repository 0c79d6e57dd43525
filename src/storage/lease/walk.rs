//! Where the leasing layer keeps its limiters, and the housekeeping walk
//! that gives idle leases back and forgets limiters with nothing in force.
//!
//! Each of the [`SHARDS`] maps keeps, beside its limiters, a queue of when
//! each limiter has something due ([`Held::due`]), earliest first. A
//! change that brings a limiter's time forward queues it again (its older
//! entry goes stale and is skipped); the walk looks only at the limiters
//! whose time has come, then queues each at its next time. So the walk's
//! work follows the leases that end or go idle, not the limiters held: a
//! replica holding leases of 100,000 users looks at each about once a
//! window, not at every tick.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use hashbrown::HashTable;

use super::held::Held;
use super::key::LeaseKey;
use super::reserved::Reservations;
use super::{FORGET_MICROS, Leasing};
use crate::storage::{Cost, Hit};

/// How many maps hold the limiters ([`Leasing::held`]).
pub(super) const SHARDS: usize = 16;

/// One map of limiters and its walk queue.
#[derive(Default)]
pub(super) struct Shard {
    /// Limiters by [`Held::fingerprint`], each confirmed by its key;
    /// stored in the table's own slots, found in one probe.
    limiters: HashTable<Held>,
    /// (when, fingerprint): a limiter's live entry is the one whose time
    /// is its [`Held::queued`]; others are stale.
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    /// The bytes of the keys' text ([`LeaseKey::heap_bytes`]).
    text_bytes: usize,
    /// The bytes of the limiters' reservations ([`Reservations::heap_bytes`]).
    reserved_bytes: usize,
}

/// `f` on `h`, its reservations' bytes kept in `bytes`.
fn counting<T>(bytes: &mut usize, h: &mut Held, f: impl FnOnce(&mut Held) -> T) -> T {
    let before = h.reserved.heap_bytes();
    let out = f(h);
    *bytes = (*bytes + h.reserved.heap_bytes()).saturating_sub(before);
    out
}

pub(super) type HeldMap = Mutex<Shard>;

pub(super) fn lock(map: &HeldMap) -> MutexGuard<'_, Shard> {
    map.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shard {
    /// `f` on the limiter of `hit`, made if new while the map holds fewer
    /// than `cap` (else `None`: the hit goes to the store as without
    /// leases); it is queued again when its time came forward. Returns
    /// `f`'s answer and the time the map's walk must come by (`u64::MAX`:
    /// no sooner than before).
    pub(super) fn with<T>(
        &mut self,
        fingerprint: u64,
        hit: &Hit<'_>,
        now: u64,
        cap: usize,
        f: impl FnOnce(&mut Held) -> T,
    ) -> Option<(T, u64)> {
        let found = |h: &Held| h.fingerprint == fingerprint && h.id.is(hit);
        if self.limiters.find(fingerprint, found).is_none() {
            if self.limiters.len() >= cap {
                return None;
            }
            let key = LeaseKey::of(hit);
            self.text_bytes += key.heap_bytes();
            self.limiters
                .insert_unique(fingerprint, Held::new(fingerprint, key), |h| h.fingerprint);
        }
        let h = self.limiters.find_mut(fingerprint, found)?;
        let out = counting(&mut self.reserved_bytes, h, f);
        let due = h.due(now);
        if due < h.queued {
            h.queued = due;
            self.queue.push(Reverse((due, fingerprint)));
            return Some((out, due));
        }
        Some((out, u64::MAX))
    }

    /// `f` on the limiter of `hit` if the map holds it (its time is left
    /// as it is: `f` must not bring it forward).
    pub(super) fn existing<T>(
        &mut self,
        fingerprint: u64,
        hit: &Hit<'_>,
        f: impl FnOnce(&mut Held) -> T,
    ) -> Option<T> {
        let h = self.limiters.find_mut(fingerprint, |h| {
            h.fingerprint == fingerprint && h.id.is(hit)
        })?;
        Some(counting(&mut self.reserved_bytes, h, f))
    }

    /// Forgets every limiter.
    pub(super) fn clear(&mut self) {
        self.limiters.clear();
        self.queue.clear();
        self.text_bytes = 0;
        self.reserved_bytes = 0;
    }

    /// Limiters held.
    pub(super) fn len(&self) -> usize {
        self.limiters.len()
    }

    /// Limiters holding reservations.
    pub(super) fn reserving(&self) -> usize {
        self.reserved_bytes / Reservations::RUN_BYTES
    }

    /// The heap bytes the map holds: its table's slots, its queue's, the
    /// keys' text and the reservations.
    pub(super) fn heap_bytes(&self) -> usize {
        self.limiters.capacity() * (std::mem::size_of::<Held>() + 1)
            + self.queue.capacity() * std::mem::size_of::<Reverse<(u64, u64)>>()
            + self.text_bytes
            + self.reserved_bytes
    }

    /// The earliest queued time (`u64::MAX`: nothing queued).
    fn next(&self) -> u64 {
        self.queue.peek().map_or(u64::MAX, |Reverse((t, _))| *t)
    }
}

impl Leasing {
    /// Gives back the unused hits of leases idle for a few of their
    /// limiter's gaps between hits (see [`Held::idle_after`]), forgets
    /// what ended, and forgets limiters with nothing in force: only those
    /// whose queued time has come.
    pub async fn give_back_idle(&self) {
        let now = self.clock.monotonic_micros();
        let mut back = Vec::new();
        for (shard, due) in self.held.iter().zip(self.due.iter()) {
            if now < due.load(Ordering::Relaxed) {
                continue;
            }
            let mut map = lock(shard);
            let map = &mut *map;
            let mut walked = 0;
            while let Some(&Reverse((at, fingerprint))) = map.queue.peek() {
                if at > now {
                    break;
                }
                map.queue.pop();
                for h in map.limiters.iter_hash_mut(fingerprint) {
                    if h.fingerprint != fingerprint || h.queued != at {
                        continue;
                    }
                    walked += 1;
                    h.queued = u64::MAX;
                    counting(&mut map.reserved_bytes, h, |h| h.lapse(now, &self.counters));
                    h.drop_closed_ask();
                    let ended = h.back_at_end() && h.tokens > 0 && now >= h.until;
                    if (ended || h.back_when_idle(now).is_some_and(|back| now >= back))
                        && let Some(r) = h.take_unused(now, &self.counters)
                    {
                        back.push((h.id.to_id(), r));
                    }
                }
                let idle = |h: &Held| {
                    h.fingerprint == fingerprint
                        && h.queued == u64::MAX
                        && h.tokens == 0
                        && h.reserved.is_empty()
                        && now >= h.tight_until
                        && now.saturating_sub(h.last_seen) >= FORGET_MICROS
                };
                while let Ok(entry) = map.limiters.find_entry(fingerprint, idle) {
                    let (h, _) = entry.remove();
                    map.text_bytes -= h.id.heap_bytes();
                }
                for h in map.limiters.iter_hash_mut(fingerprint) {
                    if h.fingerprint == fingerprint && h.queued == u64::MAX {
                        // Never now again: at the next tick at the soonest.
                        let next = h.due(now).max(now + 1);
                        h.queued = next;
                        map.queue.push(Reverse((next, fingerprint)));
                    }
                }
            }
            // Under the lock: a change after this lowers it again.
            due.store(map.next(), Ordering::Relaxed);
            self.counters.walked.fetch_add(walked, Ordering::Relaxed);
        }
        for (id, r) in back {
            let hit = id.hit(Cost {
                hits: r.hits,
                negative: false,
            });
            self.give_back(&hit, Some(r)).await;
        }
    }

    /// Per map, the earliest time the walk has anything to do in it.
    pub(super) fn new_due() -> Box<[AtomicU64]> {
        (0..SHARDS).map(|_| AtomicU64::new(u64::MAX)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held limiter's slot: what `lease.max_limiters` multiplies (with
    /// the table's spare slots, the walk queue and the key's text; the
    /// resident memory is measured in `tests/lease.rs`). A field more
    /// fails here first.
    #[test]
    fn a_held_limiter_stays_small() {
        assert!(
            std::mem::size_of::<Held>() <= 232,
            "Held is {} bytes",
            std::mem::size_of::<Held>()
        );
    }
}
