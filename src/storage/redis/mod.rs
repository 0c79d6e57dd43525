//! The Redis store: one Lua script per algorithm (`lua/*.lua`), run with
//! `EVALSHA` so deciding and recording is one atomic step on the server, on
//! the server's clock. Standalone, Cluster and Sentinel deployments, with or
//! without TLS. This is the only module that knows fred.
//!
//! Invariants:
//! * A call never waits longer than `command_timeout`, connected or not: a
//!   caller (Envoy, 20 ms by default) prefers a fast error to a late answer.
//! * Nothing piles up while Redis is away: a call made while disconnected
//!   fails at once, fred's command queue is bounded, and a command is written
//!   at most once (`max_command_attempts = 1`), so a hit cut off by a dropped
//!   connection is never counted twice by a silent retry.
//! * [`RedisStore::connect`] never fails because Redis is down: the store
//!   starts not ready and keeps reconnecting in the background.
//! * Scripts are reloaded on `NOSCRIPT`, because a failed-over primary (or a
//!   restarted server) has an empty script cache: Redis 7 does not replicate
//!   `SCRIPT LOAD`.
//! * One server's trouble stays with it. A cluster gets one client per
//!   primary, routed by our own copy of `CLUSTER SLOTS` (see
//!   [`CLUSTER_REFRESH`] for why not fred's cluster client), and
//!   [`Store::node`] names the primary of a hit so the breaker keeps a
//!   circuit per primary.
//! * State changes are logged once each by the supervisor (connected, lost,
//!   back, a primary unreachable or back, the routing changed); a failed
//!   call is never logged here, only returned.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use fred::interfaces::ClusterInterface;
use fred::prelude::{
    Builder, Client, ClientLike, Config, Error as FredError, ErrorKind, EventInterface, Pool,
    ReconnectPolicy, Server, ServerConfig, TlsConfig,
};
use fred::types::cluster::ClusterRouting;
use fred::types::config::UnresponsiveConfig;
use fred::types::scripts::Script;
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::TryRecvError;
use tokio::task::AbortHandle;

mod batch;
mod config;
mod group;
mod lease;
mod node;
mod redirect;
mod reset;
mod routing;
mod scripts;
mod supervise;
mod undo;

use crate::clock::{Clock, SystemClock};
use crate::limit::algorithms::{Leasing, Param, sliding_counter};
use batch::{Batcher, Call};
pub use config::RedisConfig;
pub(crate) use config::redact;
use node::*;
use redirect::*;
use routing::*;
use scripts::{Scripts, ahead, batch_id};
use supervise::*;

use crate::limit::{Algorithm, effective_burst};
use crate::storage::keys::{self, KeyBuilder, Role};
use crate::storage::{
    Ahead, BoxFuture, Cost, Decision, Hit, LeaseCall, NodeId, Receipt, Store, StoreError,
    StoreGauges,
};

/// Lua numbers are doubles: integers are exact up to 2^53.
const MAX_EXACT: u64 = 1 << 53;
/// How long a cluster waits for every primary before it reports ready
/// with those that answer.
const STARTUP_GRACE: Duration = Duration::from_secs(5);

/// A [`Store`] on Redis. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    deployment: Deployment,
    scripts: Arc<Scripts>,
    keys: KeyBuilder,
    kind: &'static str,
    command_timeout: Duration,
    /// Which server each hit goes to; rebuilt by the supervisor, read on
    /// every hit.
    routing: RwLock<Arc<Routing>>,
    /// A call met a slot that moved: look at the cluster again now.
    stale: AtomicBool,
    /// Pools opened for servers a redirection named that the routing does
    /// not list (yet): a new primary receiving its first slot.
    redirect_pools: Mutex<HashMap<String, Arc<NodePool>>>,
    /// Script sets loaded into a server, for metrics.
    script_loads: AtomicU64,
    /// Calls sent again after a redirection, for metrics.
    redirects: AtomicU64,
    /// The reset counter as last read ([`Store::reset_generation`]).
    reset_generation: AtomicU64,
    /// The supervisor; aborted on drop so a dropped store stops
    /// reconnecting.
    supervisor: Mutex<Option<AbortHandle>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self
            .supervisor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

