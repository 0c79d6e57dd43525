//! Coalescing over real gRPC and a real Redis: 64 concurrent callers on
//! one limiter through one replica get exactly the limit, in far fewer
//! script calls than decisions; with `redis.coalesce=false` every decision
//! is a call.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::redis::{RedisServer, command_calls};
use support::tollgate::{Tollgate, descriptor};
use support::{away_from_an_hour_boundary, http_get, unique_domain};

fn rules(domain: &str) -> String {
    format!(
        r#"
domain: {domain}
descriptors:
  - key: fixed
    rate_limit: {{unit: hour, requests_per_unit: 100, algorithm: fixed_window}}
  - key: log
    rate_limit: {{unit: hour, requests_per_unit: 100, algorithm: sliding_window_log}}
  - key: counter
    rate_limit: {{unit: hour, requests_per_unit: 100, algorithm: sliding_window_counter}}
"#
    )
}

/// `demand` calls on one limiter from 64 closed-loop callers: (admitted,
/// refused).
async fn flood(t: &Tollgate, domain: &str, key: &str, demand: usize) -> (usize, usize) {
    let client = t.client().await;
    let next = Arc::new(AtomicUsize::new(0));
    let callers = (0..64).map(|_| {
        let mut client = client.clone();
        let next = next.clone();
        let req = RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![descriptor(&[(key, "hot")])],
            hits_addend: 0,
        };
        async move {
            let (mut ok, mut over) = (0, 0);
            while next.fetch_add(1, Ordering::Relaxed) < demand {
                match client.should_rate_limit(req.clone()).await {
                    Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => ok += 1,
                    Ok(r) if r.get_ref().overall_code == Code::OverLimit as i32 => over += 1,
                    other => panic!("{key}: {other:?}"),
                }
            }
            (ok, over)
        }
    });
    let counts = futures_util::future::join_all(callers).await;
    (
        counts.iter().map(|c| c.0).sum(),
        counts.iter().map(|c| c.1).sum(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_hits_share_script_calls_and_stay_exact() {
    let redis = RedisServer::start();
    let url = redis.url();
    let domain = unique_domain("coalesce");
    let text = rules(&domain);
    // The replica that does not coalesce counts other limiters.
    let single = unique_domain("single");
    let single_text = rules(&single);
    let files = [
        ("coalesce.yaml", text.as_str()),
        ("single.yaml", single_text.as_str()),
    ];
    // The over-limit cache would answer refusals without Redis, and
    // leases admit hits without it: both off, so every decision reaches
    // the coalescing layer.
    let common = [
        ("store", url.as_str()),
        ("redis.command_timeout_ms", "2000"),
        ("over_limit_cache.enabled", "false"),
        ("lease", "false"),
    ];
    let on = Tollgate::start(&files, &common).await;
    let off_settings: Vec<(&str, &str)> = common
        .iter()
        .copied()
        // Nor batched: each decision its own EVALSHA, the count below.
        .chain([("redis.coalesce", "false"), ("redis.batch_max", "1")])
        .collect();
    let off = Tollgate::start(&files, &off_settings).await;
    on.wait_serving(Duration::from_secs(20)).await;
    off.wait_serving(Duration::from_secs(20)).await;

    away_from_an_hour_boundary().await;
    for key in ["fixed", "log", "counter"] {
        // Coalesced: exactly the limit, and well under one call per decision.
        let before = command_calls(redis.port(), "evalsha");
        let (ok, over) = flood(&on, &domain, key, 1000).await;
        let calls = command_calls(redis.port(), "evalsha") - before;
        assert_eq!((ok, over), (100, 900), "{key}, coalesced");
        assert!(
            calls * 4 <= 1000,
            "{key}: {calls} script calls for 1000 decisions"
        );
        eprintln!("{key}: {calls} script calls for 1000 decisions, coalesced");
    }

    // The batches are counted on /metrics; the replica that does not
    // coalesce exports no such series.
    let (status, text) = http_get(on.http, "/metrics").await;
    assert_eq!(status, 200);
    let value = |name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().last())
            .map(|v| v.parse().unwrap())
    };
    let batches = value("tollgate_coalesce_batches_total").expect("a batches series");
    let hits = value("tollgate_coalesce_hits_total").expect("a hits series");
    assert!(
        batches > 0.0 && hits > 2.0 * batches,
        "{batches} batches, {hits} hits"
    );
    let (_, text) = http_get(off.http, "/metrics").await;
    assert!(!text.contains("tollgate_coalesce_batches_total"));

    // Not coalesced: one call per decision, the same answers.
    for key in ["fixed", "log"] {
        let before = command_calls(redis.port(), "evalsha");
        let (ok, over) = flood(&off, &single, key, 300).await;
        let calls = command_calls(redis.port(), "evalsha") - before;
        assert_eq!((ok, over), (100, 200), "{key}, not coalesced");
        assert_eq!(calls, 300, "{key}: one call per decision");
    }
    on.stop().await;
    off.stop().await;
}

