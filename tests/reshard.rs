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
use support::redis::{ClusterOptions, RedisCluster};
use support::tollgate::{Tollgate, descriptor};
use support::unique_domain;

const ALGOS: [&str; 4] = [
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
];
/// Exact limiters per algorithm, each asked far more often than its limit.
const HOT: usize = 10;
const LIMIT: u64 = 100;
const CALLERS: usize = 8;

fn rules(domain: &str) -> String {
    let mut text = format!("domain: {domain}\ndescriptors:\n");
    for algo in ALGOS {
        text.push_str(&format!(
            "  - key: {algo}\n    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, algorithm: {algo}}}\n"
        ));
    }
    text
}

/// The node id and port of each primary, by `CLUSTER NODES`.
fn primaries(cluster: &RedisCluster) -> Vec<(String, u16, usize)> {
    let port = cluster.ports()[0];
    cluster
        .cli(port, &["CLUSTER", "NODES"])
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if !f.get(2)?.split(',').any(|x| x == "master") {
                return None;
            }
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let slots = f[8..]
                .iter()
                .filter(|r| !r.starts_with('['))
                .map(|r| {
                    let (lo, hi) = r.split_once('-').unwrap_or((r, r));
                    hi.parse::<usize>().unwrap() - lo.parse::<usize>().unwrap() + 1
                })
                .sum();
            Some((f[0].to_string(), port, slots))
        })
        .collect()
}

/// Load from `CALLERS` callers until `stop`: each call a hot limiter (of
/// every algorithm in turn) or a fresh cold one. Counts answers, errors,
/// and admissions per hot limiter.
struct Load {
    answers: AtomicU64,
    errors: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
    admitted: std::sync::Mutex<HashMap<(usize, usize), u64>>,
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
        match c.should_rate_limit(req).await {
            Ok(r) => {
                load.answers.fetch_add(1, Ordering::Relaxed);
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
async fn under_load(cluster: &RedisCluster, change: impl FnOnce() + Send + 'static) {
    support::away_from_an_hour_boundary().await;
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
        stop: AtomicBool::new(false),
    });
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
    tokio::task::spawn_blocking(change).await.unwrap();
    let during = load.answers.load(Ordering::Relaxed) - before;
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
    let answers = load.answers.load(Ordering::Relaxed);
    let errors = load.errors.load(Ordering::Relaxed);
    eprintln!("{answers} answers ({during} during the change), {errors} errors");
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
    for ((algo, i), n) in admitted.iter() {
        // The bucket refills 100 an hour: under a minute adds at most 2.
        let bound = if ALGOS[*algo] == "token_bucket" {
            LIMIT + 2
        } else {
            LIMIT
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

/// Moves `slots` slots from the primary with the most to the one with the
/// fewest, with `redis-cli --cluster reshard`.
fn reshard(port: u16, from: &str, to: &str, slots: usize) {
    let out = std::process::Command::new("redis-cli")
        .args(["--cluster", "reshard", &format!("127.0.0.1:{port}")])
        .args(["--cluster-from", from, "--cluster-to", to])
        .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "reshard failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reshard_under_load_answers_every_decision() {
    let cluster = RedisCluster::start_with(ClusterOptions {
        replicas: 0,
        require_full_coverage: true,
    });
    let p = primaries(&cluster);
    assert_eq!(p.len(), 3, "{p:?}");
    let (from, to) = (p[0].0.clone(), p[1].0.clone());
    let port = p[2].1;
    under_load(&cluster, move || reshard(port, &from, &to, 4000)).await;
    let after = primaries(&cluster);
    assert!(after.iter().any(|(_, _, s)| *s >= 9000), "{after:?}");
}
