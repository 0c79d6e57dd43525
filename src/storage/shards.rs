//! Sharded limiters (`rate_limit.shards: N`): one limit split over N
//! sub-limiters, each with its own keys in its own Redis Cluster slot, so a
//! hot limiter's load spreads over several primaries (and cores) instead of
//! one.
//!
//! The limit `L` is split into shares that add up to exactly `L`
//! ([`share`]). Each shard decides alone, atomically, against its share, so
//! the total admitted in any window never exceeds `L`: every algorithm keeps
//! its own guarantee per shard, and the shares sum to the limit.
//!
//! A hit goes to one shard chosen locally (round robin per replica, which
//! keeps the shards evenly used). When that shard refuses, the next ones are
//! tried in turn before the hit is refused, so a full shard never refuses a
//! hit another shard could take: under demand above the limit every share
//! fills, and the whole limit is admitted. Those extra calls happen only
//! near the limit; the over-limit cache below this layer answers a full
//! shard's refusals locally, so they seldom reach the store.
//!
//! What a sharded answer reports:
//! - admitted: the part of its share the shard that took the hit has left,
//!   applied to the shares of the shards not seen full in this call (the
//!   round robin uses every shard alike, so the others hold about as much):
//!   an estimate, never more than the limit less this hit; reset is that
//!   shard's.
//! - refused: remaining 0, reset the soonest of the shards' resets (when a
//!   hit may be admitted again).
//!
//! A descriptor with several limits (`rate_limits:`) is sharded as a
//! whole: each shard holds a share of every limit of the list, all in the
//! shard's slot, and decides the list in one step there; the totals still
//! add up to each limit.
//!
//! A give-back (`negative`) goes to one shard, clamped at zero there. A hit
//! whose cost exceeds a shard's share can never be admitted; rules are
//! refused at load when a share would be 0. On a limiter that takes usage
//! reports a positive cost is recorded by the one shard it goes to, refused
//! or not, and is not passed on (it would be recorded twice); checks (cost
//! 0) are passed on as other hits are, so a check is admitted while some
//! shard is within its share.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::storage::{Also, BoxFuture, Decision, Group, Hit, Receipt, Shard, Store, StoreError};

/// The share of shard `index` of `count` in `limit`: the first
/// `limit % count` shards get one more, so the shares add up to `limit`.
pub fn share(limit: u64, count: u16, index: u16) -> u64 {
    let count = u64::from(count.max(1));
    let base = limit / count;
    base + u64::from(u64::from(index) < limit % count)
}

/// The sharding layer over any store.
pub struct Sharded {
    inner: Arc<dyn Store>,
    /// Round-robin position, shared by every sharded limiter of this replica.
    next: AtomicU64,
}

impl Sharded {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            next: AtomicU64::new(0),
        }
    }

    /// Decides a sharded hit: a give-back or a usage report on the one
    /// shard the round robin picks; any other hit on that shard, then on
    /// the next ones in turn while they refuse it.
    async fn sharded(&self, hit: Hit<'_>) -> Result<Decision, StoreError> {
        let count = hit.shard.count;
        let start = (self.next.fetch_add(1, Ordering::Relaxed) % u64::from(count)) as u16;
        // A give-back goes to one shard. So does a positive cost on a
        // limiter that takes usage reports: the shard records it whatever
        // it answers, so passing it on would record it twice.
        if hit.negative || (hit.usage_reports && hit.hits > 0) {
            let also = shares_of_list(&hit, start);
            let sub = Hit {
                also: &also,
                ..shard_hit(&hit, start)
            };
            return self.inner.hit(sub).await;
        }
        let mut tried = Tried::default();
        for k in 0..count {
            let index = (start + k) % count;
            let also = shares_of_list(&hit, index);
            let sub = Hit {
                also: &also,
                ..shard_hit(&hit, index)
            };
            match self.inner.hit(sub).await {
                Ok(d) if d.admitted => return Ok(admitted(&hit, &sub, d, tried.full)),
                Ok(d) => tried.refused(d),
                // One shard's server failing does not stop the others from
                // answering; the failure is reported only when no shard
                // could take the hit and none refused it either.
                Err(e) => tried.failure = Some(e),
            }
        }
        tried.answer()
    }
}

/// Several limits: each shard holds a share of every one of them (no
/// allocation for a single limit). The list of shard `index`.
fn shares_of_list(hit: &Hit<'_>, index: u16) -> Vec<Also> {
    let count = hit.shard.count;
    hit.also
        .iter()
        .map(|a| Also {
            limit: share(a.limit, count, index),
            burst: share_of_burst(a.burst, count, index),
            ..*a
        })
        .collect()
}

