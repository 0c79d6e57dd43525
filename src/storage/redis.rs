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

use crate::limit::Algorithm;
use crate::storage::keys::{self, KeyBuilder, Role};
use crate::storage::{BoxFuture, Cost, Decision, Hit, NodeId, Store, StoreError, StoreGauges};

const FIXED_WINDOW_LUA: &str = include_str!("../../lua/fixed_window.lua");
const SLIDING_COUNTER_LUA: &str = include_str!("../../lua/sliding_window_counter.lua");
const SLIDING_LOG_LUA: &str = include_str!("../../lua/sliding_window_log.lua");

/// Commands queued inside fred per client before it answers `Backpressure`.
const MAX_QUEUED_COMMANDS: usize = 4096;
/// Reconnect backoff, in milliseconds: exponential between these bounds.
const RECONNECT_MIN_MS: u32 = 50;
const RECONNECT_MAX_MS: u32 = 1_000;
/// A connection with a reply outstanding for this long is closed and
/// reopened (a paused or black-holed node sends no FIN).
const UNRESPONSIVE_AFTER: Duration = Duration::from_secs(2);
/// How often the background task checks connections and scripts.
const SUPERVISE_EVERY: Duration = Duration::from_millis(100);
/// Lua numbers are doubles: integers are exact up to 2^53.
const MAX_EXACT: u64 = 1 << 53;
/// How long a cluster waits for every primary before it reports ready
/// with those that answer.
const STARTUP_GRACE: Duration = Duration::from_secs(5);
/// Hash slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// How to reach Redis. Its `Debug` output hides the password (the field
/// and the URL's).
#[derive(Clone)]
pub struct RedisConfig {
    /// `redis://`, `rediss://` (TLS), `redis-cluster://h:p?node=h2:p2`,
    /// `redis-sentinel://h:p?sentinelServiceName=name&node=...`, as fred
    /// parses them.
    pub url: String,
    /// Overrides the URL's user name.
    pub username: Option<String>,
    /// Overrides the URL's password.
    pub password: Option<String>,
    /// PEM bundle of trusted CAs (default: the system's). Giving any TLS file
    /// turns TLS on.
    pub tls_ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for mutual TLS (with `tls_key_file`).
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: Option<PathBuf>,
    /// Connections (each auto-pipelines, so a few are plenty).
    pub pool_size: usize,
    /// Bound on opening one connection (TCP, TLS, AUTH, cluster discovery).
    pub connect_timeout: Duration,
    /// Bound on one call, end to end. Keep it well under Envoy's timeout
    /// (20 ms by default) so Envoy gets a real answer or error.
    pub command_timeout: Duration,
    /// Key prefix; see [`keys`].
    pub key_prefix: String,
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &redact(&self.url))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".to_owned(),
            username: None,
            password: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            pool_size: 4,
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_millis(500),
            key_prefix: keys::DEFAULT_PREFIX.to_owned(),
        }
    }
}

impl RedisConfig {
    /// Checks the URL and TLS files without connecting: settings call this
    /// before anything is bound. The message never contains a password.
    pub fn validate(&self) -> Result<(), String> {
        self.to_fred().map(|_| ()).map_err(|e| match e {
            StoreError::Protocol(m) => m,
            other => other.to_string(),
        })
    }

    /// fred's configuration, and the deployment kind for logs.
    fn to_fred(&self) -> Result<(Config, &'static str), StoreError> {
        let mut fred_config = Config::from_url(&self.url)
            .map_err(|e| invalid(format!("redis url {:?}: {e}", redact(&self.url))))?;
        if self.username.is_some() {
            fred_config.username = self.username.clone();
        }
        if self.password.is_some() {
            fred_config.password = self.password.clone();
        }
        // Keep retrying the first connection too, instead of failing.
        fred_config.fail_fast = false;
        let wants_tls = fred_config.tls.is_some()
            || self.tls_ca_file.is_some()
            || self.tls_cert_file.is_some()
            || self.tls_key_file.is_some();
        if wants_tls {
            fred_config.tls = Some(tls_config(self)?);
        }
        let kind = match fred_config.server {
            ServerConfig::Clustered { .. } => "redis-cluster",
            ServerConfig::Sentinel { .. } => "redis-sentinel",
            _ => "redis",
        };
        Ok((fred_config, kind))
    }
}

