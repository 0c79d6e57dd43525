//! Usage reported after the response closes a budget: Envoy's
//! `apply_on_stream_done` (Envoy Gateway's `cost.response`, AI gateways'
//! token limits) checks with a cost of 0 before the request and reports the
//! real cost when the stream ends, ignoring the answer. The report must be
//! recorded whatever it is, so the next check is refused. Over real gRPC on
//! the embedded store, Redis and a 3+3 Redis Cluster, for every algorithm.

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use support::redis::{RedisCluster, RedisServer, command_calls};
use support::tollgate::{Tollgate, descriptor};
use support::unique_domain;
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Rules of one domain: a 1,000-per-hour budget per `tenant` under each
/// `algo` value, as each algorithm with `usage_reports: true`, and as a
/// rule that names no algorithm (Envoy Gateway's), left to the defaults.
fn rules(domain: &str) -> String {
    let mut text = format!(
        "domain: {domain}\ndescriptors:\n  - key: algo\n    value: default\n    descriptors:\n      - key: tenant\n        rate_limit: {{unit: hour, requests_per_unit: 1000}}\n"
    );
    for algo in [
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
    ] {
        text.push_str(&format!(
            "  - key: algo\n    value: {algo}\n    descriptors:\n      - key: tenant\n        rate_limit: {{unit: hour, requests_per_unit: 1000, algorithm: {algo}, usage_reports: true}}\n"
        ));
    }
    // Naming an algorithm without usage_reports keeps admission semantics.
    text.push_str("  - key: algo\n    value: admission\n    descriptors:\n      - key: tenant\n        rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: sliding_window_log}\n");
    text
}

const ALGOS: [&str; 4] = [
    "default",
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
];

/// One descriptor `algo=<algo>, tenant=<tenant>` with a per-descriptor
/// cost, as Envoy sends it (0 on the request path, the usage at the end).
fn call(domain: &str, algo: &str, tenant: &str, cost: u64) -> RateLimitRequest {
    let mut d: RateLimitDescriptor = descriptor(&[("algo", algo), ("tenant", tenant)]);
    d.hits_addend = Some(UInt64Value { value: cost });
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![d],
        hits_addend: 0,
    }
}

async fn ask(c: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(r).await.unwrap().into_inner()
}

/// The flow on one store: checks before each report of 300 answer OK until
/// the fourth report takes the budget over 1,000, then refuse; a single
/// report of 5,000 closes a fresh budget at once.
async fn reports_close_the_budget(settings: &[(&str, &str)]) {
    support::away_from_an_hour_boundary().await;
    let domain = unique_domain("reports");
    let t = Tollgate::start(&[("r.yaml", &rules(&domain))], settings).await;
    t.wait_serving(Duration::from_secs(30)).await;
    let mut c = t.client().await;
    for algo in ALGOS {
        let tenant = "four-reports";
        for n in 1..=4 {
            let check = ask(&mut c, call(&domain, algo, tenant, 0)).await;
            assert_eq!(check.overall_code, OK, "{algo}: check before report {n}");
            let report = ask(&mut c, call(&domain, algo, tenant, 300)).await;
            // The answer to the fourth (1,200 of 1,000) says so; Envoy
            // ignores it, but it is recorded.
            let want = if n == 4 { OVER } else { OK };
            assert_eq!(report.overall_code, want, "{algo}: report {n}");
        }
        for _ in 0..3 {
            let check = ask(&mut c, call(&domain, algo, tenant, 0)).await;
            assert_eq!(
                check.overall_code, OVER,
                "{algo}: check after 1,200 of 1,000"
            );
            let s = &check.statuses[0];
            assert_eq!(s.limit_remaining, 0, "{algo}");
            let reset = s.duration_until_reset.as_ref().unwrap();
            // The counter (two hour-long buckets) forgets the current
            // bucket's usage only as it slides out after the hour ends: up
            // to two windows; the others within one.
            let longest = match algo {
                "default" | "sliding_window_counter" => 7200,
                _ => 3600,
            };
            assert!(
                reset.seconds > 0 && reset.seconds <= longest,
                "{algo}: {reset:?}"
            );
            // A plain request (cost 1) is refused too.
            let plain = ask(&mut c, call(&domain, algo, tenant, 1)).await;
            assert_eq!(
                plain.overall_code, OVER,
                "{algo}: a request after the budget"
            );
        }

        let tenant = "one-big-report";
        let check = ask(&mut c, call(&domain, algo, tenant, 0)).await;
        assert_eq!(check.overall_code, OK, "{algo}");
        let report = ask(&mut c, call(&domain, algo, tenant, 5000)).await;
        assert_eq!(
            report.overall_code, OVER,
            "{algo}: a report above the limit"
        );
        let check = ask(&mut c, call(&domain, algo, tenant, 0)).await;
        assert_eq!(
            check.overall_code, OVER,
            "{algo}: check after 5,000 of 1,000"
        );
    }

    // Naming a sliding algorithm without usage_reports keeps admission
    // semantics: a cost that does not fit is refused and not recorded.
    let algo = "admission";
    for n in 1..=3 {
        let report = ask(&mut c, call(&domain, algo, "a", 300)).await;
        assert_eq!(report.overall_code, OK, "admission: report {n}");
    }
    let refused = ask(&mut c, call(&domain, algo, "a", 300)).await;
    assert_eq!(refused.overall_code, OVER);
    let check = ask(&mut c, call(&domain, algo, "a", 0)).await;
    assert_eq!(check.overall_code, OK, "900 of 1,000 recorded");
    assert_eq!(check.statuses[0].limit_remaining, 100);
    let fits = ask(&mut c, call(&domain, algo, "a", 100)).await;
    assert_eq!(fits.overall_code, OK);
    t.stop().await;
}

