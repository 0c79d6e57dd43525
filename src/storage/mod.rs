//! Where counts live. A [`Store`] answers one question for one limiter:
//! "given this many hits now, is it admitted, and what is left?". It decides
//! and records in one atomic step, on its own clock.
//!
//! Every implementation passes the same contract suite (`tests/contract.rs`),
//! so the embedded store and Redis behave the same.

pub mod breaker;
pub mod cache;
pub mod coalesce;
pub mod gate;
pub mod hotkeys;
pub mod keys;
pub mod lease;
pub mod limiter;
mod list;
pub mod memory;
mod receipt;
pub mod redis;
pub mod shards;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::limit::{Algorithm, DEFAULT_BUCKETS, Window};
use crate::quota;

pub use breaker::{Breaker, BreakerConfig};
pub use cache::{CacheConfig, CacheCounts, LimiterId, OverLimitCache};
pub use coalesce::{CoalesceCounts, Coalescing};
pub use gate::Gate;
pub use hotkeys::{HotKeyStore, HotKeys};
pub use list::{Also, Group};
pub use memory::{MemoryBounds, MemoryStore};
pub use receipt::{Ahead, Receipt};
pub use redis::{RedisConfig, RedisStore};
pub use shards::Sharded;

/// A boxed future, so stores can sit behind `Arc<dyn Store>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One limiter's share of a request.
#[derive(Debug, Clone, Copy)]
pub struct Hit<'a> {
    pub domain: &'a str,
    /// The descriptor's entries, in request order; with `domain`, the
    /// limiter's identity.
    pub entries: &'a [(String, String)],
    pub algorithm: Algorithm,
    /// Requests per window; never 0 (a zero limit is decided without a
    /// store).
    pub limit: u64,
    /// The window's length is what counts (`unit` x `unit_multiplier`).
    pub window: Window,
    /// Cost of this call. 0 checks without counting.
    pub hits: u64,
    /// Give `hits` back instead of taking them (never below zero).
    pub negative: bool,
    /// Record every positive cost, also one that takes the limiter over its
    /// limit or is above the limit itself (usage reported after the
    /// response, which Envoy sends whatever the answer): the answer is
    /// still OVER_LIMIT when the total is over, and checks are refused
    /// until enough of it has aged out. Otherwise only admitted hits are
    /// recorded (the fixed window also records refused ones up to the
    /// limit, as the reference does).
    pub usage_reports: bool,
    /// Buckets of a `sliding_window_counter` (2..=60; part of the limiter's
    /// identity). Other algorithms ignore it.
    pub buckets: u8,
    /// Size of a `token_bucket` (tokens it holds when full); 0 means the
    /// limit. Other algorithms ignore it.
    pub burst: u64,
    /// Which sub-limiter of a sharded limit this hit counts against. The
    /// engine sends every hit with index 0 of the rule's shard count; the
    /// sharding layer ([`shards::Sharded`]) picks the shard and sets
    /// `limit` to that shard's share before any store sees it.
    pub shard: Shard,
    /// Answer with a [`Receipt`] of what this call recorded, so that it can
    /// be taken back ([`Store::undo`]): the engine asks for one on the
    /// limiters of `count_refused: false` rules. Not part of the limiter's
    /// state: its keys are the same either way.
    pub receipt: bool,
    /// The further limits of the same descriptor (`rate_limits:`), empty
    /// for a single limit. The hit is then one call on every limit of the
    /// list, in one atomic step: admitted only when each admits its cost,
    /// and then recorded on each (as each would record it alone);
    /// otherwise recorded on none (a usage report on every one). Each
    /// limit keeps the keys it would have alone (its algorithm and window
    /// tell them apart), all in the descriptor's slot. The answer says
    /// which limit it describes ([`Decision::group`]).
    pub also: &'a [Also],
    /// Decide from quota this replica leased, where it holds some
    /// ([`lease::Leasing`]). Below that layer it is set only on a token
    /// bucket's lease: the store records the cost as a lease (its tokens
    /// keep their room in the bucket while it lives, the answer's reset
    /// is its life) and [`Store::undo`] of it ends the lease.
    pub lease: bool,
    /// A fixed window's or a sliding counter's lease (with a receipt, no
    /// further costs, not a calendar window) may also reserve hits in the
    /// windows (buckets) after the current one: see [`Ahead`].
    pub ahead: Ahead,
}

