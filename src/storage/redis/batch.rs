//! Per-server batching of script calls. Calls bound for one server that
//! are ready at the same moment go out as one `EVALSHA` of the batch
//! script: one write on the socket, one command for Redis to parse, one
//! reply to read. There is no timer: a batch is whatever queued while the
//! server's previous batches were in flight (at most `lanes` at once, one
//! per connection), so a lone call goes out at once, alone, from its
//! caller's own task, and batches grow only when calls would otherwise
//! wait.
//!
//! A call whose caller stopped waiting (its deadline passed while it
//! queued) is left out of the batch. Each call of a batch answers for
//! itself: one whose keys are not on the server (a slot moving) gets
//! [`NOT_HERE_ERROR`], having recorded nothing, and the others their
//! answers. An error of the whole batch (a timeout, a lost connection) is
//! every call's error and is never resent: part of it may have run, and a
//! hit is written at most once.

use std::collections::VecDeque;

use tokio::sync::oneshot;

use super::*;

/// The error a batched call gets when its keys were not on the server
/// (see [`scripts::NOT_HERE`]): nothing was recorded; send it again alone.
pub(super) const NOT_HERE_ERROR: &str = "NOTHERE the call's keys are not on this server";

/// One script call: its algorithm, keys and arguments.
pub(super) struct Call {
    /// `None`: the limits of a `rate_limits:` list, decided together by
    /// the batch script's group function ([`scripts::GROUP`]).
    pub(super) algorithm: Option<Algorithm>,
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<i64>,
}

impl Call {
    /// The script that runs the call alone: its algorithm's, or the batch
    /// script for a group (as a batch of one, its keys also declared so
    /// that a cluster redirects it).
    pub(super) fn script<'s>(&self, scripts: &'s Scripts) -> &'s Script {
        match self.algorithm {
            Some(a) => scripts.of(a),
            None => &scripts.batch,
        }
    }

    /// The call's number in a batch.
    fn batch_id(&self) -> i64 {
        self.algorithm.map_or(scripts::GROUP, batch_id)
    }

    /// The call as one entry of a batch: its number, key and argument
    /// counts, keys, arguments.
    fn push_entry(&self, out: &mut Vec<fred::types::Value>) {
        out.extend([
            self.batch_id().into(),
            (self.keys.len() as i64).into(),
            (self.args.len() as i64).into(),
        ]);
        out.extend(self.keys.iter().map(|k| k.as_str().into()));
        out.extend(self.args.iter().map(|&a| a.into()));
    }

    /// The `ARGV` of the call sent alone.
    pub(super) fn values(&self) -> Vec<fred::types::Value> {
        match self.algorithm {
            Some(_) => self.args.iter().map(|&a| a.into()).collect(),
            None => {
                let mut out = Vec::with_capacity(3 + self.keys.len() + self.args.len());
                self.push_entry(&mut out);
                out
            }
        }
    }
}

/// The reply of a call sent alone, as its own: a group's comes as a batch
/// of one.
pub(super) fn own_reply(group: bool, reply: Vec<i64>) -> Reply {
    if !group {
        return Ok(reply);
    }
    match reply.split_first() {
        Some((&scripts::NOT_HERE, [])) => Err(FredError::new(ErrorKind::Unknown, NOT_HERE_ERROR)),
        Some((&n, rest)) if n >= 0 && n as usize == rest.len() => Ok(rest.to_vec()),
        _ => Err(FredError::new(
            ErrorKind::Unknown,
            format!("ERR a script call on several limits failed: {reply:?}"),
        )),
    }
}

type Reply = Result<Vec<i64>, FredError>;

struct Waiting {
    call: Call,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Waiting>,
    /// Batches in flight.
    running: usize,
}

/// The batching of one server's calls.
pub(super) struct Batcher {
    pool: Pool,
    scripts: Arc<Scripts>,
    queue: Mutex<Queue>,
    /// Batches in flight at most.
    lanes: usize,
    /// Calls in one batch at most; 1 turns batching off (every call sent at once).
    max_calls: usize,
    /// Counts, for tests and metrics: batches sent, calls in them.
    batches: AtomicU64,
    batched_calls: AtomicU64,
}

