//! Parity with the reference service's rule files: its own fixtures get
//! the verdict its tests expect from `tollgate validate`, and the keys it
//! added (`share_threshold`, `value_to_metric`, `metadata`,
//! `merge_domain_config`, `unit_multiplier`, response dynamic metadata)
//! behave as it documents them, over real gRPC on the embedded store and
//! on Redis.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::value::Kind;
use support::redis::{RedisServer, require_redis};
use support::tollgate::{Tollgate, descriptor as desc};
use support::{http_get, unique_domain};

fn reference_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/reference")
        .join(case)
}

/// What the reference's tests expect of each case.
enum Verdict {
    Accepted,
    /// Refused; the error names this (tollgate's wording of the same
    /// reason the reference gives).
    Refused(&'static str),
}

#[test]
fn reference_fixtures_get_the_reference_verdict() {
    use Verdict::*;
    // (case, merge_domain_config, verdict, the reference's reason)
    let cases: &[(&str, bool, Verdict)] = &[
        ("basic_config", false, Accepted),
        // "duplicate descriptor composite key 'test-domain.key1_value1'"
        ("duplicate_key", false, Refused("duplicate descriptor")),
        // "duplicate domain 'test-domain' in config file"
        ("duplicate_domain", false, Refused("duplicate domain")),
        // MERGE_DOMAIN_CONFIG: the two halves make one domain...
        ("merge_domain", true, Accepted),
        // ...and without it they are a duplicate domain.
        ("merge_domain", false, Refused("duplicate domain")),
        // "duplicate descriptor composite key" across merged files.
        ("merge_domain_clash", true, Refused("duplicate descriptor")),
        ("metadata", false, Accepted),
        // "config error, unknown key 'ratelimit'"
        (
            "misspelled_key",
            false,
            Refused("unknown key \"ratelimit\""),
        ),
        // "config error, unknown key 'requestsperunit'"
        (
            "misspelled_key2",
            false,
            Refused("unknown key \"requestsperunit\""),
        ),
        ("multiple_domains", false, Accepted),
        // "yaml file contains list of type other than map: a"
        (
            "non_map_list",
            false,
            Refused("expected a descriptor mapping"),
        ),
        // "key is not of type string: 0.25" (a number key is no known key)
        ("non_string_key", false, Refused("unknown key \"0.25\"")),
        // "should not have an empty replaces entry"
        ("replaces_empty", false, Refused("empty replaces name")),
        // "replaces should not contain name of same descriptor"
        ("replaces_self", false, Refused("cannot replace itself")),
        ("shadowmode_config", false, Accepted),
        ("share_threshold", false, Accepted),
        // "share_threshold can only be used with wildcard values"
        (
            "share_threshold_without_wildcard",
            false,
            Refused("share_threshold applies only to a wildcard value"),
        ),
        (
            "share_threshold_without_value",
            false,
            Refused("share_threshold applies only to a wildcard value"),
        ),
        // "should not specify rate limit unit when unlimited"
        (
            "unlimited_with_unit",
            false,
            Refused("must not be set together with unlimited"),
        ),
        ("wildcard", false, Accepted),
        ("value_to_metric", false, Accepted),
        // "config file cannot have empty domain"
        ("empty_domain", false, Refused("empty domain")),
        // "descriptor has empty key"
        ("empty_key", false, Refused("empty key")),
        // "invalid rate limit unit 'foo'"
        ("bad_limit_unit", false, Refused("foo")),
        // "error loading config file: yaml: ..."
        ("bad_yaml", false, Refused("invalid YAML")),
        ("integration", false, Accepted),
        // The reference's reload test with MERGE_DOMAIN_CONFIG: a second
        // file of domain `basic` merges in...
        ("existing_domain_reload", true, Accepted),
        // ...and without it is a duplicate domain.
        ("existing_domain_reload", false, Refused("duplicate domain")),
        ("examples", false, Accepted),
        ("unit_multiplier", false, Accepted),
        // "invalid unit multiplier of 0"
        (
            "zero_unit_multiplier",
            false,
            Refused("invalid unit multiplier of 0"),
        ),
    ];
    let listed: Vec<&str> = cases.iter().map(|c| c.0).collect();
    let mut on_disk: Vec<String> = std::fs::read_dir(reference_dir(""))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        sorted, on_disk,
        "every fixture has a verdict, and only those"
    );

