//! The Redis Cluster changing under load: `redis-cli --cluster reshard`
//! moves thousands of slots between primaries while eight callers decide
//! on thousands of limiters. Every decision is an answer (no error, with
//! `on_store_error: error`, the default, so a failed call would show), and
//! no exact limiter passes its limit while its keys move.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::redis::{ClusterOptions, RedisCluster, cluster_tool};
use support::tollgate::{Tollgate, descriptor};
use support::unique_domain;

/// Each algorithm, and `list`: a `rate_limits:` list (an hour's log and
/// a day's token bucket), decided in one script call.
const ALGOS: [&str; 5] = [
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
    "list",
];
/// Exact limiters per algorithm, each asked far more often than its limit.
const HOT: usize = 10;
const LIMIT: u64 = 100;
const CALLERS: usize = 8;

fn rules(domain: &str) -> String {
    let mut text = format!("domain: {domain}\ndescriptors:\n");
    for algo in &ALGOS[..4] {
        text.push_str(&format!(
            "  - key: {algo}\n    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, algorithm: {algo}}}\n"
        ));
    }
    text.push_str(&format!(
        "  - key: list\n    rate_limits:\n      - {{unit: hour, requests_per_unit: {LIMIT}, algorithm: sliding_window_log}}\n      - {{unit: day, requests_per_unit: {}, algorithm: token_bucket}}\n",
        LIMIT * 2
    ));
    text
}

/// Load from `CALLERS` callers until `stop`: each call a hot limiter (of
/// every algorithm in turn) or a fresh cold one. Counts answers, errors,
/// and admissions per hot limiter.
struct Load {
    answers: AtomicU64,
    errors: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
    admitted: std::sync::Mutex<HashMap<(usize, usize), u64>>,
    /// Each answer's latency in microseconds, with whether the change was
    /// under way.
    latencies: std::sync::Mutex<Vec<(bool, u64)>>,
    changing: AtomicBool,
    stop: AtomicBool,
}

async fn caller(t: Arc<Tollgate>, domain: String, load: Arc<Load>, me: usize) {
    let mut c = t.client().await;
    let mut n: usize = 0;
    while !load.stop.load(Ordering::Relaxed) {
        n += 1;
        let algo = (n + me) % ALGOS.len();
        // Two calls in three on a hot limiter, one on a new cold one.
        let (value, hot) = if n.is_multiple_of(3) {
            (format!("cold-{me}-{n}"), None)
        } else {
            let i = (n / ALGOS.len() + me) % HOT;
            (format!("hot-{i}"), Some(i))
        };
        let req = RateLimitRequest {
            domain: domain.clone(),
            descriptors: vec![descriptor(&[(ALGOS[algo], &value)])],
            hits_addend: 0,
        };
        let sent = std::time::Instant::now();
        match c.should_rate_limit(req).await {
            Ok(r) => {
                load.answers.fetch_add(1, Ordering::Relaxed);
                let during = load.changing.load(Ordering::Relaxed);
                let micros = sent.elapsed().as_micros() as u64;
                load.latencies.lock().unwrap().push((during, micros));
                if let Some(i) = hot
                    && r.into_inner().overall_code == Code::Ok as i32
                {
                    *load.admitted.lock().unwrap().entry((algo, i)).or_default() += 1;
                }
            }
            Err(status) => {
                load.errors.fetch_add(1, Ordering::Relaxed);
                load.first_error
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| status.message().to_string());
            }
        }
    }
}

