//! tollgate over real gRPC on loopback, driven by an independent client (the
//! `envoy-types` crate's generated Envoy API), on the embedded store.

mod support;

use support::free_port;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit,
};
use envoy_types::pb::google::protobuf::UInt64Value;
use support::tollgate::{Tollgate, descriptor as desc};
use support::{away_from_an_hour_boundary, wait_past_an_hour_boundary};
use tonic::transport::Channel;

fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

fn limit(rpu: u32, unit: rate_limit::Unit, name: &str) -> Option<RateLimit> {
    Some(RateLimit {
        name: name.into(),
        requests_per_unit: rpu,
        unit: unit as i32,
    })
}

const RULES: &str = r#"
domain: shop
descriptors:
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: fixed_window}
  - key: counter
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window_counter}
  - key: log
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window_log, name: log_limit}
  - key: open
    rate_limit: {unlimited: true}
  - key: trusted
  - key: banned
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota_b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: broad
    rate_limit: {unit: minute, requests_per_unit: 1, name: broad}
  - key: narrow
    rate_limit:
      unit: minute
      requests_per_unit: 100
      replaces: [{name: broad}]
  - key: weighted
    rate_limit: {unit: hour, requests_per_unit: 9500, algorithm: sliding_window_log}
"#;

#[tokio::test]
async fn each_algorithm_counts_down_then_refuses_with_a_reset() {
    let t = Tollgate::start(&[("shop.yaml", RULES)], &[]).await;
    away_from_an_hour_boundary().await;
    for key in ["fixed", "counter", "log"] {
        for remaining in [2, 1, 0] {
            let r = t.ask(req("shop", vec![desc(&[(key, "x")])])).await;
            assert_eq!(r.overall_code, Code::Ok as i32, "{key}");
            assert_eq!(r.statuses[0].limit_remaining, remaining, "{key}");
        }
        let r = t.ask(req("shop", vec![desc(&[(key, "x")])])).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{key}");
        let s = &r.statuses[0];
        assert_eq!(s.code, Code::OverLimit as i32);
        let name = if key == "log" { "log_limit" } else { "" };
        let unit = if key == "fixed" {
            rate_limit::Unit::Hour
        } else {
            rate_limit::Unit::Minute
        };
        assert_eq!(s.current_limit, limit(3, unit, name), "{key}");
        assert_eq!(s.limit_remaining, 0);
        let reset = s
            .duration_until_reset
            .expect("a refused status has a reset");
        // The counter may have to wait into the next bucket: up to 2 windows.
        let most = match key {
            "counter" => 120,
            "fixed" => 3600,
            _ => 60,
        };
        assert!(
            reset.seconds <= most && (reset.seconds > 0 || reset.nanos > 0),
            "{key}: {reset:?}"
        );
    }
    t.stop().await;
}

#[tokio::test]
async fn statuses_follow_request_order_and_the_reference_semantics() {
    let t = Tollgate::start(&[("shop.yaml", RULES)], &[]).await;
    let r = t
        .ask(req(
            "shop",
            vec![
                desc(&[("log", "a")]),
                desc(&[("nothing", "matches")]),
                desc(&[("open", "x")]),
                desc(&[("trusted", "x")]),
                desc(&[("log", "a"), ("too", "deep")]),
            ],
        ))
        .await;
    let log = &r.statuses[0];
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 5);
    assert_eq!(log.code, Code::Ok as i32);
    assert_eq!(
        log.current_limit,
        limit(3, rate_limit::Unit::Minute, "log_limit")
    );
    assert_eq!(log.limit_remaining, 2);
    let no_limit = DescriptorStatus {
        code: Code::Ok as i32,
        ..Default::default()
    };
    assert_eq!(r.statuses[1], no_limit);
    assert_eq!(
        r.statuses[2],
        DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: u32::MAX,
            ..Default::default()
        }
    );
    assert_eq!(r.statuses[3], no_limit);
    assert_eq!(r.statuses[4], no_limit);
    t.stop().await;
}