/// A [`Store`] on Redis. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    deployment: Deployment,
    fixed_window: Script,
    sliding_counter: Script,
    sliding_log: Script,
    keys: KeyBuilder,
    kind: &'static str,
    command_timeout: Duration,
    /// Which server each hit goes to; rebuilt by the supervisor, read on
    /// every hit.
    routing: RwLock<Arc<Routing>>,
    /// A call met a slot that moved: look at the cluster again now.
    stale: AtomicBool,
    /// Script sets loaded into a server, for metrics.
    script_loads: AtomicU64,
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

/// Why a Redis Cluster gets one client per primary rather than fred's
/// cluster client: fred's cluster client reconnects as a whole, and while it
/// retries a node that stays down (a primary with no replica to promote) it
/// takes no new command for any node. Separate clients keep a dead primary's
/// trouble to its own slots; the routing comes from `CLUSTER SLOTS`, asked
/// every [`CLUSTER_REFRESH`] and at once when a call meets a moved slot.
const CLUSTER_REFRESH: Duration = Duration::from_secs(1);

/// What it takes to open a pool like the first one.
#[derive(Clone)]
struct PoolSettings {
    config: Config,
    pool_size: usize,
    connect_timeout: Duration,
    command_timeout: Duration,
}

impl PoolSettings {
    fn open(&self, config: Config, id: NodeId) -> Result<NodePool, StoreError> {
        let connect_timeout = self.connect_timeout;
        let command_timeout = self.command_timeout;
        let pool = Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = connect_timeout;
                c.internal_command_timeout = connect_timeout;
                c.max_command_attempts = 1;
                c.max_command_buffer_len = MAX_QUEUED_COMMANDS;
                c.unresponsive = UnresponsiveConfig {
                    max_timeout: Some(UNRESPONSIVE_AFTER),
                    interval: Duration::from_millis(500),
                };
                c.tcp.nodelay = Some(true);
            })
            .with_performance_config(|p| p.default_command_timeout = command_timeout)
            .set_policy(ReconnectPolicy::new_exponential(
                0,
                RECONNECT_MIN_MS,
                RECONNECT_MAX_MS,
                2,
            ))
            .build_pool(self.pool_size.max(1))
            .map_err(|e| invalid(format!("redis client: {e}")))?;
        let mut tasks = Vec::new();
        for handle in pool.connect_pool() {
            tasks.push(handle.abort_handle());
            tokio::spawn(async move {
                // Ends only on a fatal error (bad settings), quit or abort.
                if let Ok(Err(e)) = handle.await {
                    tracing::error!(error = %e, "redis connection task stopped");
                }
            });
        }
        let reconnects = pool.clients().iter().map(|c| c.reconnect_rx()).collect();
        Ok(NodePool {
            id,
            pool,
            tasks,
            loaded: AtomicBool::new(false),
            reconnects: Mutex::new(reconnects),
            reachable: AtomicBool::new(true),
            answered: AtomicBool::new(false),
        })
    }

    /// A pool to one cluster node.
    fn open_node(&self, server: Server) -> Result<NodePool, StoreError> {
        let mut config = self.config.clone();
        let id = NodeId::named(&server.to_string());
        config.server = ServerConfig::Centralized { server };
        self.open(config, id)
    }
}

/// Connections to one server. Dropping it stops them.
struct NodePool {
    id: NodeId,
    pool: Pool,
    tasks: Vec<AbortHandle>,
    /// Scripts loaded since the last (re)connection.
    loaded: AtomicBool,
    /// Read by the supervisor only.
    reconnects: Mutex<Vec<Receiver<Server>>>,
    /// As last logged by the supervisor.
    reachable: AtomicBool,
    /// Scripts were loaded once: the server has answered since the pool
    /// opened.
    answered: AtomicBool,
}

impl Drop for NodePool {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl NodePool {
    fn is_connected(&self) -> bool {
        self.pool.clients().iter().any(|c| c.is_connected())
    }

    fn is_ready(&self) -> bool {
        self.loaded.load(Ordering::Acquire) && self.is_connected()
    }

