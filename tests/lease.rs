//! Decisions from leased quota (`lease: true`). On a virtual clock, 1 to
//! 10 replicas (each a leasing layer of its own) share one store under
//! random demand, with replicas crashing (their leases lost) and
//! restarting: no window ever admits more than the limit, and once demand
//! settles at least 95% of min(demand, limit) is admitted. Then over real
//! gRPC: three replicas on one Redis and on a 3+3 Redis Cluster, flooded,
//! never pass the limit while most hits cost no store call.

mod support;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use support::redis::{RedisCluster, RedisServer};
use support::tollgate::{Tollgate, descriptor};
use support::unique_domain;
use tollgate::clock::{Clock, ManualClock};
use tollgate::limit::{Algorithm, Unit};
use tollgate::storage::lease::Leasing;
use tollgate::storage::{Hit, MemoryStore, Shard, Store};

const LIMIT: u64 = 1_000;
/// Virtual time per step.
const STEP_MICROS: u64 = 5_000;

fn hit(entries: &[(String, String)]) -> Hit<'_> {
    Hit {
        domain: "lease",
        entries,
        algorithm: Algorithm::FixedWindow,
        limit: LIMIT,
        window: Unit::Second.into(),
        hits: 1,
        negative: false,
        usage_reports: false,
        buckets: 2,
        burst: 0,
        shard: Shard::NONE,
        receipt: false,
        also: &[],
        lease: true,
    }
}

/// One run: `replicas` replicas over `windows` one-second windows, each
/// with a demand (hits per second) drawn per phase of 3 windows; a crash
/// drops a replica's layer (its leases are lost) and a new one takes its
/// place. Returns the admitted and demanded hits of each settled window
/// (the last two of each phase), and the hits admitted without a store
/// call.
async fn run(seed: u64, replicas: usize, windows: u64) -> (Vec<(u64, u64)>, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let clock = Arc::new(ManualClock::at_secs(1_000_000));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(clock.clone()));
    let layer = || Leasing::new(store.clone(), clock.clone() as Arc<dyn Clock>);
    let mut layers: Vec<Leasing> = (0..replicas).map(|_| layer()).collect();
    let entries = vec![("user".to_string(), "shared".to_string())];
    let mut demand = vec![0u64; replicas];
    let mut owed = vec![0f64; replicas];
    let mut settled = Vec::new();
    let mut local = 0;
    let steps_per_window = 1_000_000 / STEP_MICROS;
    for window in 0..windows {
        if window % 3 == 0 {
            for d in demand.iter_mut() {
                // 0 to 3 times a fair share of the limit, sometimes idle.
                *d = match rng.next_u32() % 4 {
                    0 => 0,
                    _ => u64::from(rng.next_u32()) % (LIMIT * 3 / replicas as u64 + 1),
                };
            }
        }
        let (mut admitted, mut asked) = (0u64, 0u64);
        for _ in 0..steps_per_window {
            if rng.next_u32() % 400 == 0 {
                // A replica crashes and another starts in its place.
                let i = rng.next_u32() as usize % replicas;
                local += layers[i].counts().local;
                layers[i] = layer();
            }
            for i in 0..replicas {
                owed[i] += demand[i] as f64 / steps_per_window as f64;
                while owed[i] >= 1.0 {
                    owed[i] -= 1.0;
                    asked += 1;
                    let d = layers[i].hit(hit(&entries)).await.unwrap();
                    admitted += u64::from(d.admitted);
                }
            }
            clock.advance_micros(STEP_MICROS);
            if clock.now_micros() % tollgate::storage::lease::IDLE_MICROS < STEP_MICROS {
                for l in &layers {
                    l.give_back_idle().await;
                }
            }
        }
        assert!(
            admitted <= LIMIT,
            "seed {seed}, {replicas} replicas, window {window}: {admitted} admitted of {LIMIT} \
             (demand {demand:?})"
        );
        if window % 3 != 0 {
            settled.push((admitted, asked));
        }
    }
    local += layers.iter().map(|l| l.counts().local).sum::<u64>();
    (settled, local)
}

#[tokio::test(flavor = "current_thread")]
async fn leases_never_pass_the_limit_and_admit_what_is_asked() {
    let mut worst = 1.0f64;
    for seed in 0..12u64 {
        let replicas = 1 + (seed as usize * 7) % 10;
        let (settled, local) = run(seed, replicas, 12).await;
        let (admitted, wanted): (u64, u64) = settled
            .iter()
            .map(|&(a, d)| (a, d.min(LIMIT)))
            .fold((0, 0), |(a, w), (x, y)| (a + x, w + y));
        let share = if wanted == 0 {
            1.0
        } else {
            admitted as f64 / wanted as f64
        };
        eprintln!(
            "seed {seed}: {replicas} replicas, {admitted} of {wanted} admitted ({share:.3}), \
             {local} without a store call"
        );
        worst = worst.min(share);
        assert!(
            local * 2 > admitted,
            "seed {seed}: leases decided {local} of {admitted}"
        );
    }
    assert!(
        worst >= 0.95,
        "settled windows admitted {worst:.3} of min(demand, limit)"
    );
}