#[tokio::test]
async fn bad_requests_get_invalid_argument() {
    let t = Tollgate::start(&[("shop.yaml", RULES)], &[]).await;
    let mut c = t.client().await;
    let e = c
        .should_rate_limit(req("", vec![desc(&[("k", "v")])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("domain"), "{}", e.message());
    let e = c.should_rate_limit(req("shop", vec![])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("descriptors"), "{}", e.message());
    let mut bad = desc(&[("k", "v")]);
    bad.limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: 0,
    });
    let e = c
        .should_rate_limit(req("shop", vec![bad]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("unit"), "{}", e.message());
    // The service still answers afterwards.
    let r = t.ask(req("shop", vec![desc(&[("log", "z")])])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    t.stop().await;
}

#[tokio::test]
async fn unknown_domain_is_ok_without_limits() {
    let t = Tollgate::start(&[("shop.yaml", RULES)], &[]).await;
    let r = t
        .ask(req(
            "elsewhere",
            vec![desc(&[("log", "a")]), desc(&[("fixed", "b")])],
        ))
        .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    for s in &r.statuses {
        assert_eq!(s.code, Code::Ok as i32);
        assert_eq!(s.current_limit, None);
    }
    t.stop().await;
}

#[tokio::test]
async fn zero_limit_shadow_quota_replaces_and_override() {
    let t = Tollgate::start(&[("shop.yaml", RULES)], &[]).await;
    // requests_per_unit 0 always rejects.
    let r = t.ask(req("shop", vec![desc(&[("banned", "x")])])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(
        r.statuses[0].current_limit,
        limit(0, rate_limit::Unit::Hour, "")
    );

    // Shadow: counted and over, but answered OK.
    for _ in 0..3 {
        let r = t.ask(req("shop", vec![desc(&[("shadow", "x")])])).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses[0].code, Code::Ok as i32);
    }
    assert_eq!(
        t.ask(req("shop", vec![desc(&[("shadow", "x")])]))
            .await
            .statuses[0]
            .limit_remaining,
        0
    );

    // Quota mode: over only when every quota descriptor is over.
    let quota = || {
        req(
            "shop",
            vec![desc(&[("quota_a", "q")]), desc(&[("quota_b", "q")])],
        )
    };
    assert_eq!(t.ask(quota()).await.overall_code, Code::Ok as i32);
    let r = t.ask(quota()).await; // a is over, b has 1 left
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.overall_code, Code::Ok as i32);
    let r = t.ask(quota()).await; // both over
    assert_eq!(r.overall_code, Code::OverLimit as i32);

    // `narrow` replaces `broad` in the same request.
    for _ in 0..3 {
        let r = t
            .ask(req(
                "shop",
                vec![desc(&[("broad", "x")]), desc(&[("narrow", "x")])],
            ))
            .await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses[0].current_limit, None);
    }
    // Alone, `broad` applies.
    let alone = req("shop", vec![desc(&[("broad", "y")])]);
    assert_eq!(t.ask(alone.clone()).await.overall_code, Code::Ok as i32);
    assert_eq!(t.ask(alone).await.overall_code, Code::OverLimit as i32);

    // A request-supplied limit wins when the domain exists.
    let mut o = desc(&[("anything", "x")]);
    o.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 1, // SECOND
    });
    let r = t.ask(req("shop", vec![o.clone()])).await;
    assert_eq!(
        r.statuses[0].current_limit,
        limit(1, rate_limit::Unit::Second, "")
    );
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(
        t.ask(req("shop", vec![o])).await.overall_code,
        Code::OverLimit as i32
    );
    t.stop().await;
}