    for (case, merge, verdict) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("validate")
            .arg(reference_dir(case))
            .env_clear()
            .env("TOLLGATE_MERGE_DOMAIN_CONFIG", merge.to_string())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        match verdict {
            Accepted => assert_eq!(out.status.code(), Some(0), "{case}: {stderr}"),
            Refused(why) => {
                assert_eq!(out.status.code(), Some(1), "{case}: {stderr}");
                assert!(stderr.contains(why), "{case}: expected {why:?} in {stderr}");
                // Every error names its file and line.
                assert!(stderr.contains(".yaml:"), "{case}: {stderr}");
            }
        }
    }
}

/// The error of a refused `share_threshold` points at the key, with the
/// path and the value.
#[test]
fn share_threshold_without_a_wildcard_names_file_line_and_path() {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("validate")
        .arg(reference_dir("share_threshold_without_wildcard"))
        .env_clear()
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "share_threshold_without_wildcard.yaml:6: descriptors[0].share_threshold: \
             share_threshold applies only to a wildcard value"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("\"files/readme\""), "{stderr}");
}

/// The reference's `unit_multiplier` case read as its test reads it: key1
/// is 20 per 5 minutes, key2 (no multiplier) 25 per minute, here through
/// the library and on `/rlconfig` of a running server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unit_multiplier_fixture_gives_the_reference_windows() {
    use tollgate::limit::{Unit, Window};
    use tollgate::rules::{LimitSpec, LoadOptions, load_dir};
    let set = load_dir(&reference_dir("unit_multiplier"), &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let limit = |key: &str| {
        let entries = vec![(key.to_string(), String::new())];
        set.find("test-domain", &entries).unwrap().limit.clone()
    };
    assert_eq!(
        limit("key1"),
        LimitSpec::PerUnit {
            requests_per_unit: 20,
            window: Window::new(Unit::Minute, 5).unwrap()
        }
    );
    assert_eq!(
        limit("key2"),
        LimitSpec::PerUnit {
            requests_per_unit: 25,
            window: Window::of(Unit::Minute)
        }
    );

    let text =
        std::fs::read_to_string(reference_dir("unit_multiplier").join("unit_multiplier.yaml"))
            .unwrap();
    let t = Tollgate::start(&[("unit_multiplier.yaml", &text)], &[]).await;
    let (status, json) = http_get(t.debug, "/rlconfig?format=json").await;
    assert_eq!(status, 200, "{json}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rules = json["rules"].as_array().unwrap();
    let rule = |name: &str| rules.iter().find(|r| r["rule"] == name).unwrap().clone();
    let key1 = rule("key1");
    assert_eq!(
        (
            &key1["requestsPerUnit"],
            &key1["unit"],
            &key1["unitMultiplier"],
            &key1["windowSeconds"]
        ),
        (&20.into(), &"minute".into(), &5.into(), &300.into()),
        "{key1}"
    );
    let key2 = rule("key2");
    assert_eq!(
        (
            &key2["unit"],
            &key2["unitMultiplier"],
            &key2["windowSeconds"]
        ),
        (&"minute".into(), &1.into(), &60.into()),
        "{key2}"
    );
    let (_, text) = http_get(t.debug, "/rlconfig").await;
    assert!(text.contains("test-domain.key1: 20/5 minutes "), "{text}");
    t.stop().await;
}

/// Waits until the wall clock is early in an even second: the start of a
/// 2-second fixed window (Redis runs on this machine's clock).
async fn early_in_an_even_second() {
    let into = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        % 2_000_000;
    if into > 250_000 {
        tokio::time::sleep(Duration::from_micros((2_010_000 - into) as u64)).await;
    }
}

/// 3 per 2 seconds (`unit: second, unit_multiplier: 2`) over gRPC, for
/// every algorithm at once, starting early in an even second: the 4th call
/// is OVER_LIMIT with the reset a 2-second window gives; 1.2 s later a
/// 1-second window would have admitted again, this one still refuses
/// (the bucket, refilled 1.5 a second, has one token again); 3.1 s after
/// the start every algorithm admits again. `current_limit` says SECOND
/// (Envoy's unit: its protocol has no multiplier).
async fn two_second_windows(store: &[(&str, &str)]) -> Tollgate {
    let domain = unique_domain("two-seconds");
    let mut rules = format!("domain: {domain}\ndescriptors:\n");
    for algorithm in ALGORITHMS {
        rules.push_str(&format!(
            "  - key: {algorithm}\n    rate_limit:\n      unit: second\n      \
             unit_multiplier: 2\n      requests_per_unit: 3\n      algorithm: {algorithm}\n"
        ));
    }
    let server = Tollgate::start(&[("w.yaml", &rules)], store).await;
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let t = &server;
    let domain = domain.as_str();
    early_in_an_even_second().await;
    let start = tokio::time::Instant::now();
    // The fixed window ends this long after `start` (the log's first hit
    // leaves later, the counter later still).
    let into = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        % 2_000_000;
    let window_end = start + Duration::from_micros((2_000_000 - into) as u64);
    // The counter's buckets start at an offset of the descriptor: its
    // value is one whose buckets start within 20 ms before an even
    // second, so that its run is the one an aligned counter makes.
    let window = tollgate::limit::Window::new(tollgate::limit::Unit::Second, 2)
        .unwrap()
        .staggered();
    let counter_value = (0..)
        .map(|i| format!("x{i}"))
        .find(|v| {
            let e = [("sliding_window_counter".to_string(), v.clone())];
            tollgate::limit::algorithms::sliding_counter::phase(domain, &e, window) < 20_000
        })
        .unwrap();
    let counter_value = counter_value.as_str();
    let runs = ALGORITHMS.iter().map(|&algorithm| async move {
        let value = match algorithm {
            "sliding_window_counter" => counter_value,
            _ => "x",
        };
        let ask = || t.ask(req(domain, &[(algorithm, value)]));
        for _ in 0..3 {
            assert_eq!(ask().await.overall_code, ok, "{algorithm}");
        }
        let r = ask().await;
        assert_eq!(r.overall_code, over, "{algorithm}");
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit),
            (3, envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit::Second as i32),
            "{algorithm}"
        );
        let reset = s.duration_until_reset.as_ref().unwrap();
        let reset = Duration::new(reset.seconds as u64, reset.nanos as u32);
        let (least, most) = match algorithm {
            "fixed_window" | "sliding_window_log" => (1_500, 2_000),
            "sliding_window_counter" => (2_180, 2_667),
            _ => (550, 667),
        };
        // The lower bounds hold for four calls made at once; on a busy
        // machine the calls take longer, and every reset is that much
        // nearer (a 1-second window would still be at most half these).
        let least = Duration::from_millis(least).saturating_sub(start.elapsed());
        assert!(
            (least..=Duration::from_millis(most)).contains(&reset),
            "{algorithm}: reset {reset:?}, at least {least:?}"
        );
        tokio::time::sleep_until(start + Duration::from_millis(1_200)).await;
        let expected = if algorithm == "token_bucket" { ok } else { over };
        let code = ask().await.overall_code;
        // A busy machine may answer that call after the window's end,
        // where it proves nothing: checked when it came back before.
        let in_time = tokio::time::Instant::now() + Duration::from_millis(50) < window_end;
        if expected == ok || in_time {
            assert_eq!(code, expected, "{algorithm} at 1.2 s");
        } else {
            eprintln!("{algorithm}: the call at 1.2 s came back past the window's end");
        }
        tokio::time::sleep_until(start + Duration::from_millis(3_100)).await;
        let r = ask().await;
        assert_eq!(r.overall_code, ok, "{algorithm} at 3.1 s");
    });
    futures_util::future::join_all(runs).await;
    server
}

