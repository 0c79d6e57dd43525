//! Several limits on one descriptor (`rate_limits:`), over real gRPC on
//! the embedded store, Redis and a 3+3 Redis Cluster: a request is
//! admitted only when every limit admits it and then recorded on all; one
//! refused by any is charged to none; the answer names the limit that
//! refused (or the tightest one) with its reset; concurrent callers never
//! pass any limit.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use support::redis::{RedisCluster, RedisServer};
use support::tollgate::{Tollgate, descriptor};
use support::unique_domain;

fn rules(domain: &str) -> String {
    format!(
        "domain: {domain}
descriptors:
  # 5 per second and 12 per minute, each an exact sliding log.
  - key: log
    rate_limits:
      - {{unit: second, requests_per_unit: 5, algorithm: sliding_window_log, name: per_second}}
      - {{unit: minute, requests_per_unit: 12, algorithm: sliding_window_log, name: per_minute}}
  # The same naming no algorithm, as a reference user writes it: the
  # default_algorithm (the sliding window counter, 2 buckets).
  - key: plain
    rate_limits:
      - {{unit: second, requests_per_unit: 5, name: per_second}}
      - {{unit: minute, requests_per_unit: 12, name: per_minute}}
  # Every algorithm in one list.
  - key: mixed
    rate_limits:
      - {{unit: second, requests_per_unit: 5, algorithm: token_bucket, name: bucket}}
      - {{unit: minute, requests_per_unit: 12, algorithm: sliding_window_counter, name: counter}}
      - {{unit: hour, requests_per_unit: 100, algorithm: fixed_window, name: hourly}}
      - {{unit: day, requests_per_unit: 1000, algorithm: sliding_window_log, name: daily}}
"
    )
}

fn request(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors: vec![descriptor(&[(key, value)])],
        hits_addend: 0,
    }
}

fn status(r: &RateLimitResponse) -> &DescriptorStatus {
    &r.statuses[0]
}

fn limit_name(r: &RateLimitResponse) -> String {
    status(r)
        .current_limit
        .as_ref()
        .map(|l| l.name.clone())
        .unwrap_or_default()
}

fn reset_secs(r: &RateLimitResponse) -> f64 {
    let d = status(r).duration_until_reset.unwrap_or_default();
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

/// `n` requests one after the other; how many were admitted.
async fn burst(t: &Tollgate, domain: &str, key: &str, value: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let r = t.ask(request(domain, key, value)).await;
        if r.overall_code == Code::Ok as i32 {
            ok += 1;
        }
    }
    ok
}

/// Fixed windows are aligned on the minute: start the sequence well
/// inside one, so that it ends before the next (it takes about 3 s).
async fn away_from_a_minute_boundary() {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let into = now.as_secs_f64() % 60.0;
    if into > 50.0 {
        tokio::time::sleep(Duration::from_secs_f64(60.5 - into)).await;
    }
}

/// How long until the per-second limit has forgotten a burst: a second
/// for the log; two buckets of a second for the counter of the rules that
/// name no algorithm (its previous bucket still weighs for a second).
fn step(key: &str) -> Duration {
    Duration::from_millis(if key == "log" { 1_100 } else { 2_050 })
}