/// An override's limiter is the descriptor's entries under the default
/// algorithm and the override's unit, as a rule's limit of that
/// algorithm and unit is: the limit a request names is what it is
/// decided against, not part of what it counts on.
#[tokio::test]
async fn an_override_counts_with_a_rule_of_its_algorithm_and_unit() {
    const PLANS: &str = "domain: plans\ndescriptors:\n  - key: plan\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";
    let t = Tollgate::start(&[("plans.yaml", PLANS)], &[]).await;
    away_from_an_hour_boundary().await;
    let plain = || req("plans", vec![desc(&[("plan", "gold")])]);
    let own = |n: u32, unit: i32| {
        let mut d = desc(&[("plan", "gold")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: n,
            unit,
        });
        req("plans", vec![d])
    };
    const MINUTE: i32 = 2;
    const HOUR: i32 = 3;
    for left in [2, 1] {
        assert_eq!(t.ask(plain()).await.statuses[0].limit_remaining, left);
    }
    // The rule's two hits count against an override of 5 an hour, and
    // that one against an override of 10.
    let r = t.ask(own(5, HOUR)).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 2)
    );
    let r = t.ask(own(10, HOUR)).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 6)
    );
    // Four counted: the rule's limit of 3 is passed.
    assert_eq!(t.ask(plain()).await.overall_code, Code::OverLimit as i32);
    // Another unit is another limiter.
    let r = t.ask(own(2, MINUTE)).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 1)
    );
    t.stop().await;
}

#[tokio::test]
async fn hits_addend_weights_checks_and_gives_back() {
    let t = Tollgate::start(&[("shop.yaml", RULES)], &[]).await;
    let weighted = |hits: Option<u64>, negative: bool, request_hits: u32| {
        let mut d = desc(&[("weighted", "job")]);
        d.hits_addend = hits.map(|value| UInt64Value { value });
        d.is_negative_hits = negative;
        RateLimitRequest {
            domain: "shop".into(),
            descriptors: vec![d],
            hits_addend: request_hits,
        }
    };
    // Request-level cost 100 against 9500.
    let r = t.ask(weighted(None, false, 100)).await;
    assert_eq!(r.statuses[0].limit_remaining, 9400);
    // Request hits_addend 0 counts as 1.
    assert_eq!(
        t.ask(weighted(None, false, 0)).await.statuses[0].limit_remaining,
        9399
    );
    // A per-descriptor hits_addend wins, even 0 (check only).
    assert_eq!(
        t.ask(weighted(Some(0), false, 500)).await.statuses[0].limit_remaining,
        9399
    );
    assert_eq!(
        t.ask(weighted(Some(399), false, 500)).await.statuses[0].limit_remaining,
        9000
    );
    // A cost above the limit never passes and costs nothing.
    let r = t.ask(weighted(Some(9501), false, 0)).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].limit_remaining, 9000);
    // Giving hits back answers OK and restores the budget.
    let r = t.ask(weighted(Some(1000), true, 0)).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 9500);
    t.stop().await;
}

#[tokio::test]
async fn global_shadow_mode_and_rate_limit_headers() {
    let t = Tollgate::start(
        &[("shop.yaml", RULES)],
        &[
            ("shadow_mode", "true"),
            ("rate_limit_headers", "true"),
            ("header_reset", "X-RateLimit-Reset"),
        ],
    )
    .await;
    away_from_an_hour_boundary().await;
    let two = || req("shop", vec![desc(&[("log", "h")]), desc(&[("fixed", "h")])]);
    t.ask(two()).await;
    t.ask(two()).await;
    t.ask(two()).await;
    let r = t.ask(two()).await;
    // Both are over, but global shadow mode answers OK overall.
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.overall_code, Code::Ok as i32);
    let headers: HashMap<_, _> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert_eq!(headers["RateLimit-Limit"], "3, 3;w=60");
    assert_eq!(headers["RateLimit-Remaining"], "0");
    let reset: u64 = headers["X-RateLimit-Reset"].parse().unwrap();
    assert!((1..=60).contains(&reset), "{reset}");
    t.stop().await;
}

