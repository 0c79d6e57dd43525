//! A client that keeps sending faster than its limit still gets its limit:
//! plain requests (no per-descriptor `hits_addend`, as Envoy's ordinary rate
//! limits send them) are admitted or refused by the algorithm and, on the
//! sliding windows and the token bucket, recorded only when admitted, also
//! on limiters that take usage reports (every rule that names no algorithm).
//! Over real gRPC on the embedded store, Redis and a 3+3 Redis Cluster, for
//! every algorithm.

mod support;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use support::redis::{RedisCluster, RedisServer};
use support::tollgate::{Tollgate, descriptor};
use support::unique_domain;
use tokio::time::Instant;

/// The limit every rule here has: 20 per second.
const LIMIT: u64 = 20;
/// The client sends 1.5 times the limit.
const RATE: u64 = 30;
const SECONDS: u64 = 5;

/// Each rule a reference user could write for 20 per second: one that
/// names no algorithm (usage reports by default), and each algorithm with
/// `usage_reports: true`.
const RULES: [&str; 5] = [
    "default",
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
];

fn rules(domain: &str) -> String {
    let mut text = format!(
        "domain: {domain}\ndescriptors:\n  - key: algo\n    value: default\n    descriptors:\n      - key: client\n        rate_limit: {{unit: second, requests_per_unit: {LIMIT}}}\n"
    );
    for algo in &RULES[1..] {
        text.push_str(&format!(
            "  - key: algo\n    value: {algo}\n    descriptors:\n      - key: client\n        rate_limit: {{unit: second, requests_per_unit: {LIMIT}, algorithm: {algo}, usage_reports: true}}\n"
        ));
    }
    text
}

/// One client flooding one rule: `RATE` plain requests a second for
/// `SECONDS`, each sent on schedule whatever the earlier ones got. Returns
/// the requests admitted and those sent in each second since the start (by
/// when each was sent), and how long the flood took until its last answer.
async fn flood(t: Arc<Tollgate>, domain: String, algo: &'static str) -> Flood {
    let client = t.client().await;
    let start = Instant::now();
    let mut sends = Vec::new();
    for i in 0..RATE * SECONDS {
        let at = start + Duration::from_micros(i * 1_000_000 / RATE);
        tokio::time::sleep_until(at).await;
        let mut c = client.clone();
        let req = RateLimitRequest {
            domain: domain.clone(),
            descriptors: vec![descriptor(&[("algo", algo), ("client", "flood")])],
            hits_addend: 0,
        };
        sends.push(tokio::spawn(async move {
            let sent = start.elapsed();
            let r = c.should_rate_limit(req).await.unwrap().into_inner();
            (sent, r.overall_code == Code::Ok as i32)
        }));
    }
    let mut admitted = vec![0u64; SECONDS as usize + 1];
    let mut sent_in = vec![0u64; SECONDS as usize + 1];
    for s in sends {
        let (sent, ok) = s.await.unwrap();
        let second = (sent.as_secs() as usize).min(SECONDS as usize);
        sent_in[second] += 1;
        if ok {
            admitted[second] += 1;
        }
    }
    Flood {
        admitted,
        sent: sent_in,
        took: start.elapsed(),
    }
}

struct Flood {
    admitted: Vec<u64>,
    sent: Vec<u64>,
    took: Duration,
}

/// Every rule flooded at once on one store: at least 70% of the limit in
/// every second after the first, and never more than the limit (plus a
/// window's worth for the fixed window's boundary and the bucket's burst)
/// over the run.
async fn a_client_over_its_limit_keeps_its_limit(settings: &[(&str, &str)]) {
    let domain = unique_domain("flood");
    let t = Arc::new(Tollgate::start(&[("r.yaml", &rules(&domain))], settings).await);
    t.wait_serving(Duration::from_secs(30)).await;
    let runs: Vec<_> = RULES
        .iter()
        .map(|algo| tokio::spawn(flood(t.clone(), domain.clone(), algo)))
        .collect();
    let mut failures = Vec::new();
    for (algo, run) in RULES.iter().zip(runs) {
        let Flood {
            admitted,
            sent,
            took,
        } = run.await.unwrap();
        let total: u64 = admitted.iter().sum();
        // The last slot holds sends a busy machine made after the run.
        let seconds = &admitted[..SECONDS as usize];
        let floor = LIMIT * 7 / 10;
        // A second in which a busy machine sent well under the rate says
        // nothing of the floor.
        let pressed = |i: usize| sent[i] >= RATE * 9 / 10;
        if (1..seconds.len()).any(|i| pressed(i) && seconds[i] < floor) {
            failures.push(format!(
                "{algo}: admitted per second {admitted:?} (sent {sent:?}), below {floor} after the first"
            ));
        }
        // The limit for every second the flood took, up to its last
        // answer (a busy machine stretches it), plus a window.
        let most = LIMIT * took.as_secs_f64().ceil() as u64 + LIMIT;
        if total > most {
            failures.push(format!(
                "{algo}: {total} admitted in {took:?} ({admitted:?}), over {LIMIT}/s plus {LIMIT}"
            ));
        }
        eprintln!("{algo}: admitted per second {seconds:?}, sent {sent:?}, in {took:?}");
    }
    assert!(failures.is_empty(), "{failures:#?}");

    // Refused requests are not usage: the metric of usage recorded past
    // the limit stays at 0 through the flood, and counts one report of 100
    // (a descriptor with its own cost) as 100.
    assert_eq!(recorded_over(&t, &domain).await, 0.0, "after the flood");
    let mut report = descriptor(&[("algo", "default"), ("client", "reporter")]);
    report.hits_addend = Some(UInt64Value { value: 100 });
    let r = t
        .ask(RateLimitRequest {
            domain: domain.clone(),
            descriptors: vec![report],
            hits_addend: 0,
        })
        .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(recorded_over(&t, &domain).await, 100.0, "after one report");
    Arc::into_inner(t).unwrap().stop().await;
}

/// The sum of `tollgate_rule_usage_recorded_over_limit_total` over the
/// domain's rules.
async fn recorded_over(t: &Tollgate, domain: &str) -> f64 {
    let (status, page) = support::http_get(t.http, "/metrics").await;
    assert_eq!(status, 200);
    page.lines()
        .filter(|l| l.starts_with("tollgate_rule_usage_recorded_over_limit_total{"))
        .filter(|l| l.contains(&format!("domain=\"{domain}\"")))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_limit_keeps_its_limit_on_the_embedded_store() {
    a_client_over_its_limit_keeps_its_limit(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_limit_keeps_its_limit_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    a_client_over_its_limit_keeps_its_limit(&[("store", &url)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_limit_keeps_its_limit_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    a_client_over_its_limit_keeps_its_limit(&[("store", &url)]).await;
}