const ALGORITHMS: [&str; 4] = [
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_second_windows_on_the_embedded_store() {
    two_second_windows(&[]).await.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_second_windows_on_redis() {
    require_redis();
    let redis = RedisServer::start();
    let t = two_second_windows(&[("store", &redis.url())]).await;
    // The fixed window's key names its 2-second window.
    let keys = redis.cli(&["--scan", "--pattern", "*:f2:*"]);
    assert_eq!(keys.lines().count(), 1, "{keys}");
    t.stop().await;
}

fn shared_rules(domain: &str) -> String {
    format!(
        "domain: {domain}
descriptors:
  - key: files
    value: files/special
    rate_limit: {{unit: hour, requests_per_unit: 5}}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {{unit: hour, requests_per_unit: 2}}
  - key: docs
    value: docs/*
    rate_limit: {{unit: hour, requests_per_unit: 2}}
  - key: user
    value: u*
    share_threshold: true
    descriptors:
      - key: action
        rate_limit: {{unit: hour, requests_per_unit: 2}}
"
    )
}

fn req(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![desc(entries)],
        hits_addend: 0,
    }
}

/// Three values under a shared wildcard with a limit of 2: OK, OK,
/// OVER_LIMIT; an explicit value beside it keeps its own counter; a
/// wildcard without `share_threshold` counts each value apart; a shared
/// wildcard above the limit's level shares it too.
async fn shares_one_counter(store: &[(&str, &str)]) {
    support::away_from_an_hour_boundary().await;
    let domain = unique_domain("share");
    let t = Tollgate::start(&[("s.yaml", &shared_rules(&domain))], store).await;
    let mut codes = Vec::new();
    for v in ["files/a", "files/b", "files/c"] {
        codes.push(t.ask(req(&domain, &[("files", v)])).await.overall_code);
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, vec![ok, ok, over]);
    // The explicit value wins over the wildcard, on its own counter.
    for _ in 0..5 {
        let r = t.ask(req(&domain, &[("files", "files/special")])).await;
        assert_eq!(r.overall_code, ok);
        assert_eq!(
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            5
        );
    }
    let r = t.ask(req(&domain, &[("files", "files/special")])).await;
    assert_eq!(r.overall_code, over);
    // Without share_threshold, each value has its own counter.
    for v in ["docs/a", "docs/b", "docs/c", "docs/a"] {
        assert_eq!(
            t.ask(req(&domain, &[("docs", v)])).await.overall_code,
            ok,
            "{v}"
        );
    }
    // A shared wildcard on the first level, the limit on the second.
    let mut codes = Vec::new();
    for u in ["u1", "u2", "u3"] {
        codes.push(
            t.ask(req(&domain, &[("user", u), ("action", "read")]))
                .await
                .overall_code,
        );
    }
    assert_eq!(codes, vec![ok, ok, over]);
    // A value sent as the pattern itself is one more value of it, no more.
    let r = t.ask(req(&domain, &[("files", "files/*")])).await;
    assert_eq!(r.overall_code, over);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_shares_one_counter_on_the_embedded_store() {
    shares_one_counter(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_shares_one_counter_on_redis() {
    require_redis();
    let redis = RedisServer::start();
    shares_one_counter(&[("store", &redis.url())]).await;
    // One limiter for the three values: its key names the pattern.
    let keys = redis.cli(&["--scan", "--pattern", "*files*"]);
    assert_eq!(
        keys.lines().filter(|k| k.contains("files=")).count(),
        2,
        "{keys}"
    );
}

async fn json_post(addr: std::net::SocketAddr, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /json HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_string())
}

fn sample(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `value_to_metric` names runtime values where the rule has none, as the
/// reference names its metric keys, within the `detailed_metric` cap; the
/// rule's own series counts every hit; `metadata` reaches `/rlconfig`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_series_and_metadata_on_rlconfig() {
    let rules = "domain: vtm
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: hour, requests_per_unit: 100}
            metadata:
              team: payments
              limits: {tier: 2, burst: true}
  - key: wild
    value: foo*
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: shared
    value: bar*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
";
    let t = Tollgate::start(
        &[("vtm.yaml", rules)],
        &[("metrics.detailed_max_series", "3")],
    )
    .await;
    let calls: &[&[(&str, &str)]] = &[
        &[
            ("route", "api"),
            ("http_method", "GET"),
            ("subject_id", "1"),
        ],
        &[
            ("route", "api"),
            ("http_method", "GET"),
            ("subject_id", "2"),
        ],
        &[
            ("route", "web"),
            ("http_method", "POST"),
            ("subject_id", "3"),
        ],
        &[("wild", "foo1")],
        &[("shared", "bar1")],
        &[("shared", "bar2")],
    ];
    for entries in calls {
        assert_eq!(
            t.ask(req("vtm", entries)).await.overall_code,
            Code::Ok as i32
        );
    }
    for n in 0..5 {
        t.ask(req(
            "vtm",
            &[
                ("route", &format!("r{n}")),
                ("http_method", "GET"),
                ("subject_id", "9"),
            ],
        ))
        .await;
    }
    let (status, page) = http_get(t.http, "/metrics").await;
    assert_eq!(status, 200);
    let hits = "tollgate_rule_detailed_hits_total";
    let rule = "route.http_method.subject_id";
    assert_eq!(
        sample(
            &page,
            hits,
            &[
                ("rule", rule),
                ("descriptor", "route_api.http_method_GET.subject_id")
            ]
        ),
        Some(2.0),
        "{page}"
    );
    assert_eq!(
        sample(
            &page,
            hits,
            &[
                ("rule", rule),
                ("descriptor", "route_web.http_method_POST.subject_id")
            ]
        ),
        Some(1.0)
    );
    // The cap (3 series), then the overflow.
    assert_eq!(
        sample(&page, hits, &[("rule", rule), ("descriptor", "_overflow")]),
        Some(4.0)
    );
    assert_eq!(
        sample(&page, "tollgate_rule_hits_total", &[("rule", rule)]),
        Some(8.0)
    );
    // A wildcard with value_to_metric: the whole runtime value.
    assert_eq!(
        sample(
            &page,
            hits,
            &[("rule", "wild_foo*"), ("descriptor", "wild_foo1")]
        ),
        Some(1.0)
    );
    // share_threshold wins: the pattern, one series for both values.
    assert_eq!(
        sample(
            &page,
            hits,
            &[("rule", "shared_bar*"), ("descriptor", "shared_bar*")]
        ),
        Some(2.0)
    );

    let (status, json) = http_get(t.debug, "/rlconfig?format=json").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let found = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == rule)
        .unwrap();
    assert_eq!(
        found["metadata"],
        serde_json::json!({"team": "payments", "limits": {"tier": 2, "burst": true}})
    );
    assert_eq!(found["valueToMetric"], true);
    let shared = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rule"] == "shared_bar*")
        .unwrap();
    assert_eq!(shared["shareThreshold"], true);
    t.stop().await;
}

/// With `response_dynamic_metadata`, answers carry the domain, the
/// entries and the merged `metadata` of the rules that answered OK; off
/// (the default), none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_dynamic_metadata_carries_the_matched_rules_metadata() {
    support::away_from_an_hour_boundary().await;
    let rules = "domain: md
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 1}
    metadata: {name: service_a, shared: {x: 1}}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 10}
    metadata: {name: service_b, shared: {x: 2, y: \"3\"}}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 10}
";
    let on = Tollgate::start(
        &[("md.yaml", rules)],
        &[("response_dynamic_metadata", "true")],
    )
    .await;
    let request = RateLimitRequest {
        domain: "md".into(),
        descriptors: vec![
            desc(&[("a", "1")]),
            desc(&[("b", "2")]),
            desc(&[("c", "3")]),
        ],
        hits_addend: 0,
    };
    let first = on.ask(request.clone()).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    let md = first.dynamic_metadata.expect("dynamic metadata");
    let text = |v: &envoy_types::pb::google::protobuf::Value| match &v.kind {
        Some(Kind::StringValue(s)) => s.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(text(&md.fields["domain"]), "md");
    let Some(Kind::ListValue(list)) = &md.fields["descriptors"].kind else {
        panic!("{md:?}")
    };
    assert_eq!(list.values.len(), 3);
    let Some(Kind::StructValue(d0)) = &list.values[0].kind else {
        panic!()
    };
    let Some(Kind::ListValue(entries)) = &d0.fields["entries"].kind else {
        panic!()
    };
    assert_eq!(text(&entries.values[0]), "a=1");
    let Some(Kind::StructValue(meta)) = &md.fields["metadata"].kind else {
        panic!("{md:?}")
    };
    // The first descriptor's value wins; mappings merge key by key.
    assert_eq!(text(&meta.fields["name"]), "service_a");
    let Some(Kind::StructValue(shared)) = &meta.fields["shared"].kind else {
        panic!()
    };
    assert_eq!(shared.fields["x"].kind, Some(Kind::NumberValue(1.0)));
    assert_eq!(text(&shared.fields["y"]), "3");

    // `POST /json` shows it in the JSON mapping.
    let body = r#"{"domain":"md","descriptors":[{"entries":[{"key":"c","value":"3"}]}]}"#;
    let (status, json) = json_post(on.http, body).await;
    assert_eq!(status, 200, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["dynamicMetadata"]["domain"], "md");
    assert_eq!(v["dynamicMetadata"]["descriptors"][0]["entries"][0], "c=3");

    // `a` is now over its limit: only `b`'s metadata is returned.
    let second = on.ask(request.clone()).await;
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    let md = second.dynamic_metadata.unwrap();
    let Some(Kind::StructValue(meta)) = &md.fields["metadata"].kind else {
        panic!("{md:?}")
    };
    assert_eq!(text(&meta.fields["name"]), "service_b");
    on.stop().await;

    let off = Tollgate::start(&[("md.yaml", rules)], &[]).await;
    assert_eq!(off.ask(request).await.dynamic_metadata, None);
    off.stop().await;
}

/// With `merge_domain_config`, two files of one domain serve both halves
/// (without it they are refused: `reference_fixtures_get_the_reference_verdict`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_domain_files_serve_both_halves() {
    support::away_from_an_hour_boundary().await;
    let one = "domain: m\ndescriptors:\n  - key: k1\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let two = "domain: m\ndescriptors:\n  - key: k2\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let t = Tollgate::start(
        &[("one.yaml", one), ("two.yaml", two)],
        &[("merge_domain_config", "true")],
    )
    .await;
    let r = t.ask(req("m", &[("k1", "x")])).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    let r = t.ask(req("m", &[("k2", "x")])).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        2
    );
    t.stop().await;
}