#[tokio::test]
async fn health_reflection_and_http_healthcheck() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let t = Tollgate::start(&[("shop.yaml", RULES)], &[]).await;
    let channel = Channel::from_shared(format!("http://{}", t.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    for service in ["", "ratelimit"] {
        let mut status = None;
        for _ in 0..50 {
            let s = health
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner()
                .status;
            status = Some(s);
            if s == ServingStatus::Serving as i32 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(status, Some(ServingStatus::Serving as i32), "{service:?}");
    }

    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel);
    let outbound = tokio_stream::iter(vec![ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }]);
    let mut inbound = reflection
        .server_reflection_info(outbound)
        .await
        .unwrap()
        .into_inner();
    let msg = inbound.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
        panic!("unexpected reflection answer: {msg:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService"),
        "{names:?}"
    );

    let body = http_get(t.http, "/healthcheck").await;
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.ends_with("OK\n"), "{body}");

    let body = http_get(t.debug, "/rlconfig").await;
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    for line in [
        "shop.log: 3/minute sliding_window_log name=log_limit lease=true (shop.yaml:",
        "shop.open: unlimited (shop.yaml:",
        "shop.trusted: no limit (whitelist) (shop.yaml:",
        "shop.shadow: 1/minute sliding_window_counter shadow_mode lease=true (shop.yaml:",
        "shop.narrow: 100/minute sliding_window_counter replaces=broad lease=true (shop.yaml:",
    ] {
        assert!(body.contains(line), "{line:?} missing from:\n{body}");
    }
    t.stop().await;
}

/// A minimal HTTP/1.1 GET over a raw socket: enough for a health check.
async fn http_get(addr: SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    out
}

#[tokio::test]
async fn rules_reload_and_a_bad_reload_keeps_the_old_rules() {
    let t = Tollgate::start(&[("shop.yaml", RULES)], &[]).await;
    let path = t.rules.path().join("shop.yaml");
    let ask_log = || req("shop", vec![desc(&[("log", "reload")])]);
    assert_eq!(
        t.ask(ask_log()).await.statuses[0].current_limit,
        limit(3, rate_limit::Unit::Minute, "log_limit")
    );
    // A good edit takes effect.
    std::fs::write(
        &path,
        RULES.replace(
            "requests_per_unit: 3, algorithm: sliding_window_log",
            "requests_per_unit: 7, algorithm: sliding_window_log",
        ),
    )
    .unwrap();
    wait_for_limit(&t, 7).await;
    assert!(reload_counts(&t).await.0 >= 1, "the good edit was counted");
    // A broken file is refused; the last good rules stay. The refusal is
    // waited for first, so the check below follows the bad edit.
    std::fs::write(&path, "domain: shop\ndescriptors:\n  - key: log\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    wait_for_refusals(&t, 1).await;
    assert_eq!(
        t.ask(ask_log()).await.statuses[0].current_limit,
        limit(7, rate_limit::Unit::Minute, "log_limit")
    );
    // A log limit above max_log_limit is refused on reload as at startup.
    std::fs::write(
        &path,
        RULES.replace(
            "requests_per_unit: 3, algorithm: sliding_window_log",
            "requests_per_unit: 10001, algorithm: sliding_window_log",
        ),
    )
    .unwrap();
    wait_for_refusals(&t, 2).await;
    assert_eq!(
        t.ask(ask_log()).await.statuses[0].current_limit,
        limit(7, rate_limit::Unit::Minute, "log_limit")
    );
    t.stop().await;
}

/// The reload counts `/rlconfig` reports: (loaded, refused).
async fn reload_counts(t: &Tollgate) -> (u64, u64) {
    let response = http_get(t.debug, "/rlconfig").await;
    let header = |name: &str| -> u64 {
        response
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} header in:\n{response}"))
            .trim()
            .parse()
            .unwrap()
    };
    (header("x-rules-reloaded"), header("x-rules-refused"))
}