    /// Whether a connection came back since the last look.
    fn reconnected(&self) -> bool {
        let mut reconnects = self.reconnects.lock().unwrap_or_else(|e| e.into_inner());
        let mut reconnected = false;
        for (rx, client) in reconnects.iter_mut().zip(self.pool.clients()) {
            loop {
                match rx.try_recv() {
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Closed) => {
                        // fred swaps the channel on some state changes.
                        *rx = client.reconnect_rx();
                        reconnected = true;
                        break;
                    }
                    Ok(_) | Err(TryRecvError::Lagged(_)) => reconnected = true,
                }
            }
        }
        reconnected
    }

    /// Loads the scripts after every (re)connection, so the first calls do
    /// not pay for a `NOSCRIPT` round trip and readiness means "can
    /// answer". A reconnect does not flip readiness while it reloads: other
    /// connections still answer, and a call that meets `NOSCRIPT` reloads on
    /// its own.
    async fn keep_scripts(&self, inner: &Inner) {
        let reconnected = self.reconnected();
        let Some(client) = self.pool.clients().iter().find(|c| c.is_connected()) else {
            self.loaded.store(false, Ordering::Release);
            return;
        };
        if !reconnected && self.loaded.load(Ordering::Acquire) {
            return;
        }
        let load = load_scripts(inner, client);
        let loaded = match tokio::time::timeout(Duration::from_secs(2), load).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::debug!(node = %self.id, error = %e, "loading redis scripts failed");
                false
            }
            Err(_) => {
                tracing::debug!(node = %self.id, "loading redis scripts timed out");
                false
            }
        };
        self.loaded.store(loaded, Ordering::Release);
        if loaded {
            self.answered.store(true, Ordering::Release);
        }
    }
}