enum Deployment {
    /// Standalone, or Sentinel (fred follows the primary).
    Single(NodePool),
    /// A Redis Cluster, with one pool per primary (see [`Routing`]) and
    /// these to open them.
    Cluster {
        settings: PoolSettings,
        seeds: Vec<Server>,
    },
}

impl RedisStore {
    /// Builds the store and starts connecting in the background. Fails only
    /// on invalid settings (URL, TLS files), never because Redis is down;
    /// see [`Store::is_ready`] and [`RedisStore::wait_ready`]. Needs a tokio
    /// runtime.
    pub async fn connect(config: RedisConfig) -> Result<RedisStore, StoreError> {
        let (fred_config, kind) = config.to_fred()?;
        let scripts = Arc::new(Scripts::new());
        let settings = PoolSettings {
            config: fred_config.clone(),
            pool_size: config.pool_size,
            connect_timeout: config.connect_timeout,
            command_timeout: config.command_timeout,
            scripts: scripts.clone(),
            batch_max: config.batch_max,
            batch_lanes: config.batch_lanes,
        };
        // A standalone server is named from the start, so a failure before
        // the supervisor first looks is already counted against it.
        let routing = match &fred_config.server {
            ServerConfig::Centralized { server } => {
                let name = server.to_string();
                Routing {
                    single: NodeId::named(&name),
                    source: vec![(0, 0, name)],
                    ..Routing::default()
                }
            }
            _ => Routing::default(),
        };
        let deployment = match &fred_config.server {
            ServerConfig::Clustered { hosts, .. } => Deployment::Cluster {
                seeds: hosts.clone(),
                settings,
            },
            _ => Deployment::Single(settings.open(fred_config, NodeId::SOLE)?),
        };
        let inner = Arc::new(Inner {
            deployment,
            scripts,
            keys: KeyBuilder::new(config.key_prefix),
            kind,
            command_timeout: config.command_timeout,
            routing: RwLock::new(Arc::new(routing)),
            stale: AtomicBool::new(true),
            redirect_pools: Mutex::new(HashMap::new()),
            script_loads: AtomicU64::new(0),
            redirects: AtomicU64::new(0),
            reset_generation: AtomicU64::new(0),
            supervisor: Mutex::new(None),
        });
        tokio::spawn(reset::follow_resets(Arc::downgrade(&inner)));
        let task = tokio::spawn(supervise(Arc::downgrade(&inner)));
        *inner.supervisor.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
        Ok(RedisStore { inner })
    }

    /// The script, keys and arguments of `hit`, followed by the further
    /// costs `more` of the same limiter (decided after it, in order).
    fn prepare(&self, hit: &Hit<'_>, more: &[Cost]) -> (u16, Call) {
        let limiter = self.inner.keys.limiter(hit);
        let slot = limiter.slot();
        let spec = hit.algorithm.spec();
        let (last, rest) = spec.roles.split_last().expect("an algorithm has keys");
        let mut keys: Vec<String> = rest.iter().map(|role| limiter.key(*role)).collect();
        keys.push(limiter.into_key(*last));
        // Integers go out as their decimal text, as the scripts read ARGV;
        // all are below 2^53, so they fit an i64.
        let mut args = Vec::with_capacity(10 + 2 * more.len());
        // A calendar window: its boundaries around this replica's clock,
        // among which the script picks by the server's.
        let calendar = hit
            .window
            .zone()
            .and_then(|zone| zone.around(hit.window.unit(), SystemClock.now_micros()));
        args.extend([
            hit.limit.min(MAX_EXACT) as i64,
            match calendar {
                Some(_) => 0,
                None => hit.window.micros().min(MAX_EXACT) as i64,
            },
            hit.hits.min(MAX_EXACT) as i64,
            // 3: a token bucket's or a log's lease ([`Hit::lease`]
            // reaches a store only on such a lease).
            if hit.lease && matches!(spec.leasing, Leasing::Tokens | Leasing::Log) {
                3
            } else {
                i64::from(hit.negative)
            },
            match spec.param {
                // Held within what the script keeps exact.
                Param::Burst => {
                    effective_burst(hit.burst, hit.limit, hit.window).min(MAX_EXACT) as i64
                }
                Param::Buckets => i64::from(hit.buckets),
                Param::MaxDuration => hit.burst.clamp(1, MAX_EXACT) as i64,
            },
            // 2: answer with receipts (never asked with usage reports);
            // 3: and reserve hits in the next windows.
            if ahead(hit, calendar.is_some(), more) {
                3
            } else if hit.receipt {
                2
            } else {
                i64::from(hit.usage_reports)
            },
        ]);
        if spec.staggered {
            // ARGV[7]: where its buckets start (below the window, which
            // fits MAX_EXACT); 0 when its window is not staggered.
            args.push(sliding_counter::phase(hit.domain, hit.entries, hit.window) as i64);
        }
        if let Some(bounds) = calendar {
            args.extend(bounds.map(|b| b.min(MAX_EXACT) as i64));
        } else if ahead(hit, false, more) {
            args.push(i64::from(hit.ahead.windows.min(Ahead::MAX_WINDOWS)));
            args.push(hit.ahead.hits.min(MAX_EXACT) as i64);
        }
        for cost in more {
            args.push(cost.hits.min(MAX_EXACT) as i64);
            args.push(i64::from(cost.negative));
        }
        let call = Call {
            algorithm: Some(hit.algorithm),
            keys,
            args,
        };
        (slot, call)
    }