/// A request weighed by a gRPC client (the request's `hits_addend`) that
/// does not fit is refused and not recorded, on every rule: only a
/// descriptor's own cost is a report.
fn weighted(domain: &str, algo: &str, tenant: &str, cost: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![descriptor(&[("algo", algo), ("tenant", tenant)])],
        hits_addend: cost,
    }
}

/// Ten streams checked at zero usage, each reporting 300 when it ends, on
/// a 1,000 budget: all ten reports are recorded (3,000), as giving back
/// shows to the hit. And weighted requests keep admission semantics.
async fn streams_and_weighted_requests(settings: &[(&str, &str)]) {
    support::away_from_an_hour_boundary().await;
    let domain = unique_domain("streams");
    let t = Tollgate::start(&[("r.yaml", &rules(&domain))], settings).await;
    t.wait_serving(Duration::from_secs(30)).await;
    let mut c = t.client().await;
    for algo in ALGOS {
        let tenant = "ten-streams";
        for n in 0..10 {
            let check = ask(&mut c, call(&domain, algo, tenant, 0)).await;
            assert_eq!(check.overall_code, OK, "{algo}: check of stream {n}");
        }
        let reports = (0..10).map(|_| {
            let mut c = c.clone();
            let r = call(&domain, algo, tenant, 300);
            async move { ask(&mut c, r).await }
        });
        futures_util::future::join_all(reports).await;
        // 3,000 recorded: 1,999 back leaves 1,001 (refused), one more
        // leaves 1,000 (a check fits, nothing remains).
        let mut back = call(&domain, algo, tenant, 1999);
        back.descriptors[0].is_negative_hits = true;
        ask(&mut c, back).await;
        let check = ask(&mut c, call(&domain, algo, tenant, 0)).await;
        assert_eq!(check.overall_code, OVER, "{algo}: 1,001 of 1,000 left");
        let mut back = call(&domain, algo, tenant, 1);
        back.descriptors[0].is_negative_hits = true;
        ask(&mut c, back).await;
        let check = ask(&mut c, call(&domain, algo, tenant, 0)).await;
        assert_eq!(check.overall_code, OK, "{algo}: 1,000 of 1,000 left");
        assert_eq!(check.statuses[0].limit_remaining, 0, "{algo}");

        let tenant = "weighted";
        for n in 1..=3 {
            let r = ask(&mut c, weighted(&domain, algo, tenant, 300)).await;
            assert_eq!(r.overall_code, OK, "{algo}: weighted request {n}");
        }
        let r = ask(&mut c, weighted(&domain, algo, tenant, 300)).await;
        assert_eq!(r.overall_code, OVER, "{algo}: 1,200 does not fit 1,000");
        let r = ask(&mut c, weighted(&domain, algo, tenant, 100)).await;
        if algo == "fixed_window" {
            // The reference's fixed window: the refused 300 stays counted.
            assert_eq!(r.overall_code, OVER, "{algo}: 1,200 recorded");
        } else {
            assert_eq!(
                r.overall_code, OK,
                "{algo}: the refused 300 was not recorded"
            );
            assert_eq!(r.statuses[0].limit_remaining, 0, "{algo}");
        }
    }
    t.stop().await;
}

