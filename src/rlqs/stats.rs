//! What the quota service counts, for metrics and the debug view. Relaxed
//! atomics: counting must cost next to nothing, readers need recent totals.

use std::sync::atomic::{AtomicU64, Ordering};

use super::bucket::{Assignment, Skip};

/// Counters of the quota service since start.
#[derive(Debug, Default)]
pub struct QuotaStats {
    streams_open: AtomicU64,
    streams_total: AtomicU64,
    streams_refused: AtomicU64,
    buckets: AtomicU64,
    allow_all: AtomicU64,
    deny_all: AtomicU64,
    token_buckets: AtomicU64,
    abandoned: AtomicU64,
    skipped: [AtomicU64; Skip::ALL.len()],
    store_errors: AtomicU64,
    reported_allowed: AtomicU64,
    reported_denied: AtomicU64,
}

/// A reading of [`QuotaStats`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QuotaStatsSnapshot {
    /// Streams open now.
    pub streams_open: u64,
    pub streams_total: u64,
    /// Streams refused past `rlqs.max_streams`.
    pub streams_refused: u64,
    /// Buckets answered on the open streams now.
    pub buckets: u64,
    /// Assignments sent, by kind.
    pub allow_all: u64,
    pub deny_all: u64,
    pub token_buckets: u64,
    pub abandoned: u64,
    /// Buckets skipped, by [`Skip`] in [`Skip::ALL`]'s order.
    pub skipped: [u64; Skip::ALL.len()],
    /// Lease calls the store failed.
    pub store_errors: u64,
    /// Requests Envoy reported, allowed and denied.
    pub reported_allowed: u64,
    pub reported_denied: u64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn sub(counter: &AtomicU64, n: u64) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(n))
    });
}

impl QuotaStats {
    /// Counts a stream opened, unless `most` are open already: then it
    /// is counted refused, and `false`.
    pub(super) fn stream_opened(&self, most: u64) -> bool {
        let opened = self
            .streams_open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |open| {
                (open < most).then_some(open + 1)
            })
            .is_ok();
        add(
            if opened {
                &self.streams_total
            } else {
                &self.streams_refused
            },
            1,
        );
        opened
    }

    /// Buckets answered on the open streams now.
    pub(super) fn buckets(&self) -> u64 {
        self.buckets.load(Ordering::Relaxed)
    }

    pub(super) fn stream_closed(&self) {
        sub(&self.streams_open, 1);
    }

    pub(super) fn buckets_added(&self, n: u64) {
        add(&self.buckets, n);
    }

    pub(super) fn buckets_removed(&self, n: u64) {
        sub(&self.buckets, n);
    }

    pub(super) fn sent(&self, assignment: Assignment) {
        add(
            match assignment {
                Assignment::AllowAll => &self.allow_all,
                Assignment::DenyAll => &self.deny_all,
                Assignment::TokenBucket { .. } => &self.token_buckets,
            },
            1,
        );
    }

    pub(super) fn abandoned(&self) {
        add(&self.abandoned, 1);
    }

    pub(super) fn skipped(&self, why: Skip) {
        let i = Skip::ALL.iter().position(|s| *s == why).unwrap_or(0);
        add(&self.skipped[i], 1);
    }

    pub(super) fn store_error(&self) {
        add(&self.store_errors, 1);
    }

    pub(super) fn reported(&self, allowed: u64, denied: u64) {
        add(&self.reported_allowed, allowed);
        add(&self.reported_denied, denied);
    }

    pub fn snapshot(&self) -> QuotaStatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        QuotaStatsSnapshot {
            streams_open: get(&self.streams_open),
            streams_total: get(&self.streams_total),
            streams_refused: get(&self.streams_refused),
            buckets: get(&self.buckets),
            allow_all: get(&self.allow_all),
            deny_all: get(&self.deny_all),
            token_buckets: get(&self.token_buckets),
            abandoned: get(&self.abandoned),
            skipped: self.skipped.each_ref().map(get),
            store_errors: get(&self.store_errors),
            reported_allowed: get(&self.reported_allowed),
            reported_denied: get(&self.reported_denied),
        }
    }
}

/// One bucket's last assignment on one stream, for the debug view.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareView {
    pub stream: u64,
    pub domain: String,
    /// The bucket id's entries in key order, values past `max_value_bytes`
    /// as digests (client data: the debug view shows values as digests
    /// unless told otherwise).
    pub bucket: Vec<(String, String)>,
    /// The matched rule's path, if any.
    pub rule: Option<String>,
    pub assignment: Assignment,
    /// Holders of the limit's ledger and their shares in force, in tokens
    /// per fill, as of this stream's last report (leased buckets only).
    pub holders: u64,
    pub granted_total: u64,
}
