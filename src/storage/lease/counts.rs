//! What the leasing layer did since start: its counters, and what
//! metrics read of them.

use std::sync::atomic::{AtomicU64, Ordering};

/// What the leasing layer did since start, for metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct LeaseCounts {
    /// Leases the store granted, and the hits they held.
    pub taken: u64,
    pub taken_hits: u64,
    /// Of those hits, the ones reserved in the windows after the lease's.
    pub reserved_hits: u64,
    /// Unused hits given back to the store.
    pub returned_hits: u64,
    /// Unused hits forgotten at their window's end (they counted in it).
    pub expired_hits: u64,
    /// Hits admitted from a lease, without a store call.
    pub local: u64,
    /// Store calls made for leased limiters (leases, give-backs, and hits
    /// decided in the store near the limit).
    pub store_calls: u64,
    /// Limiters the housekeeping walk looked at (a map is skipped while
    /// none of its limiters has anything due).
    pub walked: u64,
    /// Leased hits on limiters the layer had no room for
    /// (`lease.max_limiters`), decided in the store as without leases.
    pub past_cap: u64,
    /// Limiters held now, and of them those holding reservations ahead.
    pub limiters: u64,
    pub reserving: u64,
    /// The memory they take: the maps' slots and walk queues, the
    /// limiters' keys and their reservations.
    pub bytes: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) taken: AtomicU64,
    pub(super) taken_hits: AtomicU64,
    pub(super) reserved_hits: AtomicU64,
    pub(super) returned_hits: AtomicU64,
    pub(super) expired_hits: AtomicU64,
    pub(super) local: AtomicU64,
    pub(super) store_calls: AtomicU64,
    pub(super) walked: AtomicU64,
    pub(super) past_cap: AtomicU64,
}

impl Counters {
    pub(super) fn read(&self) -> LeaseCounts {
        let c = self;
        LeaseCounts {
            taken: c.taken.load(Ordering::Relaxed),
            taken_hits: c.taken_hits.load(Ordering::Relaxed),
            reserved_hits: c.reserved_hits.load(Ordering::Relaxed),
            returned_hits: c.returned_hits.load(Ordering::Relaxed),
            expired_hits: c.expired_hits.load(Ordering::Relaxed),
            local: c.local.load(Ordering::Relaxed),
            store_calls: c.store_calls.load(Ordering::Relaxed),
            walked: c.walked.load(Ordering::Relaxed),
            past_cap: c.past_cap.load(Ordering::Relaxed),
            limiters: 0,
            reserving: 0,
            bytes: 0,
        }
    }
}
