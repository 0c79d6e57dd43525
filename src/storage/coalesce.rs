//! Coalescing: while a store call for a limiter is in flight, further hits
//! on the same limiter in this replica queue up, and the next call carries
//! all of their costs ([`Store::hit_batch`]: one script call, which decides
//! them one by one in arrival order and answers each). A hot limiter then
//! costs one Redis call per round trip instead of one per hit, and its
//! decisions are exactly those of the same hits sent one at a time.
//!
//! No waiting is added: a hit on a limiter with nothing in flight goes out
//! at once, alone. The call that finds a queue behind it when it returns
//! answers its own caller at once and hands the queue to a task that sends
//! the next batch (and the next, until the queue stays empty); a leader
//! dropped mid-call (its caller's deadline passed) hands it over the same
//! way, so a queued hit is never left without an answer. A queued caller
//! that stops waiting (its deadline) is left out of the next batch: its
//! cost is not spent.
//!
//! Limiters are found by a fingerprint of their identity and confirmed by
//! comparing the parts (as in the over-limit cache); an owned identity is
//! built once per call in flight. A hit queues only behind hits it can go
//! out with unchanged: a token bucket's leases ([`Hit::lease`]) behind
//! leases, other hits behind other hits, and the batch keeps the flag; a
//! lease reserving hits ahead goes alone. A std mutex guards the map and is never
//! held across an `.await`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::storage::cache::{Limiter, LimiterId};
use crate::storage::{BoxFuture, Cost, Decision, Hit, Store, StoreError, StoreGauges};

/// Most hits one call carries: a script runs alone on its Redis server, so
/// a batch is kept short enough not to hold up that server's other work;
/// the rest of a queue goes in the next call.
const MAX_BATCH: usize = 256;

/// Hits answered by batches, and the batches: what a metrics exporter reads.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CoalesceCounts {
    /// Store calls that carried queued hits.
    pub batches: u64,
    /// Hits decided in those calls.
    pub coalesced_hits: u64,
}

/// The coalescing layer over any store.
pub struct Coalescing {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Arc<dyn Store>,
    /// Limiters with a call in flight, by fingerprint.
    flights: Mutex<HashMap<u64, Vec<Flight>>>,
    next_serial: AtomicU64,
    batches: AtomicU64,
    coalesced_hits: AtomicU64,
}

/// One limiter with a call in flight, and the hits queued behind it.
struct Flight {
    serial: u64,
    id: LimiterId,
    /// Whether its hits are token bucket leases ([`Hit::lease`]): the one
    /// part of a hit beyond its identity and cost that changes what the
    /// store does with it, so only hits that agree on it queue together,
    /// and the batch goes out with it.
    lease: bool,
    queue: Vec<Waiter>,
}

struct Waiter {
    cost: Cost,
    answer: oneshot::Sender<Result<Decision, StoreError>>,
}