/// A sub-limiter of a limit split over `count` shards (`rate_limit.shards`),
/// each with its own keys in its own Redis Cluster slot. `count` 1 is an
/// unsharded limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard {
    pub index: u16,
    pub count: u16,
}

impl Shard {
    /// Not sharded.
    pub const NONE: Shard = Shard { index: 0, count: 1 };

    pub fn is_sharded(self) -> bool {
        self.count > 1
    }
}

/// The part of a hit that differs between hits of one limiter queued
/// together: see [`Store::hit_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    pub hits: u64,
    pub negative: bool,
}

impl Hit<'_> {
    pub fn cost(&self) -> Cost {
        Cost {
            hits: self.hits,
            negative: self.negative,
        }
    }
}

/// One stream's report on a limiter whose limit is shared by lease (the
/// Rate Limit Quota Service): the ledger of the limiter `domain` and
/// `entries` count with `algorithm` over `window` grants `holder` its
/// share. See [`crate::quota`].
#[derive(Debug, Clone, Copy)]
pub struct LeaseCall<'a> {
    pub domain: &'a str,
    pub entries: &'a [(String, String)],
    /// The limit's algorithm (the rule's, else the default): with the
    /// window, what tells apart the ledgers of the limits of one
    /// `rate_limits:` list, as it tells apart their counts.
    pub algorithm: Algorithm,
    pub window: Window,
    /// Who holds the share: one stream of one replica.
    pub holder: &'a str,
    pub report: quota::Report,
    pub terms: quota::Terms,
    /// How requests decided one at a time count the limit, when shares
    /// and those requests keep one count in the limiter's own state (a
    /// fixed window or a token bucket: [`quota::Counted`]). `None`: the
    /// ledger bounds the shares alone.
    pub counted: Option<quota::Counted>,
}

impl<'a> LeaseCall<'a> {
    /// The limiter as a hit, for its keys: the lease key shares the
    /// limiter's hash tag (its slot), with its own role; so does the state
    /// of the fixed window the shares spend. The shape [`Hit::ledger`]
    /// gives the limit's own hits: one ledger.
    pub fn limiter(&self) -> Hit<'a> {
        Hit {
            domain: self.domain,
            entries: self.entries,
            algorithm: self.algorithm,
            limit: self.terms.capacity.max(1),
            window: self.window,
            hits: 0,
            negative: false,
            usage_reports: false,
            buckets: DEFAULT_BUCKETS,
            burst: 0,
            shard: Shard::NONE,
            receipt: false,
            also: &[],
            lease: false,
            ahead: Ahead::NONE,
        }
    }

    /// The token bucket a share is charged to ([`quota::bucket`]), as a hit
    /// of `hits` (given back when `negative`): the limiter's own, so its
    /// keys share the ledger's slot. A charge is recorded even where the
    /// bucket cannot pay it (as a usage report).
    pub fn bucket(&self, b: quota::bucket::Bucket, hits: u64, negative: bool) -> Hit<'a> {
        Hit {
            algorithm: Algorithm::TokenBucket,
            limit: b.limit,
            hits,
            negative,
            usage_reports: !negative,
            burst: b.burst,
            ..self.limiter()
        }
    }
}

impl<'a> Hit<'a> {
    /// The lease ledger of this limiter, as a hit (for its keys): the
    /// shape [`LeaseCall::limiter`] gives a lease of the same descriptor,
    /// algorithm and window, whatever the shard, a counter's buckets or
    /// where they start (RLQS names the rule's window, unstaggered).
    /// Each limit of a `rate_limits:` list has its own (a list never
    /// counts one window twice with one algorithm).
    pub fn ledger(&self) -> Hit<'a> {
        Hit {
            window: self.window.unstaggered(),
            hits: 0,
            negative: false,
            usage_reports: false,
            buckets: DEFAULT_BUCKETS,
            burst: 0,
            shard: Shard::NONE,
            receipt: false,
            also: &[],
            lease: false,
            ahead: Ahead::NONE,
            ..*self
        }
    }
}

