use super::*;

/// Why a Redis Cluster gets one client per primary rather than fred's
/// cluster client: fred's cluster client reconnects as a whole, and while it
/// retries a node that stays down (a primary with no replica to promote) it
/// takes no new command for any node. Separate clients keep a dead primary's
/// trouble to its own slots; the routing comes from `CLUSTER SLOTS`, asked
/// every [`CLUSTER_REFRESH`] and at once when a call meets a moved slot.
pub(super) const CLUSTER_REFRESH: Duration = Duration::from_secs(1);

/// How often the background task checks connections and scripts.
pub(super) const SUPERVISE_EVERY: Duration = Duration::from_millis(100);

/// Keeps connections useful: scripts loaded after every (re)connection,
/// the routing current, and each change of reachability logged once.
/// Holds only a weak reference: ends with the store.
pub(super) async fn supervise(store: Weak<Inner>) {
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
pub(super) fn follow_single_primary(inner: &Inner, node: &NodePool) {
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
pub(super) async fn refresh_cluster(
    inner: &Inner,
    settings: &PoolSettings,
    seeds: &[Server],
    pools: &mut HashMap<String, Arc<NodePool>>,
    preferred: &mut Option<String>,
) {
    if !pools.values().any(|p| p.is_connected()) {
        // Nothing reachable (first start, or every known node gone): go
        // back to the seeds.
        open_seeds(settings, seeds, pools);
    }
    let Some(state) = ask_cluster_slots(settings, pools, preferred).await else {
        return;
    };
    if Routing::cluster_source(&state) == inner.routing().source {
        return;
    }
    adopt_routing(inner, settings, &state, pools).await;
}

/// Opens a pool to every seed that has none yet.
fn open_seeds(
    settings: &PoolSettings,
    seeds: &[Server],
    pools: &mut HashMap<String, Arc<NodePool>>,
) {
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

/// The first non-empty `CLUSTER SLOTS` reply of a connected pool, asking
/// the node that answered last time (`preferred`) first, and remembering
/// the one that answers now.
async fn ask_cluster_slots(
    settings: &PoolSettings,
    pools: &HashMap<String, Arc<NodePool>>,
    preferred: &mut Option<String>,
) -> Option<ClusterRouting> {
    // The node that answered last time first: a hung node (connected, but
    // silent until the unresponsive check closes it) costs a timeout per
    // refresh when asked first every time.
    let mut candidates: Vec<&Arc<NodePool>> = pools.values().filter(|p| p.is_connected()).collect();
    candidates.sort_by_key(|p| p.id.name() != preferred.as_deref());
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
                    return Some(state);
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(node = %pool.id, error = %e, "bad CLUSTER SLOTS reply"),
            }
        }
    }
    None
}

/// Routes by `state` from now on: its primaries' pools (known ones reused,
/// new ones opened and given time to connect) become the open pools, and
/// the redirection pools it now routes to are no longer kept apart.
async fn adopt_routing(
    inner: &Inner,
    settings: &PoolSettings,
    state: &ClusterRouting,
    pools: &mut HashMap<String, Arc<NodePool>>,
) {
    let known = known_pools(inner, pools);
    match Routing::cluster(state, &known, settings) {
        Ok(routing) => {
            wait_connected(&routing, settings).await;
            let primaries: Vec<String> = routing.nodes.iter().map(|n| n.id.to_string()).collect();
            tracing::info!(kind = inner.kind, primaries = ?primaries, "redis cluster routing updated");
            *pools = routing
                .nodes
                .iter()
                .map(|n| (n.id.to_string(), n.clone()))
                .collect();
            inner
                .redirect_pools
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|name, _| !pools.contains_key(name));
            inner.set_routing(routing);
        }
        Err(e) => tracing::error!(error = %e, "opening a redis cluster node"),
    }
}

/// The open pools, and those opened to follow a redirection (a new
/// primary that took its first slots), which are used as they are.
fn known_pools(
    inner: &Inner,
    pools: &HashMap<String, Arc<NodePool>>,
) -> HashMap<String, Arc<NodePool>> {
    let mut known = pools.clone();
    for (name, pool) in inner
        .redirect_pools
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        known.entry(name.clone()).or_insert(pool.clone());
    }
    known
}

/// A primary new to us gets its connections before calls are routed to
/// it: until then its slots' calls go to the old owner, which redirects
/// them. Waits at most the connect timeout for them all.
async fn wait_connected(routing: &Routing, settings: &PoolSettings) {
    let deadline = tokio::time::Instant::now() + settings.connect_timeout;
    for node in &routing.nodes {
        while !node.is_connected() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Logs a primary going out of reach, and coming back, once each.
pub(super) fn log_reachability(inner: &Inner, node: &NodePool) {
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
pub(super) enum Link {
    Connecting,
    Up,
    Lost,
}

impl Link {
    pub(super) fn observe(&mut self, inner: &Inner, connected: bool) {
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

pub(super) async fn load_scripts(inner: &Inner, client: &Client) -> Result<(), FredError> {
    let scripts = &inner.scripts;
    for script in scripts.all() {
        // On a cluster, loads on every primary.
        script.load(client).await?;
    }
    inner.script_loads.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

impl RedisStore {
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
}
