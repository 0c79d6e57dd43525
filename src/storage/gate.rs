//! The in-flight gate: at most `max_in_flight` store calls wait at once
//! (decisions, the quota service's lease calls and undos alike).
//! Past it a call fails at once with [`StoreError::Overloaded`], and the
//! engine answers it by `on_overload` (error, allow or deny), so work never
//! queues without bound when the store slows down.
//!
//! It sits below the over-limit cache and above the backend: a refusal the
//! cache can give locally never waits for a slot, so a flood on an
//! exhausted limiter keeps getting decisions (not errors, which Envoy lets
//! through) however busy the store is; requests that match no limit never
//! reach a store at all.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::quota;
use crate::storage::{BoxFuture, Decision, Hit, LeaseCall, Receipt, Store, StoreError};

pub struct Gate {
    inner: Arc<dyn Store>,
    max: usize,
    in_flight: AtomicUsize,
}

/// One call holding a slot; the slot is freed when the call ends, answered
/// or dropped (the caller's deadline passed).
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Gate {
    /// `max` is at least 1.
    pub fn new(inner: Arc<dyn Store>, max: usize) -> Self {
        Self {
            inner,
            max: max.max(1),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// Calls waiting on the store now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// A slot for one call, or `Overloaded` at once: waiting past the
    /// bound only adds latency that the caller's deadline turns into an
    /// error anyway.
    fn enter(&self) -> Result<Slot<'_>, StoreError> {
        let now = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        let slot = Slot(&self.in_flight);
        if now > self.max {
            return Err(StoreError::Overloaded(self.max));
        }
        Ok(slot)
    }
}

impl Store for Gate {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            let _slot = self.enter()?;
            self.inner.hit(hit).await
        })
    }

    fn lease<'a>(&'a self, call: LeaseCall<'a>) -> BoxFuture<'a, Result<quota::Grant, StoreError>> {
        Box::pin(async move {
            let _slot = self.enter()?;
            self.inner.lease(call).await
        })
    }

    fn undo<'a>(&'a self, hit: Hit<'a>, receipt: Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let _slot = self.enter()?;
            self.inner.undo(hit, receipt).await
        })
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, Unit};
    use crate::storage::Shard;
    use std::time::Duration;

    /// A store whose calls wait until released.
    struct Held(tokio::sync::Semaphore);

    impl Store for Held {
        fn hit<'a>(&'a self, _hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
            Box::pin(async move {
                let _permit = self.0.acquire().await;
                Ok(Decision {
                    admitted: true,
                    remaining: 1,
                    reset_micros: 1,
                    receipt: None,
                    group: None,
                })
            })
        }

        fn lease<'a>(
            &'a self,
            _call: LeaseCall<'a>,
        ) -> BoxFuture<'a, Result<quota::Grant, StoreError>> {
            Box::pin(async move {
                let _permit = self.0.acquire().await;
                Ok(quota::Grant {
                    tokens: 1,
                    holders: 1,
                    granted_total: 1,
                })
            })
        }
    }

    fn lease<'a>(entries: &'a [(String, String)]) -> LeaseCall<'a> {
        LeaseCall {
            domain: "d",
            entries,
            algorithm: Algorithm::FixedWindow,
            window: Unit::Second.into(),
            holder: "stream-1",
            report: quota::Report {
                requests: 1,
                elapsed_secs: 1,
            },
            terms: quota::Terms {
                capacity: 10,
                fill_secs: 1,
                hold_micros: 1_000_000,
            },
            counted: None,
        }
    }

    /// Lease calls share the bound with decisions: a flood of quota
    /// reports cannot queue without bound on a slow store either.
    #[tokio::test(start_paused = true)]
    async fn lease_calls_take_slots_too() {
        let held = Arc::new(Held(tokio::sync::Semaphore::new(0)));
        let gate = Arc::new(Gate::new(held.clone(), 2));
        let entries = vec![("k".to_owned(), "v".to_owned())];
        let first = {
            let (gate, entries) = (gate.clone(), entries.clone());
            tokio::spawn(async move { gate.lease(lease(&entries)).await.map(|g| g.tokens) })
        };
        let second = {
            let (gate, entries) = (gate.clone(), entries.clone());
            tokio::spawn(async move { gate.hit(hit(&entries)).await.map(|d| d.remaining) })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(gate.in_flight(), 2);
        let third = gate.lease(lease(&entries)).await;
        assert!(matches!(third, Err(StoreError::Overloaded(2))), "{third:?}");
        held.0.add_permits(2);
        assert_eq!(first.await.unwrap().unwrap(), 1);
        assert_eq!(second.await.unwrap().unwrap(), 1);
        assert_eq!(gate.in_flight(), 0);
    }

    fn hit(entries: &[(String, String)]) -> Hit<'_> {
        Hit {
            domain: "d",
            entries,
            algorithm: Algorithm::FixedWindow,
            limit: 10,
            window: Unit::Second.into(),
            hits: 1,
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

    #[tokio::test(start_paused = true)]
    async fn past_max_fails_at_once_and_slots_come_back() {
        let held = Arc::new(Held(tokio::sync::Semaphore::new(0)));
        let gate = Arc::new(Gate::new(held.clone(), 2));
        let entries = vec![("k".to_owned(), "v".to_owned())];
        let waiting: Vec<_> = (0..2)
            .map(|_| {
                let (gate, entries) = (gate.clone(), entries.clone());
                tokio::spawn(async move { gate.hit(hit(&entries)).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(gate.in_flight(), 2);
        let third = gate.hit(hit(&entries)).await;
        assert!(matches!(third, Err(StoreError::Overloaded(2))), "{third:?}");
        // The refused call gave its slot back at once.
        assert_eq!(gate.in_flight(), 2);
        held.0.add_permits(2);
        for w in waiting {
            assert!(w.await.unwrap().is_ok());
        }
        assert_eq!(gate.in_flight(), 0);
        held.0.add_permits(1);
        assert!(gate.hit(hit(&entries)).await.is_ok());
    }
}