/// What a store decided for one [`Hit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub admitted: bool,
    /// What is left after this call, by the algorithm's count.
    pub remaining: u64,
    /// Admitted: microseconds until the oldest counted hit stops counting
    /// (fixed window: until the window ends). Refused: microseconds until a
    /// hit of this cost would be admitted.
    pub reset_micros: u64,
    /// What the call recorded, when the hit asked for a receipt
    /// ([`Hit::receipt`]) and something was recorded; `None` otherwise.
    pub receipt: Option<Receipt>,
    /// A hit on several limits ([`Hit::also`]): each limit's own answer,
    /// and which one this decision describes. `None` for a single limit.
    pub group: Option<Box<Group>>,
}

impl Decision {
    /// A decision without a receipt.
    pub const fn new(admitted: bool, remaining: u64, reset_micros: u64) -> Decision {
        Decision {
            admitted,
            remaining,
            reset_micros,
            receipt: None,
            group: None,
        }
    }
}

/// Why a store could not answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The backend did not answer within the configured timeout.
    #[error("store timed out after {0} ms")]
    Timeout(u64),
    /// The backend is unreachable or failing; retrying later may work.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Too many recent failures; the store is not tried until a probe succeeds.
    #[error("store circuit open after repeated failures")]
    CircuitOpen,
    /// The backend answered something this version does not understand.
    #[error("store protocol error: {0}")]
    Protocol(String),
    /// Over `max_in_flight` store calls were already waiting: refused at
    /// once, without trying the store (see [`gate`]).
    #[error("over max_in_flight={0}: too many store calls in flight")]
    Overloaded(usize),
    /// The limiter's keys were moving between servers (a Redis Cluster
    /// reshard) and no server took the call before the timeout; nothing
    /// was recorded. Routing, not a server's health: the breaker counts it
    /// neither way.
    #[error("store unavailable while its slot moves: {0}")]
    Moved(String),
}

impl StoreError {
    /// Whether trying again later can succeed.
    pub fn is_transient(&self) -> bool {
        !matches!(self, StoreError::Protocol(_))
    }
}

/// The backend server a hit goes to (a Redis Cluster primary), so failures
/// of one server are kept apart from the others. Cheap to clone.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct NodeId(Option<Arc<str>>);

impl NodeId {
    /// The one server of a store that has one (or that cannot tell).
    pub const SOLE: NodeId = NodeId(None);

    /// A server by its name, e.g. `10.0.0.7:6379`.
    pub fn named(name: &str) -> NodeId {
        NodeId(Some(Arc::from(name)))
    }

    pub fn name(&self) -> Option<&str> {
        self.0.as_deref()
    }

    /// The name as a shared string: labels take it without a copy.
    pub fn shared_name(&self) -> Option<Arc<str>> {
        self.0.clone()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name().unwrap_or("sole"))
    }
}

/// Failed calls since start, by kind: what a metrics exporter reads.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FailureCounts {
    pub timeout: u64,
    pub unavailable: u64,
    pub protocol: u64,
    /// Refused by an open circuit without trying the backend.
    pub circuit_open: u64,
}

/// [`FailureCounts`] kept with relaxed atomics: counting must cost next to
/// nothing on the request path, and readers only need a recent total.
#[derive(Debug, Default)]
pub struct FailureCounters {
    timeout: AtomicU64,
    unavailable: AtomicU64,
    protocol: AtomicU64,
    circuit_open: AtomicU64,
}

