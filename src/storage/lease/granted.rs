//! What the leasing layer does with the store's answer to a lease call:
//! a refused lease, and a granted one kept.

use std::sync::atomic::Ordering;

use tokio::sync::watch;

use super::Leasing;
use super::hits::store_hit;
use super::reserved::reservations;
use crate::limit::algorithms::{Leasing as Leases, sliding_log};
use crate::storage::{Ahead, Decision, Hit, Receipt, StoreError};

/// A lease call the store answered: what refusing or keeping the lease
/// reads.
pub(super) struct Asked<'a, 'h> {
    pub hit: &'a Hit<'h>,
    /// The store call made: a lease of `size` hits, or the hit alone.
    pub lease: Hit<'h>,
    pub size: u64,
    /// The reservations asked for in the next windows.
    pub ahead: Ahead,
    /// When the lease was asked for, and when the store answered.
    pub now: u64,
    pub answered: u64,
    /// The resets seen before asking.
    pub generation: (u64, u64),
}

impl Leasing {
    /// Less than a lease is left in this window: what the refusal
    /// recorded goes back, and the window's last hits are decided
    /// in the store alone.
    pub(super) async fn refused(
        &self,
        asked: Asked<'_, '_>,
        d: Decision,
        asking: Option<watch::Sender<()>>,
    ) -> Result<Decision, StoreError> {
        let Asked {
            hit,
            lease,
            size,
            now,
            answered,
            ..
        } = asked;
        self.with_held(hit, answered, |h| {
            h.tight_until = now.saturating_add(d.reset_micros);
            h.store_left = 0;
            h.asking = None;
        });
        drop(asking);
        if size == hit.hits {
            return Ok(d);
        }
        if let Some(r) = d.receipt {
            self.counters.store_calls.fetch_add(1, Ordering::Relaxed);
            let _ = self.inner.undo(lease, r).await;
        }
        self.counters.store_calls.fetch_add(1, Ordering::Relaxed);
        self.inner.hit(store_hit(hit, hit.hits)).await
    }

    /// Keeps a granted lease of more than the hit (with its reservations),
    /// giving back an older one that landed meanwhile; a lease that may
    /// predate a reset, or finds no room in the map, goes back instead.
    pub(super) async fn keep(
        &self,
        asked: Asked<'_, '_>,
        d: Decision,
        asking: Option<watch::Sender<()>>,
    ) -> Result<Decision, StoreError> {
        let Asked {
            hit,
            size,
            ahead,
            now,
            answered,
            generation,
            ..
        } = asked;
        let until = lease_until(hit, &d, now);
        let reserved = reservations(hit, &d, ahead, now, answered);
        let reserved_hits = reserved.hits();
        self.counters.taken.fetch_add(1, Ordering::Relaxed);
        self.counters
            .taken_hits
            .fetch_add(size + reserved_hits, Ordering::Relaxed);
        self.counters
            .reserved_hits
            .fetch_add(reserved_hits, Ordering::Relaxed);
        self.follow_resets();
        let left = size - hit.hits;
        // A lease asked concurrently may have landed meanwhile: the older
        // one's unused hits go back.
        let kept = self.with_held(hit, answered, |h| {
            // The call is over: who waits on it holds the channel.
            h.asking = None;
            // Under the map's lock, which a reset takes to forget the
            // lease after the store's reset: a lease asked before a reset
            // completed is either refused here or forgotten by it.
            if self.generation_now() != generation {
                return None;
            }
            let older = h.take_unused(now, &self.counters);
            h.tokens = left;
            h.receipt = d.receipt;
            h.until = until;
            h.last_used = now;
            h.store_left = d.remaining;
            h.store_left_until = now.saturating_add(d.reset_micros);
            h.leased_at = now;
            let dropped = h.reserved.set(reserved);
            self.counters
                .expired_hits
                .fetch_add(dropped, Ordering::Relaxed);
            Some((older, h.local_reset(now)))
        });
        let Some((older, reset)) = kept.flatten() else {
            // The lease may predate a reset: its hits are not used. Or
            // the map had no room left for the limiter: they go back.
            drop(asking);
            if self.generation_now() == generation {
                let unused = d.receipt.map(|r| Receipt {
                    hits: left.min(r.hits),
                    ..r
                });
                self.give_back(hit, unused.filter(|r| r.hits > 0)).await;
            }
            return Ok(Decision::new(true, d.remaining, d.reset_micros));
        };
        drop(asking);
        self.give_back(hit, older).await;
        Ok(Decision::new(true, d.remaining.saturating_add(left), reset))
    }
}

/// Until when (this replica's monotonic clock) a lease asked `now` and
/// granted by `d` may be spent: the window's end, or a token bucket's
/// lease life, as the store's reset says; a sliding counter's lease only
/// while the bucket it was recorded in is current, as its receipt's mark
/// says; a log's for its life, at whose end the store stamped its hits.
/// Each counted from when the call was sent, so never late.
fn lease_until(hit: &Hit<'_>, d: &Decision, now: u64) -> u64 {
    match hit.algorithm.spec().leasing {
        Leases::Bucket => now.saturating_add(d.receipt.map_or(0, |r| r.mark)),
        // Its hits were stamped at the store's now plus this, after the
        // call was sent.
        Leases::Log => now.saturating_add(sliding_log::lease_life(hit.window.micros())),
        _ => now.saturating_add(d.reset_micros),
    }
}
