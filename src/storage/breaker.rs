//! A circuit breaker around any [`Store`], one circuit per backend server
//! ([`Store::node`]): when a server keeps failing, stop waiting on it and
//! answer [`StoreError::CircuitOpen`] at once, while limiters on the other
//! servers (the other primaries of a Redis Cluster) go on as usual.
//!
//! Per server:
//! * Closed: calls go through. `failure_threshold` consecutive failures open
//!   the circuit. A failure is a transient error (timeout, unavailable); a
//!   protocol error means the backend answered, so it counts as a success.
//! * Open: every call is refused immediately for `cooldown`.
//! * Half-open: after the cooldown exactly one call (the probe) goes
//!   through while the others are still refused. Its success closes the
//!   circuit; its failure opens it for another cooldown. A probe dropped
//!   before it finishes (a caller that gave up) lets the next call probe.
//!
//! Only servers in trouble have an entry: a healthy closed circuit is the
//! absence of one, so the map stays as small as the set of failing servers.
//! An entry not used for [`FORGET_AFTER`] (the server left the routing) is
//! dropped by [`Store::maintain`].
//!
//! Opening and closing are logged once each, naming the server; single
//! failed calls are not logged (an outage would flood the log), only
//! counted ([`Store::failures`]).
//!
//! The map sits behind a std `Mutex`: it is held for a lookup and a few
//! comparisons, never across an `.await`. Time comes from an injected
//! [`Clock`]; if it steps backwards while open, the cooldown counts as over
//! rather than holding the circuit open for the size of the step.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::storage::{
    BoxFuture, Cost, Decision, FailureCounters, FailureCounts, Hit, LeaseCall, NodeId, Receipt,
    Store, StoreError, StoreGauges,
};

/// A server's entry unused for this long is forgotten.
pub const FORGET_AFTER: Duration = Duration::from_secs(60);

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
    /// With at least one failure: zero failures is no entry at all.
    Closed { failures: u32 },
    /// Opened at this time (microseconds).
    Open { since: u64 },
    /// The probe is in flight.
    HalfOpen,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    state: State,
    /// Last call admitted or finished (microseconds).
    used: u64,
}