impl FailureCounters {
    pub fn record(&self, error: &StoreError) {
        let counter = match error {
            StoreError::Timeout(_) => &self.timeout,
            StoreError::Unavailable(_) | StoreError::Moved(_) => &self.unavailable,
            StoreError::Protocol(_) => &self.protocol,
            StoreError::CircuitOpen => &self.circuit_open,
            // Not the backend's failure: it was never asked.
            StoreError::Overloaded(_) => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> FailureCounts {
        FailureCounts {
            timeout: self.timeout.load(Ordering::Relaxed),
            unavailable: self.unavailable.load(Ordering::Relaxed),
            protocol: self.protocol.load(Ordering::Relaxed),
            circuit_open: self.circuit_open.load(Ordering::Relaxed),
        }
    }
}

/// What a metrics exporter reads from a store besides its failures; each
/// store fills what it has.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StoreGauges {
    /// Limiters held (embedded store).
    pub limiters: Option<u64>,
    /// Limiters forgotten to stay within the caps (embedded store).
    pub evictions: Option<u64>,
    /// Estimated bytes of the limiters held (embedded store).
    pub bytes: Option<u64>,
    /// Every server a circuit knows of, and whether calls to it are refused.
    pub circuits: Vec<(NodeId, bool)>,
    /// Times the scripts were loaded into a server (Redis: at connect and
    /// after every reconnect).
    pub script_loads: Option<u64>,
    /// Redis: batches of several script calls sent as one `EVALSHA`, and
    /// the calls they carried (calls sent alone are in neither).
    pub batches: Option<(u64, u64)>,
    /// Redis Cluster: calls sent again because their slot had moved or was
    /// moving (`MOVED`, `ASK`, a batched call whose keys were elsewhere,
    /// `TRYAGAIN`, `CLUSTERDOWN`).
    pub redirects: Option<u64>,
    /// The local over-limit cache in front of the store, when enabled.
    pub over_limit_cache: Option<CacheCounts>,
    /// The coalescing layer, when enabled.
    pub coalesced: Option<CoalesceCounts>,
    /// The leasing layer (`lease: true` limiters).
    pub lease: Option<lease::LeaseCounts>,
}

/// A counting backend. Implementations must be safe under concurrent calls:
/// no lost updates and no over-admission for one limiter.
pub trait Store: Send + Sync + 'static {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>>;

