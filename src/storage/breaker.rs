//! A circuit breaker around any [`Store`]: when the backend keeps failing,
//! stop waiting on it and answer [`StoreError::CircuitOpen`] at once.
//!
//! * Closed: calls go through. `failure_threshold` consecutive failures open
//!   the circuit. A failure is a transient error (timeout, unavailable); a
//!   protocol error means the backend answered, so it counts as a success.
//! * Open: every call is refused immediately for `cooldown`.
//! * Half-open: after the cooldown exactly one call (the probe) goes
//!   through while the others are still refused. Its success closes the
//!   circuit; its failure opens it for another cooldown. A probe dropped
//!   before it finishes (a caller that gave up) lets the next call probe.
//!
//! The state sits behind a std `Mutex`: it is held for a few comparisons and
//! never across an `.await`. Time comes from an injected [`Clock`]; if it
//! steps backwards while open, the cooldown counts as over rather than
//! holding the circuit open for the size of the step.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::storage::{BoxFuture, Decision, Hit, Store, StoreError};

/// When to open and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures that open the circuit (at least 1).
    pub failure_threshold: u32,
    /// How long the circuit stays open before a probe is let through.
    pub cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            failure_threshold: 5,
            cooldown: Duration::from_millis(500),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    /// Opened at this time (microseconds).
    Open {
        since: u64,
    },
    /// The probe is in flight.
    HalfOpen,
}

/// Wraps a store with a circuit breaker. See the module docs.
pub struct Breaker<S> {
    inner: S,
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

impl<S: Store> Breaker<S> {
    pub fn new(inner: S, config: BreakerConfig) -> Self {
        Self::with_clock(inner, config, Arc::new(SystemClock))
    }

    pub fn with_clock(inner: S, config: BreakerConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            inner,
            config: BreakerConfig {
                failure_threshold: config.failure_threshold.max(1),
                ..config
            },
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// True while calls are refused without trying the store.
    pub fn is_open(&self) -> bool {
        match *self.lock() {
            State::Closed { .. } => false,
            State::Open { since } => self.cooling(since),
            State::HalfOpen => true,
        }
    }

    /// Whether a circuit opened at `since` is still in its cooldown.
    fn cooling(&self, since: u64) -> bool {
        let now = self.clock.now_micros();
        now >= since && now - since < self.config.cooldown.as_micros() as u64
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a plain value; a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Decides whether a call may go through, and as what.
    fn admit(&self) -> Result<Permit<'_, S>, StoreError> {
        let mut state = self.lock();
        let probe = match *state {
            State::Closed { .. } => false,
            State::Open { since } if self.cooling(since) => {
                return Err(StoreError::CircuitOpen);
            }
            State::Open { .. } => {
                *state = State::HalfOpen;
                true
            }
            State::HalfOpen => return Err(StoreError::CircuitOpen),
        };
        Ok(Permit {
            breaker: self,
            probe,
            finished: false,
        })
    }

    fn succeeded(&self) {
        let mut state = self.lock();
        if !matches!(*state, State::Closed { .. }) {
            tracing::info!(store = self.inner.kind(), "store circuit closed");
        }
        *state = State::Closed { failures: 0 };
    }

    fn failed(&self, probe: bool) {
        let mut state = self.lock();
        let open = match *state {
            State::Closed { failures } if failures + 1 >= self.config.failure_threshold => true,
            State::Closed { failures } => {
                *state = State::Closed {
                    failures: failures + 1,
                };
                false
            }
            // Only the probe decides in half-open; a late failure of a call
            // admitted earlier does not extend an open circuit.
            State::HalfOpen => probe,
            State::Open { .. } => false,
        };
        if open {
            tracing::warn!(
                store = self.inner.kind(),
                cooldown_ms = self.config.cooldown.as_millis() as u64,
                "store circuit opened"
            );
            *state = State::Open {
                since: self.clock.now_micros(),
            };
        }
    }
}

/// One admitted call. Dropping an unfinished probe hands the probe to the
/// next caller.
struct Permit<'a, S: Store> {
    breaker: &'a Breaker<S>,
    probe: bool,
    finished: bool,
}

impl<S: Store> Permit<'_, S> {
    fn finish(mut self, result: &Result<Decision, StoreError>) {
        self.finished = true;
        match result {
            Err(e) if e.is_transient() => self.breaker.failed(self.probe),
            _ => self.breaker.succeeded(),
        }
    }
}

