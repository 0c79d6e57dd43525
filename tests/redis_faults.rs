//! What callers see when Redis misbehaves: an emptied script cache, a
//! server that goes away and comes back, a cluster primary that dies, a
//! sentinel-managed primary that dies. Every wait is bounded, so a
//! regression fails instead of hanging.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::task::JoinHandle;
use tollgate::limit::{Algorithm, Unit};
use tollgate::storage::keys::{KeyBuilder, Role};
use tollgate::storage::{
    Breaker, BreakerConfig, Decision, Hit, RedisConfig, RedisStore, Store, StoreError,
};

use support::redis::{
    RedisCluster, RedisSentinel, RedisServer, SENTINEL_SERVICE, SentinelOptions, cli, command_calls,
};
use support::unique_domain;

/// Slack on top of the command timeout for scheduling on a busy machine.
const SLACK: Duration = Duration::from_millis(150);

struct Limiter {
    domain: String,
    entries: Vec<(String, String)>,
    algorithm: Algorithm,
}

impl Limiter {
    fn new(case: &str, algorithm: Algorithm) -> Limiter {
        Limiter {
            domain: unique_domain(case),
            entries: vec![("k".into(), "v".into())],
            algorithm,
        }
    }

    fn as_hit(&self) -> Hit<'_> {
        Hit {
            domain: &self.domain,
            entries: &self.entries,
            algorithm: self.algorithm,
            // Never refuses: these tests are about errors, not counting.
            limit: 1_000_000_000,
            window: Unit::Minute.into(),
            hits: 1,
            negative: false,
            usage_reports: false,
            buckets: 2,
            burst: 0,
            shard: tollgate::storage::Shard::NONE,
            receipt: false,
            also: &[],
            lease: false,
            ahead: tollgate::storage::Ahead::NONE,
        }
    }

    /// The call's result and how long it took.
    async fn timed_hit(&self, store: &dyn Store) -> (Result<Decision, StoreError>, Duration) {
        let started = Instant::now();
        let result = store.hit(self.as_hit()).await;
        (result, started.elapsed())
    }

    fn state_key(&self) -> String {
        let keys = KeyBuilder::default().limiter(&self.as_hit());
        match self.algorithm {
            Algorithm::SlidingWindowLog => keys.key(Role::LogSet),
            _ => keys.key(Role::State),
        }
    }
}

async fn connect(url: String, command_timeout: Duration) -> RedisStore {
    let store = RedisStore::connect(RedisConfig {
        url,
        command_timeout,
        ..RedisConfig::default()
    })
    .await
    .expect("valid settings");
    assert!(
        store.wait_ready(Duration::from_secs(20)).await,
        "store not ready after 20 s"
    );
    store
}

/// Polls `store` with hits on `limiter` until one succeeds; panics after
/// `timeout`.
async fn wait_for_success(store: &dyn Store, limiter: &Limiter, timeout: Duration, what: &str) {
    let deadline = Instant::now() + timeout;
    loop {
        if limiter.timed_hit(store).await.0.is_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: no success within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Hits every algorithm in a loop from a few tasks while `disturb` runs;
/// returns every call's result.
async fn hit_while(
    store: Arc<RedisStore>,
    disturb: impl std::future::Future<Output = ()>,
) -> Vec<Result<Decision, StoreError>> {
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..3)
        .map(|i| {
            let store = store.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let limiters: Vec<Limiter> = Algorithm::ALL
                    .into_iter()
                    .map(|a| Limiter::new(&format!("flush-{i}"), a))
                    .collect();
                let mut results = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    for l in &limiters {
                        results.push(l.timed_hit(&*store).await.0);
                    }
                }
                results
            })
        })
        .collect();
    disturb.await;
    stop.store(true, Ordering::Relaxed);
    join_all(workers)
        .await
        .into_iter()
        .flat_map(|r| r.expect("worker panicked"))
        .collect()
}