async fn wait_for_refusals(t: &Tollgate, n: u64) {
    for _ in 0..200 {
        if reload_counts(t).await.1 >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the watcher never refused edit number {n}");
}

/// A sliding-window log limit above `max_log_limit` (or one inheriting the
/// log from `default_algorithm`) stops startup with file and line.
#[tokio::test]
async fn startup_refuses_a_log_limit_above_max_log_limit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("big.yaml"),
        "domain: big\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 500}\n",
    )
    .unwrap();
    let build = |extra: &[(&str, &str)]| {
        let mut overrides = vec![("rules_dir".to_string(), dir.path().display().to_string())];
        overrides.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let settings = tollgate::settings::Settings::load(&tollgate::settings::Sources {
            overrides,
            ..Default::default()
        })
        .unwrap();
        async move {
            tollgate::server::build_engine(
                &settings,
                std::sync::Arc::new(tollgate::clock::SystemClock),
            )
            .await
            .map(|_| ())
        }
    };
    build(&[("max_log_limit", "100")])
        .await
        .expect("the counter is not capped");
    build(&[("default_algorithm", "sliding_window_log")])
        .await
        .expect("500 is within 10000");
    let e = build(&[
        ("default_algorithm", "sliding_window_log"),
        ("max_log_limit", "100"),
    ])
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(
            "big.yaml:4: descriptors[0].rate_limit.requests_per_unit: sliding_window_log limit 500"
        ),
        "{e}"
    );
    assert!(e.contains("sliding_window_counter"), "{e}");
}

/// `memory.max_limiters` bounds the embedded store behind the gRPC API: with
/// room for 4 limiters, a refused user is forgotten once 100 others came by
/// (and admitted again); with the default room, it stays refused.
#[tokio::test]
async fn the_embedded_store_forgets_limiters_beyond_its_cap() {
    const CAP_RULES: &str = "domain: cap\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: sliding_window_log}\n";
    for (cap, forgotten) in [(Some("4"), true), (None, false)] {
        // Without the over-limit cache, which would keep refusing "hot"
        // until its reset whatever the store forgot.
        let mut settings = vec![("over_limit_cache.enabled", "false")];
        settings.extend(cap.map(|c| ("memory.max_limiters", c)));
        let t = Tollgate::start(&[("cap.yaml", CAP_RULES)], &settings).await;
        let user = |name: &str| req("cap", vec![desc(&[("user", name)])]);
        assert_eq!(t.ask(user("hot")).await.overall_code, Code::Ok as i32);
        assert_eq!(
            t.ask(user("hot")).await.overall_code,
            Code::OverLimit as i32
        );
        for i in 0..100 {
            let r = t.ask(user(&format!("other{i}"))).await;
            assert_eq!(r.overall_code, Code::Ok as i32, "other{i}");
        }
        let want = if forgotten { Code::Ok } else { Code::OverLimit };
        assert_eq!(
            t.ask(user("hot")).await.overall_code,
            want as i32,
            "cap {cap:?}"
        );
        t.stop().await;
    }
}

async fn wait_for_limit(t: &Tollgate, rpu: u32) {
    for _ in 0..100 {
        let r = t.ask(req("shop", vec![desc(&[("log", "reload")])])).await;
        if r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
            == Some(rpu)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the new limit {rpu} never applied");
}

fn tollgate_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tollgate"))
}

/// `validate` checks log limits against the same settings `serve` reads:
/// flags, then `TOLLGATE_*`, then the settings file, then the defaults.
#[test]
fn validate_checks_log_limits_against_the_settings() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("logs.yaml"),
        "domain: logs\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 500, algorithm: sliding_window_log}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 20000}\n",
    )
    .unwrap();
    // Not in the rules directory: it would be read as a rule file.
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("settings.yaml");
    std::fs::write(&config, "max_log_limit: 100\n").unwrap();
    let rules = dir.path().display().to_string();
    let validate = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(tollgate_bin())
            .arg("validate")
            .arg(&rules)
            .args(args)
            .env_clear()
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Defaults: 500 is within 10000 and `b` runs the counter.
    let (code, stderr) = validate(&[], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    // `b` inherits the log from the default algorithm.
    let (code, stderr) = validate(&["--default-algorithm", "sliding_window_log"], &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("logs.yaml:6: descriptors[1].rate_limit.requests_per_unit: sliding_window_log limit 20000 (the default_algorithm"), "{stderr}");
    assert!(stderr.contains("sliding_window_counter"), "{stderr}");
    assert!(!stderr.contains("logs.yaml:4"), "{stderr}");
    // The cap from a flag, from the environment, from the settings file.
    for (args, env) in [
        (vec!["--max-log-limit", "499"], vec![]),
        (vec![], vec![("TOLLGATE_MAX_LOG_LIMIT", "499")]),
        (vec!["--config", config.to_str().unwrap()], vec![]),
    ] {
        let (code, stderr) = validate(&args, &env);
        assert_eq!(code, Some(1), "{args:?} {env:?}: {stderr}");
        assert!(stderr.contains("logs.yaml:4: descriptors[0].rate_limit.requests_per_unit: sliding_window_log limit 500 is above max_log_limit"), "{stderr}");
    }
    // Bad settings are a usage error, as for serve.
    let (code, stderr) = validate(&["--max-log-limit", "lots"], &[]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("max_log_limit"), "{stderr}");
}