impl<S: Store> Drop for Permit<'_, S> {
    fn drop(&mut self) {
        if self.probe && !self.finished {
            let mut state = self.breaker.lock();
            if *state == State::HalfOpen {
                // Open with the cooldown already over: the next call probes.
                *state = State::Open { since: 0 };
            }
        }
    }
}

impl<S: Store> Store for Breaker<S> {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        match self.admit() {
            Err(e) => Box::pin(async move { Err(e) }),
            Ok(permit) => Box::pin(async move {
                let result = self.inner.hit(hit).await;
                permit.finish(&result);
                result
            }),
        }
    }

    fn is_ready(&self) -> bool {
        self.inner.is_ready()
    }

    fn maintain(&self) {
        self.inner.maintain();
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

    use tokio::sync::Notify;

    use super::*;
    use crate::clock::ManualClock;
    use crate::limit::{Algorithm, Unit};

    const OK: u8 = 0;
    const UNAVAILABLE: u8 = 1;
    const TIMEOUT: u8 = 2;
    const PROTOCOL: u8 = 3;
    /// Waits for `release` before answering OK.
    const HANG: u8 = 4;

    /// A store that fails on demand and counts the calls that reach it.
    #[derive(Default)]
    struct Scripted {
        mode: AtomicU8,
        calls: AtomicUsize,
        release: Notify,
    }

    impl Scripted {
        fn set(&self, mode: u8) {
            self.mode.store(mode, Ordering::SeqCst);
        }

        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    impl Store for Arc<Scripted> {
        fn hit<'a>(&'a self, _hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mode = self.mode.load(Ordering::SeqCst);
            Box::pin(async move {
                match mode {
                    UNAVAILABLE => Err(StoreError::Unavailable("down".into())),
                    TIMEOUT => Err(StoreError::Timeout(10)),
                    PROTOCOL => Err(StoreError::Protocol("bad reply".into())),
                    HANG => {
                        self.release.notified().await;
                        Ok(ok())
                    }
                    _ => Ok(ok()),
                }
            })
        }

        fn kind(&self) -> &'static str {
            "scripted"
        }
    }

    fn ok() -> Decision {
        Decision {
            admitted: true,
            remaining: 1,
            reset_micros: 1,
        }
    }

    const ENTRIES: &[(String, String)] = &[];

    fn hit() -> Hit<'static> {
        Hit {
            domain: "d",
            entries: ENTRIES,
            algorithm: Algorithm::FixedWindow,
            limit: 10,
            unit: Unit::Second,
            hits: 1,
            negative: false,
        }
    }

    struct Setup {
        store: Arc<Scripted>,
        breaker: Breaker<Arc<Scripted>>,
        clock: ManualClock,
    }

    impl Setup {
        fn advance_ms(&self, ms: u64) {
            self.clock.advance_micros(ms * 1_000);
        }
    }

    fn breaker(threshold: u32) -> Setup {
        let store = Arc::new(Scripted::default());
        let clock = ManualClock::at_secs(1_000);
        let breaker = Breaker::with_clock(
            store.clone(),
            BreakerConfig {
                failure_threshold: threshold,
                cooldown: Duration::from_millis(500),
            },
            Arc::new(clock.clone()),
        );
        Setup {
            store,
            breaker,
            clock,
        }
    }

    fn is_circuit_open(result: Result<Decision, StoreError>) -> bool {
        matches!(result, Err(StoreError::CircuitOpen))
    }

    #[tokio::test]
    async fn opens_after_consecutive_failures_and_answers_at_once() {
        let setup = breaker(5);
        setup.store.set(UNAVAILABLE);
        for _ in 0..4 {
            assert!(matches!(
                setup.breaker.hit(hit()).await,
                Err(StoreError::Unavailable(_))
            ));
            assert!(!setup.breaker.is_open());
        }
        assert!(matches!(
            setup.breaker.hit(hit()).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(setup.breaker.is_open());
        setup.store.set(OK);
        for _ in 0..10 {
            assert!(is_circuit_open(setup.breaker.hit(hit()).await));
        }
        assert_eq!(
            setup.store.calls(),
            5,
            "an open circuit does not call the store"
        );
    }

    #[tokio::test]
    async fn timeouts_count_and_protocol_errors_do_not() {
        let setup = breaker(3);
        setup.store.set(PROTOCOL);
        for _ in 0..10 {
            assert!(matches!(
                setup.breaker.hit(hit()).await,
                Err(StoreError::Protocol(_))
            ));
        }
        assert!(!setup.breaker.is_open());
        setup.store.set(TIMEOUT);
        for _ in 0..3 {
            assert!(matches!(
                setup.breaker.hit(hit()).await,
                Err(StoreError::Timeout(_))
            ));
        }
        assert!(setup.breaker.is_open());
    }

    #[tokio::test]
    async fn a_success_resets_the_count() {
        let setup = breaker(3);
        for _ in 0..5 {
            setup.store.set(UNAVAILABLE);
            let _ = setup.breaker.hit(hit()).await;
            let _ = setup.breaker.hit(hit()).await;
            setup.store.set(OK);
            assert!(setup.breaker.hit(hit()).await.is_ok());
        }
        assert!(!setup.breaker.is_open());
    }

    #[tokio::test]
    async fn probe_after_cooldown_closes_on_success() {
        let setup = breaker(1);
        setup.store.set(UNAVAILABLE);
        let _ = setup.breaker.hit(hit()).await;
        assert!(setup.breaker.is_open());
        setup.advance_ms(499);
        assert!(is_circuit_open(setup.breaker.hit(hit()).await));
        setup.advance_ms(2);
        setup.store.set(OK);
        assert!(
            setup.breaker.hit(hit()).await.is_ok(),
            "the probe goes through"
        );
        assert!(!setup.breaker.is_open());
        assert!(setup.breaker.hit(hit()).await.is_ok());
        assert_eq!(setup.store.calls(), 3);
    }

    #[tokio::test]
    async fn failed_probe_reopens_for_a_full_cooldown() {
        let setup = breaker(2);
        setup.store.set(UNAVAILABLE);
        let _ = setup.breaker.hit(hit()).await;
        let _ = setup.breaker.hit(hit()).await;
        setup.advance_ms(600);
        assert!(matches!(
            setup.breaker.hit(hit()).await,
            Err(StoreError::Unavailable(_))
        ));
        assert!(
            setup.breaker.is_open(),
            "one failed probe is enough to reopen"
        );
        setup.advance_ms(400);
        assert!(is_circuit_open(setup.breaker.hit(hit()).await));
        setup.advance_ms(200);
        setup.store.set(OK);
        assert!(setup.breaker.hit(hit()).await.is_ok());
        assert_eq!(setup.store.calls(), 4);
    }

    #[tokio::test]
    async fn half_open_lets_exactly_one_probe_through() {
        let setup = breaker(1);
        setup.store.set(UNAVAILABLE);
        let _ = setup.breaker.hit(hit()).await;
        setup.advance_ms(600);
        setup.store.set(HANG);
        let mut probe = setup.breaker.hit(hit());
        // Start the probe: it reaches the store and waits there.
        assert!(futures_util::poll!(&mut probe).is_pending());
        for _ in 0..5 {
            assert!(is_circuit_open(setup.breaker.hit(hit()).await));
        }
        assert_eq!(setup.store.calls(), 2);
        setup.store.release.notify_one();
        assert!(probe.await.is_ok());
        setup.store.set(OK);
        assert!(setup.breaker.hit(hit()).await.is_ok());
    }

    #[tokio::test]
    async fn an_abandoned_probe_hands_over_to_the_next_call() {
        let setup = breaker(1);
        setup.store.set(UNAVAILABLE);
        let _ = setup.breaker.hit(hit()).await;
        setup.advance_ms(600);
        setup.store.set(HANG);
        {
            let mut probe = setup.breaker.hit(hit());
            assert!(futures_util::poll!(&mut probe).is_pending());
            // The caller gives up (e.g. Envoy's deadline): dropped here.
        }
        setup.store.set(OK);
        assert!(setup.breaker.hit(hit()).await.is_ok());
        assert!(!setup.breaker.is_open());
    }
}