/// Runs `change` (blocking) while the load runs; checks every answer.
async fn under_load(what: &str, cluster: &RedisCluster, change: impl FnOnce() + Send + 'static) {
    // A phase takes 20 to 60 s, longer on a busy machine: it starts with
    // three minutes left in its hour, and the check below allows a second
    // fixed window only where the clock shows it crossed into the next.
    let hour = support::within_one_hour(Duration::from_secs(180)).await;
    let domain = unique_domain("reshard");
    let t = Arc::new(
        Tollgate::start(&[("r.yaml", &rules(&domain))], &[("store", &cluster.url())]).await,
    );
    t.wait_serving(Duration::from_secs(30)).await;
    let load = Arc::new(Load {
        answers: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        first_error: std::sync::Mutex::new(None),
        admitted: std::sync::Mutex::new(HashMap::new()),
        latencies: std::sync::Mutex::new(Vec::new()),
        changing: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    });
    let begun = std::time::Instant::now();
    let callers: Vec<_> = (0..CALLERS)
        .map(|me| tokio::spawn(caller(t.clone(), domain.clone(), load.clone(), me)))
        .collect();
    // The hot limiters close to their limit when the change starts, so
    // that they reach it while their keys move.
    let warm = (HOT * ALGOS.len()) as u64 * LIMIT * 7 / 10;
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    while load.admitted.lock().unwrap().values().sum::<u64>() < warm
        && tokio::time::Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = load.answers.load(Ordering::Relaxed);
    let redirects_before = redirects(&t).await;
    load.changing.store(true, Ordering::Relaxed);
    let started = std::time::Instant::now();
    tokio::task::spawn_blocking(change).await.unwrap();
    let took = started.elapsed();
    load.changing.store(false, Ordering::Relaxed);
    let during = load.answers.load(Ordering::Relaxed) - before;
    let redirected = redirects(&t).await - redirects_before;
    // Every hot limiter past its limit, or 10 s more.
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while load
        .admitted
        .lock()
        .unwrap()
        .values()
        .filter(|&&n| n >= LIMIT)
        .count()
        < HOT * ALGOS.len()
        && tokio::time::Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    load.stop.store(true, Ordering::Relaxed);
    for c in callers {
        c.await.unwrap();
    }
    let ran = begun.elapsed();
    let answers = load.answers.load(Ordering::Relaxed);
    let errors = load.errors.load(Ordering::Relaxed);
    let latencies = load.latencies.lock().unwrap().clone();
    let (rate_before, p99_before) = phase(&latencies, false);
    let (_, p99_during) = phase(&latencies, true);
    eprintln!(
        "{what}: {answers} answers, {errors} errors; before: {rate_before:.0}/s-ish, p99 {p99_before} us; \
         during ({:.1} s): {:.0}/s, p99 {p99_during} us; {redirected} calls redirected",
        took.as_secs_f64(),
        during as f64 / took.as_secs_f64()
    );
    assert!(during > 100, "the load ran during the change: {during}");
    assert_eq!(
        errors,
        0,
        "{errors} of {} decisions were errors, the first: {:?}",
        answers + errors,
        load.first_error.lock().unwrap()
    );
    let admitted = load.admitted.lock().unwrap().clone();
    let saturated = admitted.values().filter(|&&n| n >= LIMIT).count();
    // Hour-long windows begun during the phase, as the clock shows it
    // (none, unless the phase ran past its three minutes).
    let crossed = support::hour_now() - hour;
    if crossed > 0 {
        eprintln!(
            "{what}: the phase ran into the next hour: a fixed window may admit its limit again"
        );
    }
    for ((algo, i), n) in admitted.iter() {
        let bound = match ALGOS[*algo] {
            // The bucket refills 100 an hour: what the phase's time, as
            // measured, adds (rounded up).
            "token_bucket" => LIMIT + (ran.as_secs() * LIMIT).div_ceil(3600) + 1,
            // Each hour's window is a fresh limit.
            "fixed_window" => LIMIT * (1 + crossed),
            // The log is exact over any hour. The counter's hits, all
            // made in the phase, weigh whole until an hour after their
            // bucket began, whatever bucket boundary the phase met.
            _ => LIMIT,
        };
        assert!(
            *n <= bound,
            "{} hot-{i}: {n} admitted of {LIMIT}",
            ALGOS[*algo]
        );
    }
    eprintln!("{saturated} hot limiters reached their limit");
    assert!(
        saturated >= HOT * ALGOS.len() / 2,
        "only {saturated} hot limiters reached their limit: the check proves little"
    );
    Arc::into_inner(t).unwrap().stop().await;
}

/// Answers per second (over the whole phase's answers, for a rough
/// comparison) and the p99 latency in microseconds of one phase.
fn phase(latencies: &[(bool, u64)], during: bool) -> (f64, u64) {
    let mut l: Vec<u64> = latencies
        .iter()
        .filter(|(d, _)| *d == during)
        .map(|(_, us)| *us)
        .collect();
    if l.is_empty() {
        return (0.0, 0);
    }
    l.sort_unstable();
    let total: u64 = l.iter().sum();
    let rate = CALLERS as f64 * l.len() as f64 / (total as f64 / 1e6);
    (rate, l[(l.len() * 99 / 100).min(l.len() - 1)])
}