impl Batcher {
    pub(super) fn new(
        pool: Pool,
        scripts: Arc<Scripts>,
        lanes: usize,
        max_calls: usize,
    ) -> Batcher {
        Batcher {
            pool,
            scripts,
            queue: Mutex::new(Queue::default()),
            lanes: lanes.max(1),
            max_calls: max_calls.max(1),
            batches: AtomicU64::new(0),
            batched_calls: AtomicU64::new(0),
        }
    }

    /// Runs `call` on this server, in a batch with whatever else is ready.
    pub(super) async fn submit(self: &Arc<Self>, call: Call) -> Reply {
        if self.max_calls == 1 {
            // Batching off: every call goes out at once, as many in flight
            // as callers (fred pipelines them on the pool's connections).
            let client = self.pool.next_connected().clone();
            return self.alone(&client, call).await;
        }
        let lone = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.waiting.is_empty() && q.running < self.lanes {
                q.running += 1;
                true
            } else {
                false
            }
        };
        if lone {
            // Nothing waits and a lane is free: the call goes out from the
            // caller's own task, without a hand-over to another task. The
            // lane is given back (or passed to what queued meanwhile) when
            // the call ends or its caller stops waiting.
            let _lane = Lane(self);
            let client = self.pool.next_connected().clone();
            return self.alone(&client, call).await;
        }
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.waiting.push_back(Waiting { call, reply: tx });
            if q.running < self.lanes {
                q.running += 1;
                true
            } else {
                false
            }
        };
        if start {
            // Its own task: a caller that stops waiting must not cancel
            // the others' batch.
            tokio::spawn(self.clone().drain());
        }
        rx.await.unwrap_or_else(|_| {
            Err(FredError::new(
                ErrorKind::Canceled,
                "redis batch dropped before its reply",
            ))
        })
    }

    /// Frees a lane taken by a lone call, or hands it to a drain of the
    /// calls that queued while it was in flight.
    fn release(self: &Arc<Self>) {
        let more = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.waiting.retain(|w| !w.reply.is_closed());
            if q.waiting.is_empty() {
                q.running -= 1;
                false
            } else {
                true
            }
        };
        if more {
            tokio::spawn(self.clone().drain());
        }
    }

    /// Sends batches until the queue is empty, then frees its lane.
    async fn drain(self: Arc<Self>) {
        loop {
            let batch: Vec<Waiting> = {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                q.waiting.retain(|w| !w.reply.is_closed());
                if q.waiting.is_empty() {
                    q.running -= 1;
                    return;
                }
                let n = q.waiting.len().min(self.max_calls);
                q.waiting.drain(..n).collect()
            };
            self.send(batch).await;
        }
    }

    async fn send(&self, mut batch: Vec<Waiting>) {
        let client = self.pool.next_connected().clone();
        if batch.len() == 1 {
            let w = batch.pop().expect("one call");
            let reply = self.alone(&client, w.call).await;
            let _ = w.reply.send(reply);
            return;
        }
        let mut args: Vec<fred::types::Value> = Vec::new();
        for w in &batch {
            w.call.push_entry(&mut args);
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batched_calls
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let reply = run_script(&self.scripts.batch, &client, Vec::new(), args).await;
        match reply {
            Ok(reply) => {
                let mut rest = &reply[..];
                for w in batch {
                    let part = match rest.split_first() {
                        Some((&scripts::NOT_HERE, tail)) => {
                            rest = tail;
                            Err(FredError::new(ErrorKind::Unknown, NOT_HERE_ERROR))
                        }
                        Some((&scripts::FAILED, tail)) => {
                            rest = tail;
                            Err(FredError::new(
                                ErrorKind::Unknown,
                                "ERR a batched script call failed",
                            ))
                        }
                        Some((&n, tail)) if n >= 0 && (n as usize) <= tail.len() => {
                            let (part, tail) = tail.split_at(n as usize);
                            rest = tail;
                            Ok(part.to_vec())
                        }
                        _ => Err(FredError::new(
                            ErrorKind::Protocol,
                            format!("unexpected batch reply {reply:?}"),
                        )),
                    };
                    let _ = w.reply.send(part);
                }
            }
            Err(e) => {
                for w in batch {
                    let _ = w.reply.send(Err(e.clone()));
                }
            }
        }
    }

    async fn alone(&self, client: &Client, call: Call) -> Reply {
        let args = call.values();
        let reply = run_script(call.script(&self.scripts), client, call.keys, args).await?;
        own_reply(call.algorithm.is_none(), reply)
    }

    /// (batches sent, calls in them) so far.
    pub(super) fn counts(&self) -> (u64, u64) {
        (
            self.batches.load(Ordering::Relaxed),
            self.batched_calls.load(Ordering::Relaxed),
        )
    }
}

