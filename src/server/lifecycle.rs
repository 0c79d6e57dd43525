//! Start and stop: gRPC waits for the store at startup, and shutdown is
//! two steps, a drain (health NOT_SERVING, calls still answered) and then
//! closing the listeners with a grace period for calls in flight.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::storage::Store;

/// Resolves once `store` is ready, or after `limit`.
pub(super) async fn wait_ready(store: Arc<dyn Store>, limit: Duration) {
    let started = tokio::time::Instant::now();
    if store.is_ready() {
        return;
    }
    tracing::info!(
        store = store.kind(),
        wait_ms = limit.as_millis() as u64,
        "waiting for the store before answering gRPC"
    );
    while !store.is_ready() {
        if started.elapsed() >= limit {
            tracing::warn!(
                store = store.kind(),
                "store not ready after the startup wait: answering gRPC, store failures follow on_store_error"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::info!(
        store = store.kind(),
        waited_ms = started.elapsed().as_millis() as u64,
        "store ready"
    );
}

/// The two shutdown steps (see the module docs), once `shutdown` resolves.
pub(super) async fn drain_and_stop(
    servers: impl Future<Output = anyhow::Result<()>>,
    shutdown: impl Future<Output = ()>,
    drain_tx: watch::Sender<bool>,
    stop_tx: watch::Sender<bool>,
    health_task: tokio::task::JoinHandle<()>,
    drain: Duration,
    grace: Duration,
) -> anyhow::Result<()> {
    tokio::pin!(servers);
    tokio::select! {
        r = &mut servers => return r,
        _ = shutdown => {}
    }
    tracing::info!(
        drain_ms = drain.as_millis() as u64,
        grace_ms = grace.as_millis() as u64,
        "draining: health is NOT_SERVING, calls are still answered"
    );
    let _ = drain_tx.send(true);
    tokio::select! {
        r = &mut servers => return r,
        _ = tokio::time::sleep(drain) => {}
    }
    tracing::info!("closing listeners; finishing calls in flight");
    let _ = stop_tx.send(true);
    let _ = health_task.await;
    match tokio::time::timeout(grace, servers).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!("grace period over; dropping open calls");
            Ok(())
        }
    }
}
