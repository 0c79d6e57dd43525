//! Resetting limiters: `POST /reset` on the debug listener and `tollgate
//! reset`, over real gRPC on the embedded store, Redis and a 3+3 Redis
//! Cluster. Every algorithm and a sharded limit get their whole limit back
//! after a reset, no more, while another limiter keeps its state; a reset
//! through one replica reaches the other's over-limit cache within a
//! second; the public port has no `/reset`; the binary's subcommand, log
//! line and metric.

mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;
use support::process::{Proc, tollgate_bin};
use support::redis::{RedisCluster, RedisServer};
use support::tollgate::{Tollgate, descriptor};
use support::{away_from_an_hour_boundary, free_port, http_post as post, unique_domain};

/// Requests per hour of every unsharded rule.
const LIMIT: usize = 3;
/// Requests per hour of the sharded rule, over its three shards.
const SHARDED_LIMIT: usize = 6;

const ALGORITHMS: [&str; 4] = [
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
];

/// One rule per algorithm under `algo=<name>`, then `user`; and a sharded
/// log under `algo=sharded`. Hour-long windows: nothing comes back with
/// time while a case runs.
fn rules(domain: &str) -> String {
    let mut text = format!("domain: {domain}\ndescriptors:\n");
    for algo in ALGORITHMS {
        text.push_str(&format!(
            "  - key: algo\n    value: {algo}\n    descriptors:\n      - key: user\n        rate_limit: {{unit: hour, requests_per_unit: {LIMIT}, algorithm: {algo}}}\n"
        ));
    }
    // A `rate_limits:` list whose second limit binds first.
    text.push_str(
        "  - key: algo\n    value: listed\n    descriptors:\n      - key: user\n        rate_limits:\n          - {unit: hour, requests_per_unit: 4, algorithm: sliding_window_log, name: hourly}\n          - {unit: day, requests_per_unit: 3, algorithm: fixed_window, name: daily}\n",
    );
    text.push_str(&format!(
        "  - key: algo\n    value: sharded\n    descriptors:\n      - key: user\n        rate_limit: {{unit: hour, requests_per_unit: {SHARDED_LIMIT}, algorithm: sliding_window_log, shards: 3}}\n"
    ));
    text
}

/// Every rule of [`rules`] with its limit.
fn limiters() -> Vec<(&'static str, usize)> {
    let mut all: Vec<_> = ALGORITHMS.iter().map(|a| (*a, LIMIT)).collect();
    all.push(("sharded", SHARDED_LIMIT));
    all
}

async fn ask(t: &Tollgate, domain: &str, algo: &str, user: &str) -> bool {
    let r = t
        .ask(RateLimitRequest {
            domain: domain.to_string(),
            descriptors: vec![descriptor(&[("algo", algo), ("user", user)])],
            hits_addend: 0,
        })
        .await;
    r.overall_code == Code::Ok as i32
}

/// Exactly `n` requests admitted, then the next refused.
async fn admits_exactly(t: &Tollgate, domain: &str, algo: &str, user: &str, n: usize, when: &str) {
    for i in 0..n {
        assert!(
            ask(t, domain, algo, user).await,
            "{algo} {user} {when}: request {i} of {n} refused"
        );
    }
    assert!(
        !ask(t, domain, algo, user).await,
        "{algo} {user} {when}: request {n} admitted, over the limit"
    );
}

/// The JSON body of a reset of `descriptors` in `domain`.
fn reset_body(domain: &str, descriptors: &[&[(&str, &str)]]) -> String {
    let descriptors: Vec<serde_json::Value> = descriptors
        .iter()
        .map(|entries| {
            let entries: Vec<_> = entries
                .iter()
                .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                .collect();
            serde_json::json!({ "entries": entries })
        })
        .collect();
    serde_json::json!({"domain": domain, "descriptors": descriptors}).to_string()
}

/// The value of `tollgate_resets_total` for `domain` and `rule`, if any.
async fn resets_metric(t: &Tollgate, domain: &str, rule: &str) -> Option<f64> {
    let (status, page) = support::http_get(t.http, "/metrics").await;
    assert_eq!(status, 200);
    page.lines()
        .filter(|l| l.starts_with("tollgate_resets_total{"))
        .filter(|l| l.contains(&format!("domain=\"{domain}\"")))
        .find(|l| l.contains(&format!("rule=\"{rule}\"")))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
}