/// Three replicas of one rule with `lease: true` on a real store, each
/// flooded by its own client at 1.5 times the limit for 3 s: no
/// second admits more than the limit, every second admits most of it, and
/// most hits were decided without a store call.
async fn replicas_share_one_limit(
    store: &[(&str, &str)],
    redis_port: Option<u16>,
    lease: bool,
) -> f64 {
    const PER_SECOND: u64 = 300;
    let domain = unique_domain("leases");
    let rules = format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: second, requests_per_unit: {PER_SECOND}, algorithm: fixed_window, lease: {lease}}}\n"
    );
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let t = Tollgate::start(&[("r.yaml", &rules)], store).await;
        t.wait_serving(Duration::from_secs(30)).await;
        replicas.push(Arc::new(t));
    }
    // `/rlconfig` says which rules lease.
    let (status, text) = support::http_get(replicas[0].debug, "/rlconfig").await;
    assert_eq!(status, 200);
    assert!(text.contains(&format!("lease={lease}")), "{text}");
    let evals_before = redis_port.map(|p| support::redis::command_calls(p, "evalsha"));
    // Start on a second's boundary, so whole seconds are counted.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    tokio::time::sleep(Duration::from_nanos(
        1_000_000_000 - u64::from(now.subsec_nanos()),
    ))
    .await;
    let start = std::time::Instant::now();
    let epoch_second = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    const SECONDS: u64 = 3;
    let floods: Vec<_> = replicas
        .iter()
        .map(|t| {
            let (t, domain) = (t.clone(), domain.clone());
            tokio::spawn(async move {
                let mut c = t.client().await;
                let mut per_second = vec![0u64; SECONDS as usize + 1];
                let mut asked = 0u64;
                let rate = PER_SECOND / 2;
                while start.elapsed() < Duration::from_secs(SECONDS) {
                    let at = start + Duration::from_micros(asked * 1_000_000 / rate);
                    tokio::time::sleep_until(at.into()).await;
                    asked += 1;
                    let req = RateLimitRequest {
                        domain: domain.clone(),
                        descriptors: vec![descriptor(&[("user", "shared")])],
                        hits_addend: 0,
                    };
                    let r = c.should_rate_limit(req).await.unwrap().into_inner();
                    let second = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_secs()
                        - epoch_second;
                    if r.overall_code == Code::Ok as i32 {
                        per_second[(second as usize).min(SECONDS as usize)] += 1;
                    }
                }
                (per_second, asked)
            })
        })
        .collect();
    let mut total = vec![0u64; SECONDS as usize + 1];
    let mut asked = 0;
    for f in floods {
        let (per, n) = f.await.unwrap();
        asked += n;
        for (t, p) in total.iter_mut().zip(per) {
            *t += p;
        }
    }
    eprintln!("admitted per second {total:?} of {asked} asked");
    for (s, &n) in total.iter().enumerate() {
        assert!(n <= PER_SECOND, "second {s}: {n} admitted of {PER_SECOND}");
    }
    for (s, &n) in total.iter().enumerate().take(SECONDS as usize) {
        assert!(
            n >= PER_SECOND * 8 / 10,
            "second {s}: only {n} admitted ({total:?})"
        );
    }
    let mut per = 0.0;
    if let (Some(port), Some(before)) = (redis_port, evals_before) {
        let calls = support::redis::command_calls(port, "evalsha") - before;
        per = calls as f64 / asked as f64;
        eprintln!(
            "lease: {lease}: {calls} script calls for {asked} decisions: {per:.3} per decision"
        );
    }
    for t in replicas {
        Arc::into_inner(t).unwrap().stop().await;
    }
    per
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_limit_on_redis() {
    let redis = RedisServer::start();
    let store = [("store", redis.url())];
    let store: Vec<(&str, &str)> = store.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let leased = replicas_share_one_limit(&store, Some(redis.port()), true).await;
    let plain = replicas_share_one_limit(&store, Some(redis.port()), false).await;
    assert!(
        leased * 3.0 < plain,
        "script calls per decision: {leased:.3} leased against {plain:.3} without"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_limit_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    replicas_share_one_limit(&[("store", &cluster.url())], None, true).await;
}

/// A reset through the replica that holds a lease forgets it: after the
/// reset the window admits exactly its limit, not the limit plus what the
/// lease still held.
#[tokio::test(flavor = "current_thread")]
async fn a_reset_forgets_the_lease() {
    let clock = Arc::new(ManualClock::at_secs(2_000_000));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(clock.clone()));
    let layer = Leasing::new(store, clock.clone() as Arc<dyn Clock>);
    let entries = vec![("user".to_string(), "reset".to_string())];
    // 1,000 a second of demand: leases of a tenth of the limit (100);
    // after 150 hits the replica holds 50 unused.
    for _ in 0..150 {
        assert!(layer.hit(hit(&entries)).await.unwrap().admitted);
        clock.advance_micros(1_000);
    }
    assert!(layer.counts().local > 0, "{:?}", layer.counts());
    layer.reset(hit(&entries)).await.unwrap();
    let mut admitted = 0;
    for _ in 0..2 * LIMIT {
        admitted += u64::from(layer.hit(hit(&entries)).await.unwrap().admitted);
    }
    assert_eq!(admitted, LIMIT, "the whole limit after the reset, no more");
}
