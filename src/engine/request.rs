//! What the engine is asked and what it answers: protocol-neutral, so
//! `service` and `json` convert to and from Envoy's messages and the engine
//! never sees them.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::limit::algorithms::Param;
use crate::limit::{Algorithm, Unit, Window};
use crate::storage::StoreError;

/// One descriptor of a request, protocol-neutral.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Descriptor {
    pub entries: Vec<(String, String)>,
    /// A caller-supplied limit that replaces the configured one.
    pub limit_override: Option<LimitOverride>,
    /// Per-descriptor cost; wins over the request's when present (0 checks).
    pub hits: Option<u64>,
    /// Give the hits back instead of taking them.
    pub negative: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

/// A request, protocol-neutral.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    pub domain: String,
    pub descriptors: Vec<Descriptor>,
    /// The request-wide cost; 0 means 1.
    pub hits: u64,
    /// When the caller stops waiting (its `grpc-timeout`, less a margin):
    /// store calls are cut off there, and none starts after it.
    pub deadline: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The limit that was applied to a descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedLimit {
    pub requests_per_unit: u32,
    /// The unit (what Envoy is told) and how many of them make the window.
    pub window: Window,
    pub name: Option<String>,
    pub algorithm: Algorithm,
    /// Buckets of a `sliding_window_counter` (the rule's, or the default).
    pub buckets: u8,
    /// A `token_bucket`'s burst (the rule's); 0 means `requests_per_unit`.
    pub burst: u64,
    /// Sub-limiters the limit is split over (`rate_limit.shards`; 1 when
    /// not sharded).
    pub shards: u16,
    /// This call is a usage report on a limiter that takes them: its
    /// positive cost is recorded whatever the answer (see
    /// `storage::Hit::usage_reports`). Only a descriptor that carries its
    /// own cost is a report; a plain request on the same limiter is not.
    pub usage_reports: bool,
    /// `false`: what a request answered OVER_LIMIT charged is taken back
    /// (`count_refused`).
    pub count_refused: bool,
    /// Decided from quota this replica leased (`lease`; see
    /// `storage::lease`).
    pub lease: bool,
}

impl AppliedLimit {
    /// The largest cost one call can ever be admitted: a token bucket's
    /// burst (it never holds more tokens), the limit for the other
    /// algorithms; of a sharded limit, the largest shard's share (one
    /// shard decides a hit). A `rate_limits:` list has one per limit.
    pub fn capacity(&self) -> u64 {
        let whole = match self.algorithm.spec().param {
            Param::Burst if self.burst > 0 => self.burst,
            _ => u64::from(self.requests_per_unit),
        };
        crate::storage::shards::share(whole, self.shards, 0)
    }
}

/// The answer for one descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    /// `None` when no limit applies (no rule, whitelist, unlimited).
    pub limit: Option<AppliedLimit>,
    /// `u32::MAX` for unlimited descriptors, 0 when no limit applies.
    pub remaining: u32,
    /// When a call of this cost may pass. `None` on an OVER_LIMIT status
    /// with a limit says no such time is known, so waiting does not help:
    /// the cost is above the limit (see [`AppliedLimit::capacity`]) and
    /// can never pass, or the store failed and the policy denied.
    pub reset: Option<Duration>,
}

impl Status {
    pub(super) fn no_limit() -> Self {
        Status {
            code: Code::Ok,
            limit: None,
            remaining: 0,
            reset: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub overall: Code,
    pub statuses: Vec<Status>,
    /// The `metadata` of the rules of descriptors answered OK (after
    /// shadow mode), in request order: what `response_dynamic_metadata`
    /// returns.
    pub metadata: Vec<Arc<serde_json::Map<String, serde_json::Value>>>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    #[error("domain must not be empty")]
    EmptyDomain,
    #[error("descriptors must not be empty")]
    NoDescriptors,
    #[error("descriptor {index}: {reason}")]
    BadDescriptor { index: usize, reason: String },
    #[error("descriptor {index}: {source}")]
    Store { index: usize, source: StoreError },
    /// The caller's deadline passed before the store answered (or before
    /// the call was made: such calls are not sent at all).
    #[error("descriptor {index}: the caller's deadline passed before the store answered")]
    DeadlineExceeded { index: usize },
    /// Too many store calls were waiting and `on_overload` says error.
    #[error("descriptor {index}: over max_in_flight={max}: too many store calls in flight")]
    Overloaded { index: usize, max: usize },
}