/// Wraps a store with a circuit breaker per server. See the module docs.
pub struct Breaker<S> {
    inner: S,
    config: BreakerConfig,
    clock: Arc<dyn Clock>,
    nodes: Mutex<HashMap<NodeId, Entry>>,
    failures: FailureCounters,
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
            nodes: Mutex::new(HashMap::new()),
            failures: FailureCounters::default(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// True while some server's calls are refused without trying it.
    pub fn is_open(&self) -> bool {
        let nodes = self.lock();
        nodes.values().any(|e| self.refuses(e.state))
    }

    /// True while calls to `node` are refused without trying it.
    pub fn is_open_for(&self, node: &NodeId) -> bool {
        self.lock().get(node).is_some_and(|e| self.refuses(e.state))
    }

    /// Servers whose calls are refused now.
    pub fn open_nodes(&self) -> Vec<NodeId> {
        let nodes = self.lock();
        nodes
            .iter()
            .filter(|(_, e)| self.refuses(e.state))
            .map(|(node, _)| node.clone())
            .collect()
    }

    fn refuses(&self, state: State) -> bool {
        match state {
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

    fn lock(&self) -> MutexGuard<'_, HashMap<NodeId, Entry>> {
        // Plain values; a panic elsewhere cannot leave them torn.
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn name<'n>(&'n self, node: &'n NodeId) -> &'n str {
        node.name().unwrap_or(self.inner.kind())
    }

    /// Decides whether a call to `node` may go through, and as what.
    fn admit(&self, node: NodeId) -> Result<Permit<'_, S>, StoreError> {
        let mut nodes = self.lock();
        let probe = match nodes.get_mut(&node) {
            None => false,
            Some(entry) => {
                entry.used = self.clock.now_micros();
                match entry.state {
                    State::Closed { .. } => false,
                    State::Open { since } if self.cooling(since) => {
                        return Err(StoreError::CircuitOpen);
                    }
                    State::Open { .. } => {
                        entry.state = State::HalfOpen;
                        true
                    }
                    State::HalfOpen => return Err(StoreError::CircuitOpen),
                }
            }
        };
        drop(nodes);
        Ok(Permit {
            breaker: self,
            node,
            probe,
            finished: false,
        })
    }

    fn succeeded(&self, node: &NodeId) {
        let mut nodes = self.lock();
        if let Some(entry) = nodes.remove(node)
            && !matches!(entry.state, State::Closed { .. })
        {
            tracing::info!(
                store = self.inner.kind(),
                node = self.name(node),
                "store circuit closed"
            );
        }
    }

    fn failed(&self, node: &NodeId, probe: bool) {
        let now = self.clock.now_micros();
        let mut nodes = self.lock();
        let entry = nodes.entry(node.clone()).or_insert(Entry {
            state: State::Closed { failures: 0 },
            used: now,
        });
        entry.used = now;
        let open = match entry.state {
            State::Closed { failures } if failures + 1 >= self.config.failure_threshold => true,
            State::Closed { failures } => {
                entry.state = State::Closed {
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
            // Logged when a closed circuit opens, not when a probe fails:
            // an outage logs once, however long it lasts.
            if matches!(entry.state, State::Closed { .. }) {
                tracing::warn!(
                    store = self.inner.kind(),
                    node = self.name(node),
                    cooldown_ms = self.config.cooldown.as_millis() as u64,
                    "store circuit opened"
                );
            }
            entry.state = State::Open { since: now };
        }
    }

    /// Drops entries of servers no call has gone to for [`FORGET_AFTER`].
    fn forget_unused(&self) {
        let now = self.clock.now_micros();
        let horizon = FORGET_AFTER.as_micros() as u64;
        let mut nodes = self.lock();
        nodes.retain(|node, entry| {
            // A backwards clock step keeps the entry: forgetting is a
            // clean-up, never urgent.
            let keep = entry.state == State::HalfOpen || now.saturating_sub(entry.used) < horizon;
            if !keep {
                tracing::debug!(
                    store = self.inner.kind(),
                    node = node.name().unwrap_or(self.inner.kind()),
                    "store circuit forgotten: no calls go to this server any more"
                );
            }
            keep
        });
    }
}

/// One admitted call. Dropping an unfinished probe hands the probe to the
/// next caller.
struct Permit<'a, S: Store> {
    breaker: &'a Breaker<S>,
    node: NodeId,
    probe: bool,
    finished: bool,
}

impl<S: Store> Permit<'_, S> {
    fn finish<T>(mut self, result: &Result<T, StoreError>) {
        self.finished = true;
        if let Err(e) = result {
            self.breaker.failures.record(e);
        }
        match result {
            // A slot moving says nothing of the server's health; a probe
            // that meets one hands the probe on (as when dropped).
            Err(StoreError::Moved(_)) => self.finished = false,
            Err(e) if e.is_transient() => self.breaker.failed(&self.node, self.probe),
            _ => self.breaker.succeeded(&self.node),
        }
    }
}

impl<S: Store> Drop for Permit<'_, S> {
    fn drop(&mut self) {
        if self.probe && !self.finished {
            let mut nodes = self.breaker.lock();
            if let Some(entry) = nodes.get_mut(&self.node)
                && entry.state == State::HalfOpen
            {
                // Open with the cooldown already over: the next call probes.
                entry.state = State::Open { since: 0 };
            }
        }
    }
}

impl<S: Store> Breaker<S> {
    /// Runs one call to `node` under its circuit: refused at once while
    /// the circuit is open, else counted as one success or failure.
    fn guarded<'a, T: Send + 'a>(
        &'a self,
        node: NodeId,
        call: impl FnOnce() -> BoxFuture<'a, Result<T, StoreError>>,
    ) -> BoxFuture<'a, Result<T, StoreError>> {
        match self.admit(node) {
            Err(e) => {
                self.failures.record(&e);
                Box::pin(async move { Err(e) })
            }
            Ok(permit) => {
                let call = call();
                Box::pin(async move {
                    let result = call.await;
                    permit.finish(&result);
                    result
                })
            }
        }
    }
}

