//! Per-server batching of script calls, on real Redis: 64 callers on 64
//! different limiters of one server are decided exactly, in far fewer
//! `EVALSHA` calls and socket reads than decisions; with `redis.batch_max=1`
//! each decision is its own call. On a 3+3 cluster the batches carry
//! limiters of many slots of one primary and stay exact.

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::redis::{RedisCluster, RedisServer, cli, command_calls};
use support::tollgate::{Tollgate, descriptor};
use support::{away_from_an_hour_boundary, http_get, unique_domain};

const CALLERS: usize = 64;
const PER_CALLER: usize = 5;
const LIMIT: usize = 3;

fn rules(domain: &str) -> String {
    format!(
        r#"
domain: {domain}
descriptors:
  - key: fixed
    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, algorithm: fixed_window}}
  - key: log
    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, algorithm: sliding_window_log}}
  - key: counter
    rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, algorithm: sliding_window_counter}}
"#
    )
}

/// Each of 64 callers sends 5 calls on its own limiter (`key` = its own
/// value), one after the other: every limiter admits exactly 3.
async fn callers_on_their_own_limiters(t: &Tollgate, domain: &str, key: &str) {
    let client = t.client().await;
    let callers = (0..CALLERS).map(|i| {
        let mut client = client.clone();
        let req = RateLimitRequest {
            domain: domain.into(),
            descriptors: vec![descriptor(&[(key, &format!("caller-{i}"))])],
            hits_addend: 0,
        };
        async move {
            let mut codes = Vec::new();
            for _ in 0..PER_CALLER {
                let r = client.should_rate_limit(req.clone()).await.unwrap();
                codes.push(r.into_inner().overall_code);
            }
            codes
        }
    });
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;
    for (i, codes) in futures_util::future::join_all(callers)
        .await
        .into_iter()
        .enumerate()
    {
        let mut want = vec![ok; LIMIT];
        want.resize(PER_CALLER, over);
        assert_eq!(codes, want, "{key}, caller {i}");
    }
}