#[tokio::test]
async fn reports_close_the_budget_on_the_embedded_store() {
    reports_close_the_budget(&[]).await;
    streams_and_weighted_requests(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_close_the_budget_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let settings = [
        ("store", url.as_str()),
        ("redis.command_timeout_ms", "5000"),
    ];
    reports_close_the_budget(&settings).await;
    streams_and_weighted_requests(&settings).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_close_the_budget_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let settings = [
        ("store", url.as_str()),
        ("redis.command_timeout_ms", "5000"),
    ];
    reports_close_the_budget(&settings).await;
    streams_and_weighted_requests(&settings).await;
}

/// `usage_reports: false` as a setting gives rules that name no algorithm
/// admission semantics; `true` gives every rule that does not say usage
/// reports.
#[tokio::test]
async fn the_setting_is_the_default_of_rules_that_do_not_say() {
    support::away_from_an_hour_boundary().await;
    for (setting, algo, closes) in [
        ("false", "default", false),
        ("true", "admission", true),
        ("true", "default", true),
    ] {
        let domain = unique_domain("setting");
        let t = Tollgate::start(
            &[("r.yaml", &rules(&domain))],
            &[("usage_reports", setting)],
        )
        .await;
        let mut c = t.client().await;
        for _ in 0..4 {
            ask(&mut c, call(&domain, algo, "t", 300)).await;
        }
        let check = ask(&mut c, call(&domain, algo, "t", 0)).await;
        let want = if closes { OVER } else { OK };
        assert_eq!(check.overall_code, want, "usage_reports={setting}, {algo}");
        t.stop().await;
    }
}

/// The over-limit cache answers checks on a closed budget locally, and
/// still sends every report to Redis, where it is recorded: a give-back
/// of less than what the cache saw reported leaves the budget closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_refusal_never_hides_a_report() {
    support::away_from_an_hour_boundary().await;
    let redis = RedisServer::start();
    let domain = unique_domain("cached");
    let t = Tollgate::start(
        &[("r.yaml", &rules(&domain))],
        &[("store", &redis.url()), ("redis.coalesce", "false")],
    )
    .await;
    t.wait_serving(Duration::from_secs(30)).await;
    let mut c = t.client().await;
    for algo in ALGOS {
        let report = ask(&mut c, call(&domain, algo, "t", 1200)).await;
        assert_eq!(report.overall_code, OVER, "{algo}");
        let before = command_calls(redis.port(), "evalsha");
        for _ in 0..20 {
            let check = ask(&mut c, call(&domain, algo, "t", 0)).await;
            assert_eq!(check.overall_code, OVER, "{algo}");
        }
        assert!(
            command_calls(redis.port(), "evalsha") <= before + 1,
            "{algo}: checks on a closed budget are answered locally"
        );
        let before = command_calls(redis.port(), "evalsha");
        for _ in 0..5 {
            let report = ask(&mut c, call(&domain, algo, "t", 100)).await;
            assert_eq!(report.overall_code, OVER, "{algo}");
        }
        assert_eq!(
            command_calls(redis.port(), "evalsha"),
            before + 5,
            "{algo}: every report reached Redis"
        );
        // 1,700 recorded: giving 600 back leaves 1,100, still over.
        let mut give_back = call(&domain, algo, "t", 600);
        give_back.descriptors[0].is_negative_hits = true;
        ask(&mut c, give_back).await;
        let check = ask(&mut c, call(&domain, algo, "t", 0)).await;
        assert_eq!(
            check.overall_code, OVER,
            "{algo}: the reports were recorded"
        );
        // Another 200 back: 900, open again.
        let mut give_back = call(&domain, algo, "t", 200);
        give_back.descriptors[0].is_negative_hits = true;
        ask(&mut c, give_back).await;
        let check = ask(&mut c, call(&domain, algo, "t", 0)).await;
        assert_eq!(check.overall_code, OK, "{algo}: 900 of 1,000");
    }
    t.stop().await;
}

/// Usage piling up past the limit keeps a sliding log bounded: reports
/// while the log is full add to its newest member, so it never holds more
/// members than its limit, however many reports arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_stays_bounded_when_usage_piles_up() {
    support::away_from_an_hour_boundary().await;
    let redis = RedisServer::start();
    let domain = unique_domain("pile");
    let text = format!(
        "domain: {domain}\ndescriptors:\n  - key: tenant\n    rate_limit: {{unit: hour, requests_per_unit: 5, algorithm: sliding_window_log, usage_reports: true}}\n"
    );
    let t = Tollgate::start(&[("r.yaml", &text)], &[("store", &redis.url())]).await;
    t.wait_serving(Duration::from_secs(30)).await;
    let mut c = t.client().await;
    let report = |cost| {
        let mut d = descriptor(&[("tenant", "t")]);
        d.hits_addend = Some(UInt64Value { value: cost });
        RateLimitRequest {
            domain: domain.clone(),
            descriptors: vec![d],
            hits_addend: 0,
        }
    };
    for _ in 0..200 {
        ask(&mut c, report(1)).await;
    }
    let keys = redis.cli(&["--scan", "--pattern", "*:z:*"]);
    let keys: Vec<&str> = keys.lines().filter(|k| k.contains("pile")).collect();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let members: u64 = redis.cli(&["ZCARD", keys[0]]).trim().parse().unwrap();
    assert!(members <= 5, "{members} members for a limit of 5");
    // Every report is still counted: giving back 195 leaves the 5.
    let mut back = report(195);
    back.descriptors[0].is_negative_hits = true;
    ask(&mut c, back).await;
    let check = ask(&mut c, report(0)).await;
    assert_eq!(check.overall_code, OK);
    assert_eq!(check.statuses[0].limit_remaining, 0, "5 of 5 left");
    t.stop().await;
}