/// The answer to `hit` when the shard asked with `sub` admitted it after
/// `full` shards refused it: the shard's remaining as a part of its share,
/// applied to the shares of the shards not seen full (of the limit the
/// answer describes, one of a list), never more than the limit less this
/// hit.
fn admitted(hit: &Hit<'_>, sub: &Hit<'_>, d: Decision, full: u64) -> Decision {
    let count = hit.shard.count;
    let open_shards = u64::from(count) - full;
    // The limit the answer describes (one of a list).
    let (whole, part) = (hit.part(d.which()).limit, sub.part(d.which()).limit);
    let spare = whole.saturating_sub(hit.hits);
    let estimate = u128::from(d.remaining) * u128::from(whole) * u128::from(open_shards)
        / (u128::from(part.max(1)) * u128::from(count));
    let remaining = u64::try_from(estimate).unwrap_or(u64::MAX).min(spare);
    Decision {
        admitted: true,
        remaining,
        ..d
    }
}

/// What the shards tried so far answered, none admitting the hit.
#[derive(Default)]
struct Tried {
    /// The soonest reset of the shards that refused.
    soonest: Option<u64>,
    /// Several limits: the answer of the shard whose reset is soonest.
    refusal: Option<Box<Group>>,
    /// The last failure of a shard's server.
    failure: Option<StoreError>,
    /// Shards that refused.
    full: u64,
}

impl Tried {
    /// A shard refused with `d`.
    fn refused(&mut self, d: Decision) {
        // A refused hit the shard recorded (the fixed window's) stays: the
        // hit is tried on the next shard, and one receipt names one shard.
        self.full += 1;
        if self.soonest.is_none_or(|s| d.reset_micros < s) {
            self.soonest = Some(d.reset_micros);
            self.refusal = d.group;
        }
    }

    /// The answer once every shard was tried: refused until the soonest
    /// reset, or the failure when no shard answered at all.
    fn answer(self) -> Result<Decision, StoreError> {
        match (self.soonest, self.failure) {
            (None, Some(e)) => Err(e),
            (soonest, _) => Ok(Decision {
                admitted: false,
                remaining: 0,
                reset_micros: soonest.unwrap_or(0),
                receipt: None,
                group: self.refusal,
            }),
        }
    }
}

/// `hit` as it goes to shard `index` of its limit: the shard's share of
/// the limit, and of a token bucket's burst (0 stays the share).
fn shard_hit<'a>(hit: &Hit<'a>, index: u16) -> Hit<'a> {
    let count = hit.shard.count;
    Hit {
        limit: share(hit.limit, count, index),
        burst: share_of_burst(hit.burst, count, index),
        shard: Shard { index, count },
        ..*hit
    }
}

/// A shard's share of a token bucket's burst (0, the limit, stays 0).
fn share_of_burst(burst: u64, count: u16, index: u16) -> u64 {
    match burst {
        0 => 0,
        burst => share(burst, count, index).max(1),
    }
}

impl Store for Sharded {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        if hit.shard.is_sharded() {
            Box::pin(self.sharded(hit))
        } else {
            self.inner.hit(hit)
        }
    }

    /// Goes to the shard that recorded it.
    fn undo<'a>(&'a self, hit: Hit<'a>, receipt: Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        if hit.shard.is_sharded() && receipt.shard < hit.shard.count {
            self.inner.undo(shard_hit(&hit, receipt.shard), receipt)
        } else {
            self.inner.undo(hit, receipt)
        }
    }

    /// Every shard: each keeps a part of the limit. A shard that fails
    /// does not stop the others; the first failure is returned.
    fn reset<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        if !hit.shard.is_sharded() {
            return self.inner.reset(hit);
        }
        Box::pin(async move {
            let mut failure = None;
            for index in 0..hit.shard.count {
                if let Err(e) = self.inner.reset(shard_hit(&hit, index)).await {
                    failure.get_or_insert(e);
                }
            }
            failure.map_or(Ok(()), Err)
        })
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_to_the_limit() {
        for limit in [1u64, 7, 8, 100, 101, 1_000_003] {
            for count in 1..=16u16 {
                if limit < u64::from(count) {
                    continue;
                }
                let total: u64 = (0..count).map(|i| share(limit, count, i)).sum();
                assert_eq!(total, limit, "{limit} over {count}");
                let max = (0..count).map(|i| share(limit, count, i)).max().unwrap();
                let min = (0..count).map(|i| share(limit, count, i)).min().unwrap();
                assert!(max - min <= 1);
            }
        }
    }
}