/// `total_reads_processed` of `INFO stats`: the reads Redis made from its
/// clients' sockets.
fn reads(port: u16) -> u64 {
    cli(port, &["INFO", "stats"])
        .lines()
        .find_map(|l| l.strip_prefix("total_reads_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("total_reads_processed in INFO stats")
}

fn metric(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|rest| rest.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_on_many_limiters_of_one_server_share_calls_and_stay_exact() {
    let redis = RedisServer::start();
    let url = redis.url();
    let domain = unique_domain("batch");
    let alone = unique_domain("alone");
    let lanes = unique_domain("lanes");
    let (text, alone_text, lanes_text) = (rules(&domain), rules(&alone), rules(&lanes));
    let files = [
        ("b.yaml", text.as_str()),
        ("a.yaml", alone_text.as_str()),
        ("l.yaml", lanes_text.as_str()),
    ];
    // The over-limit cache would answer refusals without Redis: off, so
    // every decision is a script call to count.
    let common = [
        ("store", url.as_str()),
        ("redis.command_timeout_ms", "5000"),
        ("over_limit_cache.enabled", "false"),
    ];
    let batched = Tollgate::start(&files, &common).await;
    let mut alone_settings = common.to_vec();
    alone_settings.push(("redis.batch_max", "1"));
    let single = Tollgate::start(&files, &alone_settings).await;
    let mut lanes_settings = common.to_vec();
    lanes_settings.push(("redis.batch_lanes", "4"));
    let four = Tollgate::start(&files, &lanes_settings).await;
    batched.wait_serving(Duration::from_secs(20)).await;
    single.wait_serving(Duration::from_secs(20)).await;
    four.wait_serving(Duration::from_secs(20)).await;
    away_from_an_hour_boundary().await;

    let decisions = (CALLERS * PER_CALLER) as u64;
    for key in ["fixed", "log", "counter"] {
        let (calls_before, reads_before) =
            (command_calls(redis.port(), "evalsha"), reads(redis.port()));
        callers_on_their_own_limiters(&batched, &domain, key).await;
        let calls = command_calls(redis.port(), "evalsha") - calls_before;
        let read = reads(redis.port()) - reads_before;
        eprintln!("{key}, batched: {calls} EVALSHA and {read} reads for {decisions} decisions");
        assert!(
            calls * 3 <= decisions,
            "{key}: {calls} script calls for {decisions} decisions"
        );
        assert!(
            read * 2 <= decisions,
            "{key}: {read} reads for {decisions} decisions"
        );

        let before = command_calls(redis.port(), "evalsha");
        callers_on_their_own_limiters(&single, &alone, key).await;
        let calls = command_calls(redis.port(), "evalsha") - before;
        assert_eq!(calls, decisions, "{key}: batch_max=1 sends each call alone");

        // Four batches in flight at once: smaller batches, still exact.
        let before = command_calls(redis.port(), "evalsha");
        callers_on_their_own_limiters(&four, &lanes, key).await;
        let calls = command_calls(redis.port(), "evalsha") - before;
        eprintln!("{key}, four lanes: {calls} EVALSHA for {decisions} decisions");
        assert!(
            calls * 4 <= decisions * 3,
            "{key}, four lanes: {calls} script calls for {decisions} decisions"
        );
    }

    let (status, text) = http_get(batched.http, "/metrics").await;
    assert_eq!(status, 200);
    let batches = metric(&text, "tollgate_store_batches_total{kind=\"batches\"").expect("batches");
    let carried = metric(&text, "tollgate_store_batches_total{kind=\"calls\"").expect("calls");
    assert!(
        batches > 0.0 && carried >= 2.0 * batches,
        "{batches} batches, {carried} calls"
    );
    batched.stop().await;
    single.stop().await;
    four.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_on_a_cluster_carry_many_slots_of_one_primary_and_stay_exact() {
    let cluster = RedisCluster::start();
    cluster.wait_healthy(Duration::from_secs(60));
    let url = cluster.url();
    let domain = unique_domain("batchcluster");
    let text = rules(&domain);
    let t = Tollgate::start(
        &[("b.yaml", text.as_str())],
        &[
            ("store", url.as_str()),
            ("redis.command_timeout_ms", "5000"),
            ("over_limit_cache.enabled", "false"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(30)).await;
    away_from_an_hour_boundary().await;
    let total =
        |c: &RedisCluster| -> u64 { c.ports().iter().map(|&p| command_calls(p, "evalsha")).sum() };
    let decisions = (CALLERS * PER_CALLER) as u64;
    for key in ["fixed", "log", "counter"] {
        let before = total(&cluster);
        callers_on_their_own_limiters(&t, &domain, key).await;
        let calls = total(&cluster) - before;
        eprintln!("{key}, cluster: {calls} EVALSHA for {decisions} decisions");
        // 64 callers over three primaries of one lane each: most wait,
        // and ride in a batch.
        assert!(
            calls * 4 <= decisions * 3,
            "{key}: {calls} script calls for {decisions} decisions"
        );
    }
    t.stop().await;
}

/// A caller that stops waiting while its call is on the wire gives its
/// lane back: with one lane (`redis.batch_lanes=1`), calls cut off by their
/// deadline while Redis is paused leave the server able to decide, and the
/// next calls are answered by Redis (an OVER_LIMIT only the store can give,
/// with the over-limit cache off), not by the failure policy at their
/// deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_stop_waiting_give_their_lane_back() {
    let redis = RedisServer::start();
    let url = redis.url();
    let domain = unique_domain("lane");
    let text = rules(&domain);
    let t = Tollgate::start(
        &[("l.yaml", text.as_str())],
        &[
            ("store", url.as_str()),
            ("redis.batch_lanes", "1"),
            ("redis.command_timeout_ms", "5000"),
            ("over_limit_cache.enabled", "false"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    away_from_an_hour_boundary().await;
    let client = t.client().await;
    let ask = |value: String, timeout: Duration| {
        let mut client = client.clone();
        let domain = domain.clone();
        async move {
            let mut req = tonic::Request::new(RateLimitRequest {
                domain,
                descriptors: vec![descriptor(&[("fixed", &value)])],
                hits_addend: 0,
            });
            req.set_timeout(timeout);
            client.should_rate_limit(req).await
        }
    };

    assert_eq!(
        redis.cli(&["CLIENT", "PAUSE", "1500", "ALL"]).trim(),
        "OK",
        "CLIENT PAUSE"
    );
    // One alone on the wire, the rest queued behind it; all give up.
    let impatient = (0..8).map(|i| ask(format!("gone-{i}"), Duration::from_millis(300)));
    let started = std::time::Instant::now();
    let answers = futures_util::future::join_all(impatient).await;
    assert!(
        started.elapsed() < Duration::from_millis(1400),
        "impatient callers waited {:?}",
        started.elapsed()
    );
    eprintln!(
        "while paused: {:?}",
        answers
            .iter()
            .map(|a| a
                .as_ref()
                .map(|r| r.get_ref().overall_code)
                .map_err(|s| s.code()))
            .collect::<Vec<_>>()
    );
    tokio::time::sleep(Duration::from_millis(1600).saturating_sub(started.elapsed())).await;

    // Redis is back: each limiter admits exactly its 3, in time.
    for round in 0..3 {
        let callers = (0..16).map(|i| async move {
            let mut codes = Vec::new();
            for _ in 0..PER_CALLER {
                let r = ask(format!("back-{round}-{i}"), Duration::from_secs(4))
                    .await
                    .expect("an answer");
                codes.push(r.into_inner().overall_code);
            }
            codes
        });
        for codes in futures_util::future::join_all(callers).await {
            let mut want = vec![Code::Ok as i32; LIMIT];
            want.resize(PER_CALLER, Code::OverLimit as i32);
            assert_eq!(codes, want, "round {round}");
        }
    }
}