/// One list: a burst of 20 admits 5; a second later 5 more (the 15
/// refused were charged to nothing); then 2 more, and the next is refused
/// by the minute limit, with its reset.
async fn the_sequence(t: &Tollgate, domain: &str, key: &str) {
    away_from_a_minute_boundary().await;
    let value = "alice";
    let first = t.ask(request(domain, key, value)).await;
    assert_eq!(first.overall_code, Code::Ok as i32, "{key}: {first:?}");
    // Admitted: the tightest limit, 4 left of 5 per second.
    assert_eq!(limit_name(&first), "per_second", "{key}: {first:?}");
    assert_eq!(status(&first).limit_remaining, 4, "{key}: {first:?}");
    let limit = status(&first).current_limit.clone().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (5, Unit::Second as i32)
    );
    assert_eq!(
        burst(t, domain, key, value, 19).await,
        4,
        "{key}: a burst of 20 admits 5"
    );
    let refused = t.ask(request(domain, key, value)).await;
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    assert_eq!(limit_name(&refused), "per_second", "{key}: {refused:?}");
    // The log's second ends within a second; the counter's previous
    // bucket weighs for up to a second more.
    let most = if key == "log" { 1.0 } else { 2.0 };
    assert!(reset_secs(&refused) <= most, "{key}: {refused:?}");

    tokio::time::sleep(step(key)).await;
    assert_eq!(
        burst(t, domain, key, value, 20).await,
        5,
        "{key}: a second later 5 more: the refused requests were charged to nothing"
    );
    tokio::time::sleep(step(key)).await;
    assert_eq!(burst(t, domain, key, value, 2).await, 2, "{key}: 2 more");
    let last = t.ask(request(domain, key, value)).await;
    assert_eq!(last.overall_code, Code::OverLimit as i32, "{key}: {last:?}");
    assert_eq!(limit_name(&last), "per_minute", "{key}: {last:?}");
    let limit = status(&last).current_limit.clone().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (12, Unit::Minute as i32)
    );
    // The log: until its oldest hit (about 2.2 s old) leaves the minute;
    // the counter: until enough of its count has aged out.
    let reset = reset_secs(&last);
    if key == "log" {
        assert!((50.0..=58.5).contains(&reset), "{key}: reset {reset}");
    } else {
        assert!(reset > 1.0 && reset <= 120.0, "{key}: reset {reset}");
    }
    // Envoy's X-RateLimit-* headers come from these statuses: the limit
    // that refused, not the first of the list.
}

/// 40 callers at once on a fresh list admit exactly its tightest limit.
async fn concurrent(t: &Arc<Tollgate>, domain: &str, key: &str) {
    away_from_a_minute_boundary().await;
    let value = "concurrent";
    let calls: Vec<_> = (0..40)
        .map(|_| {
            let (t, req) = (t.clone(), request(domain, key, value));
            tokio::spawn(async move { t.ask(req).await.overall_code == Code::Ok as i32 })
        })
        .collect();
    let mut ok = 0;
    for c in calls {
        ok += usize::from(c.await.unwrap());
    }
    assert_eq!(ok, 5, "{key}: 40 concurrent callers admit exactly 5");
    // Nothing refused was charged: the minute limit has 7 left.
    tokio::time::sleep(step(key)).await;
    assert_eq!(burst(t, domain, key, value, 10).await, 5, "{key}");
    assert_eq!(burst(t, domain, key, value, 1).await, 0, "{key}");
    tokio::time::sleep(step(key)).await;
    assert_eq!(burst(t, domain, key, value, 5).await, 2, "{key}");
}

/// Four algorithms in one list: the token bucket (5 a second, burst 5)
/// refuses first; each limit's own metric series counts its answers.
async fn every_algorithm(t: &Tollgate, domain: &str) {
    assert_eq!(burst(t, domain, "mixed", "bob", 8).await, 5);
    let r = t.ask(request(domain, "mixed", "bob")).await;
    assert_eq!(limit_name(&r), "bucket", "{r:?}");
    let (status, page) = support::http_get(t.http, "/metrics").await;
    assert_eq!(status, 200);
    for (path, over) in [
        ("mixed[0]", 4.0),
        ("mixed[1]", 0.0),
        ("mixed[2]", 0.0),
        ("mixed[3]", 0.0),
    ] {
        let series = |name: &str| {
            page.lines()
                .filter(|l| l.starts_with(name))
                .filter(|l| l.contains(&format!("domain=\"{domain}\"")))
                .filter(|l| l.contains(&format!("rule=\"{path}\"")))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
                .sum::<f64>()
        };
        assert_eq!(
            series("tollgate_rule_hits_total{"),
            9.0,
            "{path} counts every call:\n{page}"
        );
        assert_eq!(
            series("tollgate_rule_over_limit_total{"),
            over,
            "{path} counts its own refusals"
        );
    }
}

