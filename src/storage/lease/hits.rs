//! How the leasing layer sees a hit: whether it is leased here, the
//! shapes its hits take towards the store, and what a lease is measured
//! against.

use crate::limit::algorithms::{Leasing, Param, sliding_counter, sliding_log};
use crate::limit::{effective_burst, lease_period};
use crate::storage::Hit;

/// `hit` as the store sees it, with `cost`: not leased further down.
pub(super) fn store_hit<'a>(hit: &Hit<'a>, cost: u64) -> Hit<'a> {
    Hit {
        hits: cost,
        lease: false,
        receipt: false,
        ..*hit
    }
}

/// A lease of `cost` on `hit`'s limiter as the store sees it (and its
/// end, given to [`crate::storage::Store::undo`]): a fixed window's is a weighted hit
/// with a receipt; a token bucket's tells the store it is a lease, whose
/// tokens keep their room in the bucket while it lives; a log's, so that
/// its hits are stamped at its end.
pub(super) fn lease_hit<'a>(hit: &Hit<'a>, cost: u64) -> Hit<'a> {
    Hit {
        hits: cost,
        lease: matches!(hit.algorithm.spec().leasing, Leasing::Tokens | Leasing::Log),
        receipt: true,
        ..*hit
    }
}

/// The size leases are measured against: the fixed window's limit, the
/// token bucket's burst.
pub(super) fn capacity(hit: &Hit<'_>) -> u64 {
    match hit.algorithm.spec().param {
        Param::Burst => effective_burst(hit.burst, hit.limit, hit.window),
        Param::Buckets | Param::MaxDuration => hit.limit,
    }
}

/// How far ahead a lease taken `now` (this replica's monotonic clock)
/// may be spent at least, on that clock: to the fixed window's end (a
/// sliding counter's: its current bucket's) as the wall clock reads
/// `wall` now (only sizing reads it), for a token bucket one lease period,
/// for a log a lease's life.
pub(super) fn horizon(hit: &Hit<'_>, now: u64, wall: u64) -> u64 {
    match hit.algorithm.spec().leasing {
        Leasing::Tokens => now + lease_period(hit.window.micros()),
        Leasing::Bucket => now.saturating_add(sliding_counter::bucket_left(wall, hit)),
        Leasing::Log => now.saturating_add(sliding_log::lease_life(hit.window.micros())),
        _ => now.saturating_add(hit.window.span(wall).end.saturating_sub(wall)),
    }
}

/// Whether a hit is decided from leased quota here.
pub(super) fn leased(hit: &Hit<'_>) -> bool {
    hit.lease
        && !matches!(hit.algorithm.spec().leasing, Leasing::Never(_))
        && hit.hits > 0
        && !hit.negative
        && !hit.usage_reports
        && !hit.receipt
        && hit.also.is_empty()
        && !hit.shard.is_sharded()
        && hit.window.zone().is_none()
}
