//! Resetting a limiter on Redis: its keys deleted on the primary of their
//! slot (following a cluster's redirections as script calls do), then the
//! prefix's reset counter moved. Every replica reads that counter
//! every [`RESET_POLL`] and publishes it as [`Store::reset_generation`], so
//! their over-limit caches forget their refusals. The counter is state,
//! not a message: a replica that cannot reach Redis for a while misses
//! nothing, it sees the counter moved on its first read after (a reset
//! made meanwhile is answered by its cache until then, at most until the
//! refusal's own reset).

use fred::types::{ClusterHash, CustomCommand, Value};

use super::*;
use crate::limit::algorithms::{Reset, sliding_counter};
use crate::limit::{Algorithm, DEFAULT_BUCKETS, MAX_BUCKETS};

/// How often a replica reads the reset counter: a reset through one
/// replica reaches the others' caches within about this long.
pub(super) const RESET_POLL: Duration = Duration::from_millis(200);

/// A fixed window's or a sliding counter's reset: its keys deleted, and
/// its state hash left holding `x`, when it was reset (the server's
/// clock), until the eighth window after the reset's ends, so that a
/// give-back recorded before the reset takes nothing off the fresh count
/// (see `lua/fixed_window.lua` and `lua/sliding_window_counter.lua`): a
/// reservation reaches seven windows on (a counter of two buckets: seven
/// buckets, a window each), and a counter's receipt is taken back while
/// its bucket is in the trailing window, a bucket more.
///
/// When the stored window (a counter's bucket) starts after now, the
/// server's clock stepped back: `x` is that start instead, so that a
/// give-back recorded in it before the reset still takes nothing.
///
/// KEYS     the limiter's keys, its state hash first
/// ARGV[1]  the window's length in microseconds; 0 for a calendar window
/// ARGV[2]  a calendar window: how long `x` is kept, in microseconds
/// ARGV[3]  a counter's buckets less one (scaled units per microsecond);
///          1 for a fixed window
/// ARGV[4]  a counter's phase in scaled units (sliding_counter::phase); 0
/// Returns 1.
const RESET_FIXED_LUA: &str = r#"
local sw = tonumber(redis.call('HGET', KEYS[1], 'w'))
redis.call('DEL', unpack(KEYS))
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local w = tonumber(ARGV[1])
local life = tonumber(ARGV[2])
local x = now
if w > 0 and sw then
  -- Bucket sw starts at (sw x w - phase) / spans microseconds, split so
  -- that no product passes 2^53.
  local spans = tonumber(ARGV[3])
  local q = math.floor(sw / spans)
  local from = q * w + math.ceil(((sw - q * spans) * w - tonumber(ARGV[4])) / spans)
  if from > x then x = from end
end
if w > 0 then life = (math.floor(x / w) + 9) * w - now end
redis.call('HSET', KEYS[1], 'x', string.format('%d', x))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(life / 1000)))
return 1
"#;

impl RedisStore {
    /// Deletes every key `hit`'s limiter may have (`h`, `z`, `m`: whichever
    /// its algorithm writes) and its lease ledger (`q`, in the slot of the
    /// unsharded identity), then moves the reset counter.
    pub(super) async fn reset_call(&self, hit: &Hit<'_>) -> Result<(), StoreError> {
        let limiter = self.inner.keys.limiter(hit);
        let ledger = self.inner.keys.limiter(&hit.ledger());
        let slot = limiter.slot();
        let mut keys = vec![
            limiter.key(Role::State),
            limiter.key(Role::LogSet),
            limiter.into_key(Role::LogMeta),
        ];
        if ledger.slot() == slot {
            keys.push(ledger.into_key(Role::Lease));
        } else {
            let lease_slot = ledger.slot();
            self.command(lease_slot, "DEL", vec![ledger.into_key(Role::Lease)])
                .await?;
        }
        if hit.algorithm.spec().reset == Reset::OweHeld {
            // Its own script keeps what was held as owed, in one step.
            keys.drain(1..3);
            self.command(slot, "DEL", keys).await?;
            let (slot, mut call) = self.prepare(hit, &[]);
            call.args[3] = 5;
            let timeout = self.inner.command_timeout;
            match tokio::time::timeout(timeout, self.call(slot, call)).await {
                Err(_) => return Err(StoreError::Timeout(timeout.as_millis() as u64)),
                Ok(reply) => match reply?[..] {
                    [1] => {}
                    ref other => {
                        return Err(StoreError::Protocol(format!(
                            "unexpected reset reply {other:?}"
                        )));
                    }
                },
            }
        } else if hit.algorithm.spec().reset == Reset::MarkWindow {
            // Deleted and marked in one step: no give-back lands between.
            let (w, life) = match hit.window.zone() {
                None => (hit.window.micros(), 0),
                Some(_) => {
                    let now = SystemClock.now_micros();
                    let end = hit.window.span(now).end;
                    (0, end.saturating_sub(now).saturating_add(1_000_000))
                }
            };
            let mut args = vec![RESET_FIXED_LUA.to_string(), keys.len().to_string()];
            args.extend(keys);
            let (spans, phase) = match hit.algorithm {
                Algorithm::SlidingWindowCounter => (
                    u64::from(hit.buckets.clamp(DEFAULT_BUCKETS, MAX_BUCKETS)) - 1,
                    sliding_counter::phase(hit.domain, hit.entries, hit.window),
                ),
                _ => (1, 0),
            };
            args.extend([
                w.to_string(),
                life.to_string(),
                spans.to_string(),
                phase.to_string(),
            ]);
            self.command(slot, "EVAL", args).await?;
        } else {
            self.command(slot, "DEL", keys).await?;
        }
        let counter = self.inner.keys.resets();
        let step = counter_step().to_string();
        self.command(keys::slot_of(&counter), "INCRBY", vec![counter, step])
            .await?;
        Ok(())
    }

