//! The local over-limit cache and the hot-key report, end to end: real
//! Redis, tollgate over gRPC on loopback, `/metrics` and `/debug/hotkeys`
//! read over HTTP.

mod support;

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use support::redis::{RedisServer, command_calls, require_redis};
use support::tollgate::{Tollgate, descriptor};
use support::{http_get, unique_domain};

/// The value of an unlabelled series on `/metrics`.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let (n, v) = l.split_once(' ')?;
            (n == name || n.starts_with(&format!("{name}{{"))).then(|| v.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
}

fn rules(domain: &str, limit: u32) -> String {
    format!(
        r#"
domain: {domain}
descriptors:
  - key: log
    rate_limit: {{unit: day, requests_per_unit: {limit}, algorithm: sliding_window_log}}
  - key: fixed
    rate_limit: {{unit: day, requests_per_unit: {limit}, algorithm: fixed_window}}
  - key: counter
    rate_limit: {{unit: day, requests_per_unit: {limit}, algorithm: sliding_window_counter}}
"#
    )
}

/// `cost` None: the request's cost (1); Some(0) checks.
fn request(
    domain: &str,
    key: &str,
    value: &str,
    cost: Option<u64>,
    negative: bool,
) -> RateLimitRequest {
    let mut d = descriptor(&[(key, value)]);
    d.hits_addend = cost.map(|value| UInt64Value { value });
    d.is_negative_hits = negative;
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![d],
        hits_addend: 0,
    }
}