#[test]
fn validate_prints_every_error_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("broken.yaml"),
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: b\n    colour: red\n",
    )
    .unwrap();
    let out = Command::new(tollgate_bin())
        .args(["validate", &dir.path().display().to_string()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("broken.yaml:4"), "{stderr}");
    assert!(stderr.contains("fortnight"), "{stderr}");
    assert!(stderr.contains("broken.yaml:6"), "{stderr}");
    assert!(stderr.contains("colour"), "{stderr}");

    let ok = Command::new(tollgate_bin())
        .args([
            "validate",
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/rules")
                .display()
                .to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

#[test]
fn bad_settings_exit_64_before_binding() {
    let out = Command::new(tollgate_bin())
        .args(["serve", "--grpc-addr", "not-an-address"])
        .env("TOLLGATE_HTTP_ADDR", "127.0.0.1:0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("grpc_addr=not-an-address is not valid"),
        "{stderr}"
    );
}

/// The README's walkthrough: `tollgate serve` as a process, then
/// `tollgate check` until OVER_LIMIT, for each algorithm.
#[test]
fn serve_and_check_binaries() {
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("shop.yaml"), RULES).unwrap();
    let grpc = free_port();
    let child = Command::new(tollgate_bin())
        .args([
            "serve",
            "--rules",
            &rules.path().display().to_string(),
            "--grpc-addr",
            &format!("127.0.0.1:{grpc}"),
            "--http-addr",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .env("TOLLGATE_SHUTDOWN_DRAIN_MS", "0")
        // Tests run side by side: no fixed debug port.
        .env("TOLLGATE_DEBUG_ADDR", "127.0.0.1:0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut guard = Kill(child);
    let check = |key: &str| {
        Command::new(tollgate_bin())
            .args([
                "check",
                "--addr",
                &format!("127.0.0.1:{grpc}"),
                "--domain",
                "shop",
                "--descriptor",
                &format!("{key}=cli"),
            ])
            .output()
            .unwrap()
    };
    // Wait until it serves.
    let mut up = false;
    for _ in 0..100 {
        if check("trusted").status.success() {
            up = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(up, "tollgate serve did not come up");
    std::thread::sleep(wait_past_an_hour_boundary());
    for key in ["fixed", "counter", "log"] {
        for left in [2, 1, 0] {
            let out = String::from_utf8(check(key).stdout).unwrap();
            assert!(out.starts_with("overall: OK"), "{key}: {out}");
            assert!(out.contains(&format!("remaining={left}")), "{key}: {out}");
        }
        let out = String::from_utf8(check(key).stdout).unwrap();
        assert!(out.starts_with("overall: OVER_LIMIT"), "{key}: {out}");
        let unit = if key == "fixed" { "hour" } else { "minute" };
        assert!(out.contains(&format!("limit=3/{unit}")), "{key}: {out}");
        assert!(out.contains("remaining=0 reset="), "{key}: {out}");
    }
    // SIGTERM: a graceful stop.
    let child = &mut guard.0;
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let mut done = false;
    for _ in 0..100 {
        if let Ok(Some(status)) = child.try_wait() {
            assert!(status.success(), "{status}");
            done = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(done, "tollgate did not stop on SIGTERM");
}