fn assert_all_ok(results: &[Result<Decision, StoreError>], what: &str) {
    let failures: Vec<&StoreError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{what}: {} of {} calls failed, first: {}",
        failures.len(),
        results.len(),
        failures[0]
    );
    assert!(
        results.len() > 30,
        "{what}: only {} calls ran",
        results.len()
    );
}

/// One call made by a [`LoadLoop`]: when it started, whether it succeeded,
/// how long it took.
type Call = (Instant, bool, Duration);

/// Tasks hitting one limiter in a loop until stopped, recording every call.
struct LoadLoop {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<Vec<Call>>>,
}

impl LoadLoop {
    fn start(store: Arc<RedisStore>, limiter: Arc<Limiter>, tasks: usize) -> LoadLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..tasks)
            .map(|_| {
                let store = store.clone();
                let limiter = limiter.clone();
                let stop = stop.clone();
                tokio::spawn(async move {
                    let mut calls = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let at = Instant::now();
                        let (result, took) = limiter.timed_hit(&*store).await;
                        calls.push((at, result.is_ok(), took));
                        if result.is_err() {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                    calls
                })
            })
            .collect();
        LoadLoop { stop, tasks }
    }

    /// Stops the tasks; returns every call they made.
    async fn finish(self) -> Vec<Call> {
        self.stop.store(true, Ordering::Relaxed);
        let joined = tokio::time::timeout(Duration::from_secs(10), join_all(self.tasks))
            .await
            .expect("load tasks did not stop within 10 s");
        joined
            .into_iter()
            .flat_map(|r| r.expect("load task panicked"))
            .collect()
    }
}