/// A lane held by a call sent from its caller's task.
struct Lane<'a>(&'a Arc<Batcher>);

impl Drop for Lane<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// `EVALSHA`, loading the script on `NOSCRIPT` and trying again (see
/// [`loading_on_noscript`]).
pub(super) async fn run_script(
    script: &Script,
    client: &Client,
    keys: Vec<String>,
    args: Vec<fred::types::Value>,
) -> Reply {
    use fred::interfaces::LuaInterface;
    loading_on_noscript(script, client, || {
        client.evalsha::<Vec<i64>, _, _, _>(script.sha1().clone(), keys.clone(), args.clone())
    })
    .await
}

/// Sends a script call, loading the script and sending it again on
/// `NOSCRIPT`, up to three times: a `SCRIPT FLUSH` (or a failover to a
/// server that never loaded it) between the load and the retry leaves it
/// missing again. Safe, since `NOSCRIPT` means nothing ran.
async fn loading_on_noscript<F, Fut>(script: &Script, client: &Client, mut send: F) -> Reply
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Reply>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        // Each on the heap: fred's futures are kilobytes, and held here
        // they would be copied at every level of the call above.
        match Box::pin(send()).await {
            Err(e) if attempt < 3 && e.details().starts_with("NOSCRIPT") => {
                Box::pin(script.load(client)).await?;
            }
            other => return other,
        }
    }
}

/// `ASKING` then `EVALSHA` on one connection, back to back (one pipeline:
/// nothing of another caller comes between them, so the `ASKING` is this
/// call's): how a call reaches the target of a slot being migrated. The
/// script is loaded there on `NOSCRIPT`, as [`run_script`] does.
pub(super) async fn run_asking(
    script: &Script,
    client: &Client,
    keys: Vec<String>,
    args: Vec<fred::types::Value>,
) -> Reply {
    use fred::interfaces::ClientLike;
    use fred::types::{ClusterHash, CustomCommand};
    let mut command: Vec<fred::types::Value> = Vec::with_capacity(2 + keys.len() + args.len());
    command.push(script.sha1().clone().into());
    command.push((keys.len() as i64).into());
    command.extend(keys.iter().map(|k| k.as_str().into()));
    command.extend(args);
    loading_on_noscript(script, client, || async {
        let pipeline = client.pipeline();
        let asking = CustomCommand::new_static("ASKING", ClusterHash::Random, false);
        let _: () = pipeline
            .custom(asking, Vec::<fred::types::Value>::new())
            .await?;
        let evalsha = CustomCommand::new_static("EVALSHA", ClusterHash::Random, false);
        let _: () = pipeline.custom(evalsha, command.clone()).await?;
        pipeline
            .try_all::<fred::types::Value>()
            .await
            .pop()
            .unwrap_or_else(|| Err(FredError::new(ErrorKind::Protocol, "empty pipeline reply")))
            .and_then(|v| v.convert())
    })
    .await
}