// ------------------------------------- a lease queued behind a plain hit

use tollgate::clock::ManualClock;
use tollgate::limit::{Algorithm, Unit, Window};
use tollgate::storage::{
    Ahead, BoxFuture, Coalescing, Decision, Hit, MemoryStore, Shard, Store, StoreError,
};

/// The embedded store answering each call after a pause (tokio's time,
/// paused in the test): long enough for hits to queue behind it. Counts
/// the calls that reached it, so a test sees one in flight.
struct Slow(MemoryStore, Arc<AtomicUsize>);

impl Store for Slow {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            self.1.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            self.0.hit(hit).await
        })
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&self.0)
    }
}

fn bucket(entries: &[(String, String)], hits: u64) -> Hit<'_> {
    Hit {
        domain: "coalesce",
        entries,
        algorithm: Algorithm::TokenBucket,
        // A token a second, a burst of 10; leases live 10 to 20 s.
        limit: 10,
        window: Window::new(Unit::Second, 10).unwrap(),
        hits,
        negative: false,
        usage_reports: false,
        buckets: 2,
        burst: 10,
        shard: Shard::NONE,
        receipt: true,
        also: &[],
        lease: false,
        ahead: Ahead::NONE,
    }
}

/// A token bucket's lease that queues behind another on its limiter
/// (after a reset generation moved, a replica's cleared map asks again
/// while its earlier lease call is in flight) goes out as a lease: the store keeps room for its tokens while it
/// lives, so the bucket does not refill over them, and its answer is the
/// lease's life. Sent as a plain charge it had no floor.
#[tokio::test(start_paused = true)]
async fn a_queued_lease_stays_a_lease() {
    let clock = ManualClock::at_secs(1_800_028_800);
    let memory = MemoryStore::new(Arc::new(clock.clone()));
    let reached = Arc::new(AtomicUsize::new(0));
    let store = Arc::new(Coalescing::new(Arc::new(Slow(memory, reached.clone()))));
    let entries = vec![("user".to_string(), "queued".to_string())];
    let first = {
        let (store, entries) = (store.clone(), entries.clone());
        tokio::spawn(async move {
            store
                .hit(Hit {
                    lease: true,
                    ..bucket(&entries, 1)
                })
                .await
        })
    };
    // The first call is in the store before the second is sent (yielding
    // does not move the paused clock, so it stays there).
    while reached.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let lease = {
        let (store, entries) = (store.clone(), entries.clone());
        tokio::spawn(async move {
            store
                .hit(Hit {
                    lease: true,
                    ..bucket(&entries, 5)
                })
                .await
        })
    };
    assert!(first.await.unwrap().unwrap().admitted);
    let d = lease.await.unwrap().unwrap();
    assert_eq!(store.counts().batches, 1, "the lease was queued");
    assert!(d.admitted, "{d:?}");
    assert!(
        (10_000_000..=20_000_000).contains(&d.reset_micros),
        "the answer is the lease's life: {d:?}"
    );
    // Three seconds refill three tokens: 6 owed less 3, but the 6 leased
    // keep their room: 4 left, not 7.
    clock.advance_secs(3);
    let check = store.hit(bucket(&entries, 0)).await.unwrap();
    assert_eq!(
        check.remaining, 4,
        "the bucket refilled over the queued lease: {check:?}"
    );
}
