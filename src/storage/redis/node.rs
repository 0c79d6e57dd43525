use super::*;

/// Commands queued inside fred per client before it answers `Backpressure`.
pub(super) const MAX_QUEUED_COMMANDS: usize = 4096;
/// Reconnect backoff, in milliseconds: exponential between these bounds.
pub(super) const RECONNECT_MIN_MS: u32 = 50;
pub(super) const RECONNECT_MAX_MS: u32 = 1_000;
/// A connection with a reply outstanding for this long is closed and
/// reopened (a paused or black-holed node sends no FIN).
pub(super) const UNRESPONSIVE_AFTER: Duration = Duration::from_secs(2);

/// What it takes to open a pool like the first one.
#[derive(Clone)]
pub(super) struct PoolSettings {
    pub(super) config: Config,
    pub(super) pool_size: usize,
    pub(super) connect_timeout: Duration,
    pub(super) command_timeout: Duration,
    pub(super) scripts: Arc<Scripts>,
    /// Calls in one batch at most (see [`Batcher`]).
    pub(super) batch_max: usize,
    /// Batches in flight at most.
    pub(super) batch_lanes: usize,
}

impl PoolSettings {
    pub(super) fn open(&self, config: Config, id: NodeId) -> Result<NodePool, StoreError> {
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
        let batcher = Arc::new(Batcher::new(
            pool.clone(),
            self.scripts.clone(),
            self.batch_lanes,
            self.batch_max,
        ));
        Ok(NodePool {
            id,
            batcher,
            pool,
            tasks,
            loaded: AtomicBool::new(false),
            reconnects: Mutex::new(reconnects),
            reachable: AtomicBool::new(true),
            answered: AtomicBool::new(false),
        })
    }

    /// A pool to one cluster node.
    pub(super) fn open_node(&self, server: Server) -> Result<NodePool, StoreError> {
        let mut config = self.config.clone();
        let id = NodeId::named(&server.to_string());
        config.server = ServerConfig::Centralized { server };
        self.open(config, id)
    }
}

/// Connections to one server. Dropping it stops them.
pub(super) struct NodePool {
    pub(super) id: NodeId,
    /// Script calls to this server go out through it.
    pub(super) batcher: Arc<Batcher>,
    pub(super) pool: Pool,
    pub(super) tasks: Vec<AbortHandle>,
    /// Scripts loaded since the last (re)connection.
    pub(super) loaded: AtomicBool,
    /// Read by the supervisor only.
    pub(super) reconnects: Mutex<Vec<Receiver<Server>>>,
    /// As last logged by the supervisor.
    pub(super) reachable: AtomicBool,
    /// Scripts were loaded once: the server has answered since the pool
    /// opened.
    pub(super) answered: AtomicBool,
}

impl Drop for NodePool {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl NodePool {
    pub(super) fn is_connected(&self) -> bool {
        self.pool.clients().iter().any(|c| c.is_connected())
    }

    pub(super) fn is_ready(&self) -> bool {
        self.loaded.load(Ordering::Acquire) && self.is_connected()
    }

    /// Whether a connection came back since the last look.
    pub(super) fn reconnected(&self) -> bool {
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
    pub(super) async fn keep_scripts(&self, inner: &Inner) {
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

pub(super) fn connected_client(node: &NodePool) -> Result<&Client, StoreError> {
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
