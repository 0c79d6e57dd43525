//! The token bucket against its definition: on the embedded store with a
//! clock the test holds, every answer equals an independent model's to the
//! microsecond, over random rates, bursts, costs and gaps; in any interval
//! of length t the admitted cost is at most `burst + rate x t`; a client
//! that keeps under the rate is never refused. Then the bound and the
//! steady client on real Redis, standalone and a 3+3 cluster.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use tollgate::clock::ManualClock;
use tollgate::limit::{Algorithm, Unit, Window};
use tollgate::storage::{Decision, Hit, MemoryStore, RedisConfig, RedisStore, Shard, Store};

use support::redis::{RedisCluster, RedisServer};
use support::unique_domain;

/// Some time in 2027.
const T0: u64 = 1_800_028_800 * 1_000_000;

/// The generic cell rate algorithm as written down, in another shape than
/// the store's: an absolute theoretical arrival time, with every time
/// multiplied by the limit (so a token is `w` of those units).
struct Model {
    limit: u128,
    w: u128,
    burst: u128,
    /// Theoretical arrival time x limit.
    tat: u128,
}

impl Model {
    fn new(limit: u64, unit: Window, burst: u64) -> Model {
        Model {
            limit: limit.into(),
            w: unit.micros().into(),
            burst: burst.into(),
            tat: 0,
        }
    }

    fn decide(&mut self, now: u64, hits: u64, negative: bool) -> Decision {
        let now = u128::from(now) * self.limit;
        let cost = u128::from(hits) * self.w;
        let full = self.burst * self.w;
        let tat = self.tat.max(now);
        let micros = |units: u128| units.div_ceil(self.limit) as u64;
        let remaining = |tat: u128| (full.saturating_sub(tat - now) / self.w) as u64;
        if negative {
            self.tat = tat.saturating_sub(cost).max(now);
            return Decision {
                admitted: true,
                remaining: remaining(self.tat),
                reset_micros: micros(self.tat - now),
                receipt: None,
                group: None,
            };
        }
        if u128::from(hits) > self.burst {
            return Decision {
                admitted: false,
                remaining: remaining(tat),
                reset_micros: micros(full),
                receipt: None,
                group: None,
            };
        }
        let next = tat + cost;
        if next - now <= full {
            self.tat = next;
            Decision {
                admitted: true,
                remaining: remaining(next),
                reset_micros: micros(next - now),
                receipt: None,
                group: None,
            }
        } else {
            Decision {
                admitted: false,
                remaining: remaining(tat),
                reset_micros: micros(next - now - full),
                receipt: None,
                group: None,
            }
        }
    }
}

fn hit<'a>(
    entries: &'a [(String, String)],
    limit: u64,
    window: impl Into<Window>,
    burst: u64,
) -> Hit<'a> {
    Hit {
        domain: "bucket",
        entries,
        algorithm: Algorithm::TokenBucket,
        limit,
        window: window.into(),
        hits: 1,
        negative: false,
        usage_reports: false,
        buckets: 2,
        burst,
        shard: Shard::NONE,
        receipt: false,
        also: &[],
        lease: false,
        ahead: tollgate::storage::Ahead::NONE,
    }
}

/// Windows of one unit, and of several (`unit_multiplier`, up to 10: a
/// 10-day bucket of 2,000 still counts exactly).
fn unit() -> impl Strategy<Value = Window> {
    let unit = prop_oneof![
        Just(Unit::Second),
        Just(Unit::Minute),
        Just(Unit::Hour),
        Just(Unit::Day)
    ];
    (unit, prop_oneof![3 => Just(1u32), 1 => 2u32..=10])
        .prop_map(|(unit, n)| Window::new(unit, n).expect("a short window"))
}

/// (gap before the call in microseconds, cost, give back)
fn calls(max_gap: u64, max_cost: u64) -> impl Strategy<Value = Vec<(u64, u64, bool)>> {
    prop::collection::vec(
        (
            prop_oneof![3 => 0..=max_gap / 100, 1 => 0..=max_gap],
            0..=max_cost,
            prop::bool::weighted(0.1),
        ),
        1..200,
    )
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    })
}

