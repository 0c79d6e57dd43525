//! Lease ledgers on Redis: one call of `lua/rlqs_lease.lua` per report, on
//! the primary of the limiter's slot (the ledger key shares the limiter's
//! hash tag; so does the fixed window's state the shares spend with
//! requests decided one at a time, when they do: [`crate::quota::window`]). Leases are a few calls per stream every few seconds: they go
//! out alone, not through the batcher, and a `MOVED` answer is not
//! followed (the next report goes to the new owner).

use super::*;
use crate::quota::Grant;
use crate::storage::LeaseCall;

pub(super) const LEASE_LUA: &str = include_str!("../../../lua/rlqs_lease.lua");

impl RedisStore {
    pub(super) async fn lease_call(&self, call: LeaseCall<'_>) -> Result<Grant, StoreError> {
        let limiter = self.inner.keys.limiter(&call.limiter());
        let slot = limiter.slot();
        let mut keys = vec![limiter.key(Role::Lease)];
        let routing = self.inner.routing();
        let node = match &self.inner.deployment {
            Deployment::Single(node) => node,
            Deployment::Cluster { .. } => routing.owner(slot).ok_or_else(|| {
                StoreError::Unavailable(format!("no redis primary serves slot {slot}"))
            })?,
        };
        let client = connected_client(node)?;
        let mut args: Vec<fred::types::Value> = vec![
            call.holder.into(),
            (call.report.requests.min(MAX_EXACT) as i64).into(),
            (call.report.elapsed_secs.min(MAX_EXACT) as i64).into(),
            (call.terms.capacity.min(MAX_EXACT) as i64).into(),
            (call.terms.fill_secs.min(MAX_EXACT) as i64).into(),
            (call.terms.hold_micros.min(MAX_EXACT) as i64).into(),
        ];
        if let Some(counted) = call.counted {
            // The fixed window's state, in the same slot: one count.
            keys.push(limiter.into_key(Role::State));
            args.extend([
                (counted.limit.min(MAX_EXACT) as i64).into(),
                (counted.window_micros.min(MAX_EXACT) as i64).into(),
                (crate::quota::window::MARGIN_MICROS as i64).into(),
            ]);
        }
        let timeout = self.inner.command_timeout;
        let script = &self.inner.scripts.lease;
        let run = batch::run_script(script, client, keys, args);
        let reply = match tokio::time::timeout(timeout, run).await {
            Err(_) => return Err(StoreError::Timeout(timeout.as_millis() as u64)),
            Ok(Err(e)) => {
                if ["MOVED", "ASK"].iter().any(|p| e.details().starts_with(p)) {
                    self.inner.stale.store(true, Ordering::Release);
                }
                return Err(store_error(e, timeout));
            }
            Ok(Ok(reply)) => reply,
        };
        match reply[..] {
            [tokens, holders, total] if tokens >= 0 && holders >= 1 && total >= tokens => {
                Ok(Grant {
                    tokens: tokens as u64,
                    holders: holders as u64,
                    granted_total: total as u64,
                })
            }
            _ => Err(StoreError::Protocol(format!(
                "unexpected lease script reply {reply:?}"
            ))),
        }
    }
}