async fn run(settings: &[(&str, &str)]) {
    let domain = unique_domain("lists");
    let t = Arc::new(Tollgate::start(&[("r.yaml", &rules(&domain))], settings).await);
    t.wait_serving(Duration::from_secs(30)).await;
    let (a, b) = tokio::join!(
        the_sequence(&t, &domain, "log"),
        the_sequence(&t, &domain, "plain")
    );
    let _ = (a, b);
    let (a, b) = tokio::join!(
        concurrent(&t, &domain, "log"),
        concurrent(&t, &domain, "plain")
    );
    let _ = (a, b);
    if !settings.is_empty() {
        // On Redis the callers queued behind a call in flight went out
        // together: a list's queued hits in one group call.
        let batches = metric_sum(&t, "tollgate_coalesce_batches_total").await;
        assert!(batches >= 1.0, "coalesced calls: {batches}");
    }
    every_algorithm(&t, &domain).await;
    Arc::into_inner(t).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_on_the_embedded_store() {
    run(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_on_redis() {
    let redis = RedisServer::start();
    run(&[("store", &redis.url())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    run(&[("store", &cluster.url())]).await;
}

fn feature_rules(domain: &str) -> String {
    format!(
        "domain: {domain}
descriptors:
  # Charged only by requests answered OK: the gate refusing takes back
  # what the list charged, on every limit.
  - key: user
    rate_limits:
      - {{unit: minute, requests_per_unit: 10, algorithm: sliding_window_log, count_refused: false}}
      - {{unit: hour, requests_per_unit: 3, algorithm: fixed_window, name: hourly, count_refused: false}}
  - key: gate
    rate_limit: {{unit: hour, requests_per_unit: 1, algorithm: fixed_window}}
  # Counted, never enforced.
  - key: shadow
    shadow_mode: true
    rate_limits:
      - {{unit: minute, requests_per_unit: 2, algorithm: sliding_window_log}}
      - {{unit: hour, requests_per_unit: 3, algorithm: sliding_window_log}}
  # One limit of a list replaced by another descriptor's rule.
  - key: app
    rate_limits:
      - {{unit: minute, requests_per_unit: 100, algorithm: sliding_window_log, name: app_minute}}
      - {{unit: hour, requests_per_unit: 2, algorithm: sliding_window_log, name: app_hour}}
  - key: premium
    rate_limit:
      unit: hour
      requests_per_unit: 1000
      algorithm: sliding_window_log
      replaces: [{{name: app_hour}}]
  # Split over 4 shards, each holding a share of both limits.
  - key: sharded
    rate_limits:
      - {{unit: second, requests_per_unit: 8, algorithm: sliding_window_log, shards: 4}}
      - {{unit: minute, requests_per_unit: 12, algorithm: sliding_window_log, shards: 4, name: sharded_minute}}
  # A calendar quota beside a rate: 3 a day in Auckland, renewed at
  # local midnight.
  - key: calendar
    rate_limits:
      - {{unit: second, requests_per_unit: 10, algorithm: sliding_window_log}}
      - {{unit: day, requests_per_unit: 3, timezone: Pacific/Auckland, name: daily}}
  # A zero limit in a list refuses the descriptor, without a store call.
  - key: banned
    rate_limits:
      - {{unit: minute, requests_per_unit: 100}}
      - {{unit: hour, requests_per_unit: 0, name: ban}}
"
    )
}

/// Seconds since the epoch of the first midnight in Auckland after `at`,
/// by Python's `zoneinfo` on the host's time-zone database.
fn auckland_midnight_after(at: f64) -> f64 {
    const SCRIPT: &str = "import sys\nfrom datetime import datetime, timedelta\nfrom zoneinfo import ZoneInfo\nz = ZoneInfo('Pacific/Auckland')\nd = datetime.fromtimestamp(float(sys.argv[1]), z).date() + timedelta(days=1)\nprint(datetime(d.year, d.month, d.day, tzinfo=z).timestamp())";
    let out = std::process::Command::new("python3")
        .args(["-c", SCRIPT, &at.to_string()])
        .output()
        .expect("python3 with zoneinfo");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

async fn ask_many(t: &Tollgate, req: &RateLimitRequest, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        ok += usize::from(t.ask(req.clone()).await.overall_code == Code::Ok as i32);
    }
    ok
}

async fn metric_sum(t: &Tollgate, name: &str) -> f64 {
    let (status, page) = support::http_get(t.http, "/metrics").await;
    assert_eq!(status, 200);
    page.lines()
        .filter(|l| l.starts_with(name))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

async fn features(settings: &[(&str, &str)]) {
    let domain = unique_domain("list-features");
    let t = Tollgate::start(&[("r.yaml", &feature_rules(&domain))], settings).await;
    t.wait_serving(Duration::from_secs(30)).await;
    let one = |entries: &[(&str, &str)]| RateLimitRequest {
        domain: domain.clone(),
        descriptors: entries.iter().map(|e| descriptor(&[*e])).collect(),
        hits_addend: 0,
    };

    // count_refused: false. The first request passes the gate; the next
    // four are refused by it, and what they charged on both limits of the
    // list is taken back: the user still has 2 of the hour's 3.
    let both = one(&[("user", "u1"), ("gate", "g1")]);
    assert_eq!(ask_many(&t, &both, 5).await, 1);
    let alone = one(&[("user", "u1")]);
    assert_eq!(
        ask_many(&t, &alone, 5).await,
        2,
        "the refused requests' charges stay taken back"
    );
    let r = t.ask(alone.clone()).await;
    assert_eq!(limit_name(&r), "hourly", "{r:?}");

    // shadow_mode: never refused.
    let shadow = one(&[("shadow", "s1")]);
    assert_eq!(ask_many(&t, &shadow, 6).await, 6);

    // replaces: with `premium`, the list's hour limit is dropped and its
    // minute limit stays; without, the hour limit holds.
    let with_premium = one(&[("app", "a1"), ("premium", "p1")]);
    assert_eq!(ask_many(&t, &with_premium, 5).await, 5);
    let app = one(&[("app", "a1")]);
    assert_eq!(
        ask_many(&t, &app, 5).await,
        2,
        "the hour limit counted none of the replaced calls"
    );

    // A request's limit override replaces the whole list.
    let mut over = one(&[("app", "a2")]);
    over.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 4,
        unit: Unit::Hour as i32,
    });
    assert_eq!(ask_many(&t, &over, 6).await, 4);
    let r = t.ask(over.clone()).await;
    let limit = status(&r).current_limit.clone().unwrap();
    assert_eq!((limit.requests_per_unit, limit.name.as_str()), (4, ""));

    // Shards: 8 a second and 12 a minute over 4 shards admit exactly 8,
    // then 4 more a second later, then none: every limit's shares add up
    // to it.
    let sharded = one(&[("sharded", "x")]);
    assert_eq!(ask_many(&t, &sharded, 20).await, 8);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(ask_many(&t, &sharded, 20).await, 4);
    let r = t.ask(sharded.clone()).await;
    assert_eq!(limit_name(&r), "sharded_minute", "{r:?}");

    // A calendar limit in a list: refused once the day's 3 are spent,
    // until local midnight in Auckland (Python's zoneinfo says when).
    let calendar = one(&[("calendar", "c")]);
    assert_eq!(ask_many(&t, &calendar, 5).await, 3);
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let r = t.ask(calendar.clone()).await;
    assert_eq!(limit_name(&r), "daily", "{r:?}");
    let midnight = auckland_midnight_after(at);
    assert!(
        (reset_secs(&r) - (midnight - at)).abs() < 1.5,
        "reset {} against {} to Auckland's midnight",
        reset_secs(&r),
        midnight - at
    );

    // A zero limit in the list: refused, naming it.
    let r = t.ask(one(&[("banned", "b")])).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(limit_name(&r), "ban", "{r:?}");

    // The over-limit cache answers a list's repeated refusals, naming
    // the limit that refused (not on `count_refused: false` lists, whose
    // charges can be taken back before the reset).
    let hits_before = metric_sum(&t, "tollgate_over_limit_cache_hits_total").await;
    for _ in 0..5 {
        let r = t.ask(app.clone()).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        assert_eq!(limit_name(&r), "app_hour", "{r:?}");
    }
    let hits = metric_sum(&t, "tollgate_over_limit_cache_hits_total").await - hits_before;
    assert!(hits >= 4.0, "the cache answered {hits} of 5 refusals");

    // /rlconfig lists every limit of a list by its place.
    let (status, text) = support::http_get(t.debug, "/rlconfig").await;
    assert_eq!(status, 200);
    for line in [
        format!("{domain}.user[0]: 10/minute sliding_window_log"),
        format!("{domain}.user[1]: 3/hour fixed_window"),
    ] {
        assert!(text.contains(&line), "{line} in:\n{text}");
    }
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_with_other_features_on_the_embedded_store() {
    features(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_with_other_features_on_redis() {
    let redis = RedisServer::start();
    features(&[("store", &redis.url())]).await;
}

/// A decision on a list of four limits is one script call on Redis: 50
/// decisions one after the other, 50 `EVALSHA` (and no other command
/// that runs a script).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_is_decided_by_one_script_call() {
    let redis = RedisServer::start();
    let domain = unique_domain("one-call");
    let t = Tollgate::start(
        &[("r.yaml", &rules(&domain))],
        &[("store", &redis.url()), ("redis.coalesce", "false")],
    )
    .await;
    t.wait_serving(Duration::from_secs(30)).await;
    // Loads the scripts and warms the connection.
    t.ask(request(&domain, "mixed", "warm")).await;
    let before = support::redis::command_calls(redis.port(), "evalsha");
    let evals = support::redis::command_calls(redis.port(), "eval");
    for i in 0..50 {
        let r = t.ask(request(&domain, "mixed", &format!("k{i}"))).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    let calls = support::redis::command_calls(redis.port(), "evalsha") - before;
    assert_eq!(calls, 50, "one EVALSHA per decision on four limits");
    assert_eq!(support::redis::command_calls(redis.port(), "eval"), evals);
    t.stop().await;
}

/// A limit of a list that fails after the limits before it recorded (here
/// its key holds a string: `WRONGTYPE`) fails the whole call, and what the
/// others recorded is taken back in the same step: nothing of the call
/// stays. (A limit whose keys moved away during a reshard fails the same
/// way, and the call is sent again where they are.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_failing_midway_leaves_nothing_recorded() {
    let redis = RedisServer::start();
    let domain = unique_domain("midway");
    let rules = format!(
        "domain: {domain}
descriptors:
  - key: user
    rate_limits:
      - {{unit: hour, requests_per_unit: 10, algorithm: fixed_window}}
      - {{unit: day, requests_per_unit: 10, algorithm: fixed_window}}
"
    );
    let t = Tollgate::start(&[("r.yaml", &rules)], &[("store", &redis.url())]).await;
    t.wait_serving(Duration::from_secs(30)).await;
    let req = request(&domain, "user", "u");
    assert_eq!(t.ask(req.clone()).await.overall_code, Code::Ok as i32);
    let keys = redis.cli(&["KEYS", "*"]);
    let hour = keys
        .lines()
        .find(|k| k.contains(":f3600:"))
        .unwrap()
        .to_string();
    let day = keys
        .lines()
        .find(|k| k.contains(":f86400:"))
        .unwrap()
        .to_string();
    assert_eq!(redis.cli(&["HGET", &hour, "c"]).trim(), "1");
    redis.cli(&["DEL", &day]);
    redis.cli(&["SET", &day, "not a hash"]);
    let mut client = t.client().await;
    let status = client.should_rate_limit(req.clone()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert_eq!(
        redis.cli(&["HGET", &hour, "c"]).trim(),
        "1",
        "the hour's charge of the failed call was taken back"
    );
    redis.cli(&["DEL", &day]);
    assert_eq!(t.ask(req).await.overall_code, Code::Ok as i32);
    assert_eq!(redis.cli(&["HGET", &hour, "c"]).trim(), "2");
    t.stop().await;
}