impl<S: Store> Store for Breaker<S> {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        self.guarded(self.inner.node(&hit), || self.inner.hit(hit))
    }

    /// One call to the server: one permit, one success or failure.
    fn hit_batch<'a>(
        &'a self,
        hit: Hit<'a>,
        more: &'a [Cost],
    ) -> BoxFuture<'a, Result<Vec<Decision>, StoreError>> {
        self.guarded(self.inner.node(&hit), || self.inner.hit_batch(hit, more))
    }

    /// Leases go through the same circuit as hits: an open circuit refuses
    /// them at once, so a report of many buckets does not wait a timeout
    /// per bucket on a failing server.
    fn lease<'a>(
        &'a self,
        call: LeaseCall<'a>,
    ) -> BoxFuture<'a, Result<crate::quota::Grant, StoreError>> {
        self.guarded(self.inner.node(&call.limiter()), || self.inner.lease(call))
    }

    /// An undo is one call to the limiter's server, under its circuit.
    fn undo<'a>(&'a self, hit: Hit<'a>, receipt: Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        self.guarded(self.inner.node(&hit), || self.inner.undo(hit, receipt))
    }

    fn maintain(&self) {
        self.forget_unused();
        self.inner.maintain();
    }

    fn failures(&self) -> FailureCounts {
        self.failures.snapshot()
    }

    fn gauges(&self) -> StoreGauges {
        let circuits = {
            let nodes = self.lock();
            nodes
                .iter()
                .map(|(node, e)| (node.clone(), self.refuses(e.state)))
                .collect()
        };
        StoreGauges {
            circuits,
            ..self.inner.gauges()
        }
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&self.inner)
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

    /// A store that fails on demand and counts the calls that reach it. Its
    /// servers are named after the hit's domain; each can be given its own
    /// mode, the others follow the default one.
    #[derive(Default)]
    struct Scripted {
        mode: AtomicU8,
        node_modes: Mutex<HashMap<String, u8>>,
        calls: AtomicUsize,
        node_calls: Mutex<HashMap<String, usize>>,
        release: Notify,
    }

    impl Scripted {
        fn set(&self, mode: u8) {
            self.mode.store(mode, Ordering::SeqCst);
        }

        fn set_node(&self, node: &str, mode: u8) {
            self.node_modes
                .lock()
                .unwrap()
                .insert(node.to_owned(), mode);
        }

        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }

        fn calls_to(&self, node: &str) -> usize {
            self.node_calls
                .lock()
                .unwrap()
                .get(node)
                .copied()
                .unwrap_or(0)
        }
    }

    impl Store for Arc<Scripted> {
        fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            *self
                .node_calls
                .lock()
                .unwrap()
                .entry(hit.domain.to_owned())
                .or_default() += 1;
            let mode = match self.node_modes.lock().unwrap().get(hit.domain) {
                Some(&mode) => mode,
                None => self.mode.load(Ordering::SeqCst),
            };
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

        fn node(&self, hit: &Hit<'_>) -> NodeId {
            NodeId::named(hit.domain)
        }
    }

    fn ok() -> Decision {
        Decision {
            admitted: true,
            remaining: 1,
            reset_micros: 1,
            receipt: None,
            group: None,
        }
    }

    const ENTRIES: &[(String, String)] = &[];

    fn hit() -> Hit<'static> {
        hit_on("d")
    }

    /// A hit on the server named `node`.
    fn hit_on(node: &'static str) -> Hit<'static> {
        Hit {
            domain: node,
            entries: ENTRIES,
            algorithm: Algorithm::FixedWindow,
            limit: 10,
            window: Unit::Second.into(),
            hits: 1,
            negative: false,
            usage_reports: false,
            buckets: 2,
            burst: 0,
            shard: crate::storage::Shard::NONE,
            receipt: false,
            also: &[],
            lease: false,
            ahead: crate::storage::Ahead::NONE,
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

    #[tokio::test]
    async fn failures_on_one_node_open_that_node_only() {
        let setup = breaker(3);
        setup.store.set_node("a", UNAVAILABLE);
        for _ in 0..3 {
            assert!(matches!(
                setup.breaker.hit(hit_on("a")).await,
                Err(StoreError::Unavailable(_))
            ));
            // Successes on another server do not reset the count of "a".
            assert!(setup.breaker.hit(hit_on("b")).await.is_ok());
        }
        let (a, b) = (NodeId::named("a"), NodeId::named("b"));
        assert!(setup.breaker.is_open_for(&a));
        assert!(!setup.breaker.is_open_for(&b));
        assert_eq!(setup.breaker.open_nodes(), vec![a]);
        for _ in 0..10 {
            assert!(is_circuit_open(setup.breaker.hit(hit_on("a")).await));
            assert!(setup.breaker.hit(hit_on("b")).await.is_ok());
        }
        assert_eq!(
            setup.store.calls_to("a"),
            3,
            "an open circuit spares its server"
        );
        assert_eq!(
            setup.store.calls_to("b"),
            13,
            "the other server gets every call"
        );
    }

    #[tokio::test]
    async fn each_node_has_its_own_probe() {
        let setup = breaker(1);
        setup.store.set(UNAVAILABLE);
        let _ = setup.breaker.hit(hit_on("a")).await;
        let _ = setup.breaker.hit(hit_on("b")).await;
        assert_eq!(setup.breaker.open_nodes().len(), 2);
        setup.advance_ms(600);
        setup.store.set_node("a", HANG);
        setup.store.set_node("b", OK);
        let mut probe_a = setup.breaker.hit(hit_on("a"));
        assert!(futures_util::poll!(&mut probe_a).is_pending());
        // "a" is half-open with its probe in flight; "b" probes on its own.
        assert!(is_circuit_open(setup.breaker.hit(hit_on("a")).await));
        assert!(setup.breaker.hit(hit_on("b")).await.is_ok());
        assert!(!setup.breaker.is_open_for(&NodeId::named("b")));
        assert!(setup.breaker.is_open_for(&NodeId::named("a")));
        setup.store.release.notify_one();
        assert!(probe_a.await.is_ok());
        assert!(!setup.breaker.is_open());
    }

    #[tokio::test]
    async fn a_failed_probe_on_one_node_leaves_the_other_closed() {
        let setup = breaker(1);
        setup.store.set_node("a", TIMEOUT);
        let _ = setup.breaker.hit(hit_on("a")).await;
        setup.advance_ms(600);
        assert!(matches!(
            setup.breaker.hit(hit_on("a")).await,
            Err(StoreError::Timeout(_))
        ));
        assert!(setup.breaker.is_open_for(&NodeId::named("a")));
        assert!(setup.breaker.hit(hit_on("b")).await.is_ok());
        assert_eq!(setup.breaker.open_nodes(), vec![NodeId::named("a")]);
    }

    #[tokio::test]
    async fn healthy_nodes_take_no_room_and_idle_ones_are_forgotten() {
        let setup = breaker(2);
        setup.store.set_node("a", UNAVAILABLE);
        setup.store.set_node("b", UNAVAILABLE);
        let _ = setup.breaker.hit(hit_on("a")).await;
        let _ = setup.breaker.hit(hit_on("a")).await;
        let _ = setup.breaker.hit(hit_on("b")).await;
        assert_eq!(setup.breaker.lock().len(), 2);
        setup.store.set_node("b", OK);
        assert!(setup.breaker.hit(hit_on("b")).await.is_ok());
        assert_eq!(
            setup.breaker.lock().len(),
            1,
            "a closed circuit is no entry"
        );
        // "a" stays open while calls keep coming (here a failed probe)...
        setup.advance_ms(30_000);
        assert!(matches!(
            setup.breaker.hit(hit_on("a")).await,
            Err(StoreError::Unavailable(_))
        ));
        setup.advance_ms(40_000);
        setup.breaker.maintain();
        assert!(setup.breaker.lock().contains_key(&NodeId::named("a")));
        // ...and is forgotten once nothing goes there any more.
        setup.clock.advance_micros(FORGET_AFTER.as_micros() as u64);
        setup.breaker.maintain();
        assert!(setup.breaker.lock().is_empty());
    }

    #[tokio::test]
    async fn failures_are_counted_by_kind() {
        let setup = breaker(2);
        setup.store.set(TIMEOUT);
        let _ = setup.breaker.hit(hit()).await;
        setup.store.set(UNAVAILABLE);
        let _ = setup.breaker.hit(hit()).await;
        for _ in 0..3 {
            let _ = setup.breaker.hit(hit()).await;
        }
        setup.store.set(PROTOCOL);
        let _ = setup.breaker.hit(hit_on("other")).await;
        setup.store.set(OK);
        let _ = setup.breaker.hit(hit_on("other")).await;
        assert_eq!(
            setup.breaker.failures(),
            FailureCounts {
                timeout: 1,
                unavailable: 1,
                protocol: 1,
                circuit_open: 3,
            }
        );
    }
}