    /// Runs a script for `expected` hits: one `{admitted, remaining,
    /// reset}` triple each, followed by a receipt `{hits, at, mark}` when
    /// `receipt` (of `shard`) is asked for; a lone hit that reserved
    /// ahead ([`scripts::ahead`]: `ahead` asked) then by the windows
    /// reserved.
    async fn run(
        &self,
        slot: u16,
        call: Call,
        expected: usize,
        (receipt, ahead): (Option<u16>, bool),
    ) -> Result<Vec<Decision>, StoreError> {
        let timeout = self.inner.command_timeout;
        // fred applies the same timeout per command; this one also bounds a
        // NOSCRIPT reload, a MOVED retry and any wait in fred's queue.
        let reply = match tokio::time::timeout(timeout, self.call(slot, call)).await {
            Err(_) => return Err(StoreError::Timeout(timeout.as_millis() as u64)),
            Ok(reply) => reply?,
        };
        let unexpected = || StoreError::Protocol(format!("unexpected script reply {reply:?}"));
        let width = if receipt.is_some() { 6 } else { 3 };
        // A lease reserving ahead: one more value, the windows reserved.
        let (reply, windows) = match reply.split_at_checked(6) {
            Some((body, &[windows])) if ahead && receipt.is_some() && expected == 1 => {
                let windows = u8::try_from(windows)
                    .ok()
                    .filter(|&r| r <= Ahead::MAX_WINDOWS)
                    .ok_or_else(unexpected)?;
                (body, windows)
            }
            _ => (&reply[..], 0),
        };
        if reply.len() != width * expected {
            return Err(unexpected());
        }
        reply
            .chunks_exact(width)
            .map(|d| match d[..3] {
                [admitted, remaining, reset]
                    if (0..=1).contains(&admitted) && remaining >= 0 && reset >= 0 =>
                {
                    Ok(Decision {
                        admitted: admitted == 1,
                        remaining: remaining as u64,
                        reset_micros: reset as u64,
                        receipt: match (receipt, &d[3..]) {
                            (Some(shard), &[hits, at, mark]) if hits > 0 => Some(Receipt {
                                hits: hits as u64,
                                at: u64::try_from(at).map_err(|_| unexpected())?,
                                mark: u64::try_from(mark).map_err(|_| unexpected())?,
                                shard,
                                ahead: windows,
                                reserved: 0,
                            }),
                            _ => None,
                        },
                        group: None,
                    })
                }
                _ => Err(unexpected()),
            })
            .collect()
    }