/// Every limiter driven to refusal over gRPC, reset in one call, then
/// exactly its limit admitted again; bob, on the same rules, keeps what
/// he spent. Then the answers for what cannot be reset.
async fn every_limiter_gets_its_whole_limit_back(settings: &[(&str, &str)]) {
    let domain = unique_domain("reset");
    let t = Tollgate::start(&[("r.yaml", &rules(&domain))], settings).await;
    t.wait_serving(Duration::from_secs(30)).await;
    away_from_an_hour_boundary().await;
    for (algo, limit) in limiters() {
        admits_exactly(&t, &domain, algo, "alice", limit, "before the reset").await;
        assert!(ask(&t, &domain, algo, "bob").await, "{algo} bob");
    }

    let alice: Vec<[(&str, &str); 2]> = limiters()
        .iter()
        .map(|(algo, _)| [("algo", *algo), ("user", "alice")])
        .collect();
    let alice: Vec<&[(&str, &str)]> = alice.iter().map(|d| &d[..]).collect();
    let (status, body) = post(t.debug, "/reset", &reset_body(&domain, &alice)).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let reset = answer["reset"].as_array().unwrap();
    assert_eq!(reset.len(), limiters().len(), "{body}");
    for (i, (algo, _)) in limiters().iter().enumerate() {
        let l = &reset[i];
        assert_eq!(l["descriptor"], i, "{body}");
        assert_eq!(l["rule"], format!("algo_{algo}.user"), "{body}");
        assert!(
            l["source"].as_str().unwrap().starts_with("r.yaml:"),
            "{body}"
        );
        let value = l["entries"][1]["value"].as_str().unwrap();
        assert!(
            value.starts_with("sha256:"),
            "values shown as digests: {body}"
        );
    }
    assert_eq!(reset[4]["shards"], 3, "{body}");
    assert!(!body.contains("alice"), "no value read back: {body}");

    for (algo, limit) in limiters() {
        admits_exactly(&t, &domain, algo, "alice", limit, "after the reset").await;
        admits_exactly(&t, &domain, algo, "bob", limit - 1, "untouched").await;
    }
    assert_eq!(
        resets_metric(&t, &domain, "algo_fixed_window.user").await,
        Some(1.0)
    );
    assert_eq!(
        resets_metric(&t, &domain, "algo_sharded.user").await,
        Some(1.0)
    );

    // A `rate_limits:` list: every limit of it is reset. The day (3)
    // binds before the hour (4): 3 more after the reset only when both
    // were reset.
    admits_exactly(&t, &domain, "listed", "alice", 3, "before the reset").await;
    let listed = [("algo", "listed"), ("user", "alice")];
    let (status, body) = post(t.debug, "/reset", &reset_body(&domain, &[&listed[..]])).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rules: Vec<&str> = answer["reset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["rule"].as_str().unwrap())
        .collect();
    assert_eq!(
        rules,
        ["algo_listed.user[0]", "algo_listed.user[1]"],
        "{body}"
    );
    admits_exactly(&t, &domain, "listed", "alice", 3, "after the reset").await;

    // What cannot be reset says why, and resets nothing.
    let one = |algo: &'static str, user: &'static str| [("algo", algo), ("user", user)];
    let carol = one("fixed_window", "carol");
    let nothing = [("algo", "none"), ("user", "carol")];
    assert!(ask(&t, &domain, "fixed_window", "carol").await);
    let (status, body) = post(
        t.debug,
        "/reset",
        &reset_body(&domain, &[&carol[..], &nothing[..]]),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("descriptor 1 (algo=sha256:"), "{body}");
    assert!(body.contains("matches no rule with a limit"), "{body}");
    admits_exactly(
        &t,
        &domain,
        "fixed_window",
        "carol",
        LIMIT - 1,
        "after a 404",
    )
    .await;
    let (status, body) = post(t.debug, "/reset", &reset_body("no-such-domain", &[&carol])).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no-such-domain"), "{body}");
    let (status, body) = post(t.debug, "/reset", "{\"domain\": ").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("error"), "{body}");
    let (status, body) = post(t.debug, "/reset", &reset_body(&domain, &[])).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("descriptors must not be empty"), "{body}");

    // Never on the public port.
    let (status, body) = post(t.http, "/reset", &reset_body(&domain, &[&carol])).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("debug listener"), "{body}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limiter_gets_its_whole_limit_back_on_the_embedded_store() {
    every_limiter_gets_its_whole_limit_back(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limiter_gets_its_whole_limit_back_on_redis() {
    let redis = RedisServer::start();
    every_limiter_gets_its_whole_limit_back(&[("store", &redis.url())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limiter_gets_its_whole_limit_back_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    every_limiter_gets_its_whole_limit_back(&[("store", &cluster.url())]).await;
}

/// A reset finds the limiter a decision counts on: a value a shared
/// wildcard matched resets the one limiter every such value shares, a
/// value longer than `max_value_bytes` its digest's limiter, a request's
/// override the override's limiter; a rule another descriptor of the
/// request replaces is not reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_resolves_descriptors_as_a_decision_does() {
    let domain = unique_domain("resolve");
    let rules = format!(
        "domain: {domain}
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {{unit: hour, requests_per_unit: 2}}
  - key: user
    rate_limit: {{unit: hour, requests_per_unit: 2, algorithm: fixed_window}}
  - key: plan
    rate_limit: {{unit: hour, requests_per_unit: 2, name: plan}}
  - key: vip
    rate_limit: {{unit: hour, requests_per_unit: 5, replaces: [{{name: plan}}]}}
"
    );
    let t = Tollgate::start(&[("r.yaml", &rules)], &[]).await;
    t.wait_serving(Duration::from_secs(30)).await;
    away_from_an_hour_boundary().await;
    let decide = async |entries: &[(&str, &str)], limit: Option<u32>| {
        let mut d = descriptor(entries);
        if let Some(n) = limit {
            d.limit = Some(RateLimitOverride {
                requests_per_unit: n,
                unit: RateLimitUnit::Hour as i32,
            });
        }
        let r = t
            .ask(RateLimitRequest {
                domain: domain.clone(),
                descriptors: vec![d],
                hits_addend: 0,
            })
            .await;
        r.overall_code == Code::Ok as i32
    };
    let long = "x".repeat(4096);
    // Spent: the shared files/* limiter (through two values), a long
    // user, an override of 2 on plan=gold, and plan=silver.
    assert!(decide(&[("files", "files/a")], None).await);
    assert!(decide(&[("files", "files/b")], None).await);
    assert!(!decide(&[("files", "files/c")], None).await);
    for _ in 0..2 {
        assert!(decide(&[("user", &long)], None).await);
        assert!(decide(&[("plan", "gold")], Some(2)).await);
        assert!(decide(&[("plan", "silver")], None).await);
    }
    assert!(!decide(&[("user", &long)], None).await);
    assert!(!decide(&[("plan", "gold")], Some(2)).await);
    assert!(!decide(&[("plan", "silver")], None).await);

    // A third value resets the shared limiter; the long value and the
    // override are found as they were counted.
    let body = serde_json::json!({"domain": domain, "descriptors": [
        {"entries": [{"key": "files", "value": "files/z"}]},
        {"entries": [{"key": "user", "value": long}]},
        {"entries": [{"key": "plan", "value": "gold"}], "limit": {"requestsPerUnit": 2, "unit": "HOUR"}},
    ]});
    let (status, body) = post(t.debug, "/reset", &body.to_string()).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["reset"][0]["rule"], "files_files/*", "{body}");
    assert_eq!(answer["reset"][2]["override"], true, "{body}");
    assert_eq!(
        answer["reset"][2]["rule"],
        serde_json::Value::Null,
        "{body}"
    );
    assert!(decide(&[("files", "files/a")], None).await);
    assert!(decide(&[("files", "files/q")], None).await);
    assert!(!decide(&[("files", "files/a")], None).await);
    for _ in 0..2 {
        assert!(decide(&[("user", &long)], None).await);
        assert!(decide(&[("plan", "gold")], Some(2)).await);
    }
    assert!(!decide(&[("user", &long)], None).await);
    assert!(!decide(&[("plan", "gold")], Some(2)).await);
    assert!(!decide(&[("plan", "silver")], None).await, "not asked for");

    // With vip in the same request, plan's rule is replaced: no limiter.
    let body = serde_json::json!({"domain": domain, "descriptors": [
        {"entries": [{"key": "vip", "value": "v"}]},
        {"entries": [{"key": "plan", "value": "silver"}]},
    ]});
    let (status, body) = post(t.debug, "/reset", &body.to_string()).await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("descriptor 1 (plan=sha256:"), "{body}");
    assert!(!decide(&[("plan", "silver")], None).await, "nothing reset");
    assert_eq!(
        resets_metric(&t, &domain, "").await,
        Some(1.0),
        "the override"
    );
    t.stop().await;
}