    /// Decides `hit`, then the hits of the same limiter with the costs in
    /// `more`, in that order, as if each came alone: one decision per hit.
    /// A store that talks to a server does it in one atomic step (one
    /// script call); the default decides them one call at a time, which
    /// gives the same decisions. Used by the coalescing layer.
    fn hit_batch<'a>(
        &'a self,
        hit: Hit<'a>,
        more: &'a [Cost],
    ) -> BoxFuture<'a, Result<Vec<Decision>, StoreError>> {
        Box::pin(async move {
            let mut decisions = Vec::with_capacity(1 + more.len());
            decisions.push(self.hit(hit).await?);
            for cost in more {
                let next = Hit {
                    hits: cost.hits,
                    negative: cost.negative,
                    ..hit
                };
                decisions.push(self.hit(next).await?);
            }
            Ok(decisions)
        })
    }

    /// Records `call`'s report in its limiter's lease ledger and grants the
    /// holder its share, in one atomic step ([`crate::quota::Ledger::report`]
    /// in memory, one script in Redis). Layers pass it to the backend
    /// unchanged (a lease is one call per stream and limiter every few
    /// seconds: nothing to cache, coalesce or shard), except the breaker,
    /// which runs it under the server's circuit like a hit.
    fn lease<'a>(&'a self, call: LeaseCall<'a>) -> BoxFuture<'a, Result<quota::Grant, StoreError>> {
        match self.wrapped() {
            Some(w) => w.lease(call),
            None => Box::pin(async {
                Err(StoreError::Protocol(
                    "this store keeps no lease ledgers".into(),
                ))
            }),
        }
    }

    /// Takes back what `receipt` says a call of `hit`'s limiter recorded,
    /// as if that call had never come, as far as that can be done without
    /// ever lowering the count below what the hits still recorded account
    /// for: what cannot be told apart is left counted (an error towards
    /// refusing, never towards admitting). One atomic step on the
    /// limiter's own state (in its own slot on a cluster). `hit` is the
    /// limiter as it was hit (its cost is ignored). Layers that keep
    /// nothing of a limiter pass it on.
    fn undo<'a>(&'a self, hit: Hit<'a>, receipt: Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        match self.wrapped() {
            Some(w) => w.undo(hit, receipt),
            None => Box::pin(async {
                Err(StoreError::Protocol(
                    "this store cannot take hits back".into(),
                ))
            }),
        }
    }

    /// Forgets everything `hit`'s limiter recorded, so that it has its
    /// whole limit back: every key of its state and the lease ledger of
    /// its identity ([`Hit::ledger`]). `hit` is the limiter as the engine
    /// sends it (its cost is ignored): the sharding layer resets every
    /// shard, the over-limit cache forgets the limiter's refusals, the
    /// other layers pass it on. A store that other replicas share also
    /// moves its [`Store::reset_generation`].
    fn reset<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        match self.wrapped() {
            Some(w) => w.reset(hit),
            None => Box::pin(async {
                Err(StoreError::Protocol(
                    "this store cannot reset limiters".into(),
                ))
            }),
        }
    }

    /// Decides `hit` at once without a store call when a layer holds what
    /// it needs (the leasing layer: a lease that covers it); `None`
    /// otherwise, having changed nothing a [`Store::hit`] would not, which
    /// the caller then makes. So the observing layer times only calls
    /// that reach a store. Must be cheap and never wait.
    fn decide_here(&self, hit: &Hit<'_>) -> Option<Decision> {
        self.wrapped().and_then(|w| w.decide_here(hit))
    }

    /// A number that changes when a limiter of a store shared with other
    /// replicas was reset (by any replica), as this replica last read it:
    /// the over-limit cache forgets every refusal it holds when it moves.
    /// 0 for a store no other replica shares. Read on every hit: must be
    /// cheap and never wait.
    fn reset_generation(&self) -> u64 {
        self.wrapped().map_or(0, |w| w.reset_generation())
    }

    /// The store a layer wraps. What a layer does not change (readiness,
    /// housekeeping, names, counts) reaches that store through the
    /// defaults below, so a layer writes only what it adds. `None` for a
    /// backend.
    fn wrapped(&self) -> Option<&dyn Store> {
        None
    }

    /// True once the store can answer (Redis: reachable, scripts loaded).
    fn is_ready(&self) -> bool {
        self.wrapped().is_none_or(|w| w.is_ready())
    }

    /// Periodic housekeeping (the embedded store drops expired limiters).
    /// The server calls it every few seconds, so memory follows the live
    /// windows even when traffic stops.
    fn maintain(&self) {
        if let Some(w) = self.wrapped() {
            w.maintain();
        }
    }

    /// A short name for logs: `memory`, `redis`, `redis-cluster`...
    fn kind(&self) -> &'static str {
        self.wrapped().map_or("store", |w| w.kind())
    }

    /// The server `hit` would go to, by the store's current view of its
    /// deployment. Called on every hit before [`Store::hit`]: must be cheap
    /// and never wait.
    fn node(&self, hit: &Hit<'_>) -> NodeId {
        self.wrapped().map_or(NodeId::SOLE, |w| w.node(hit))
    }

    /// Failed calls so far, for stores that count them.
    fn failures(&self) -> FailureCounts {
        self.wrapped().map(|w| w.failures()).unwrap_or_default()
    }

    /// Sizes and states for metrics. Called at scrape time, never per hit.
    fn gauges(&self) -> StoreGauges {
        self.wrapped().map(|w| w.gauges()).unwrap_or_default()
    }

    /// The heaviest limiters of this replica, from the hot-key layer.
    /// Called per `/debug/hotkeys` request.
    fn hot_keys(&self) -> Option<hotkeys::Report> {
        self.wrapped().and_then(|w| w.hot_keys())
    }
}
