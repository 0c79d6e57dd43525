//! Sharded limiters (`rate_limit.shards`) over real gRPC: the whole limit
//! and never more, the configured limit in the answer, and on a real 3+3
//! Redis Cluster, three replicas at twice the limit with the Redis work
//! spread over every primary.

mod support;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use support::redis::{RedisCluster, command_calls};
use support::tollgate::{Tollgate, descriptor};
use support::{away_from_an_hour_boundary, http_get, unique_domain};

fn request(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![descriptor(entries)],
        hits_addend: 0,
    }
}

fn rules(domain: &str, limit: u32, shards: u16) -> String {
    format!(
        r#"
domain: {domain}
descriptors:
  - key: fixed
    rate_limit: {{unit: hour, requests_per_unit: {limit}, algorithm: fixed_window, shards: {shards}}}
  - key: log
    rate_limit: {{unit: hour, requests_per_unit: {limit}, algorithm: sliding_window_log, shards: {shards}}}
  - key: counter
    rate_limit: {{unit: hour, requests_per_unit: {limit}, algorithm: sliding_window_counter, shards: {shards}}}
"#
    )
}

fn ok(r: &RateLimitResponse) -> bool {
    r.overall_code == Code::Ok as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_limit_admits_the_whole_limit_and_reports_it() {
    let domain = unique_domain("shards");
    let t = Tollgate::start(&[("rules.yaml", &rules(&domain, 10, 4))], &[]).await;
    away_from_an_hour_boundary().await;
    for key in ["fixed", "log", "counter"] {
        let mut answers = Vec::new();
        for _ in 0..25 {
            answers.push(t.ask(request(&domain, &[(key, "tenant")])).await);
        }
        let admitted = answers.iter().filter(|r| ok(r)).count();
        assert_eq!(admitted, 10, "{key}");
        // Every share is used before any hit is refused.
        assert!(answers[..10].iter().all(ok), "{key}");
        for r in &answers {
            let s = &r.statuses[0];
            let limit = s.current_limit.as_ref().expect("a limit");
            assert_eq!(limit.requests_per_unit, 10, "{key}: the configured limit");
            assert!(s.limit_remaining <= 9, "{key}: {s:?}");
            if !ok(r) {
                assert_eq!(s.limit_remaining, 0, "{key}");
                let reset = s.duration_until_reset.as_ref().expect("a reset");
                // A two-bucket counter's hit counts for up to two windows.
                assert!(
                    reset.seconds > 0 && reset.seconds <= 7200,
                    "{key}: {reset:?}"
                );
            }
        }
        // The first answer reports about the whole limit left, not one
        // share's remaining (at most 2 here).
        assert!(
            answers[0].statuses[0].limit_remaining >= 5,
            "{key}: {:?}",
            answers[0]
        );
    }
    // /rlconfig shows the shard count, as text and as JSON.
    let (status, text) = http_get(t.debug, "/rlconfig").await;
    assert_eq!(status, 200);
    assert!(text.contains("10/hour fixed_window shards=4"), "{text}");
    let (_, json) = http_get(t.debug, "/rlconfig?format=json").await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let fixed = json["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "fixed")
        .expect("the fixed rule");
    assert_eq!(fixed["shards"], 4, "{json}");

    // The hot-key report names the limiter with its configured limit and
    // shard count, not a shard's share.
    let (status, body) = http_get(t.debug, "/debug/hotkeys").await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    let first = &report["hotKeys"][0]["limiter"];
    assert_eq!(first["limit"], 10, "{body}");
    assert_eq!(first["shards"], 4, "{body}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_count_above_the_limit_is_refused_with_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 4\n      shards: 8\n  - key: j\n    rate_limit: {unit: second, requests_per_unit: 400, shards: 65}\n",
    )
    .unwrap();
    let out = std::process::Command::new(support::process::tollgate_bin())
        .args(["validate", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("bad.yaml:7")
            && text.contains("shards (8) must not exceed requests_per_unit (4)"),
        "{text}"
    );
    assert!(
        text.contains("bad.yaml:9") && text.contains("shards must be from 1 to 64, found 65"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_above_the_limit_fill_it_over_every_primary() {
    const LIMIT: usize = 400;
    const SHARDS: u16 = 8;
    let cluster = RedisCluster::start();
    let domain = unique_domain("sharded");
    let text = rules(&domain, LIMIT as u32, SHARDS);
    let url = cluster.url();
    let settings = [
        ("store", url.as_str()),
        ("redis.command_timeout_ms", "2000"),
    ];
    let replicas = Tollgate::start_replicas(3, &[("rules.yaml", &text)], &settings).await;
    let clients = futures_util::future::join_all(replicas.iter().map(|t| t.client())).await;
    // The standard split of 16,384 slots over three primaries.
    let primaries: Vec<u16> = [0u16, 8192, 16383]
        .iter()
        .map(|&slot| cluster.primary_for_slot(slot).expect("a primary"))
        .collect();
    assert_eq!(
        primaries
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len(),
        3
    );

    away_from_an_hour_boundary().await;
    // Twice the limit, and 1.2 times (on fresh limiters).
    for (key, value, demand) in [
        ("fixed", "tenant", 2 * LIMIT),
        ("log", "tenant", 2 * LIMIT),
        ("fixed", "tenant-1.2x", LIMIT * 6 / 5),
        ("log", "tenant-1.2x", LIMIT * 6 / 5),
    ] {
        let before: Vec<u64> = primaries
            .iter()
            .map(|&p| command_calls(p, "evalsha"))
            .collect();
        // From 48 callers spread over the three replicas.
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let callers = (0..48).map(|c| {
            let mut client = clients[c % 3].clone();
            let next = next.clone();
            let req = request(&domain, &[(key, value)]);
            async move {
                let (mut ok, mut over) = (0usize, 0usize);
                while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < demand {
                    let code = client
                        .should_rate_limit(req.clone())
                        .await
                        .map(|r| r.into_inner().overall_code);
                    match code {
                        Ok(c) if c == Code::Ok as i32 => ok += 1,
                        Ok(c) if c == Code::OverLimit as i32 => over += 1,
                        other => panic!("{key}: {other:?}"),
                    }
                }
                (ok, over)
            }
        });
        let counts = futures_util::future::join_all(callers).await;
        let admitted: usize = counts.iter().map(|c| c.0).sum();
        let refused: usize = counts.iter().map(|c| c.1).sum();
        assert_eq!(admitted + refused, demand, "{key}");
        assert!(
            admitted <= LIMIT,
            "{key}: {admitted} admitted over a limit of {LIMIT}"
        );
        assert!(
            admitted * 100 >= LIMIT * 97,
            "{key}: only {admitted} of {LIMIT} admitted at a demand of {demand}"
        );

        let calls: Vec<u64> = primaries
            .iter()
            .zip(&before)
            .map(|(&p, b)| command_calls(p, "evalsha") - b)
            .collect();
        let total: u64 = calls.iter().sum();
        assert!(total > 0, "{key}");
        for (p, c) in primaries.iter().zip(&calls) {
            assert!(*c > 0, "{key}: primary {p} got no calls: {calls:?}");
            assert!(
                *c * 2 <= total,
                "{key}: primary {p} got {c} of {total}: {calls:?}"
            );
        }
        eprintln!("{key} {value}: admitted {admitted} of {demand}; scripts per primary {calls:?}");
    }
    for t in replicas {
        t.stop().await;
    }
}