impl RedisStore {
    /// Builds the store and starts connecting in the background. Fails only
    /// on invalid settings (URL, TLS files), never because Redis is down;
    /// see [`Store::is_ready`] and [`RedisStore::wait_ready`]. Needs a tokio
    /// runtime.
    pub async fn connect(config: RedisConfig) -> Result<RedisStore, StoreError> {
        let (fred_config, kind) = config.to_fred()?;
        let settings = PoolSettings {
            config: fred_config.clone(),
            pool_size: config.pool_size,
            connect_timeout: config.connect_timeout,
            command_timeout: config.command_timeout,
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
            fixed_window: Script::from_lua(FIXED_WINDOW_LUA),
            sliding_counter: Script::from_lua(SLIDING_COUNTER_LUA),
            sliding_log: Script::from_lua(SLIDING_LOG_LUA),
            keys: KeyBuilder::new(config.key_prefix),
            kind,
            command_timeout: config.command_timeout,
            routing: RwLock::new(Arc::new(routing)),
            stale: AtomicBool::new(true),
            script_loads: AtomicU64::new(0),
            supervisor: Mutex::new(None),
        });
        let task = tokio::spawn(supervise(Arc::downgrade(&inner)));
        *inner.supervisor.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
        Ok(RedisStore { inner })
    }

    /// Waits until the store is ready or `timeout` passes; returns readiness.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.is_ready() {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The script, keys and arguments of `hit`, followed by the further
    /// costs `more` of the same limiter (decided after it, in order).
    fn prepare(&self, hit: &Hit<'_>, more: &[Cost]) -> (u16, &Script, Vec<String>, Vec<i64>) {
        let limiter = self.inner.keys.limiter(hit);
        let slot = limiter.slot();
        let (script, keys) = match hit.algorithm {
            Algorithm::FixedWindow => (
                &self.inner.fixed_window,
                vec![limiter.into_key(Role::State)],
            ),
            Algorithm::SlidingWindowCounter => (
                &self.inner.sliding_counter,
                vec![limiter.into_key(Role::State)],
            ),
            Algorithm::SlidingWindowLog => (
                &self.inner.sliding_log,
                vec![limiter.key(Role::LogSet), limiter.into_key(Role::LogMeta)],
            ),
        };
        // Integers go out as their decimal text, as the scripts read ARGV;
        // all are below 2^53, so they fit an i64.
        let mut args = Vec::with_capacity(6 + 2 * more.len());
        args.extend([
            hit.limit.min(MAX_EXACT) as i64,
            hit.unit.micros().min(MAX_EXACT) as i64,
            hit.hits.min(MAX_EXACT) as i64,
            i64::from(hit.negative),
            i64::from(hit.buckets),
            i64::from(hit.usage_reports),
        ]);
        for cost in more {
            args.push(cost.hits.min(MAX_EXACT) as i64);
            args.push(i64::from(cost.negative));
        }
        (slot, script, keys, args)
    }

    /// Runs a script for `expected` hits: one `{admitted, remaining,
    /// reset}` triple each.
    async fn run(
        &self,
        slot: u16,
        script: &Script,
        keys: Vec<String>,
        args: Vec<i64>,
        expected: usize,
    ) -> Result<Vec<Decision>, StoreError> {
        let timeout = self.inner.command_timeout;
        // fred applies the same timeout per command; this one also bounds a
        // NOSCRIPT reload, a MOVED retry and any wait in fred's queue.
        let reply = match tokio::time::timeout(timeout, self.call(slot, script, keys, args)).await {
            Err(_) => return Err(StoreError::Timeout(timeout.as_millis() as u64)),
            Ok(reply) => reply?,
        };
        let unexpected = || StoreError::Protocol(format!("unexpected script reply {reply:?}"));
        if reply.len() != 3 * expected {
            return Err(unexpected());
        }
        reply
            .chunks_exact(3)
            .map(|d| match *d {
                [admitted, remaining, reset]
                    if (0..=1).contains(&admitted) && remaining >= 0 && reset >= 0 =>
                {
                    Ok(Decision {
                        admitted: admitted == 1,
                        remaining: remaining as u64,
                        reset_micros: reset as u64,
                    })
                }
                _ => Err(unexpected()),
            })
            .collect()
    }

    /// Runs the script on the slot's primary. A `MOVED` reply (the slot has
    /// just changed hands, ahead of our routing) is followed once, to a
    /// primary we already know: the script did not run, so it is safe.
    async fn call(
        &self,
        slot: u16,
        script: &Script,
        keys: Vec<String>,
        args: Vec<i64>,
    ) -> Result<Vec<i64>, StoreError> {
        let timeout = self.inner.command_timeout;
        let routing = self.inner.routing();
        let node = match &self.inner.deployment {
            Deployment::Single(node) => node,
            Deployment::Cluster { .. } => match routing.owner(slot) {
                Some(node) => node,
                None if routing.nodes.is_empty() => {
                    return Err(StoreError::Unavailable(
                        "redis cluster routing not known yet".into(),
                    ));
                }
                None => {
                    return Err(StoreError::Unavailable(format!(
                        "no redis primary serves slot {slot}"
                    )));
                }
            },
        };
        let client = connected_client(node)?;
        let retry = matches!(self.inner.deployment, Deployment::Cluster { .. })
            .then(|| (keys.clone(), args.clone()));
        let first = script
            .evalsha_with_reload::<Vec<i64>, _, _>(client, keys, args)
            .await;
        let e = match first {
            Ok(reply) => return Ok(reply),
            Err(e) => e,
        };
        if !["MOVED", "ASK", "CLUSTERDOWN"]
            .iter()
            .any(|p| e.details().starts_with(p))
        {
            return Err(store_error(e, timeout));
        }
        self.inner.stale.store(true, Ordering::Release);
        // MOVED <slot> <host:port>
        let target = e
            .details()
            .strip_prefix("MOVED ")
            .and_then(|rest| rest.split_whitespace().nth(1));
        let owner = target.and_then(|t| routing.nodes.iter().find(|n| n.id.name() == Some(t)));
        match (owner, retry) {
            (Some(owner), Some((keys, args))) => {
                let client = connected_client(owner)?;
                script
                    .evalsha_with_reload::<Vec<i64>, _, _>(client, keys, args)
                    .await
                    .map_err(|e| store_error(e, timeout))
            }
            _ => Err(store_error(e, timeout)),
        }
    }
}

fn connected_client(node: &NodePool) -> Result<&Client, StoreError> {
    let client = node.pool.next_connected();
    if client.is_connected() {
        Ok(client)
    } else {
        Err(StoreError::Unavailable(match node.id.name() {
            Some(name) => format!("not connected to redis {name}"),
            None => "not connected to redis".to_owned(),
        }))
    }
}

/// Where hits go. A cluster maps each hash slot to its primary's pool; a
/// single server (standalone, or Sentinel's current primary) is the only
/// node, named once known.
#[derive(Default)]
struct Routing {
    /// Cluster only: for each slot, an index into `nodes`, or `UNOWNED`.
    slots: Vec<u16>,
    nodes: Vec<Arc<NodePool>>,
    /// Single server only: its name, once known.
    single: NodeId,
    /// What this was built from, to notice a change cheaply.
    source: Vec<(u16, u16, String)>,
    built: Option<std::time::Instant>,
}