    /// Runs the script on the node that holds the slot's keys: the primary
    /// the routing names, then wherever Redis redirects the call, as a
    /// Redis Cluster client must. A batched call whose keys were not on
    /// the server (it recorded nothing) is sent again alone with its keys
    /// declared, so that Redis answers `MOVED` (the slot moved: routing is
    /// refreshed at once and the call follows to the new owner) or `ASK`
    /// (the slot is migrating and the keys are already on the target:
    /// `ASKING` then the call, there). `TRYAGAIN` (a limiter's keys split
    /// by a migration) and `CLUSTERDOWN` wait a moment and try again. Each
    /// of these replies means the script did not run, so following it
    /// never records a hit twice; every retry stays within the call's
    /// timeout.
    async fn call(&self, slot: u16, call: Call) -> Result<Vec<i64>, StoreError> {
        let timeout = self.inner.command_timeout;
        let routing = self.inner.routing();
        let node = match &self.inner.deployment {
            Deployment::Single(node) => {
                connected_client(node)?;
                return node
                    .batcher
                    .submit(call)
                    .await
                    .map_err(|e| store_error(e, timeout));
            }
            Deployment::Cluster { .. } => routing.owner_pool(slot)?,
        };
        connected_client(&node)?;
        let script = call.script(&self.inner.scripts);
        let group = call.algorithm.is_none();
        let (keys, args) = (call.keys.clone(), call.values());
        let mut reply = node.batcher.submit(call).await;
        let (mut target, mut asking) = (node, false);
        for _ in 0..MAX_REDIRECTS {
            let e = match reply {
                Ok(reply) => return Ok(reply),
                Err(e) => e,
            };
            let redirect = Redirect::of(&e);
            if redirect.is_some() {
                self.inner.redirects.fetch_add(1, Ordering::Relaxed);
            }
            match redirect {
                None => return Err(store_error(e, timeout)),
                Some(Redirect::NotHere) => {
                    self.inner.stale.store(true, Ordering::Release);
                    (target, asking) = (self.inner.routing().owner_pool(slot)?, false);
                }
                Some(Redirect::Moved(to)) => {
                    self.inner.stale.store(true, Ordering::Release);
                    (target, asking) = (self.pool_for(&to).await?, false);
                }
                Some(Redirect::Ask(to)) => (target, asking) = (self.pool_for(&to).await?, true),
                Some(Redirect::TryAgain) => tokio::time::sleep(RETRY_PAUSE).await,
                Some(Redirect::ClusterDown) => {
                    self.inner.stale.store(true, Ordering::Release);
                    tokio::time::sleep(RETRY_PAUSE).await;
                    (target, asking) = (self.inner.routing().owner_pool(slot)?, false);
                }
            }
            let client = connected_client(&target)?.clone();
            reply = if asking {
                batch::run_asking(script, &client, keys.clone(), args.clone()).await
            } else {
                batch::run_script(script, &client, keys.clone(), args.clone()).await
            }
            .and_then(|r| batch::own_reply(group, r));
        }
        match reply {
            Ok(reply) => Ok(reply),
            Err(e) if Redirect::of(&e).is_some() => Err(StoreError::Moved(e.to_string())),
            Err(e) => Err(store_error(e, timeout)),
        }
    }
}

