//! A limiter's identity as the layers that keep something per limiter see
//! it (the over-limit cache, hot keys, coalescing): owned
//! ([`LimiterId`]) or borrowed from a hit, found by a fingerprint and
//! confirmed by comparing every part.

use crate::limit::{Algorithm, Window};
use crate::storage::{Also, Cost, Hit, Shard};

/// Everything that defines a limiter, owned: the cache's key, and the hot-key
/// report's. Two hits with equal ids count against the same state with the
/// same limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LimiterId {
    pub domain: Box<str>,
    pub entries: Box<[(String, String)]>,
    pub algorithm: Algorithm,
    pub limit: u64,
    pub window: Window,
    /// A counter's bucket count: a different count is a different limiter.
    pub buckets: u8,
    /// A token bucket's burst ([`Hit::burst`]).
    pub burst: u64,
    /// The shard of a sharded limit (its `limit` is then the shard's share).
    pub shard: Shard,
    /// Whether every positive cost is recorded ([`Hit::usage_reports`]).
    pub usage_reports: bool,
    /// Whether its hits are answered with receipts ([`Hit::receipt`]).
    pub receipt: bool,
    /// The further limits of its descriptor ([`Hit::also`]).
    pub also: Box<[Also]>,
}

/// A limiter's identity as the layers see it: owned ([`LimiterId`]) or
/// borrowed from a hit. Lookups go by [`Limiter::fingerprint`] and confirm
/// with [`Limiter::is`], so a hit is looked up without building an owned id;
/// one is built only when something is stored.
pub trait Limiter {
    fn fingerprint(&self) -> u64;
    /// Whether `id` is this limiter.
    fn is(&self, id: &LimiterId) -> bool;
    fn to_id(&self) -> LimiterId;
}

/// Hashes the parts of an identity. Fixed seed (foldhash's, a few times
/// faster than std's SipHash on every leased decision): a fingerprint is
/// only a lookup shortcut, always confirmed by comparing the parts, so a
/// collision costs a miss, never a wrong answer.
fn fingerprint_of(parts: impl std::hash::Hash) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one(parts)
}

impl Limiter for Hit<'_> {
    fn fingerprint(&self) -> u64 {
        fingerprint_of((
            self.domain,
            self.entries,
            self.algorithm,
            self.limit,
            self.window,
            self.buckets,
            self.burst,
            self.shard,
            self.usage_reports,
            self.receipt,
            self.also,
        ))
    }

    fn is(&self, id: &LimiterId) -> bool {
        *id.domain == *self.domain
            && *id.entries == *self.entries
            && id.algorithm == self.algorithm
            && id.limit == self.limit
            && id.window == self.window
            && id.buckets == self.buckets
            && id.burst == self.burst
            && id.shard == self.shard
            && id.usage_reports == self.usage_reports
            && id.receipt == self.receipt
            && *id.also == *self.also
    }

    fn to_id(&self) -> LimiterId {
        LimiterId::of(self)
    }
}

impl Limiter for LimiterId {
    fn fingerprint(&self) -> u64 {
        fingerprint_of((
            &*self.domain,
            &*self.entries,
            self.algorithm,
            self.limit,
            self.window,
            self.buckets,
            self.burst,
            self.shard,
            self.usage_reports,
            self.receipt,
            &*self.also,
        ))
    }

    fn is(&self, id: &LimiterId) -> bool {
        self == id
    }

    fn to_id(&self) -> LimiterId {
        self.clone()
    }
}

impl LimiterId {
    pub fn of(hit: &Hit<'_>) -> Self {
        Self {
            domain: hit.domain.into(),
            entries: hit.entries.into(),
            algorithm: hit.algorithm,
            limit: hit.limit,
            window: hit.window,
            buckets: hit.buckets,
            burst: hit.burst,
            shard: hit.shard,
            usage_reports: hit.usage_reports,
            receipt: hit.receipt,
            also: hit.also.into(),
        }
    }
}

impl LimiterId {
    /// A hit on this limiter with the given cost: not a lease, reserving
    /// nothing ahead (a layer that rebuilds a hit of either kind sets
    /// them, as coalescing sets [`Hit::lease`]).
    pub fn hit(&self, cost: Cost) -> Hit<'_> {
        Hit {
            domain: &self.domain,
            entries: &self.entries,
            algorithm: self.algorithm,
            limit: self.limit,
            window: self.window,
            hits: cost.hits,
            negative: cost.negative,
            usage_reports: self.usage_reports,
            buckets: self.buckets,
            burst: self.burst,
            shard: self.shard,
            receipt: self.receipt,
            also: &self.also,
            lease: false,
            ahead: crate::storage::Ahead::NONE,
        }
    }
}