/// Every answer (admitted, tokens left, reset) equals the model's, and
/// the admitted cost never exceeds `burst + rate x t` in any interval.
#[test]
fn answers_equal_the_model_and_the_bound_holds() {
    let strategy = (1u64..=1_000, unit(), 1u64..=2_000).prop_flat_map(|(limit, unit, burst)| {
        let w = unit.micros();
        (
            Just(limit),
            Just(unit),
            Just(burst),
            calls(2 * w / limit.max(1) * burst.min(50), burst + 2),
        )
    });
    runner(300)
        .run(&strategy, |(limit, unit, burst, calls)| {
            let clock = ManualClock::at_micros(T0);
            let store = MemoryStore::new(Arc::new(clock.clone()));
            let entries = vec![("k".to_string(), "v".to_string())];
            let mut model = Model::new(limit, unit, burst);
            let mut now = T0;
            // (time, cost) of every admitted positive cost, and whether a
            // give-back came before (it puts tokens back: the bound is
            // about what a client takes, not what it returns).
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            let mut gave_back = false;
            for (i, &(gap, hits, negative)) in calls.iter().enumerate() {
                now += gap;
                clock.set_micros(now);
                let got = futures_util::FutureExt::now_or_never(store.hit(Hit {
                    hits,
                    negative,
                    ..hit(&entries, limit, unit, burst)
                }))
                .expect("the embedded store answers at once")
                .expect("the embedded store always answers");
                let want = model.decide(now, hits, negative);
                prop_assert_eq!(&got, &want, "call {} of {:?}", i, &calls[..=i]);
                gave_back |= negative && hits > 0;
                if got.admitted && !negative && hits > 0 && !gave_back {
                    admitted.push((now, hits));
                }
            }
            let w = u128::from(unit.micros());
            for (i, &(start, _)) in admitted.iter().enumerate() {
                let mut sum = 0u128;
                for &(end, cost) in &admitted[i..] {
                    sum += u128::from(cost);
                    let allowed =
                        u128::from(burst) * w + u128::from(limit) * u128::from(end - start);
                    prop_assert!(
                        sum * w <= allowed,
                        "{} admitted in [{}, {}]: more than {} + {}/{:?} x t",
                        sum,
                        start,
                        end,
                        burst,
                        limit,
                        unit
                    );
                }
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A client that waits at least one token's time between calls is never
/// refused, whatever the burst (1 at least) and rate.
#[test]
fn a_client_under_the_rate_is_never_refused() {
    let strategy = (1u64..=10_000, unit(), 1u64..=100).prop_flat_map(|(limit, unit, burst)| {
        let token = unit.micros().div_ceil(limit);
        (
            Just(limit),
            Just(unit),
            Just(burst),
            prop::collection::vec(token..=3 * token, 1..300),
        )
    });
    runner(300)
        .run(&strategy, |(limit, unit, burst, gaps)| {
            let clock = ManualClock::at_micros(T0);
            let store = MemoryStore::new(Arc::new(clock.clone()));
            let entries = vec![("k".to_string(), "v".to_string())];
            for (i, gap) in gaps.iter().enumerate() {
                clock.advance_micros(*gap);
                let d = futures_util::FutureExt::now_or_never(
                    store.hit(hit(&entries, limit, unit, burst)),
                )
                .expect("the embedded store answers at once")
                .expect("the embedded store always answers");
                prop_assert!(
                    d.admitted,
                    "call {} after gaps {:?}: {:?}",
                    i,
                    &gaps[..=i],
                    d
                );
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A burst of 100 on a rate of 10 a second, to the microsecond: 100 at
/// once, then one every 100 ms, and the resets say exactly when.
#[tokio::test]
async fn burst_and_rate_to_the_microsecond() {
    let clock = ManualClock::at_micros(T0);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    let entries = vec![("k".to_string(), "v".to_string())];
    let h = hit(&entries, 10, Unit::Second, 100);
    for left in (0..100).rev() {
        let d = store.hit(h).await.unwrap();
        assert!(d.admitted && d.remaining == left, "{d:?}");
    }
    let full_in = store.hit(Hit { hits: 0, ..h }).await.unwrap();
    assert_eq!(full_in.reset_micros, 10_000_000, "ten seconds to fill");
    let d = store.hit(h).await.unwrap();
    assert_eq!((d.admitted, d.reset_micros), (false, 100_000));
    clock.advance_micros(99_999);
    assert!(!store.hit(h).await.unwrap().admitted);
    clock.advance_micros(1);
    assert!(store.hit(h).await.unwrap().admitted);
    // Two tokens: 200 ms.
    let d = store.hit(Hit { hits: 2, ..h }).await.unwrap();
    assert_eq!((d.admitted, d.reset_micros), (false, 200_000));
    // Quiet for ten seconds: the whole burst is back, and no more.
    clock.advance_micros(10_000_000);
    let d = store.hit(Hit { hits: 0, ..h }).await.unwrap();
    assert_eq!((d.remaining, d.reset_micros), (100, 0));
    clock.advance_micros(60_000_000);
    let d = store.hit(Hit { hits: 0, ..h }).await.unwrap();
    assert_eq!(d.remaining, 100, "never past the burst");
}

/// A changed limit keeps the time owed: a bucket half empty at 10 a second
/// is still half a second from full at 20 a second.
#[tokio::test]
async fn a_changed_rate_keeps_the_time_owed() {
    let clock = ManualClock::at_micros(T0);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    let entries = vec![("k".to_string(), "v".to_string())];
    let ten = hit(&entries, 10, Unit::Second, 10);
    store.hit(Hit { hits: 5, ..ten }).await.unwrap();
    let twenty = hit(&entries, 20, Unit::Second, 10);
    let d = store.hit(Hit { hits: 0, ..twenty }).await.unwrap();
    assert_eq!(d.reset_micros, 500_000);
    // Half a second owed at 20 a second is 10 tokens: the bucket of 10 is
    // empty.
    assert_eq!(d.remaining, 0);
}

// ------------------------------------------------------------ real Redis

async fn connect(url: String) -> Arc<RedisStore> {
    let store = RedisStore::connect(RedisConfig {
        url,
        command_timeout: Duration::from_millis(500),
        ..RedisConfig::default()
    })
    .await
    .expect("valid settings");
    assert!(store.wait_ready(Duration::from_secs(20)).await, "not ready");
    Arc::new(store)
}

/// Four callers hammer one bucket (burst 5, 20 a second) for 1.5 s: what is
/// admitted stays within `burst + rate x t` of the time the run took, and
/// the bucket does admit about that much. Then a client sending every
/// 100 ms (half the rate) is never refused.
async fn bound_on(store: Arc<dyn Store>) {
    let entries = Arc::new(vec![("user".to_string(), unique_domain("hammer"))]);
    let started = Instant::now();
    let run = Duration::from_millis(1_500);
    let callers = (0..4).map(|_| {
        let store = store.clone();
        let entries = entries.clone();
        tokio::spawn(async move {
            let mut admitted = 0u64;
            while started.elapsed() < run {
                let d = store
                    .hit(hit(&entries, 20, Unit::Second, 5))
                    .await
                    .expect("redis answers");
                admitted += u64::from(d.admitted);
            }
            admitted
        })
    });
    let mut admitted = 0;
    for c in callers {
        admitted += c.await.expect("caller");
    }
    let took = started.elapsed().as_secs_f64();
    let bound = 5.0 + 20.0 * took;
    assert!(
        admitted as f64 <= bound,
        "{}: {admitted} admitted in {took:.3} s, bound {bound:.1}",
        store.kind()
    );
    // Busy as the machine may be, the callers were never idle for long.
    assert!(
        admitted as f64 >= 5.0 + 20.0 * 1.0,
        "{}: only {admitted} admitted in {took:.3} s",
        store.kind()
    );

    let steady = vec![("user".to_string(), unique_domain("steady"))];
    for i in 0..20 {
        let d = store
            .hit(hit(&steady, 20, Unit::Second, 3))
            .await
            .expect("redis answers");
        assert!(
            d.admitted,
            "{}: steady call {i} refused: {d:?}",
            store.kind()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_holds_on_redis() {
    let server = RedisServer::start();
    bound_on(connect(server.url()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_holds_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let store = connect(cluster.url()).await;
    assert_eq!(store.kind(), "redis-cluster");
    bound_on(store).await;
}

// ------------------------------------------------------------ end to end

const RULES: &str = "\
domain: api
descriptors:
  - key: client
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: token_bucket
      burst: 20
";

/// Over gRPC: a burst of 20 passes with the tokens counting down, the 21st
/// is refused with the time to one token (100 ms), and `/rlconfig` shows
/// the burst.
async fn burst_over_grpc(settings: &[(&str, &str)]) {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use support::tollgate::{Tollgate, descriptor};
    let t = Tollgate::start(&[("api.yaml", RULES)], settings).await;
    let client = unique_domain("c");
    let request = RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![descriptor(&[("client", &client)])],
        hits_addend: 1,
    };
    for left in (0..20).rev() {
        let r = t.ask(request.clone()).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
        // A token comes back every 100 ms: a slow call may see one more.
        let got = r.statuses[0].limit_remaining;
        assert!(got == left || got == left + 1, "{left}: {r:?}");
    }
    // Emptied at once (a token per 100 ms comes back meanwhile): refused
    // within a few calls, with at most 100 ms to wait.
    let mut refused = None;
    for _ in 0..10 {
        let r = t.ask(request.clone()).await;
        if r.overall_code == Code::OverLimit as i32 {
            refused = Some(r);
            break;
        }
    }
    let r = refused.expect("refused once the burst is spent");
    let status = &r.statuses[0];
    assert_eq!(status.limit_remaining, 0);
    let reset = status.duration_until_reset.expect("a reset");
    assert!(
        reset.seconds == 0 && reset.nanos > 0 && reset.nanos <= 100_000_000,
        "{reset:?}"
    );
    let limit = status.current_limit.as_ref().expect("the limit");
    assert_eq!(limit.requests_per_unit, 10);

    let (_, text) = support::http_get(t.debug, "/rlconfig").await;
    assert!(text.contains("10/second token_bucket burst=20"), "{text}");
    let (_, json) = support::http_get(t.debug, "/rlconfig?format=json").await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["rules"][0]["burst"], 20, "{json}");
    assert_eq!(json["rules"][0]["algorithm"], "token_bucket", "{json}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_over_grpc_on_the_embedded_store() {
    burst_over_grpc(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_over_grpc_on_redis() {
    let server = RedisServer::start();
    let url = server.url();
    burst_over_grpc(&[
        ("store", url.as_str()),
        ("redis.command_timeout_ms", "2000"),
    ])
    .await;
}

/// `validate` accepts token bucket rules (also as the default algorithm)
/// and refuses a burst on another algorithm with its file and line.
#[test]
fn validate_accepts_buckets_and_refuses_a_misplaced_burst() {
    use std::process::Command;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("api.yaml"), RULES).unwrap();
    let validate = |dir: &std::path::Path, args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("validate")
            .arg(dir)
            .args(args)
            .env_clear()
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = validate(dir.path(), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    let bad = tempfile::tempdir().unwrap();
    std::fs::write(
        bad.path().join("window.yaml"),
        "domain: w\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      burst: 20\n",
    )
    .unwrap();
    let (code, stderr) = validate(bad.path(), &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("window.yaml:7: descriptors[0].rate_limit.burst: burst applies only to token_bucket, not sliding_window_counter"),
        "{stderr}"
    );
    let (code, stderr) = validate(bad.path(), &["--default-algorithm", "token_bucket"]);
    assert_eq!(code, Some(0), "{stderr}");
}

/// `shards: 4` splits the rate and the burst: a bucket of 20 at 10 a day
/// over four shards admits 20 at once, as one bucket would, and no more.
#[tokio::test]
async fn shards_split_the_burst_too() {
    use tollgate::storage::Sharded;
    let clock = ManualClock::at_micros(T0);
    let store = Sharded::new(Arc::new(MemoryStore::new(Arc::new(clock.clone()))));
    let entries = vec![("k".to_string(), "v".to_string())];
    let h = Hit {
        shard: Shard { index: 0, count: 4 },
        ..hit(&entries, 10, Unit::Day, 20)
    };
    let mut admitted = 0;
    for _ in 0..40 {
        admitted += u64::from(store.hit(h).await.unwrap().admitted);
    }
    assert_eq!(admitted, 20);
}

/// With `default_algorithm: token_bucket`, a request's own `limit` is a
/// bucket whose burst is that limit: 3 a minute passes 3 at once, then one
/// token every 20 s (the reset says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_is_a_bucket_with_its_limit_as_burst() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use support::tollgate::{Tollgate, descriptor};
    let t = Tollgate::start(
        &[("api.yaml", RULES)],
        &[("default_algorithm", "token_bucket")],
    )
    .await;
    let mut d = descriptor(&[("anything", &unique_domain("o"))]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 3,
        unit: 2, // MINUTE
    });
    let request = RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![d],
        hits_addend: 1,
    };
    for left in (0..3).rev() {
        let r = t.ask(request.clone()).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
        assert_eq!(r.statuses[0].limit_remaining, left, "{r:?}");
    }
    let r = t.ask(request).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    let reset = r.statuses[0].duration_until_reset.expect("a reset");
    assert!((19..=20).contains(&reset.seconds), "{reset:?}");
    t.stop().await;
}

/// After the Redis server's clock steps back (a failover to a replica
/// whose clock is behind), the bucket's stored time is ahead of the
/// server's: its debt is counted from that time, so the key must live
/// until then plus the debt, or it expires with the debt unpaid and the
/// bucket is full again too early. The step is made by writing a stored
/// time a minute ahead, as the earlier clock left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_step_back_keeps_the_debt() {
    let redis = RedisServer::start();
    let store = connect(redis.url()).await;
    let name = unique_domain("step");
    let entries = vec![("client".to_string(), name.clone())];
    // 10 a second, burst 1: one token is 100 ms of debt.
    assert!(
        store
            .hit(hit(&entries, 10, Unit::Second, 1))
            .await
            .unwrap()
            .admitted
    );
    let keys = redis.cli(&["--scan", "--pattern", "*"]);
    let key = keys
        .lines()
        .find(|k| k.contains(&name))
        .unwrap_or_else(|| panic!("no key for {name} in {keys:?}"))
        .to_string();
    let time = redis.cli(&["TIME"]);
    let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
    let now = parts.next().unwrap() * 1_000_000 + parts.next().unwrap();
    let ahead = now + 60_000_000;
    redis.cli(&["HSET", &key, "t", &ahead.to_string(), "d", "0"]);
    let d = store.hit(hit(&entries, 10, Unit::Second, 1)).await.unwrap();
    assert!(d.admitted);
    let ttl: i64 = redis.cli(&["PTTL", &key]).trim().parse().unwrap();
    assert!(
        ttl > 59_000,
        "the key expires in {ttl} ms, before its debt (counted from a minute ahead) is paid"
    );
    // Still refused: the debt stands.
    assert!(
        !store
            .hit(hit(&entries, 10, Unit::Second, 1))
            .await
            .unwrap()
            .admitted
    );
}

// ------------------------------------------------- leases given back late

/// Waits `micros`: on the test's clock when there is one, else for real.
async fn wait(clock: Option<&ManualClock>, micros: u64) {
    match clock {
        Some(c) => c.advance_micros(micros),
        None => tokio::time::sleep(Duration::from_micros(micros)).await,
    }
}

/// Ten hits on a bucket, the number admitted.
async fn drain(store: &dyn Store, h: Hit<'_>) -> u64 {
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += u64::from(store.hit(h).await.expect("the store answers").admitted);
    }
    admitted
}

/// A lease's unused tokens go back only while the lease lives, into the
/// bucket it was taken from. 10 a second, burst 10: a lease of 5 is taken,
/// then either its life passes (the bucket is full again) or the bucket is
/// reset; others drain the bucket, and only then does the give-back land.
/// It returns nothing: from the drain on, what the bucket admits stays
/// within `burst + rate x t` of the time measured around the calls.
async fn late_give_backs(store: &dyn Store, clock: Option<&ManualClock>) {
    for reset in [false, true] {
        let entries = vec![("user".to_string(), unique_domain("late"))];
        let h = hit(&entries, 10, Unit::Second, 10);
        let lease = Hit {
            lease: true,
            receipt: true,
            hits: 5,
            ..h
        };
        let d = store.hit(lease).await.unwrap();
        assert!(d.admitted, "{d:?}");
        let r = d.receipt.expect("a lease has a receipt");
        if reset {
            store.reset(h).await.unwrap();
        } else {
            // Past the lease's life, and long enough for the bucket to
            // refill over what it held.
            wait(clock, d.reset_micros + 1_000_000).await;
        }
        let started = Instant::now();
        let drained = drain(store, h).await;
        store.undo(lease, r).await.unwrap();
        let after = drain(store, h).await;
        let took = started.elapsed().as_secs_f64();
        let bound = 10.0 + 10.0 * took;
        assert!(
            (drained + after) as f64 <= bound,
            "{} (reset: {reset}): {drained} + {after} admitted in {took:.3} s, \
             bound {bound:.1}: the late give-back returned tokens",
            store.kind()
        );
    }
}

#[tokio::test]
async fn a_lease_given_back_late_returns_nothing_on_the_embedded_store() {
    let clock = ManualClock::at_micros(T0);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    late_give_backs(&store, Some(&clock)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_given_back_late_returns_nothing_on_redis() {
    let server = RedisServer::start();
    late_give_backs(&*connect(server.url()).await, None).await;
}
