//! tollgate processes on shared Redis, over real gRPC: exactness across
//! replicas on a Redis Cluster, failure policies, and startup without Redis.

mod support;

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::redis::{RedisCluster, RedisServer};
use support::tollgate::{Tollgate, descriptor};
use support::{away_from_an_hour_boundary, unique_domain};

fn request(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![descriptor(entries)],
        hits_addend: 0,
    }
}

fn rules(domain: &str) -> String {
    format!(
        r#"
domain: {domain}
descriptors:
  - key: log
    rate_limit: {{unit: hour, requests_per_unit: 100, algorithm: sliding_window_log}}
  - key: fixed
    rate_limit: {{unit: hour, requests_per_unit: 100, algorithm: fixed_window}}
  - key: counter
    rate_limit: {{unit: hour, requests_per_unit: 100, algorithm: sliding_window_counter}}
  - key: pair
    descriptors:
      - key: x
        rate_limit: {{unit: hour, requests_per_unit: 100, algorithm: sliding_window_log}}
  - key: open
    rate_limit: {{unit: second, requests_per_unit: 1000, on_store_error: allow}}
  - key: closed
    rate_limit: {{unit: second, requests_per_unit: 1000, on_store_error: deny}}
  - key: strict
    rate_limit: {{unit: second, requests_per_unit: 1000}}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_a_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    let domain = unique_domain("exact");
    let text = rules(&domain);
    let url = cluster.url();
    // Exactness is the point here, not latency: a loaded 2-core test machine
    // must not turn slow answers into errors.
    // Exactly the limit across replicas is the store's promise, not a
    // lease's (a lease left on another replica admits less; tests/lease.rs
    // floods leased replicas on a cluster): leases off.
    let settings = [
        ("store", url.as_str()),
        ("redis.command_timeout_ms", "2000"),
        ("lease", "false"),
    ];
    let replicas = Tollgate::start_replicas(3, &[("rules.yaml", &text)], &settings).await;
    let clients = futures_util::future::join_all(replicas.iter().map(|t| t.client())).await;

    away_from_an_hour_boundary().await;
    for key in ["log", "fixed", "counter"] {
        let calls = (0..300).map(|i| {
            let mut c = clients[i % 3].clone();
            let req = request(&domain, &[(key, "hot")]);
            async move {
                c.should_rate_limit(req)
                    .await
                    .map(|r| r.into_inner().overall_code)
            }
        });
        let answers = futures_util::future::join_all(calls).await;
        let ok = answers
            .iter()
            .filter(|a| matches!(a, Ok(c) if *c == Code::Ok as i32))
            .count();
        let over = answers
            .iter()
            .filter(|a| matches!(a, Ok(c) if *c == Code::OverLimit as i32))
            .count();
        let errors: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
        assert!(
            errors.is_empty(),
            "{key}: {} errors, first {:?}",
            errors.len(),
            errors.first()
        );
        assert_eq!((ok, over), (100, 200), "{key}");
    }

    // Descriptors that collide when values are naively joined get separate
    // counters, and braces never form a hash tag (no CROSSSLOT).
    let collisions = [
        ([("pair", "a_b"), ("x", "c")], [("pair", "a"), ("x", "b_c")]),
        ([("pair", "}{"), ("x", "{")], [("pair", "{}"), ("x", "{")]),
        (
            [("pair", "a:x=b"), ("x", "")],
            [("pair", "a"), ("x", "b:x=")],
        ),
    ];
    let mut c = clients[0].clone();
    for (a, b) in collisions {
        for entries in [&a, &b] {
            let r = c
                .should_rate_limit(request(&domain, entries))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(r.statuses[0].limit_remaining, 99, "{entries:?}");
        }
    }
    for t in replicas {
        t.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_redis_gets_answers_per_policy_within_the_timeout() {
    let mut redis = RedisServer::start();
    let domain = unique_domain("policy");
    let text = rules(&domain);
    let url = redis.url();
    let t = Tollgate::start(
        &[("rules.yaml", &text)],
        &[
            ("store", &url),
            ("redis.command_timeout_ms", "50"),
            ("redis.breaker_failures", "3"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    let mut c = t.client().await;
    for key in ["open", "closed", "strict"] {
        let r = c
            .should_rate_limit(request(&domain, &[(key, "x")]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32, "{key}");
    }

    redis.stop();
    for round in 0..10 {
        for (key, expect) in [
            ("open", Some(Code::Ok)),
            ("closed", Some(Code::OverLimit)),
            ("strict", None),
        ] {
            let started = Instant::now();
            let r = c.should_rate_limit(request(&domain, &[(key, "x")])).await;
            let took = started.elapsed();
            assert!(
                took < Duration::from_millis(500),
                "{key} round {round}: {took:?}"
            );
            match (expect, r) {
                (Some(code), Ok(r)) => {
                    assert_eq!(r.into_inner().overall_code, code as i32, "{key}")
                }
                (None, Err(status)) => {
                    assert_eq!(status.code(), tonic::Code::Unavailable, "{key}: {status:?}")
                }
                (want, got) => panic!("{key} round {round}: wanted {want:?}, got {got:?}"),
            }
        }
    }

    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = c
            .should_rate_limit(request(&domain, &[("strict", "y")]))
            .await;
        if let Ok(r) = r {
            assert_eq!(r.into_inner().statuses[0].limit_remaining, 999);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "service never resumed after Redis returned"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_without_redis_and_serves_once_it_appears() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let mut redis = RedisServer::start();
    redis.stop();
    let domain = unique_domain("late");
    let url = redis.url();
    let t = Tollgate::start(&[("rules.yaml", &rules(&domain))], &[("store", &url)]).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", t.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    // The service is unknown to health until the health task has looked at
    // the store once: wait for that first report, then read it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let reply = health
            .check(HealthCheckRequest {
                service: "ratelimit".into(),
            })
            .await;
        match reply {
            Ok(r) => break r.into_inner().status,
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
                assert!(Instant::now() < deadline, "health never reported the store");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(status, ServingStatus::NotServing as i32);
    // Still not serving some time later, while Redis stays away.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let status = health
        .check(HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::NotServing as i32);

    redis.restart();
    t.wait_serving(Duration::from_secs(20)).await;
    let r = t.ask(request(&domain, &[("log", "z")])).await;
    assert_eq!(r.statuses[0].limit_remaining, 99);
    t.stop().await;
}

/// A cluster primary dies under load: every answer still arrives, per the
/// rule's policy while its slot has no primary, and counting resumes by
/// itself once the replica is promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_under_load_is_answered_per_policy() {
    use tollgate::limit::{Algorithm, Unit};
    use tollgate::storage::Hit;
    use tollgate::storage::keys::{KeyBuilder, Role};

    let mut cluster = RedisCluster::start();
    let domain = unique_domain("failover");
    let url = cluster.url();
    let t = Tollgate::start(
        &[("rules.yaml", &rules(&domain))],
        &[("store", &url), ("redis.command_timeout_ms", "100")],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    let mut c = t.client().await;
    let ask = |key: &'static str| request(&domain, &[(key, "f")]);

    // The key tollgate uses for ("open", "f") on this rule.
    let entries = vec![("open".to_string(), "f".to_string())];
    let redis_key = KeyBuilder::default()
        .limiter(&Hit {
            domain: &domain,
            entries: &entries,
            algorithm: Algorithm::SlidingWindowCounter,
            limit: 1000,
            window: Unit::Second.into(),
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
        })
        .key(Role::State);
    let r = c.should_rate_limit(ask("open")).await.unwrap().into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 999);

    cluster.kill_primary_for_key(&redis_key);
    let killed = Instant::now();
    let mut saw_fallback = false;
    let mut recovered = false;
    while killed.elapsed() < Duration::from_secs(30) {
        let started = Instant::now();
        let r = c.should_rate_limit(ask("open")).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(1000),
            "an answer took {took:?}"
        );
        // `open` fails open: always an answer, never an error.
        let s = &r
            .expect("on_store_error: allow answers OK")
            .into_inner()
            .statuses[0];
        assert_eq!(s.code, Code::Ok as i32);
        if s.duration_until_reset.is_none() {
            // The policy's answer: no count behind it.
            saw_fallback = true;
        } else if saw_fallback {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        saw_fallback,
        "the store never failed while its primary was dead"
    );
    assert!(
        recovered,
        "counting did not resume within 30 s of the failover"
    );
    t.stop().await;
}