    /// One command on the keys of `slot`, sent to its primary and after it
    /// wherever the cluster redirects it, within the command timeout.
    async fn command(
        &self,
        slot: u16,
        name: &'static str,
        args: Vec<String>,
    ) -> Result<Value, StoreError> {
        let timeout = self.inner.command_timeout;
        let run = async {
            let mut target = match &self.inner.deployment {
                Deployment::Single(node) => {
                    let client = connected_client(node)?.clone();
                    return send(&client, name, args, false)
                        .await
                        .map_err(|e| store_error(e, timeout));
                }
                Deployment::Cluster { .. } => self.inner.routing().owner_pool(slot)?,
            };
            let mut asking = false;
            for _ in 0..=MAX_REDIRECTS {
                let client = connected_client(&target)?.clone();
                let e = match send(&client, name, args.clone(), asking).await {
                    Ok(v) => return Ok(v),
                    Err(e) => e,
                };
                match Redirect::of(&e) {
                    None | Some(Redirect::NotHere) => return Err(store_error(e, timeout)),
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
            }
            Err(StoreError::Moved(format!(
                "{name} redirected more than {MAX_REDIRECTS} times"
            )))
        };
        match tokio::time::timeout(timeout, run).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Timeout(timeout.as_millis() as u64)),
        }
    }
}

/// How far a reset moves the counter: at random between 1 and 2^20, so
/// that a counter lost with a restarted Redis and moved again does not
/// come back to a value a replica last read (it would miss that reset).
fn counter_step() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let random = std::hash::RandomState::new().build_hasher().finish();
    random % (1 << 20) + 1
}

/// `name` with `args`, after `ASKING` when a migration's target was named.
async fn send(
    client: &Client,
    name: &'static str,
    args: Vec<String>,
    asking: bool,
) -> Result<Value, FredError> {
    let command = CustomCommand::new_static(name, ClusterHash::FirstKey, false);
    if !asking {
        return client.custom(command, args).await;
    }
    let pipeline = client.pipeline();
    let asking = CustomCommand::new_static("ASKING", ClusterHash::Random, false);
    let _: () = pipeline.custom(asking, Vec::<Value>::new()).await?;
    let _: () = pipeline.custom(command, args).await?;
    pipeline
        .try_all::<Value>()
        .await
        .pop()
        .unwrap_or_else(|| Err(FredError::new(ErrorKind::Protocol, "empty pipeline reply")))
}

/// Reads the reset counter every [`RESET_POLL`] into the store's
/// generation. A failed read keeps the last value. Holds only a weak
/// reference: ends with the store.
pub(super) async fn follow_resets(store: Weak<Inner>) {
    loop {
        tokio::time::sleep(RESET_POLL).await;
        let Some(inner) = store.upgrade() else { return };
        let store = RedisStore { inner };
        let counter = store.inner.keys.resets();
        let read = store.command(keys::slot_of(&counter), "GET", vec![counter]);
        if let Ok(value) = read.await
            && let Ok(generation) = value.convert::<Option<u64>>()
        {
            store
                .inner
                .reset_generation
                .store(generation.unwrap_or(0), Ordering::Release);
        }
    }
}