/// `tollgate_store_redirects_total` of `t`.
async fn redirects(t: &Tollgate) -> f64 {
    let (_, page) = support::http_get(t.http, "/metrics").await;
    page.lines()
        .find(|l| l.starts_with("tollgate_store_redirects_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

/// Moves `slots` slots from node `from` to node `to` (ids).
fn reshard(port: u16, from: &str, to: &str, slots: usize) {
    cluster_tool(&[
        "reshard",
        &format!("127.0.0.1:{port}"),
        "--cluster-from",
        from,
        "--cluster-to",
        to,
        "--cluster-slots",
        &slots.to_string(),
        "--cluster-yes",
    ]);
}

/// The primaries' ids, ports and slot counts.
fn primaries(cluster: &RedisCluster) -> Vec<(String, u16, usize)> {
    cluster
        .node_ids()
        .into_iter()
        .filter_map(|(id, port, slots)| Some((id, port, slots?)))
        .collect()
}

/// Three primaries: a reshard of 4,000 slots, a fourth primary added and
/// the slots rebalanced onto it, then that primary emptied and removed,
/// each under load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reshard_scale_out_and_in_under_load() {
    let mut cluster = RedisCluster::start_with(ClusterOptions {
        replicas: 0,
        require_full_coverage: true,
    });
    let p = primaries(&cluster);
    assert_eq!(p.len(), 3, "{p:?}");
    let (from, to, port) = (p[0].0.clone(), p[1].0.clone(), p[2].1);
    under_load("reshard 4,000 slots", &cluster, move || {
        reshard(port, &from, &to, 4000)
    })
    .await;
    assert!(primaries(&cluster).iter().any(|p| p.2 >= 9000));

    let added = cluster.add_primary();
    let seed = format!("127.0.0.1:{port}");
    under_load("add a primary and rebalance", &cluster, move || {
        cluster_tool(&["rebalance", &seed, "--cluster-use-empty-masters"]);
    })
    .await;
    let p = primaries(&cluster);
    let new = p.iter().find(|n| n.1 == added).unwrap().clone();
    assert!(new.2 > 2000, "the new primary took slots: {p:?}");

    let (keep, port) = (p.iter().find(|n| n.1 != added).unwrap().0.clone(), p[0].1);
    let port = if port == added { p[1].1 } else { port };
    under_load("empty a primary and remove it", &cluster, move || {
        reshard(port, &new.0, &keep, new.2);
        cluster_tool(&["del-node", &format!("127.0.0.1:{port}"), &new.0]);
    })
    .await;
    cluster.forget_node(added);
    assert_eq!(primaries(&cluster).len(), 3);
}

/// Three primaries with a replica each: a reshard with a primary (not
/// one of the two moving slots) failing over to its replica midway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_during_a_reshard_under_load() {
    let cluster = RedisCluster::start();
    let p = primaries(&cluster);
    assert_eq!(p.len(), 3, "{p:?}");
    let (from, to, third) = (p[0].0.clone(), p[1].0.clone(), p[2].clone());
    let replica = cluster
        .node_ids()
        .into_iter()
        .find(|(_, port, slots)| {
            slots.is_none()
                && support::redis::cli(*port, &["INFO", "replication"])
                    .contains(&format!("master_port:{}", third.1))
        })
        .expect("the third primary's replica")
        .1;
    let port = third.1;
    // redis-cli reshards with the roles it read at its start (a demoted
    // primary refuses its SETSLOT), so the 3,000 slots move in six runs
    // and the failover comes between the second and the third, while the
    // load goes on.
    under_load("reshard 3,000 slots with a failover", &cluster, move || {
        for chunk in 0..6 {
            if chunk == 2 {
                assert_eq!(support::redis::cli(replica, &["CLUSTER", "FAILOVER"]), "OK");
                support::redis::wait_until(
                    "the replica took over",
                    Duration::from_secs(30),
                    || {
                        support::redis::cli(replica, &["INFO", "replication"])
                            .contains("role:master")
                    },
                );
            }
            let seed = if chunk < 2 { port } else { replica };
            // The nodes agree on the last run's slots before the next.
            support::redis::wait_until("the nodes agree", Duration::from_secs(30), || {
                std::process::Command::new("redis-cli")
                    .args(["--cluster", "check", &format!("127.0.0.1:{seed}")])
                    .stdin(std::process::Stdio::null())
                    .output()
                    .is_ok_and(|o| o.status.success())
            });
            reshard(seed, &from, &to, 500);
        }
    })
    .await;
    cluster.wait_state_ok(Duration::from_secs(30));
}

/// One batch to a primary holding calls on a limiter whose slot has just
/// moved to another primary, on a fresh limiter in a slot being migrated
/// away, and on many limiters that stay: the staying calls are answered
/// once, from the batch; the two others, which recorded nothing there, are
/// sent again alone and follow `MOVED` and `ASK`; every limiter ends with
/// exactly one more hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_a_moved_and_a_migrating_slot() {
    use tollgate::limit::{Algorithm, Unit};
    use tollgate::storage::{Hit, RedisConfig, RedisStore, Shard, Store};

    support::away_from_an_hour_boundary().await;
    let cluster = RedisCluster::start_with(ClusterOptions {
        replicas: 0,
        require_full_coverage: true,
    });
    let store = RedisStore::connect(RedisConfig {
        url: cluster.url(),
        batch_lanes: 1,
        command_timeout: Duration::from_secs(5),
        ..RedisConfig::default()
    })
    .await
    .unwrap();
    assert!(store.wait_ready(Duration::from_secs(20)).await);
    let domain = unique_domain("batch-moves");
    let names: Vec<String> = (0..300).map(|i| format!("limiter-{i}")).collect();
    let entries: Vec<Vec<(String, String)>> = names
        .iter()
        .map(|n| vec![("user".to_string(), n.clone())])
        .collect();
    let hit = |e: &'static [(String, String)], domain: &'static str| Hit {
        domain,
        entries: e,
        algorithm: Algorithm::FixedWindow,
        limit: 100,
        window: Unit::Hour.into(),
        hits: 1,
        negative: false,
        usage_reports: false,
        buckets: 2,
        burst: 0,
        shard: Shard::NONE,
        receipt: false,
        also: &[],
        lease: false,
        ahead: tollgate::storage::Ahead::NONE,
    };
    let domain: &'static str = Box::leak(domain.into_boxed_str());
    let entries: &'static [Vec<(String, String)>] = Box::leak(entries.into_boxed_slice());
    for e in entries {
        assert!(store.hit(hit(e, domain)).await.unwrap().admitted);
    }
    // Where each limiter's key lives.
    let p = primaries(&cluster);
    let (p1, p2) = (&p[0], &p[1]);
    let on_p1: Vec<(usize, String, u16)> = cluster
        .cli(p1.1, &["--scan", "--pattern", "*"])
        .lines()
        .filter(|k| k.contains(domain))
        .map(|k| {
            let i = names
                .iter()
                .position(|n| k.ends_with(&format!("user={n}")))
                .unwrap_or_else(|| panic!("which limiter is {k:?}"));
            (i, k.to_string(), cluster.keyslot(k))
        })
        .collect();
    assert!(
        on_p1.len() >= 20,
        "{} limiters on the first primary",
        on_p1.len()
    );
    let (moved, migrating) = (&on_p1[0], &on_p1[1]);
    assert_ne!(moved.2, migrating.2);
    let staying: Vec<usize> = on_p1
        .iter()
        .filter(|(_, _, slot)| *slot != moved.2 && *slot != migrating.2)
        .map(|(i, _, _)| *i)
        .collect();

    // The moved limiter's slot, with its key, to the second primary.
    let slot = moved.2.to_string();
    cluster.cli(p2.1, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &p1.0]);
    cluster.cli(p1.1, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &p2.0]);
    let migrated = cluster.cli(
        p1.1,
        &[
            "MIGRATE",
            "127.0.0.1",
            &p2.1.to_string(),
            &moved.1,
            "0",
            "5000",
        ],
    );
    assert_eq!(migrated, "OK");
    for (_, port, _) in &p {
        cluster.cli(*port, &["CLUSTER", "SETSLOT", &slot, "NODE", &p2.0]);
    }
    // The migrating limiter: fresh (its key gone), its slot on its way.
    cluster.cli(p1.1, &["DEL", &migrating.1]);
    let slot = migrating.2.to_string();
    cluster.cli(p2.1, &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &p1.0]);
    cluster.cli(p1.1, &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &p2.0]);

    let batches_before = store.gauges().batches.unwrap();
    let mut all = vec![moved.0, migrating.0];
    all.extend(&staying);
    let store = &store;
    let answers = futures_util::future::join_all(
        all.iter()
            .map(|&i| async move { (i, store.hit(hit(&entries[i], domain)).await) }),
    )
    .await;
    let batches_after = store.gauges().batches.unwrap();
    assert!(batches_after.0 > batches_before.0, "the calls were batched");
    for (i, answer) in answers {
        let d = answer.unwrap_or_else(|e| panic!("limiter-{i}: {e}"));
        assert!(d.admitted, "limiter-{i}");
        // Two hits on every limiter, one on the fresh one: exactly once.
        let want = if i == migrating.0 { 99 } else { 98 };
        assert_eq!(d.remaining, want, "limiter-{i} recorded once more");
    }
    // The migrating slot's fresh key is always asked for at home first
    // and answered with ASK. The moved slot's MOVED is seen unless the
    // slot map refresh (every second) ran between the move and the hits,
    // as it can on a busy machine: then its hit went to the new owner
    // directly, which the exact counts above show as well.
    assert!(store.gauges().redirects.unwrap() >= 1);
    // The fresh limiter was created where the slot is going, not at home.
    // (A key absent from a migrating slot is answered with ASK.)
    let home = cluster.cli(p1.1, &["EXISTS", &migrating.1]);
    assert!(home.starts_with("ASK") || home == "0", "{home}");
    let p2_keys = cluster.cli(p2.1, &["--scan", "--pattern", "*"]);
    assert!(p2_keys.lines().any(|k| k == migrating.1), "{p2_keys}");
    for (_, port, _) in &p {
        cluster.cli(*port, &["CLUSTER", "SETSLOT", &slot, "NODE", &p2.0]);
    }
}