/// A slot no primary serves in the last `CLUSTER SLOTS`.
const UNOWNED: u16 = u16::MAX;

impl Routing {
    /// `pools` holds the pools already open, by server name; they are
    /// reused, and pools for new primaries are opened.
    fn cluster(
        state: &ClusterRouting,
        pools: &HashMap<String, Arc<NodePool>>,
        settings: &PoolSettings,
    ) -> Result<Routing, StoreError> {
        let source = Self::cluster_source(state);
        let mut nodes: Vec<Arc<NodePool>> = Vec::new();
        let mut slots = vec![UNOWNED; SLOTS];
        for (range, (start, end, name)) in state.slots().iter().zip(&source) {
            let index = match nodes.iter().position(|n| n.id.name() == Some(name)) {
                Some(index) => index,
                None => {
                    let pool = match pools.get(name) {
                        Some(pool) => pool.clone(),
                        None => Arc::new(settings.open_node(range.primary.clone())?),
                    };
                    nodes.push(pool);
                    nodes.len() - 1
                }
            };
            let (start, end) = (*start as usize, (*end as usize).min(SLOTS - 1));
            if start <= end {
                slots[start..=end].fill(index as u16);
            }
        }
        Ok(Routing {
            slots,
            nodes,
            single: NodeId::SOLE,
            source,
            built: Some(std::time::Instant::now()),
        })
    }

    fn cluster_source(state: &ClusterRouting) -> Vec<(u16, u16, String)> {
        state
            .slots()
            .iter()
            .map(|r| (r.start, r.end, r.primary.to_string()))
            .collect()
    }

    fn owner(&self, slot: u16) -> Option<&NodePool> {
        match self.slots.get(slot as usize) {
            Some(&index) if index != UNOWNED => Some(&self.nodes[index as usize]),
            _ => None,
        }
    }
}

