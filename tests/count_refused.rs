//! `count_refused: false` over real gRPC, on the embedded store, Redis and
//! a 3+3 Redis Cluster: a broad limit charged only by requests answered OK.
//!
//! The case of envoyproxy/ratelimit#1060: one request carries a broad
//! `site` descriptor (10 a minute) and a granular `user` one (2 a minute).
//! User A sends 2 admitted and 20 refused requests. With `count_refused:
//! false` on `site`, A's refused requests charge it nothing and user B
//! gets the 8 left; without it (the reference's behaviour, the default) A's
//! refused requests use up the site and B is locked out.

mod support;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use support::redis::{RedisCluster, RedisServer};
use support::tollgate::{Tollgate, descriptor};
use support::unique_domain;
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

const ALGOS: [&str; 4] = [
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
];

/// The window of a case: a minute, as in the issue; an hour for the token
/// bucket, which would otherwise refill a token every 6 s of the test.
fn unit(algo: &str) -> &'static str {
    if algo == "token_bucket" {
        "hour"
    } else {
        "minute"
    }
}

/// `site` 10 and `user` 2 per unit (user B 100: a partner with a higher
/// granular limit, so only the site can stop it), `site` sharded over
/// `shards`.
fn rules(domain: &str, algo: &str, count_refused: bool, shards: u16) -> String {
    let unit = unit(algo);
    format!(
        "domain: {domain}
descriptors:
  - key: site
    rate_limit:
      unit: {unit}
      requests_per_unit: 10
      algorithm: {algo}
      shards: {shards}
      count_refused: {count_refused}
  - key: user
    rate_limit: {{unit: {unit}, requests_per_unit: 2, algorithm: {algo}}}
  - key: user
    value: B
    rate_limit: {{unit: {unit}, requests_per_unit: 100, algorithm: {algo}}}
"
    )
}

/// What Envoy sends: the broad descriptor, then the granular one.
fn request(domain: &str, user: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![
            descriptor(&[("site", "shop")]),
            descriptor(&[("user", user)]),
        ],
        hits_addend: 0,
    }
}

/// The site alone, with a cost (0 checks) or a give-back.
fn site(domain: &str, cost: u64, negative: bool) -> RateLimitRequest {
    let mut d: RateLimitDescriptor = descriptor(&[("site", "shop")]);
    d.hits_addend = Some(UInt64Value { value: cost });
    d.is_negative_hits = negative;
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![d],
        hits_addend: 0,
    }
}

async fn ask(c: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(r).await.unwrap().into_inner()
}

/// Waits, when fewer than `secs` seconds are left of the current minute,
/// until the next one has begun: a case then stays in one window.
async fn within_one_minute(secs: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = now.as_secs() % 60;
    if into + secs >= 60 {
        let wait = Duration::from_secs(60 - into) - Duration::from_nanos(now.subsec_nanos().into());
        tokio::time::sleep(wait + Duration::from_millis(200)).await;
    }
}