impl Coalescing {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            shared: Arc::new(Shared {
                inner,
                flights: Mutex::new(HashMap::new()),
                next_serial: AtomicU64::new(0),
                batches: AtomicU64::new(0),
                coalesced_hits: AtomicU64::new(0),
            }),
        }
    }

    pub fn counts(&self) -> CoalesceCounts {
        CoalesceCounts {
            batches: self.shared.batches.load(Ordering::Relaxed),
            coalesced_hits: self.shared.coalesced_hits.load(Ordering::Relaxed),
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Vec<Flight>>> {
        // A poisoned map only means a panic elsewhere mid-update of plain
        // values; the entries are still usable.
        self.flights.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the queue of a flight (at most [`MAX_BATCH`] hits of it), or
    /// ends the flight when nothing waits.
    fn take_queue(&self, fingerprint: u64, serial: u64) -> Option<(LimiterId, bool, Vec<Waiter>)> {
        let mut flights = self.lock();
        let at = position(&flights, fingerprint, serial)?;
        let flight = &mut flights.get_mut(&fingerprint)?[at];
        if flight.queue.is_empty() {
            end_flight(&mut flights, fingerprint, at);
            return None;
        }
        let take = flight.queue.len().min(MAX_BATCH);
        let waiters = flight.queue.drain(..take).collect();
        Some((flight.id.clone(), flight.lease, waiters))
    }

    /// Sends the queued hits of a flight in batches until none are left.
    async fn drain(self: Arc<Self>, fingerprint: u64, serial: u64) {
        while let Some((id, lease, waiters)) = self.take_queue(fingerprint, serial) {
            // Callers that stopped waiting are not counted.
            let waiters: Vec<Waiter> = waiters
                .into_iter()
                .filter(|w| !w.answer.is_closed())
                .collect();
            let Some(first) = waiters.first() else {
                continue;
            };
            let hit = Hit {
                lease,
                ..id.hit(first.cost)
            };
            let more: Vec<Cost> = waiters[1..].iter().map(|w| w.cost).collect();
            self.batches.fetch_add(1, Ordering::Relaxed);
            self.coalesced_hits
                .fetch_add(waiters.len() as u64, Ordering::Relaxed);
            match self.inner.hit_batch(hit, &more).await {
                Ok(decisions) if decisions.len() == waiters.len() => {
                    for (w, d) in waiters.into_iter().zip(decisions) {
                        let _ = w.answer.send(Ok(d));
                    }
                }
                Ok(decisions) => {
                    let e = StoreError::Protocol(format!(
                        "{} decisions for {} hits",
                        decisions.len(),
                        waiters.len()
                    ));
                    for w in waiters {
                        let _ = w.answer.send(Err(e.clone()));
                    }
                }
                Err(e) => {
                    for w in waiters {
                        let _ = w.answer.send(Err(e.clone()));
                    }
                }
            }
        }
    }
}

/// The caller whose hit went out alone. When it is done (or dropped), the
/// hits queued behind it get their own call.
struct Lead {
    shared: Arc<Shared>,
    fingerprint: u64,
    serial: u64,
}

impl Drop for Lead {
    fn drop(&mut self) {
        let (fingerprint, serial) = (self.fingerprint, self.serial);
        let mut flights = self.shared.lock();
        let Some(at) = position(&flights, fingerprint, serial) else {
            return;
        };
        if flights[&fingerprint][at].queue.is_empty() {
            end_flight(&mut flights, fingerprint, at);
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                drop(flights);
                runtime.spawn(self.shared.clone().drain(fingerprint, serial));
            }
            // Outside a runtime (a store used after its runtime ended) no
            // task can send the queue: ending the flight drops it, which
            // answers every waiter with an error.
            Err(_) => end_flight(&mut flights, fingerprint, at),
        }
    }
}

/// Where the flight `serial` sits in its bucket.
fn position(flights: &HashMap<u64, Vec<Flight>>, fingerprint: u64, serial: u64) -> Option<usize> {
    flights
        .get(&fingerprint)?
        .iter()
        .position(|f| f.serial == serial)
}

/// Removes a flight, and its bucket when that empties.
fn end_flight(flights: &mut HashMap<u64, Vec<Flight>>, fingerprint: u64, at: usize) {
    if let Some(bucket) = flights.get_mut(&fingerprint) {
        bucket.swap_remove(at);
        if bucket.is_empty() {
            flights.remove(&fingerprint);
        }
    }
}

impl Store for Coalescing {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        if !hit.ahead.is_none() {
            // A lease reserving hits ahead goes alone: a batch carries
            // costs (and the lease flag), not reservations.
            return self.shared.inner.hit(hit);
        }
        let fingerprint = hit.fingerprint();
        let serial = {
            let mut flights = self.shared.lock();
            let bucket = flights.entry(fingerprint).or_default();
            if let Some(flight) = bucket
                .iter_mut()
                .find(|f| f.lease == hit.lease && hit.is(&f.id))
            {
                let (answer, answered) = oneshot::channel();
                flight.queue.push(Waiter {
                    cost: hit.cost(),
                    answer,
                });
                drop(flights);
                return Box::pin(async move {
                    answered.await.unwrap_or_else(|_| {
                        Err(StoreError::Unavailable(
                            "the call carrying this hit was abandoned".into(),
                        ))
                    })
                });
            }
            let serial = self.shared.next_serial.fetch_add(1, Ordering::Relaxed);
            bucket.push(Flight {
                serial,
                id: hit.to_id(),
                lease: hit.lease,
                queue: Vec::new(),
            });
            serial
        };
        let lead = Lead {
            shared: self.shared.clone(),
            fingerprint,
            serial,
        };
        Box::pin(async move {
            let result = self.shared.inner.hit(hit).await;
            drop(lead);
            result
        })
    }

    fn hit_batch<'a>(
        &'a self,
        hit: Hit<'a>,
        more: &'a [Cost],
    ) -> BoxFuture<'a, Result<Vec<Decision>, StoreError>> {
        self.shared.inner.hit_batch(hit, more)
    }

    fn gauges(&self) -> StoreGauges {
        StoreGauges {
            coalesced: Some(self.counts()),
            ..self.shared.inner.gauges()
        }
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&*self.shared.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SystemClock;
    use crate::limit::{Algorithm, Unit};
    use crate::storage::{MemoryStore, Shard};
    use std::time::Duration;

    /// The embedded store, answering each call after a pause: a call in
    /// flight long enough to queue hits behind it.
    struct Slow(MemoryStore);

    impl Store for Slow {
        fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.0.hit(hit).await
            })
        }

        fn kind(&self) -> &'static str {
            "slow"
        }
    }

    fn hit(entries: &[(String, String)], hits: u64) -> Hit<'_> {
        Hit {
            domain: "d",
            entries,
            algorithm: Algorithm::FixedWindow,
            limit: 5,
            window: Unit::Hour.into(),
            hits,
            negative: false,
            usage_reports: false,
            buckets: 2,
            burst: 0,
            shard: Shard::NONE,
            receipt: false,
            also: &[],
            lease: false,
            ahead: crate::storage::Ahead::NONE,
        }
    }

    /// A hit of `cost` on the limiter `entries`, in its own task.
    fn spawn_hit(
        store: &Arc<Coalescing>,
        entries: &[(String, String)],
        cost: u64,
    ) -> tokio::task::JoinHandle<Result<Decision, StoreError>> {
        let (store, entries) = (store.clone(), entries.to_vec());
        tokio::spawn(async move { store.hit(hit(&entries, cost)).await })
    }

    fn store() -> Arc<Coalescing> {
        let memory = MemoryStore::new(Arc::new(SystemClock));
        Arc::new(Coalescing::new(Arc::new(Slow(memory))))
    }

    // Paused time: the pauses below are virtual and run in order, however
    // busy the machine is.
    #[tokio::test(start_paused = true)]
    async fn hits_queued_behind_a_cancelled_call_are_still_answered() {
        let store = store();
        let entries = vec![("k".to_owned(), "v".to_owned())];
        let leader = spawn_hit(&store, &entries, 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let queued = spawn_hit(&store, &entries, 2);
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The caller of the call in flight gives up (its deadline).
        leader.abort();
        let d = tokio::time::timeout(Duration::from_secs(5), queued)
            .await
            .expect("the queued hit is answered")
            .unwrap()
            .unwrap();
        assert!(d.admitted);
        assert_eq!(store.counts().batches, 1);
        // Nothing is left in flight.
        assert!(store.shared.lock().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_queue_goes_out_in_capped_batches() {
        let store = store();
        let entries = vec![("k".to_owned(), "long".to_owned())];
        let limit = 5;
        let leader = spawn_hit(&store, &entries, 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let queued: Vec<_> = (0..MAX_BATCH + 10)
            .map(|_| spawn_hit(&store, &entries, 0))
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        leader.await.unwrap().unwrap();
        for q in queued {
            // Checks (cost 0) see the leader's one hit.
            assert_eq!(q.await.unwrap().unwrap().remaining, limit - 1);
        }
        let counts = store.counts();
        assert_eq!(counts.coalesced_hits, (MAX_BATCH + 10) as u64);
        assert_eq!(counts.batches, 2, "{counts:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_queued_caller_that_stops_waiting_is_not_counted() {
        let store = store();
        let entries = vec![("k".to_owned(), "w".to_owned())];
        let leader = spawn_hit(&store, &entries, 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        let gone = spawn_hit(&store, &entries, 3);
        let stays = spawn_hit(&store, &entries, 1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        gone.abort();
        assert_eq!(leader.await.unwrap().unwrap().remaining, 4);
        // The batch carried only the caller still waiting: 3 were not spent.
        assert_eq!(stays.await.unwrap().unwrap().remaining, 3);
        assert_eq!(store.counts().coalesced_hits, 1);
    }
}