/// Waits until 20 calls in a row succeed; panics if that takes past
/// `since + within`. Returns the time from `since` to recovery.
async fn wait_for_recovery(
    store: &dyn Store,
    limiter: &Limiter,
    since: Instant,
    within: Duration,
    what: &str,
) -> Duration {
    let deadline = since + within;
    let mut consecutive = 0;
    while consecutive < 20 {
        assert!(
            Instant::now() < deadline,
            "no recovery within {within:?} after {what}"
        );
        if limiter.timed_hit(store).await.0.is_ok() {
            consecutive += 1;
        } else {
            consecutive = 0;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    since.elapsed()
}

/// Asserts that every call took at most `timeout + SLACK`; returns the
/// slowest call's time and how many calls failed at or after `since`.
fn check_calls(calls: &[Call], timeout: Duration, since: Instant) -> (Duration, usize) {
    let slowest = calls.iter().map(|c| c.2).max().unwrap_or_default();
    assert!(slowest <= timeout + SLACK, "a call took {slowest:?}");
    let failed = calls
        .iter()
        .filter(|(at, ok, _)| *at >= since && !ok)
        .count();
    (slowest, failed)
}

/// What happened while a primary was killed under load.
struct Failover {
    killed: u16,
    recovered_after: Duration,
    calls: usize,
    slowest: Duration,
    failed_after_kill: usize,
}

/// Runs three callers on `limiter`, kills a primary with `kill` (which
/// returns its port), waits (bounded) for calls to succeed again on their
/// own, and checks that every call answered within `timeout` and that some
/// failed while there was no primary.
async fn kill_under_load(
    store: Arc<RedisStore>,
    limiter: Arc<Limiter>,
    timeout: Duration,
    kill: impl FnOnce() -> u16,
) -> Failover {
    let load = LoadLoop::start(store.clone(), limiter.clone(), 3);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed_at = Instant::now();
    let killed = kill();
    let recovered_after = wait_for_recovery(
        &*store,
        &limiter,
        killed_at,
        Duration::from_secs(30),
        &format!("killing primary {killed}"),
    )
    .await;
    let calls = load.finish().await;
    let (slowest, failed_after_kill) = check_calls(&calls, timeout, killed_at);
    assert!(
        failed_after_kill > 0,
        "no call failed while there was no primary"
    );
    Failover {
        killed,
        recovered_after,
        calls: calls.len(),
        slowest,
        failed_after_kill,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_invisible_standalone() {
    let server = RedisServer::start();
    let store = Arc::new(connect(server.url(), Duration::from_millis(250)).await);
    let results = hit_while(store, async {
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(server.cli(&["SCRIPT", "FLUSH"]), "OK");
        }
    })
    .await;
    assert_all_ok(&results, "standalone SCRIPT FLUSH");
    // The flushes really emptied the cache: the store loaded scripts again.
    let stats = server.cli(&["INFO", "commandstats"]);
    let loads: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_script|load:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(loads > 3, "only {loads} SCRIPT LOADs:\n{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_fails_fast_and_recovers() {
    let timeout = Duration::from_millis(50);
    let mut server = RedisServer::start();
    let store = connect(server.url(), timeout).await;
    let breaker = Breaker::new(
        store.clone(),
        BreakerConfig {
            failure_threshold: 5,
            cooldown: Duration::from_millis(300),
        },
    );
    let l = Limiter::new("outage", Algorithm::SlidingWindowLog);
    assert!(l.timed_hit(&store).await.0.is_ok());
    assert!(l.timed_hit(&breaker).await.0.is_ok());

    server.stop();

    // Every call answers, with an error, within the timeout.
    for _ in 0..20 {
        let (result, took) = l.timed_hit(&store).await;
        assert!(result.is_err(), "a call succeeded with Redis down");
        assert!(took <= timeout + SLACK, "a call took {took:?}");
    }
    // Many concurrent callers do not pile up behind the dead connection.
    let store = Arc::new(store);
    let started = Instant::now();
    let burst = (0..2_000).map(|_| {
        let store = store.clone();
        tokio::spawn(async move {
            let l = Limiter::new("outage-burst", Algorithm::FixedWindow);
            l.timed_hit(&*store).await.0.is_err()
        })
    });
    let failed = join_all(burst)
        .await
        .into_iter()
        .filter(|r| *r.as_ref().expect("task panicked"))
        .count();
    assert_eq!(failed, 2_000);
    assert!(
        started.elapsed() <= timeout + Duration::from_secs(1),
        "2000 calls during the outage took {:?}",
        started.elapsed()
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.is_ready() {
        assert!(
            Instant::now() < deadline,
            "still ready 5 s after Redis stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The breaker: N failures, then CircuitOpen at once.
    for i in 0..5 {
        let (result, took) = l.timed_hit(&breaker).await;
        assert!(
            matches!(
                result,
                Err(StoreError::Unavailable(_) | StoreError::Timeout(_))
            ),
            "call {i} through the breaker: {result:?}"
        );
        assert!(took <= timeout + SLACK, "a call took {took:?}");
    }
    // Open for the cooldown: answered without waiting for the store (the
    // timeout). A busy machine may take the calls past the cooldown, where
    // the breaker lets a probe through: that one may fail as Redis does.
    let opened = Instant::now();
    for _ in 0..10 {
        let (result, took) = l.timed_hit(&breaker).await;
        if opened.elapsed() < Duration::from_millis(300) {
            assert!(matches!(result, Err(StoreError::CircuitOpen)), "{result:?}");
            assert!(took < timeout, "an open circuit took {took:?}");
        } else {
            assert!(result.is_err(), "{result:?}");
        }
    }

    // Back on the same port: the same store recovers on its own.
    server.restart();
    wait_for_success(&*store, &l, Duration::from_secs(10), "after restart").await;
    assert!(
        store.wait_ready(Duration::from_secs(5)).await,
        "not ready again after the restart"
    );
    for _ in 0..20 {
        assert!(l.timed_hit(&*store).await.0.is_ok());
    }
    // The breaker closes after its cooldown, on the first successful probe.
    wait_for_success(
        &breaker,
        &l,
        Duration::from_secs(5),
        "breaker after restart",
    )
    .await;
    assert!(!breaker.is_open());
    assert!(l.timed_hit(&breaker).await.0.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_script_flush_and_failover() {
    let mut cluster = RedisCluster::start();
    let store = Arc::new(connect(cluster.url(), Duration::from_millis(250)).await);

    // SCRIPT FLUSH on every node mid-run is invisible.
    let results = hit_while(store.clone(), async {
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            cluster.script_flush_all();
        }
    })
    .await;
    assert_all_ok(&results, "cluster SCRIPT FLUSH");

    // Kill the primary that owns a limiter's slot, under load.
    let timeout = Duration::from_millis(100);
    let store = Arc::new(connect(cluster.url(), timeout).await);
    let l = Arc::new(Limiter::new("failover", Algorithm::SlidingWindowLog));
    wait_for_success(&*store, &l, Duration::from_secs(5), "before the kill").await;
    let key = l.state_key();
    let f = kill_under_load(store, l, timeout, || cluster.kill_primary_for_key(&key)).await;
    let killed = f.killed;
    let new_primary = cluster.primary_for_key(&key);
    assert!(
        new_primary.is_some() && new_primary != Some(killed),
        "a replica took over the slot (now {new_primary:?})"
    );
    cluster.wait_state_ok(Duration::from_secs(10));
    eprintln!(
        "cluster failover: {} calls, {} failed after the kill, \
         recovered after {:?}, slowest call {:?}",
        f.calls, f.failed_after_kill, f.recovered_after, f.slowest
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_recovers_on_its_own() {
    let mut setup = RedisSentinel::start_with(SentinelOptions {
        sentinels: 3,
        down_after_ms: 1_000,
        failover_timeout_ms: 5_000,
        parallel_syncs: 1,
    });
    let old_primary = setup.primary_port();
    assert_eq!(setup.current_primary(), Some(old_primary));
    let timeout = Duration::from_millis(100);
    let store = Arc::new(connect(setup.url(), timeout).await);
    let l = Arc::new(Limiter::new(
        "sentinel-failover",
        Algorithm::SlidingWindowLog,
    ));
    wait_for_success(&*store, &l, Duration::from_secs(5), "before the kill").await;
    // The promoted replica starts without the scripts: Redis does not
    // replicate SCRIPT LOAD.
    assert_eq!(command_calls(setup.replica_port(), "script|load"), 0);

    // Nothing is done to the store: it follows the sentinel's choice.
    let f = kill_under_load(store.clone(), l, timeout, || setup.kill_primary()).await;
    let killed = f.killed;
    assert_eq!(killed, old_primary);

    // The sentinel really promoted the replica, and the calls ran there.
    let new_primary = setup.wait_for_new_primary(killed, Duration::from_secs(10));
    assert_eq!(new_primary, setup.replica_port());
    let named = cli(
        setup.sentinel_port(),
        &["SENTINEL", "get-master-addr-by-name", SENTINEL_SERVICE],
    );
    assert_eq!(
        named.lines().nth(1).map(str::trim),
        Some(new_primary.to_string().as_str()),
        "the sentinel names {named:?}"
    );
    assert!(
        command_calls(new_primary, "script|load") > 0,
        "the scripts were never loaded on the new primary"
    );
    assert!(
        command_calls(new_primary, "evalsha") > 0,
        "no script ran on the new primary"
    );
    // Readiness may drop for a moment as the last pool connections move
    // over (the store reloads the scripts after each reconnection).
    assert!(
        store.wait_ready(Duration::from_secs(5)).await,
        "not ready 5 s after the failover"
    );
    eprintln!(
        "sentinel failover: {} calls, {} failed after the kill, \
         recovered after {:?}, slowest call {:?}",
        f.calls, f.failed_after_kill, f.recovered_after, f.slowest
    );
}