/// What must match between the cached and uncached paths: the code, the
/// remaining count, and the reset to within the time between the two calls
/// (the cache's reset is the store's less at most one round trip).
fn assert_same(step: &str, cached: &RateLimitResponse, bare: &RateLimitResponse) {
    assert_eq!(cached.overall_code, bare.overall_code, "{step}");
    let (c, b) = (&cached.statuses[0], &bare.statuses[0]);
    assert_eq!(c.code, b.code, "{step}");
    assert_eq!(c.limit_remaining, b.limit_remaining, "{step}");
    let secs = |s: &envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus| {
        s.duration_until_reset.as_ref().map(|d| d.seconds).unwrap_or(0)
    };
    assert!(secs(c).abs_diff(secs(b)) <= 2, "{step}: {c:?} vs {b:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_on_an_exhausted_limiter_is_answered_locally_with_the_stores_answers() {
    require_redis();
    const LIMIT: u32 = 20;
    let (cached_redis, bare_redis) = (RedisServer::start(), RedisServer::start());
    let domain = unique_domain("flood");
    let rules = rules(&domain, LIMIT);
    // Script calls are counted one per request: leases off.
    let cached = Tollgate::start(
        &[("r.yaml", &rules)],
        &[("store", &cached_redis.url()), ("lease", "false")],
    )
    .await;
    let bare = Tollgate::start(
        &[("r.yaml", &rules)],
        &[
            ("store", &bare_redis.url()),
            ("over_limit_cache.enabled", "false"),
            ("lease", "false"),
        ],
    )
    .await;
    cached.wait_serving(Duration::from_secs(10)).await;
    bare.wait_serving(Duration::from_secs(10)).await;
    let (mut c_client, mut b_client) = (cached.client().await, bare.client().await);

    for key in ["log", "fixed"] {
        let before = (
            command_calls(cached_redis.port(), "evalsha"),
            command_calls(bare_redis.port(), "evalsha"),
        );
        let mut denied = 0u64;
        // A flood at 10x the limit, then checks, give-backs, weighted hits
        // and a give-back larger than everything refused locally.
        let mut script: Vec<(Option<u64>, bool)> = vec![(None, false); 10 * LIMIT as usize];
        script.push((Some(0), false));
        script.push((Some(5), true));
        script.extend([(None, false); 10]);
        script.push((Some(3), false));
        script.push((Some(0), false));
        script.push((Some(200), true));
        script.extend([(None, false); 5]);
        let flood = 10 * LIMIT as u64;
        for (i, &(cost, negative)) in script.iter().enumerate() {
            let req = request(&domain, key, "mallory", cost, negative);
            let c = c_client
                .should_rate_limit(req.clone())
                .await
                .unwrap()
                .into_inner();
            let b = b_client.should_rate_limit(req).await.unwrap().into_inner();
            assert_same(&format!("{key} step {i} {cost:?} {negative}"), &c, &b);
            if (i as u64) < flood && c.overall_code == Code::OverLimit as i32 {
                denied += 1;
            }
            if i as u64 == flood - 1 {
                let calls = (
                    command_calls(cached_redis.port(), "evalsha") - before.0,
                    command_calls(bare_redis.port(), "evalsha") - before.1,
                );
                assert_eq!(denied, flood - LIMIT as u64, "{key}");
                // The uncached path made one script call per request (so the
                // counts are read right)...
                assert_eq!(calls.1, flood, "{key}");
                // ...the cached one: the admitted ones and the first refusal.
                assert_eq!(calls.0, LIMIT as u64 + 1, "{key}");
                let per_denied = (calls.0 - LIMIT as u64) as f64 / denied as f64;
                assert!(per_denied < 0.01, "{key}: {per_denied}");
            }
        }
    }

    let (status, text) = http_get(cached.http, "/metrics").await;
    assert_eq!(status, 200);
    let hits = metric(&text, "tollgate_over_limit_cache_hits_total");
    let misses = metric(&text, "tollgate_over_limit_cache_misses_total");
    // Per limiter, 179 flood refusals at least were answered here.
    assert!(hits >= 2.0 * 179.0, "{hits}");
    assert!(misses >= 2.0 * 21.0, "{misses}");
    let (_, bare_text) = http_get(bare.http, "/metrics").await;
    assert!(!bare_text.contains("tollgate_over_limit_cache_hits"));
    cached.stop().await;
    bare.stop().await;
}

#[tokio::test]
async fn the_cache_holds_at_most_max_entries_limiters() {
    let domain = unique_domain("bounded");
    let rules = rules(&domain, 2);
    let t = Tollgate::start(
        &[("r.yaml", &rules)],
        &[("over_limit_cache.max_entries", "4")],
    )
    .await;
    let mut client = t.client().await;
    for user in 0..10 {
        for n in 0..6 {
            let r = client
                .should_rate_limit(request(&domain, "fixed", &format!("u{user}"), None, false))
                .await
                .unwrap()
                .into_inner();
            let want = if n < 2 { Code::Ok } else { Code::OverLimit };
            assert_eq!(r.overall_code, want as i32, "user {user} call {n}");
        }
    }
    let (_, text) = http_get(t.http, "/metrics").await;
    assert_eq!(metric(&text, "tollgate_over_limit_cache_entries"), 4.0);
    assert_eq!(
        metric(&text, "tollgate_over_limit_cache_evictions_total"),
        6.0
    );
    // Per user: 2 admitted and 1 refused by the store, 3 answered here.
    assert_eq!(metric(&text, "tollgate_over_limit_cache_hits_total"), 30.0);
    assert_eq!(
        metric(&text, "tollgate_over_limit_cache_misses_total"),
        30.0
    );
    t.stop().await;
}

#[tokio::test]
async fn hot_keys_lists_the_heaviest_limiter_first_with_its_share() {
    let domain = unique_domain("hot");
    let rules = rules(&domain, 500);
    // Values in the clear: the operator opted in. Every call reaches the
    // store (leases off), so the shares are the requests'.
    let t = Tollgate::start(
        &[("r.yaml", &rules)],
        &[("debug_show_values", "true"), ("lease", "false")],
    )
    .await;
    let mut client = t.client().await;
    // Before any traffic the report is empty, not an error.
    let (status, body) = http_get(t.debug, "/debug/hotkeys").await;
    assert_eq!(status, 200, "{body}");
    let empty: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(empty["hotKeys"].as_array().unwrap().len(), 0, "{body}");

    // Half the calls on one limiter (500 of its 1000 refused), a tenth on a
    // second, the rest over 400 others: many more than the tracker's
    // counters.
    for i in 0..2000u32 {
        let (key, value) = match i % 10 {
            0 | 2 | 4 | 6 | 8 => ("fixed", "tenant-big".to_string()),
            1 => ("log", "tenant-mid".to_string()),
            _ => ("counter", format!("tenant-{}", i % 400)),
        };
        client
            .should_rate_limit(request(&domain, key, &value, None, false))
            .await
            .unwrap();
    }
    let (status, body) = http_get(t.debug, "/debug/hotkeys").await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    let keys = report["hotKeys"].as_array().unwrap();
    assert!(keys.len() >= 2 && keys.len() <= 20, "{body}");
    let first = &keys[0];
    assert_eq!(first["limiter"]["domain"], domain.as_str());
    assert_eq!(
        first["limiter"]["entries"],
        serde_json::json!([{"key": "fixed", "value": "tenant-big"}])
    );
    assert_eq!(first["limiter"]["algorithm"], "fixed_window");
    assert_eq!(first["limiter"]["limit"], 500);
    let share = first["share"].as_f64().unwrap();
    assert!((share - 0.5).abs() < 0.05, "{body}");
    let over = first["overLimitShare"].as_f64().unwrap();
    assert!((over - 0.5).abs() < 0.05, "{body}");
    assert!(first["rate"].as_f64().unwrap() > 0.0, "{body}");
    let second = &keys[1];
    assert_eq!(
        second["limiter"]["entries"][0]["value"], "tenant-mid",
        "{body}"
    );
    assert!(
        (second["share"].as_f64().unwrap() - 0.1).abs() < 0.05,
        "{body}"
    );
    assert_eq!(second["overLimitShare"].as_f64().unwrap(), 0.0, "{body}");
    t.stop().await;
}

/// The first 16 hex digits of a value's SHA-256, as the debug views show
/// values by default; computed here independently of the server.
fn digest(value: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(value.as_bytes());
    let hex: String = d[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

#[tokio::test]
async fn hot_keys_show_client_values_as_digests_by_default_and_only_on_the_debug_listener() {
    let domain = unique_domain("hotmask");
    let rules = rules(&domain, 500);
    let t = Tollgate::start(&[("r.yaml", &rules)], &[]).await;
    let mut client = t.client().await;
    // Values a client chooses: an API key and a path with a token.
    let secret = "/v1/items?access_token=s3cr3t-token-value";
    for _ in 0..50 {
        client
            .should_rate_limit(request(&domain, "fixed", secret, None, false))
            .await
            .unwrap();
        client
            .should_rate_limit(request(&domain, "log", "api-key-123456", None, false))
            .await
            .unwrap();
    }
    let (status, body) = http_get(t.debug, "/debug/hotkeys").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !body.contains("s3cr3t"),
        "a client value in the clear: {body}"
    );
    assert!(!body.contains("api-key-123456"), "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    let values: Vec<&str> = report["hotKeys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["limiter"]["entries"][0]["value"].as_str().unwrap())
        .collect();
    assert!(values.contains(&digest(secret).as_str()), "{body}");
    assert!(
        values.contains(&digest("api-key-123456").as_str()),
        "{body}"
    );
    // The public listener does not serve the debug views at all.
    for path in ["/debug/hotkeys", "/rlconfig"] {
        let (status, body) = http_get(t.http, path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body.contains("debug listener"), "{path}: {body}");
    }
    t.stop().await;
}
