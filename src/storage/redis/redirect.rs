//! Following a Redis Cluster's redirections: which replies mean a call's
//! keys are elsewhere (or soon will be), and the pools of servers the
//! routing does not list yet. `RedisStore::call` does the following itself.

use super::*;

/// Most redirections one call follows (a slot that moved, then moves on).
pub(super) const MAX_REDIRECTS: usize = 5;
/// The wait before trying again after `TRYAGAIN` or `CLUSTERDOWN`: a key
/// of a migration in flight lands within a `MIGRATE`, a failover takes a
/// node timeout.
pub(super) const RETRY_PAUSE: Duration = Duration::from_millis(5);

/// A reply that says the call's keys are elsewhere, or will be: the
/// script did not run.
pub(super) enum Redirect {
    /// A batched call whose keys were not on its server ([`batch::NOT_HERE_ERROR`]).
    NotHere,
    /// `MOVED <slot> <host:port>`.
    Moved(String),
    /// `ASK <slot> <host:port>`.
    Ask(String),
    TryAgain,
    ClusterDown,
}

impl Redirect {
    pub(super) fn of(e: &FredError) -> Option<Redirect> {
        let details = e.details();
        let target = |prefix: &str| {
            details
                .strip_prefix(prefix)
                .and_then(|rest| rest.split_whitespace().nth(1))
                .map(str::to_string)
        };
        if details.starts_with(batch::NOT_HERE_ERROR) {
            Some(Redirect::NotHere)
        } else if let Some(to) = target("MOVED ") {
            Some(Redirect::Moved(to))
        } else if let Some(to) = target("ASK ") {
            Some(Redirect::Ask(to))
        } else if details.starts_with("TRYAGAIN") {
            Some(Redirect::TryAgain)
        } else if details.starts_with("CLUSTERDOWN") {
            Some(Redirect::ClusterDown)
        } else {
            None
        }
    }
}

impl RedisStore {
    /// The pool of the server named `host:port` by a redirection: a
    /// primary of the routing, or one opened for it (a node that owns no
    /// slot yet, the target of a slot's first migration), waited for
    /// within the call's timeout.
    pub(super) async fn pool_for(&self, name: &str) -> Result<Arc<NodePool>, StoreError> {
        if let Some(pool) = self
            .inner
            .routing()
            .nodes
            .iter()
            .find(|n| n.id.name() == Some(name))
        {
            return Ok(pool.clone());
        }
        let Deployment::Cluster { settings, .. } = &self.inner.deployment else {
            return Err(StoreError::Moved(format!("redirected to {name}")));
        };
        let pool = {
            let mut extra = self
                .inner
                .redirect_pools
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            match extra.get(name) {
                Some(pool) => pool.clone(),
                None => {
                    let (host, port) = name
                        .rsplit_once(':')
                        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                        .ok_or_else(|| StoreError::Moved(format!("redirected to {name}")))?;
                    let pool = Arc::new(settings.open_node(Server::new(host, port))?);
                    extra.insert(name.to_string(), pool.clone());
                    pool
                }
            }
        };
        while !pool.is_connected() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(pool)
    }
}
