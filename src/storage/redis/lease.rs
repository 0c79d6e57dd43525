//! Lease ledgers on Redis: one call of `lua/rlqs_lease.lua` per report, on
//! the primary of the limiter's slot (the ledger key shares the limiter's
//! hash tag; so does the fixed window's state the shares spend with
//! requests decided one at a time, when they do: [`crate::quota::window`]). Leases are a few calls per stream every few seconds: they go
//! out alone, not through the batcher, and a `MOVED` answer is not
//! followed (the next report goes to the new owner).

use super::*;
use crate::quota::{Counted, Grant};
use crate::storage::LeaseCall;

const LEASE_LUA: &str = include_str!("../../../lua/rlqs_lease.lua");

/// The lease script, with the token bucket's script as its function
/// `bucket` (on one clock, read once), so a share is charged to a bucket in
/// the same atomic step as it is granted.
pub(super) fn lease_lua() -> String {
    let clock = "local clock = redis.call('TIME')\nclock = clock[1] * 1000000 + clock[2]\n";
    let bucket = crate::limit::algorithms::token_bucket::SPEC.lua.replacen(
        scripts::READ_CLOCK,
        "local now = clock",
        1,
    );
    let lease = LEASE_LUA.replacen(scripts::READ_CLOCK, "local now = clock", 1);
    format!("{clock}local bucket = function(KEYS, ARGV)\n{bucket}\nend\n{lease}")
}

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
        // The limiter's state, in the same slot: one count.
        let margin = crate::quota::window::MARGIN_MICROS as i64;
        match call.counted {
            Some(Counted::Window(fixed)) => {
                keys.push(limiter.into_key(Role::State));
                args.extend([
                    "w".into(),
                    (fixed.limit.min(MAX_EXACT) as i64).into(),
                    (fixed.window_micros.min(MAX_EXACT) as i64).into(),
                    margin.into(),
                ]);
            }
            Some(Counted::Bucket(b)) => {
                let hit = call.bucket(b, 0, false);
                keys.push(self.inner.keys.limiter(&hit).into_key(Role::State));
                let burst = effective_burst(b.burst, b.limit, call.window).min(MAX_EXACT);
                args.extend([
                    "b".into(),
                    (b.limit.min(MAX_EXACT) as i64).into(),
                    (call.window.micros().min(MAX_EXACT) as i64).into(),
                    margin.into(),
                    (burst as i64).into(),
                ]);
            }
            None => {}
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