/// Asks `replica` for `user` until it admits, the reset having just been
/// answered: a call sent a second or more after the reset must be admitted.
/// Each call is timed from when it was sent, since it is decided after that:
/// on a busy machine a call sent in time can come back late, and its
/// refusal then proves nothing. Returns when the admitted call was sent.
async fn admitted_within_a_second(
    replica: &Tollgate,
    domain: &str,
    user: &str,
    what: &str,
) -> Duration {
    let reset_at = Instant::now();
    loop {
        let sent = reset_at.elapsed();
        if ask(replica, domain, "fixed_window", user).await {
            return sent;
        }
        assert!(
            sent < Duration::from_secs(1),
            "{what}: the second replica refused {user} in a call sent {sent:?} after the reset"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Two replicas on one Redis, each with its over-limit cache: the second
/// answers alice's refusals locally until the window ends; a reset through
/// the first lets the second admit her within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_reaches_the_other_replicas_cache_within_a_second() {
    let redis = RedisServer::start();
    let domain = unique_domain("replicas");
    let url = redis.url();
    let settings = [
        ("store", url.as_str()),
        ("over_limit_cache.enabled", "true"),
    ];
    let replicas = Tollgate::start_replicas(2, &[("r.yaml", &rules(&domain))], &settings).await;
    let (a, b) = (&replicas[0], &replicas[1]);
    away_from_an_hour_boundary().await;
    admits_exactly(
        b,
        &domain,
        "fixed_window",
        "alice",
        LIMIT,
        "before the reset",
    )
    .await;
    // Refused by the cache from now on: Redis sees no more calls for her.
    let calls = support::redis::command_calls(redis.port(), "evalsha");
    for _ in 0..5 {
        assert!(!ask(b, &domain, "fixed_window", "alice").await);
    }
    assert_eq!(
        support::redis::command_calls(redis.port(), "evalsha"),
        calls,
        "the second replica's cache answers alice's refusals"
    );

    let alice = [("algo", "fixed_window"), ("user", "alice")];
    let (status, body) = post(a.debug, "/reset", &reset_body(&domain, &[&alice])).await;
    assert_eq!(status, 200, "{body}");
    let after = admitted_within_a_second(b, &domain, "alice", "before the restart").await;
    eprintln!("the second replica admitted alice {after:?} after the reset");
    // Her whole limit, no more, across both replicas.
    admits_exactly(
        a,
        &domain,
        "fixed_window",
        "alice",
        LIMIT - 1,
        "after the reset",
    )
    .await;
    // The same after Redis went away and came back (its data lost with
    // it): the replicas read the counter again.
    let mut redis = redis;
    redis.restart();
    for t in &replicas {
        t.wait_serving(Duration::from_secs(30)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ask(b, &domain, "fixed_window", "erin").await {
        assert!(
            Instant::now() < deadline,
            "the second replica never decided again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admits_exactly(
        b,
        &domain,
        "fixed_window",
        "erin",
        LIMIT - 1,
        "after the restart",
    )
    .await;
    let erin = [("algo", "fixed_window"), ("user", "erin")];
    let (status, body) = post(a.debug, "/reset", &reset_body(&domain, &[&erin])).await;
    assert_eq!(status, 200, "{body}");
    let after = admitted_within_a_second(b, &domain, "erin", "after the restart").await;
    eprintln!("after the restart, the second replica admitted erin {after:?} after the reset");
    for t in replicas {
        t.stop().await;
    }
}

/// `tollgate reset` against the real binary on Redis: what it prints, its
/// exit codes, the log line and the metric.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_resets_through_the_binary() {
    let redis = RedisServer::start();
    let domain = unique_domain("cli");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), rules(&domain)).unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let debug = format!("127.0.0.1:{}", free_port());
    let rules_dir = dir.path().display().to_string();
    let url = redis.url();
    let server = Proc::spawn(
        &["serve"],
        &[
            ("TOLLGATE_GRPC_ADDR", &grpc),
            ("TOLLGATE_HTTP_ADDR", &http),
            ("TOLLGATE_DEBUG_ADDR", &debug),
            ("TOLLGATE_RULES_DIR", &rules_dir),
            ("TOLLGATE_STORE", &url),
        ],
    );
    server.wait_for_line("debug HTTP listening", Duration::from_secs(30));
    away_from_an_hour_boundary().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect_lazy();
    let mut client = RateLimitServiceClient::new(channel);
    let mut ask = async |user: &str| {
        let request = RateLimitRequest {
            domain: domain.clone(),
            descriptors: vec![descriptor(&[("algo", "token_bucket"), ("user", user)])],
            hits_addend: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // The first calls may come before the store is ready.
            match client.should_rate_limit(request.clone()).await {
                Ok(r) => return r.into_inner().overall_code == Code::Ok as i32,
                Err(e) => assert!(Instant::now() < deadline, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    for _ in 0..LIMIT {
        assert!(ask("dave").await);
    }
    assert!(!ask("dave").await);

    let reset = |args: &[&str]| {
        let out = Command::new(tollgate_bin())
            .arg("reset")
            .args(args)
            .env_clear()
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, stdout, stderr) = reset(&[
        "--addr",
        &debug,
        "--domain",
        &domain,
        "--descriptor",
        "algo=token_bucket,user=dave",
    ]);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        stdout.starts_with(&format!("reset {domain} algo=sha256:")),
        "{stdout}"
    );
    assert!(
        stdout.contains("rule algo_token_bucket.user (r.yaml:")
            && stdout.contains("token_bucket 3 per hour"),
        "{stdout}"
    );
    for _ in 0..LIMIT {
        assert!(ask("dave").await, "admitted after the CLI's reset");
    }
    assert!(!ask("dave").await);

    let line = server.wait_for_line("limiter reset", Duration::from_secs(10));
    assert!(
        line.contains("caller") && line.contains("127.0.0.1"),
        "{line}"
    );
    assert!(line.contains("sha256:") && !line.contains("dave"), "{line}");
    let http: SocketAddr = http.parse().unwrap();
    let (_, page) = support::http_get(http, "/metrics").await;
    let metric = page
        .lines()
        .find(|l| l.starts_with("tollgate_resets_total{") && l.contains(&domain))
        .unwrap_or_else(|| panic!("no tollgate_resets_total for {domain}"));
    assert!(
        metric.contains("rule=\"algo_token_bucket.user\""),
        "{metric}"
    );
    assert!(metric.ends_with(" 1"), "{metric}");

    // Nothing to reset, no answer, bad flags.
    let (code, stdout, stderr) = reset(&[
        "--addr",
        &debug,
        "--domain",
        &domain,
        "--descriptor",
        "algo=none",
    ]);
    assert_eq!(code, Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("HTTP 404") && stderr.contains("matches no rule"),
        "{stderr}"
    );
    let closed = format!("127.0.0.1:{}", free_port());
    let (code, _, stderr) = reset(&[
        "--addr",
        &closed,
        "--domain",
        &domain,
        "--descriptor",
        "a=b",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cannot connect"), "{stderr}");
    let (code, _, stderr) = reset(&[
        "--addr",
        &debug,
        "--domain",
        &domain,
        "--descriptor",
        "novalue",
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    let (code, _, _) = reset(&["--domain", &domain]);
    assert_eq!(code, Some(64), "--descriptor is required");
}

// ------------------------------------------- give-backs across a reset

use std::sync::Arc;

use tollgate::clock::{Clock, ManualClock, SystemClock};
use tollgate::limit::{Algorithm, Unit};
use tollgate::storage::lease::Leasing;
use tollgate::storage::{
    Ahead, BoxFuture, Hit, MemoryStore, RedisConfig, RedisStore, Shard, Store, StoreError,
};

fn fixed<'a>(entries: &'a [(String, String)], limit: u64, unit: Unit, hits: u64) -> Hit<'a> {
    Hit {
        domain: "giveback",
        entries,
        algorithm: Algorithm::FixedWindow,
        limit,
        window: unit.into(),
        hits,
        negative: false,
        usage_reports: false,
        buckets: 2,
        burst: 0,
        shard: Shard::NONE,
        receipt: false,
        also: &[],
        lease: false,
        ahead: Ahead::NONE,
    }
}

/// A lease of 2 hits on `h`'s limiter reserving 3 in each of the next
/// seven windows.
fn reserving(h: Hit<'_>) -> Hit<'_> {
    Hit {
        hits: 2,
        receipt: true,
        ahead: Ahead {
            windows: 7,
            hits: 3,
        },
        ..h
    }
}

/// Sleeps until 20 ms into the next second of the wall clock (Redis's).
async fn early_in_a_second() {
    let into = SystemClock.now_micros() % 1_000_000;
    tokio::time::sleep(Duration::from_micros(1_000_000 - into + 20_000)).await;
}

/// A Redis store on `server`, ready.
async fn connect(server: &RedisServer) -> RedisStore {
    let store = RedisStore::connect(RedisConfig {
        url: server.url(),
        command_timeout: Duration::from_millis(500),
        ..RedisConfig::default()
    })
    .await
    .expect("valid settings");
    assert!(store.wait_ready(Duration::from_secs(20)).await, "not ready");
    store
}

/// Hits of one until the first refusal (at most `most`): how many passed.
async fn admitted(store: &dyn Store, h: Hit<'_>, most: u64) -> u64 {
    for n in 0..most {
        if !store.hit(h).await.expect("the store answers").admitted {
            return n;
        }
    }
    most
}

/// A fixed window's give-back (a lease of 5 hits, with its receipt) that
/// lands after the reset deleted the count it was recorded in takes
/// nothing off the fresh count: after the reset the window admits its
/// limit, 10, and no more.
async fn a_give_back_after_a_reset_takes_nothing(store: &dyn Store) {
    let entries = vec![("user".to_string(), unique_domain("giveback"))];
    let h = fixed(&entries, 10, Unit::Day, 1);
    let lease = Hit {
        hits: 5,
        receipt: true,
        ..h
    };
    let d = store.hit(lease).await.unwrap();
    let r = d.receipt.expect("a weighted hit with a receipt");
    store.reset(h).await.unwrap();
    let fresh = admitted(store, h, 20).await;
    assert_eq!(
        fresh,
        10,
        "{}: the whole limit after the reset",
        store.kind()
    );
    store.undo(lease, r).await.unwrap();
    let after = admitted(store, h, 20).await;
    assert_eq!(
        after,
        0,
        "{}: the give-back from before the reset took {after} hits off the fresh count",
        store.kind()
    );
}

#[tokio::test]
async fn a_give_back_after_a_reset_takes_nothing_on_the_embedded_store() {
    a_give_back_after_a_reset_takes_nothing(&MemoryStore::new(Arc::new(SystemClock))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_after_a_reset_takes_nothing_on_redis() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    a_give_back_after_a_reset_takes_nothing(&store).await;
}

/// Hits a lease reserved in the next windows, given back after a reset
/// and a new lease's reservations, take nothing off the new ones: the
/// next window admits its limit less what the new lease reserved.
#[tokio::test]
async fn a_reservation_given_back_after_a_reset_takes_nothing() {
    let clock = ManualClock::at_secs(1_800_028_800);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    let entries = vec![("user".to_string(), "reserved".to_string())];
    let h = fixed(&entries, 10, Unit::Second, 1);
    let lease = reserving(h);
    let old = store.hit(lease).await.unwrap().receipt.unwrap();
    store.reset(h).await.unwrap();
    let new = store.hit(lease).await.unwrap().receipt.unwrap();
    assert_eq!(new.mark, 7, "{new:?}");
    // The old lease gives back its reservation of the next window.
    let next = tollgate::storage::Receipt {
        hits: 3,
        at: old.at + 1,
        mark: 0,
        ..old
    };
    store.undo(lease, next).await.unwrap();
    clock.advance_secs(1);
    assert_eq!(
        admitted(&store, h, 20).await,
        7,
        "the next window holds the new lease's 3"
    );
}

/// The embedded store under a leasing layer, its resets held until the
/// test lets them through.
struct HeldResets {
    inner: MemoryStore,
    open: tokio::sync::Semaphore,
}

impl Store for HeldResets {
    fn hit<'a>(
        &'a self,
        hit: Hit<'a>,
    ) -> BoxFuture<'a, Result<tollgate::storage::Decision, StoreError>> {
        self.inner.hit(hit)
    }

    fn reset<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.open.acquire().await.expect("open").forget();
            self.inner.reset(hit).await
        })
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&self.inner)
    }
}

/// A lease asked while the store's reset is under way (its hits counted
/// in the count the reset then deletes) is not kept past the reset: after
/// it, the replica admits the window's limit, 100, and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_asked_during_a_reset_is_not_kept() {
    let clock = ManualClock::at_secs(1_800_028_800 + 10);
    let held = Arc::new(HeldResets {
        inner: MemoryStore::new(Arc::new(clock.clone())),
        open: tokio::sync::Semaphore::new(0),
    });
    let replica = Arc::new(Leasing::new(held.clone(), Arc::new(clock.clone())));
    let entries = vec![("user".to_string(), "during".to_string())];
    let h = Hit {
        lease: true,
        ..fixed(&entries, 100, Unit::Minute, 1)
    };
    // Demand enough for leases of several hits.
    for _ in 0..20 {
        assert!(replica.hit(h).await.unwrap().admitted);
        clock.advance_micros(10_000);
    }
    let reset = {
        let replica = replica.clone();
        let entries = entries.clone();
        tokio::spawn(async move {
            let h = fixed(&entries, 100, Unit::Minute, 1);
            replica.reset(h).await
        })
    };
    // The reset is under way: this replica forgot its lease and asks again.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let taken_before = replica.counts().taken;
    let mut during = 0;
    while replica.counts().taken == taken_before && during < 200 {
        assert!(replica.hit(h).await.unwrap().admitted);
        during += 1;
    }
    assert!(
        replica.counts().taken > taken_before,
        "a lease was taken during the reset"
    );
    held.open.add_permits(1);
    reset.await.unwrap().unwrap();
    let after = admitted(&*replica, h, 300).await;
    assert!(
        after <= 100,
        "{after} admitted after the reset, limit 100: a lease from before it was kept"
    );
}

/// On Redis, as on the embedded store: a reservation given back after a
/// reset and a new lease's reservations takes nothing off the new ones.
/// Real time, windows of a second: a case whose calls straddle a
/// window's end (the clock read around them says so) is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_given_back_after_a_reset_takes_nothing_on_redis() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let wall = || SystemClock.now_micros();
    for attempt in 0.. {
        assert!(attempt < 5, "no attempt fit in one second");
        early_in_a_second().await;
        let entries = vec![("user".to_string(), unique_domain("reserved"))];
        let h = fixed(&entries, 10, Unit::Second, 1);
        let lease = reserving(h);
        let old = store.hit(lease).await.unwrap().receipt.unwrap();
        store.reset(h).await.unwrap();
        let new = store.hit(lease).await.unwrap().receipt.unwrap();
        let next = tollgate::storage::Receipt {
            hits: 3,
            at: old.at + 1,
            mark: 0,
            ..old
        };
        store.undo(lease, next).await.unwrap();
        if new.at != old.at || wall() / 1_000_000 != old.at {
            continue;
        }
        assert_eq!(new.mark, 7, "{new:?}");
        tokio::time::sleep(Duration::from_micros(
            (old.at + 1) * 1_000_000 + 20_000 - wall(),
        ))
        .await;
        let n = admitted(&store, h, 20).await;
        if wall() / 1_000_000 != old.at + 1 {
            continue;
        }
        assert_eq!(n, 7, "the next window holds the new lease's 3");
        break;
    }
}

/// A reservation that became its window's count (a fixed window's, a
/// sliding counter's bucket) and is then given back, after a reset that
/// came between the lease and that window, takes nothing: the reset
/// deleted it, and its receipt says its lease was taken a window before
/// (`Receipt::reserved`), so the store refuses it as it refuses a
/// give-back from before a reset. The window then admits its limit: 5
/// hits, the give-back, and 5 more (8 if it had taken 3 off the 5).
async fn a_reservation_in_its_window_given_back_after_a_reset_takes_nothing(
    store: &dyn Store,
    algorithm: Algorithm,
    next_window: impl std::future::Future<Output = ()>,
) -> Option<u64> {
    let entries = vec![("user".to_string(), unique_domain("reservedown"))];
    let h = Hit {
        algorithm,
        ..fixed(&entries, 10, Unit::Second, 1)
    };
    let lease = reserving(h);
    let old = store.hit(lease).await.unwrap().receipt.unwrap();
    assert_eq!(old.ahead, 7, "{} {algorithm}: {old:?}", store.kind());
    store.reset(h).await.unwrap();
    next_window.await;
    let first = admitted(store, h, 5).await;
    let reserved = tollgate::storage::Receipt {
        hits: 3,
        at: old.at + 1,
        mark: 0,
        ahead: 0,
        reserved: 1,
        ..old
    };
    store.undo(lease, reserved).await.unwrap();
    let rest = admitted(store, h, 20).await;
    Some(first + rest).filter(|_| first == 5)
}

#[tokio::test]
async fn a_reservation_in_its_window_given_back_after_a_reset_takes_nothing_embedded() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let clock = ManualClock::at_secs(1_800_028_800);
        let store = MemoryStore::new(Arc::new(clock.clone()));
        let n = a_reservation_in_its_window_given_back_after_a_reset_takes_nothing(
            &store,
            algorithm,
            async { clock.advance_secs(1) },
        )
        .await;
        assert_eq!(n, Some(10), "{algorithm}: admitted in the reserved window");
    }
}