impl Store for RedisStore {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        let (slot, script, keys, args) = self.prepare(&hit, &[]);
        Box::pin(async move {
            let mut decisions = self.run(slot, script, keys, args, 1).await?;
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
        let (slot, script, keys, args) = self.prepare(&hit, more);
        Box::pin(self.run(slot, script, keys, args, 1 + more.len()))
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

/// Keeps connections useful: scripts loaded after every (re)connection,
/// the routing current, and each change of reachability logged once.
/// Holds only a weak reference: ends with the store.
async fn supervise(store: Weak<Inner>) {
    let mut link = Link::Connecting;
    // Cluster only: every pool open, by server name (the primaries, plus
    // the seeds until the first `CLUSTER SLOTS`).
    let mut pools: HashMap<String, Arc<NodePool>> = HashMap::new();
    let mut last_refresh: Option<tokio::time::Instant> = None;
    let mut preferred: Option<String> = None;
    loop {
        tokio::time::sleep(SUPERVISE_EVERY).await;
        let Some(inner) = store.upgrade() else { return };
        match &inner.deployment {
            Deployment::Single(node) => {
                link.observe(&inner, node.is_connected());
                node.keep_scripts(&inner).await;
                follow_single_primary(&inner, node);
            }
            Deployment::Cluster { settings, seeds } => {
                let due = last_refresh.is_none_or(|t| t.elapsed() >= CLUSTER_REFRESH);
                if due || inner.stale.swap(false, Ordering::AcqRel) {
                    last_refresh = Some(tokio::time::Instant::now());
                    refresh_cluster(&inner, settings, seeds, &mut pools, &mut preferred).await;
                }
                let routing = inner.routing();
                link.observe(&inner, routing.nodes.iter().any(|n| n.is_connected()));
                for node in &routing.nodes {
                    node.keep_scripts(&inner).await;
                    log_reachability(&inner, node);
                }
            }
        }
    }
}

/// Names the one node after the server fred is connected to (Sentinel's
/// current primary), so a new primary starts with a fresh circuit.
fn follow_single_primary(inner: &Inner, node: &NodePool) {
    let Some(client) = node.pool.clients().iter().find(|c| c.is_connected()) else {
        return;
    };
    let Some(server) = client.active_connections().first().map(|s| s.to_string()) else {
        return;
    };
    let current = inner.routing();
    if current.single.name() == Some(server.as_str()) {
        return;
    }
    tracing::debug!(kind = inner.kind, primary = %server, "redis primary");
    inner.set_routing(Routing {
        single: NodeId::named(&server),
        source: vec![(0, 0, server)],
        ..Routing::default()
    });
}

/// Asks a reachable node for `CLUSTER SLOTS` and rebuilds the routing when
/// it changed, opening pools for new primaries and closing the others.
async fn refresh_cluster(
    inner: &Inner,
    settings: &PoolSettings,
    seeds: &[Server],
    pools: &mut HashMap<String, Arc<NodePool>>,
    preferred: &mut Option<String>,
) {
    if !pools.values().any(|p| p.is_connected()) {
        // Nothing reachable (first start, or every known node gone): go
        // back to the seeds.
        for seed in seeds {
            if let Entry::Vacant(slot) = pools.entry(seed.to_string()) {
                match settings.open_node(seed.clone()) {
                    Ok(pool) => {
                        slot.insert(Arc::new(pool));
                    }
                    Err(e) => tracing::error!(error = %e, "opening a redis seed node"),
                }
            }
        }
    }
    // The node that answered last time first: a hung node (connected, but
    // silent until the unresponsive check closes it) costs a timeout per
    // refresh when asked first every time.
    let mut candidates: Vec<&Arc<NodePool>> = pools.values().filter(|p| p.is_connected()).collect();
    candidates.sort_by_key(|p| p.id.name() != preferred.as_deref());
    let mut asked = None;
    for pool in candidates {
        let Some(client) = pool.pool.clients().iter().find(|c| c.is_connected()) else {
            continue;
        };
        let host = client
            .active_connections()
            .first()
            .map(|s| s.host.to_string())
            .unwrap_or_default();
        let call = client.cluster_slots::<fred::types::Value>();
        if let Ok(Ok(reply)) = tokio::time::timeout(settings.connect_timeout, call).await {
            match ClusterRouting::from_cluster_slots(reply, host) {
                Ok(state) if !state.slots().is_empty() => {
                    *preferred = pool.id.name().map(str::to_owned);
                    asked = Some(state);
                    break;
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(node = %pool.id, error = %e, "bad CLUSTER SLOTS reply"),
            }
        }
    }
    let Some(state) = asked else { return };
    if Routing::cluster_source(&state) == inner.routing().source {
        return;
    }
    match Routing::cluster(&state, pools, settings) {
        Ok(routing) => {
            let primaries: Vec<String> = routing.nodes.iter().map(|n| n.id.to_string()).collect();
            tracing::info!(kind = inner.kind, primaries = ?primaries, "redis cluster routing updated");
            *pools = routing
                .nodes
                .iter()
                .map(|n| (n.id.to_string(), n.clone()))
                .collect();
            inner.set_routing(routing);
        }
        Err(e) => tracing::error!(error = %e, "opening a redis cluster node"),
    }
}

/// Logs a primary going out of reach, and coming back, once each.
fn log_reachability(inner: &Inner, node: &NodePool) {
    let connected = node.is_connected();
    if node.reachable.swap(connected, Ordering::AcqRel) != connected {
        if connected {
            tracing::info!(kind = inner.kind, node = %node.id, "redis node back");
        } else {
            tracing::warn!(kind = inner.kind, node = %node.id, "redis node unreachable");
        }
    }
}

/// Whether the store reaches Redis, as last logged: each change is logged
/// once, never per call.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Link {
    Connecting,
    Up,
    Lost,
}

impl Link {
    fn observe(&mut self, inner: &Inner, connected: bool) {
        let next = match (*self, connected) {
            (Link::Connecting, false) => return,
            (_, true) => Link::Up,
            (_, false) => Link::Lost,
        };
        match (*self, next) {
            (Link::Connecting, Link::Up) => tracing::info!(kind = inner.kind, "redis connected"),
            (Link::Up, Link::Lost) => tracing::warn!(kind = inner.kind, "redis connection lost"),
            (Link::Lost, Link::Up) => tracing::info!(kind = inner.kind, "redis connection back"),
            _ => {}
        }
        *self = next;
    }
}

async fn load_scripts(inner: &Inner, client: &Client) -> Result<(), FredError> {
    for script in [
        &inner.fixed_window,
        &inner.sliding_counter,
        &inner.sliding_log,
    ] {
        // On a cluster, loads on every primary.
        script.load(client).await?;
    }
    inner.script_loads.fetch_add(1, Ordering::Relaxed);
    Ok(())
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
            let details = e.details();
            if TRANSIENT.iter().any(|p| details.starts_with(p)) {
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

/// The URL without its password, for error messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

fn tls_config(config: &RedisConfig) -> Result<TlsConfig, StoreError> {
    use fred::rustls::pki_types::pem::PemObject;
    use fred::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use fred::rustls::{ClientConfig, RootCertStore, crypto::ring};

    let file_error = |path: &PathBuf, e: &dyn std::fmt::Display| {
        invalid(format!("reading {}: {e}", path.display()))
    };
    let mut roots = RootCertStore::empty();
    match &config.tls_ca_file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path).map_err(|e| file_error(path, &e))?;
            for cert in certs {
                let cert = cert.map_err(|e| file_error(path, &e))?;
                roots.add(cert).map_err(|e| file_error(path, &e))?;
            }
        }
        None => {
            // Unreadable system certificates are skipped, as fred does not.
            for cert in fred::rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("tls: {e}")))?
        .with_root_certificates(roots);
    let client = match (&config.tls_cert_file, &config.tls_key_file) {
        (Some(cert_path), Some(key_path)) => {
            let chain = CertificateDer::pem_file_iter(cert_path)
                .map_err(|e| file_error(cert_path, &e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| file_error(cert_path, &e))?;
            let key =
                PrivateKeyDer::from_pem_file(key_path).map_err(|e| file_error(key_path, &e))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| invalid(format!("tls client certificate: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(invalid(
                "tls_cert_file and tls_key_file must be given together".into(),
            ));
        }
    };
    Ok(client.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_passwords() {
        let config = RedisConfig {
            url: "redis://user:hunter2@host:6379".into(),
            password: Some("sw0rdfish".into()),
            ..RedisConfig::default()
        };
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("sw0rdfish"),
            "{shown}"
        );
        assert!(shown.contains("redis://***@host:6379"), "{shown}");
    }

    #[test]
    fn redact_hides_password() {
        assert_eq!(
            redact("redis://user:secret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
    }

    #[tokio::test]
    async fn connect_succeeds_while_redis_is_down() {
        // Port 1 on loopback: nothing listens there.
        for url in [
            "redis://127.0.0.1:1",
            "rediss://127.0.0.1:1",
            "redis-cluster://127.0.0.1:1",
        ] {
            let store = RedisStore::connect(RedisConfig {
                url: url.into(),
                ..RedisConfig::default()
            })
            .await
            .unwrap();
            assert!(!store.is_ready(), "{url}");
            let entries = vec![("k".to_owned(), "v".to_owned())];
            let started = std::time::Instant::now();
            let result = store
                .hit(Hit {
                    domain: "d",
                    entries: &entries,
                    algorithm: Algorithm::FixedWindow,
                    limit: 1,
                    unit: crate::limit::Unit::Second,
                    hits: 1,
                    negative: false,
                    usage_reports: false,
                    buckets: 2,
                    shard: crate::storage::Shard::NONE,
                })
                .await;
            assert!(result.is_err(), "{url}");
            assert!(started.elapsed() < Duration::from_millis(100), "{url}");
        }
    }

    #[tokio::test]
    async fn bad_settings_fail() {
        let bad_url = RedisStore::connect(RedisConfig {
            url: "not a url".into(),
            ..RedisConfig::default()
        })
        .await;
        assert!(bad_url.is_err());
        let half_tls = RedisStore::connect(RedisConfig {
            tls_cert_file: Some("/nonexistent.pem".into()),
            ..RedisConfig::default()
        })
        .await;
        assert!(half_tls.is_err());
    }

    #[tokio::test]
    async fn kind_follows_the_url() {
        for (url, kind) in [
            ("redis://127.0.0.1:1", "redis"),
            ("redis-cluster://127.0.0.1:1", "redis-cluster"),
            (
                "redis-sentinel://127.0.0.1:1?sentinelServiceName=m",
                "redis-sentinel",
            ),
        ] {
            let store = RedisStore::connect(RedisConfig {
                url: url.into(),
                ..RedisConfig::default()
            })
            .await
            .unwrap();
            assert_eq!(store.kind(), kind);
        }
    }
}