/// The issue's case on one domain. `count_refused`: the site's rule.
async fn replay(
    c: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    algo: &str,
    count_refused: bool,
    sharded: bool,
) {
    let what = format!("{algo} count_refused={count_refused} sharded={sharded}");
    if unit(algo) == "minute" {
        within_one_minute(20).await;
    }
    for i in 0..22 {
        let r = ask(c, request(domain, "A")).await;
        let want = if i < 2 { OK } else { OVER };
        assert_eq!(r.overall_code, want, "{what}: A's request {i}");
        if i >= 2 {
            // Refused by the user's limit; the site admitted it.
            assert_eq!(r.statuses[1].code, OVER, "{what}: A's request {i}");
        }
    }
    if count_refused {
        // Today's behaviour: A's refused requests used up the site.
        let r = ask(c, request(domain, "B")).await;
        assert_eq!(r.overall_code, OVER, "{what}: B is locked out");
        assert_eq!(r.statuses[0].code, OVER, "{what}: by the site");
        return;
    }
    for i in 0..8u32 {
        let r = ask(c, request(domain, "B")).await;
        assert_eq!(r.overall_code, OK, "{what}: B's request {i}");
        if !sharded {
            // Only A's 2 admitted requests and B's count.
            assert_eq!(
                r.statuses[0].limit_remaining,
                7 - i,
                "{what}: B's request {i}"
            );
        }
    }
    let r = ask(c, request(domain, "B")).await;
    assert_eq!(r.overall_code, OVER, "{what}: B's ninth");
    assert_eq!(r.statuses[0].code, OVER, "{what}: the site is full");
    if !sharded {
        // Exactly 10 counted: one given back leaves exactly one free (11
        // counted would leave none).
        ask(c, site(domain, 1, true)).await;
        let check = ask(c, site(domain, 0, false)).await;
        assert_eq!(check.statuses[0].limit_remaining, 1, "{what}: 10 counted");
    }
}

/// Every algorithm, with and without `count_refused: false`, and a site
/// split over two shards (its charges and undos on either) for the exact
/// algorithms, on one store; with the over-limit cache (A's refusals after
/// the first are the cache's, answered before the site is asked: it is
/// only checked) and without (every refused request charges the site and
/// takes it back).
///
/// `at_once`: the store answers without waiting (the embedded store), so
/// every refusal is known before the site is asked: it is only checked,
/// and nothing is taken back but the fixed window's refused ninth of B.
async fn the_issue_replayed(settings: &[(&str, &str)], at_once: bool) {
    for cache in [true, false] {
        let mut cases = Vec::new();
        for algo in ALGOS {
            for count_refused in [false, true] {
                cases.push((unique_domain(algo), algo, count_refused, false));
            }
        }
        for algo in ["sliding_window_log", "token_bucket"] {
            cases.push((unique_domain(algo), algo, false, true));
        }
        let texts: Vec<(String, String)> = cases
            .iter()
            .map(|(domain, algo, count_refused, sharded)| {
                let shards = if *sharded { 2 } else { 1 };
                (
                    format!("{domain}.yaml"),
                    rules(domain, algo, *count_refused, shards),
                )
            })
            .collect();
        let files: Vec<(&str, &str)> = texts
            .iter()
            .map(|(n, t)| (n.as_str(), t.as_str()))
            .collect();
        let mut settings = settings.to_vec();
        let enabled = cache.to_string();
        settings.push(("over_limit_cache.enabled", &enabled));
        let t = Tollgate::start(&files, &settings).await;
        t.wait_serving(Duration::from_secs(30)).await;
        let mut c = t.client().await;
        for (domain, algo, count_refused, sharded) in &cases {
            replay(&mut c, domain, algo, *count_refused, *sharded).await;
        }

        // What the metrics say: each site rule counts A's 20 refused
        // requests as taken back. Undone: A's first refused request's
        // charge (with the cache, the others were refused before the site
        // was charged), or all 20 (without); and the fixed window's refused
        // ninth of B, as it records refused hits.
        let (status, page) = support::http_get(t.http, "/metrics").await;
        assert_eq!(status, 200);
        let free = cases.iter().filter(|c| !c.2).count() as f64;
        let per_case = match (at_once, cache) {
            (true, _) => 0.0,
            (false, true) => 1.0,
            (false, false) => 20.0,
        };
        let want = per_case * free + 1.0;
        assert_eq!(
            metric(&page, "tollgate_undos_total", ""),
            want,
            "cache {cache}"
        );
        assert_eq!(metric(&page, "tollgate_undos_lost_total", ""), 0.0);
        for (domain, _, count_refused, _) in &cases {
            let labels = format!("domain=\"{domain}\"");
            let taken = metric(&page, "tollgate_rule_taken_back_total", &labels);
            let want = if *count_refused { 0.0 } else { 20.0 };
            assert_eq!(taken, want, "{domain}, cache {cache}");
        }
        t.stop().await;
    }
}