/// A counter of two buckets takes a receipt back while its bucket is in
/// the trailing window, so a bucket after its own: the last reservation
/// a lease made before a reset (seven buckets on), given back in the
/// bucket after its own, takes nothing off what was counted in its
/// bucket after the reset. (The reset's mark lived until the seventh
/// window after the reset's ended, a bucket short: the give-back took
/// 3 of the 5 counted there, and 8 more were admitted instead of 5.)
/// `to(k)` waits until `k` buckets (seconds) after the lease's.
async fn the_last_reservation_given_back_a_bucket_late_after_a_reset_takes_nothing<F>(
    store: &dyn Store,
    to: impl Fn(u64) -> F,
) -> Option<u64>
where
    F: std::future::Future<Output = ()>,
{
    let entries = vec![("user".to_string(), unique_domain("reservelate"))];
    let h = Hit {
        algorithm: Algorithm::SlidingWindowCounter,
        ..fixed(&entries, 10, Unit::Second, 1)
    };
    let lease = reserving(h);
    let old = store.hit(lease).await.unwrap().receipt.unwrap();
    assert_eq!(old.ahead, 7, "{}: {old:?}", store.kind());
    store.reset(h).await.unwrap();
    to(7).await;
    let counted = admitted(store, h, 5).await;
    to(8).await;
    let last = tollgate::storage::Receipt {
        hits: 3,
        at: old.at + 7,
        mark: 0,
        ahead: 0,
        reserved: 7,
        ..old
    };
    store.undo(lease, last).await.unwrap();
    let after = admitted(store, h, 20).await;
    Some(after).filter(|_| counted == 5)
}