impl Store for RedisStore {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        if !hit.also.is_empty() {
            return Box::pin(async move {
                let mut decisions = self.run_group(&hit, &[]).await?;
                decisions
                    .pop()
                    .ok_or_else(|| StoreError::Protocol("empty script reply".into()))
            });
        }
        let (slot, call) = self.prepare(&hit, &[]);
        let receipt = hit.receipt.then_some(hit.shard.index);
        let ahead = !hit.ahead.is_none();
        Box::pin(async move {
            let mut decisions = self.run(slot, call, 1, (receipt, ahead)).await?;
            decisions
                .pop()
                .ok_or_else(|| StoreError::Protocol("empty script reply".into()))
        })
    }

    fn hit_batch<'a>(
        &'a self,
        hit: Hit<'a>,
        more: &'a [Cost],
    ) -> BoxFuture<'a, Result<Vec<Decision>, StoreError>> {
        if !hit.also.is_empty() {
            return Box::pin(async move { self.run_group(&hit, more).await });
        }
        let (slot, call) = self.prepare(&hit, more);
        let receipt = hit.receipt.then_some(hit.shard.index);
        Box::pin(self.run(slot, call, 1 + more.len(), (receipt, false)))
    }

    fn undo<'a>(&'a self, hit: Hit<'a>, receipt: Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.take_back(&hit, &receipt).await })
    }

    fn lease<'a>(
        &'a self,
        call: LeaseCall<'a>,
    ) -> BoxFuture<'a, Result<crate::quota::Grant, StoreError>> {
        Box::pin(self.lease_call(call))
    }

    fn reset<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { self.reset_call(&hit).await })
    }

    fn reset_generation(&self) -> u64 {
        self.inner.reset_generation.load(Ordering::Acquire)
    }

    fn is_ready(&self) -> bool {
        match &self.inner.deployment {
            Deployment::Single(node) => node.is_ready(),
            // Ready once every primary has answered (or, with one down from
            // the start, after a grace period), and then while some primary
            // answers: the limiters of a lost primary follow their failure
            // policy, which is no reason to take this instance out.
            Deployment::Cluster { .. } => {
                let routing = self.inner.routing();
                let settled = routing.built.is_some_and(|t| t.elapsed() >= STARTUP_GRACE)
                    || routing
                        .nodes
                        .iter()
                        .all(|n| n.answered.load(Ordering::Acquire));
                settled && routing.nodes.iter().any(|n| n.is_ready())
            }
        }
    }

    fn kind(&self) -> &'static str {
        self.inner.kind
    }

    fn gauges(&self) -> StoreGauges {
        StoreGauges {
            script_loads: Some(self.inner.script_loads.load(Ordering::Relaxed)),
            redirects: Some(self.inner.redirects.load(Ordering::Relaxed)),
            batches: Some(self.inner.batch_counts()),
            ..StoreGauges::default()
        }
    }

    fn node(&self, hit: &Hit<'_>) -> NodeId {
        let routing = self.inner.routing();
        match &self.inner.deployment {
            Deployment::Single(_) => routing.single.clone(),
            Deployment::Cluster { .. } => {
                // Every key of a limiter shares its hash tag, so the tag's
                // slot is the limiter's slot.
                let slot = self.inner.keys.limiter(hit).slot();
                routing
                    .owner(slot)
                    .map(|n| n.id.clone())
                    .unwrap_or_default()
            }
        }
    }
}

impl Inner {
    /// Batches and their calls, over every server.
    fn batch_counts(&self) -> (u64, u64) {
        let add = |(b, c): (u64, u64), node: &NodePool| {
            let (nb, nc) = node.batcher.counts();
            (b + nb, c + nc)
        };
        match &self.deployment {
            Deployment::Single(node) => add((0, 0), node),
            Deployment::Cluster { .. } => self
                .routing()
                .nodes
                .iter()
                .fold((0, 0), |acc, n| add(acc, n)),
        }
    }

    fn routing(&self) -> Arc<Routing> {
        self.routing
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_routing(&self, routing: Routing) {
        *self.routing.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(routing);
    }
}

fn store_error(e: FredError, timeout: Duration) -> StoreError {
    match e.kind() {
        ErrorKind::Timeout => StoreError::Timeout(timeout.as_millis() as u64),
        ErrorKind::Protocol | ErrorKind::Parse => StoreError::Protocol(e.to_string()),
        ErrorKind::Unknown | ErrorKind::InvalidArgument | ErrorKind::InvalidCommand => {
            // An error reply from Redis: transient server states are
            // "unavailable"; anything else (a script error, CROSSSLOT,
            // WRONGTYPE) is a bug or a foreign key, not worth a retry.
            const TRANSIENT: [&str; 12] = [
                "CLUSTERDOWN",
                "MOVED",
                "ASK",
                "TRYAGAIN",
                "LOADING",
                "READONLY",
                "MASTERDOWN",
                "BUSY",
                "NOREPLICAS",
                "MISCONF",
                "OOM",
                "NOSCRIPT",
            ];
            // The client's own word that it had no connection to send
            // the command on (the server went away between the check
            // for a connected client and the write): unavailable, as a
            // closed connection is, so the breaker counts it.
            const NOT_SENT: &str = "Failed to route command";
            let details = e.details();
            if TRANSIENT.iter().any(|p| details.starts_with(p)) || details.starts_with(NOT_SENT) {
                StoreError::Unavailable(e.to_string())
            } else {
                StoreError::Protocol(e.to_string())
            }
        }
        // IO, Canceled (written while disconnected), Backpressure, Cluster,
        // Routing, Sentinel, Auth, Tls...: the backend is not reachable now.
        _ => StoreError::Unavailable(e.to_string()),
    }
}

/// Invalid settings are permanent: reported as the non-transient variant.
fn invalid(message: String) -> StoreError {
    StoreError::Protocol(format!("invalid redis settings: {message}"))
}

#[cfg(test)]
mod tests;