/// The one sample of `name` whose labels contain `labels` (and `rule="site"`
/// when `labels` is set).
fn metric(page: &str, name: &str, labels: &str) -> f64 {
    let found: Vec<f64> = page
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.is_empty() || (l.contains(labels) && l.contains("rule=\"site\"")))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse().ok()))
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels}: {found:?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issue_on_the_embedded_store() {
    the_issue_replayed(&[], true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issue_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    the_issue_replayed(
        &[("store", &url), ("redis.command_timeout_ms", "5000")],
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issue_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    the_issue_replayed(
        &[("store", &url), ("redis.command_timeout_ms", "5000")],
        false,
    )
    .await;
}

/// 32 callers at once: half are users far over their own limit of 1 (so
/// most of their requests are refused by it), half are users well within
/// theirs. The site (50 an hour, `count_refused: false`) never admits
/// more than 50 requests that stay admitted, and its count is then
/// exactly the requests answered OK.
async fn many_callers_never_over_admit(settings: &[(&str, &str)]) {
    support::away_from_an_hour_boundary().await;
    for algo in [
        "fixed_window",
        "sliding_window_log",
        "sliding_window_counter",
        "token_bucket",
    ] {
        let domain = unique_domain("many");
        let text = format!(
            "domain: {domain}
descriptors:
  - key: site
    rate_limit: {{unit: hour, requests_per_unit: 50, algorithm: {algo}, count_refused: false}}
  - key: user
    rate_limit: {{unit: hour, requests_per_unit: 1, algorithm: {algo}}}
  - key: user
    value: good
    rate_limit: {{unit: hour, requests_per_unit: 1000, algorithm: {algo}}}
"
        );
        let t = Tollgate::start(&[("r.yaml", &text)], settings).await;
        t.wait_serving(Duration::from_secs(30)).await;
        let t = Arc::new(t);
        let tasks = (0..32).map(|i| {
            let (t, domain) = (t.clone(), domain.clone());
            tokio::spawn(async move {
                let mut c = t.client().await;
                let user = if i % 2 == 0 {
                    format!("flood-{i}")
                } else {
                    "good".into()
                };
                let mut ok = 0u32;
                for _ in 0..12 {
                    if ask(&mut c, request(&domain, &user)).await.overall_code == OK {
                        ok += 1;
                    }
                }
                ok
            })
        });
        let ok: u32 = futures_util::future::join_all(tasks)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .sum();
        assert!(ok <= 50, "{algo}: {ok} admitted by a site of 50");
        // 16 flood users are admitted once each; the good ones ask for 192.
        assert!(ok >= 40, "{algo}: only {ok} of 50 admitted");
        let mut c = t.client().await;
        let left = ask(&mut c, site(&domain, 0, false)).await.statuses[0].limit_remaining;
        if algo == "token_bucket" {
            // An undo gives back only the part of a charge still ahead on
            // the bucket's timeline: up to a round trip's worth stays.
            assert!(
                left <= 50 - ok && left + 1 >= 50 - ok,
                "{algo}: {left} left, {ok} OK"
            );
        } else {
            assert_eq!(
                left,
                50 - ok,
                "{algo}: the site counts exactly the requests answered OK"
            );
        }
        Arc::into_inner(t).expect("no other handle").stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_on_the_embedded_store() {
    many_callers_never_over_admit(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    many_callers_never_over_admit(&[("store", &url), ("redis.command_timeout_ms", "5000")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    many_callers_never_over_admit(&[("store", &url), ("redis.command_timeout_ms", "5000")]).await;
}

/// A bad `count_refused` is an operator's error with its file and line, in
/// `tollgate validate`, at startup and on reload (which keeps the rules in
/// force); `/rlconfig` shows the key, as text and as JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_count_refused_names_its_file_and_line() {
    let bad = "domain: shop\ndescriptors:\n  - key: site\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n      count_refused: sometimes\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 5, usage_reports: true, count_refused: false}\n";
    let want = [
        "bad.yaml:7: descriptors[0].rate_limit.count_refused: expected true or false, found \"sometimes\"",
        "bad.yaml:9: descriptors[1].rate_limit.count_refused: count_refused: false cannot go with usage_reports: true",
    ];
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.yaml"), bad).unwrap();
    let out = std::process::Command::new(support::process::tollgate_bin())
        .args(["validate", &dir.path().display().to_string()])
        .env_clear()
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    for w in want {
        assert!(stderr.contains(w), "validate: {w} in {stderr}");
    }

    let settings = tollgate::settings::Settings::load(&tollgate::settings::Sources {
        overrides: vec![("rules_dir".into(), dir.path().display().to_string())],
        ..Default::default()
    })
    .unwrap();
    let e = tollgate::server::build_engine(&settings, Arc::new(tollgate::clock::SystemClock))
        .await
        .err()
        .expect("startup refuses the rules")
        .to_string();
    for w in want {
        assert!(e.contains(w), "startup: {w} in {e}");
    }

    let good = "domain: shop\ndescriptors:\n  - key: site\n    rate_limit: {unit: minute, requests_per_unit: 10, count_refused: false}\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n";
    let t = Tollgate::start(&[("bad.yaml", good)], &[]).await;
    let rlconfig = || async {
        let (_, text) = support::http_get(t.debug, "/rlconfig").await;
        let (_, json) = support::http_get(t.debug, "/rlconfig?format=json").await;
        (text, json)
    };
    let (text, json) = rlconfig().await;
    assert!(
        text.contains("shop.site: 10/minute sliding_window_counter count_refused=false"),
        "{text}"
    );
    assert!(
        !text.contains("shop.user: 10/minute sliding_window_counter count_refused"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rule = |path: &str| {
        json["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["rule"] == path)
            .unwrap_or_else(|| panic!("no rule {path} in {json}"))
            .clone()
    };
    assert_eq!(rule("site")["countRefused"], false);
    assert_eq!(rule("user")["countRefused"], true);

    std::fs::write(t.rules.path().join("bad.yaml"), bad).unwrap();
    let mut refused = 0;
    for _ in 0..200 {
        let (_, page) = support::http_get(t.debug, "/rlconfig?format=json").await;
        let page: serde_json::Value = serde_json::from_str(&page).unwrap();
        refused = page["reloads"]["refused"].as_u64().unwrap();
        if refused > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(refused, 1, "the bad edit was refused");
    let (text, _) = rlconfig().await;
    assert!(
        text.contains("count_refused=false"),
        "the old rules stay: {text}"
    );
    t.stop().await;
}

/// How `count_refused: false` meets the other rule keys: a ban, a shadow
/// rule, an unlimited rule, quota mode, and global shadow mode (which
/// takes back as enforcement would, so its counts preview enforcement).
/// The site's rule names no algorithm: `count_refused: false` turns the
/// usage reports such a rule would take off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_rule_keys() {
    support::away_from_an_hour_boundary().await;
    let rules = "domain: mix
descriptors:
  - key: site
    rate_limit: {unit: hour, requests_per_unit: 10, count_refused: false}
  - key: user
    value: banned
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: user
    value: shadowed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: user
    value: free
    rate_limit: {unlimited: true}
  - key: plan
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
";
    let left = |c: &mut RateLimitServiceClient<Channel>| {
        let mut c = c.clone();
        async move { ask(&mut c, site("mix", 0, false)).await.statuses[0].limit_remaining }
    };
    let t = Tollgate::start(&[("mix.yaml", rules)], &[]).await;
    let mut c = t.client().await;
    for _ in 0..3 {
        let r = ask(&mut c, request("mix", "banned")).await;
        assert_eq!(r.overall_code, OVER);
    }
    assert_eq!(left(&mut c).await, 10, "a ban takes the site's charge back");
    let r = ask(&mut c, request("mix", "shadowed")).await;
    assert_eq!(r.overall_code, OK, "a shadow rule refuses nothing");
    assert_eq!(left(&mut c).await, 9, "so the site is charged");
    let r = ask(&mut c, request("mix", "free")).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(left(&mut c).await, 8);
    let quota = |n: u32| RateLimitRequest {
        domain: "mix".into(),
        descriptors: vec![
            descriptor(&[("site", "shop")]),
            descriptor(&[("plan", "p")]),
        ],
        hits_addend: n,
    };
    assert_eq!(ask(&mut c, quota(1)).await.overall_code, OK);
    assert_eq!(left(&mut c).await, 7);
    // The only quota descriptor is over: the request is refused.
    assert_eq!(ask(&mut c, quota(1)).await.overall_code, OVER);
    assert_eq!(left(&mut c).await, 7, "quota mode's refusal takes it back");
    // A give-back is never taken back, even in a refused request.
    let mut back = request("mix", "banned");
    back.descriptors[0].is_negative_hits = true;
    assert_eq!(ask(&mut c, back).await.overall_code, OVER);
    assert_eq!(left(&mut c).await, 8);
    t.stop().await;

    let t = Tollgate::start(&[("mix.yaml", rules)], &[("shadow_mode", "true")]).await;
    let mut c = t.client().await;
    let r = ask(&mut c, request("mix", "banned")).await;
    assert_eq!(r.overall_code, OK, "global shadow answers OK");
    assert_eq!(
        left(&mut c).await,
        10,
        "and takes back as enforcement would"
    );
    t.stop().await;
}

/// A request whose other descriptor's store call fails (`on_store_error:
/// error`, the default: the caller gets an error) is no OK, so what its
/// `count_refused: false` limiter charged is taken back. The failure is
/// real: the other limiter's Redis key holds a value of the wrong type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_descriptor_takes_the_others_charge_back() {
    let redis = RedisServer::start();
    let domain = unique_domain("failed");
    let text = format!(
        "domain: {domain}\ndescriptors:\n  - key: site\n    rate_limit: {{unit: hour, requests_per_unit: 1, count_refused: false, algorithm: fixed_window}}\n  - key: broken\n    rate_limit: {{unit: hour, requests_per_unit: 100, algorithm: fixed_window}}\n"
    );
    let t = Tollgate::start(&[("r.yaml", &text)], &[("store", &redis.url())]).await;
    t.wait_serving(Duration::from_secs(30)).await;
    let mut c = t.client().await;
    let one = |entries: &[(&str, &str)]| RateLimitRequest {
        domain: domain.clone(),
        descriptors: vec![descriptor(entries)],
        hits_addend: 0,
    };
    // The broken limiter's key, made a string where a hash belongs.
    ask(&mut c, one(&[("broken", "b")])).await;
    let keys = redis.cli(&["--scan", "--pattern", "*"]);
    let key = keys
        .lines()
        .find(|k| k.contains(&domain) && k.contains("broken"))
        .unwrap_or_else(|| panic!("no key for broken in {keys:?}"))
        .to_string();
    redis.cli(&["DEL", &key]);
    redis.cli(&["SET", &key, "not a hash", "EX", "3600"]);

    let both = RateLimitRequest {
        domain: domain.clone(),
        descriptors: vec![descriptor(&[("site", "s")]), descriptor(&[("broken", "b")])],
        hits_addend: 0,
    };
    let err = c.should_rate_limit(both).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    // The site's one hit an hour is still there.
    let r = ask(&mut c, one(&[("site", "s")])).await;
    assert_eq!(
        r.overall_code,
        Code::Ok as i32,
        "the failed request's charge was taken back"
    );
    let r = ask(&mut c, one(&[("site", "s")])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    t.stop().await;
}