#[tokio::test]
async fn the_last_reservation_given_back_a_bucket_late_after_a_reset_takes_nothing_embedded() {
    let clock = ManualClock::at_secs(1_800_028_800);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    let start = clock.now_micros();
    let n =
        the_last_reservation_given_back_a_bucket_late_after_a_reset_takes_nothing(&store, |k| {
            clock.advance_micros((start + k * 1_000_000).saturating_sub(clock.now_micros()));
            std::future::ready(())
        })
        .await;
    assert_eq!(
        n,
        Some(5),
        "the bucket's 5 still count at the next one's start"
    );
}

/// The same on Redis, on its clock. There `x` is a field of the state
/// hash, which the hits after the reset keep alive: the script and the
/// embedded store must agree on the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_reservation_given_back_a_bucket_late_after_a_reset_takes_nothing_on_redis() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let wall = || SystemClock.now_micros();
    for attempt in 0.. {
        assert!(attempt < 3, "no attempt fit its seconds");
        early_in_a_second().await;
        let second = wall() / 1_000_000;
        // Whether a step ran into the next one's second: the lease and
        // the reset past the lease's, the hits of the seventh past it.
        let late = std::cell::Cell::new(false);
        let n = the_last_reservation_given_back_a_bucket_late_after_a_reset_takes_nothing(
            &store,
            |k| {
                let due = (second + k) * 1_000_000 + 20_000;
                let before = if k == 7 { second + 1 } else { second + k };
                if wall() >= before * 1_000_000 {
                    late.set(true);
                }
                tokio::time::sleep(Duration::from_micros(due.saturating_sub(wall())))
            },
        )
        .await;
        // Each step in its second: the last in the eighth after the lease's.
        if late.get() || wall() / 1_000_000 != second + 8 {
            continue;
        }
        // Early in the bucket, the one before still weighs 0.98 or more.
        assert_eq!(
            n,
            Some(5),
            "the bucket's 5 still count at the next one's start"
        );
        break;
    }
}

/// The same on Redis, on its clock: the lease and the reset early in a
/// second, the rest early in the next (a case that straddles is tried
/// again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_in_its_window_given_back_after_a_reset_takes_nothing_on_redis() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let wall = || SystemClock.now_micros();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        for attempt in 0.. {
            assert!(attempt < 5, "{algorithm}: no attempt fit its seconds");
            early_in_a_second().await;
            let second = wall() / 1_000_000;
            let next = async {
                tokio::time::sleep(Duration::from_micros(
                    ((second + 1) * 1_000_000 + 20_000).saturating_sub(wall()),
                ))
                .await
            };
            let n = a_reservation_in_its_window_given_back_after_a_reset_takes_nothing(
                &store, algorithm, next,
            )
            .await;
            // The reset in the lease's second, the rest in the next one.
            if wall() / 1_000_000 != second + 1 {
                continue;
            }
            assert_eq!(n, Some(10), "{algorithm}: admitted in the reserved window");
            break;
        }
    }
}
