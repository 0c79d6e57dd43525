//! `algorithm: concurrency` over real gRPC, as a client sends it: a take
//! is a hit on the descriptor, a release the same descriptor with
//! `is_negative_hits` (as Envoy sends at stream done, for refused
//! requests too). On the embedded store, Redis and a 3+3 Redis Cluster,
//! with two replicas on the Redis stores:
//! - N slots are held and the next take is refused; a refused request's
//!   release frees nothing, an admitted one's frees a slot;
//! - releases beyond what is held free nothing: the count never goes
//!   below zero;
//! - a slot whose release never comes frees itself after `max_duration`,
//!   and not before;
//! - in a `rate_limits:` list with a rate, a take the rate refuses holds
//!   no slot, and its release frees none; nor does a take another
//!   descriptor refuses, with `count_refused: false`;
//! - a reset frees every slot, and the releases of the takes before it
//!   free nothing taken after.
//!
//! And the rule keys it refuses, with file and line.

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use support::redis::{RedisCluster, RedisServer};
use support::tollgate::{Tollgate, descriptor};
use support::{http_post as post, unique_domain};
use tollgate::rules::{LoadOptions, parse_file};
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// How long a slot is held at most, in the rules below.
const MAX_DURATION: Duration = Duration::from_secs(2);

fn rules(domain: &str) -> String {
    format!(
        "domain: {domain}
descriptors:
  - key: tenant
    rate_limit:
      algorithm: concurrency
      unit: second
      requests_per_unit: 3
      max_duration: 2s
  - key: listed
    rate_limits:
      - {{algorithm: concurrency, unit: second, requests_per_unit: 2, max_duration: 2s}}
      - {{unit: minute, requests_per_unit: 4, algorithm: fixed_window}}
  - key: pooled
    rate_limit:
      algorithm: concurrency
      unit: second
      requests_per_unit: 2
      max_duration: 2s
      count_refused: false
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: 1, algorithm: fixed_window}}
"
    )
}

/// One call on `entries`, with Envoy's `hits_addend` of 1 on the
/// descriptor; a release when `release`.
fn call(domain: &str, entries: &[(&str, &str)], release: bool) -> RateLimitRequest {
    let mut d: RateLimitDescriptor = descriptor(entries);
    d.hits_addend = Some(UInt64Value { value: 1 });
    d.is_negative_hits = release;
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![d],
        hits_addend: 0,
    }
}

/// Two clients (on two replicas where there are two), used in turn.
struct Clients {
    all: Vec<RateLimitServiceClient<Channel>>,
    next: usize,
}

impl Clients {
    async fn of(replicas: &[Tollgate]) -> Clients {
        let mut all = Vec::new();
        for r in replicas {
            all.push(r.client().await);
        }
        Clients { all, next: 0 }
    }

    async fn ask(&mut self, r: RateLimitRequest) -> RateLimitResponse {
        let i = self.next % self.all.len();
        self.next += 1;
        self.all[i].should_rate_limit(r).await.unwrap().into_inner()
    }

    async fn take(&mut self, domain: &str, entries: &[(&str, &str)]) -> i32 {
        self.ask(call(domain, entries, false)).await.overall_code
    }

    async fn release(&mut self, domain: &str, entries: &[(&str, &str)]) {
        let r = self.ask(call(domain, entries, true)).await;
        assert_eq!(r.overall_code, OK, "a release is always answered OK");
    }
}

const A: &[(&str, &str)] = &[("tenant", "a")];

async fn held_refused_and_released(c: &mut Clients, domain: &str) {
    for i in 0..3 {
        assert_eq!(c.take(domain, A).await, OK, "take {i} of 3");
    }
    assert_eq!(c.take(domain, A).await, OVER, "the 4th take, 3 held");
    // The refused request's release (Envoy sends one) frees nothing.
    c.release(domain, A).await;
    assert_eq!(
        c.take(domain, A).await,
        OVER,
        "after a refused request's release"
    );
    c.release(domain, A).await;
    // An admitted request's release frees its slot.
    c.release(domain, A).await;
    assert_eq!(
        c.take(domain, A).await,
        OK,
        "after an admitted request's release"
    );
    assert_eq!(c.take(domain, A).await, OVER, "3 held again");
    c.release(domain, A).await;
    // Releases beyond what is held: nothing below zero.
    for _ in 0..10 {
        c.release(domain, A).await;
    }
    for i in 0..3 {
        assert_eq!(
            c.take(domain, A).await,
            OK,
            "take {i} after every slot was freed"
        );
    }
    assert_eq!(
        c.take(domain, A).await,
        OVER,
        "released ten times, still 3 at most"
    );
}

/// Three slots taken and never released: refused for as long as
/// `MAX_DURATION` after the first take (whose slot frees first), measured
/// from before it was sent, then free again.
async fn expire(c: &mut Clients, domain: &str) {
    let b: &[(&str, &str)] = &[("tenant", "b")];
    let first = Instant::now();
    for i in 0..3 {
        assert_eq!(c.take(domain, b).await, OK, "take {i}");
    }
    let freed = loop {
        let code = c.take(domain, b).await;
        let answered = first.elapsed();
        if code == OK {
            break answered;
        }
        assert!(
            answered < MAX_DURATION + Duration::from_secs(10),
            "never freed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The oldest slot, the first take's, was made after `first`, so it
    // frees at MAX_DURATION after it at the earliest (the takes after it
    // may come later on a busy machine: their slots free later).
    assert!(freed >= MAX_DURATION, "a slot freed itself after {freed:?}");
}

/// A list of [2 in flight, 4 a minute]: the rate refuses the 5th take,
/// which then holds no slot; its release frees nothing.
async fn in_a_list(c: &mut Clients, domain: &str) {
    let l: &[(&str, &str)] = &[("listed", "x")];
    for i in 0..4 {
        assert_eq!(c.take(domain, l).await, OK, "take {i}");
        if i < 3 {
            c.release(domain, l).await;
        }
    }
    // One slot held (the 4th take), and the minute's 4 used.
    let r = c.ask(call(domain, l, false)).await;
    assert_eq!(r.overall_code, OVER, "the rate refuses");
    // Its release frees nothing: the slot held stays held.
    c.release(domain, l).await;
    // The other slot is free, but the rate still refuses: ask the count
    // alone. With the rate spent, only the slots tell: 1 held of 2.
    let check = RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![{
            let mut d = descriptor(l);
            d.hits_addend = Some(UInt64Value { value: 0 });
            d
        }],
        hits_addend: 0,
    };
    let r = c.ask(check).await;
    let concurrency = &r.statuses[0];
    assert!(
        concurrency.limit_remaining <= 1,
        "at most one slot left, found {}",
        concurrency.limit_remaining
    );
}

/// `count_refused: false`: a request another descriptor refuses holds no
/// slot, and its release frees none another request holds.
async fn refused_elsewhere(c: &mut Clients, domain: &str) {
    let pooled: &[(&str, &str)] = &[("pooled", "p")];
    let with_user = |user: &str| {
        let mut r = call(domain, pooled, false);
        r.descriptors.push(descriptor(&[("user", user)]));
        r
    };
    assert_eq!(
        c.ask(with_user("a")).await.overall_code,
        OK,
        "the first take"
    );
    let r = c.ask(with_user("a")).await;
    assert_eq!(r.overall_code, OVER, "the user's limit refuses");
    assert_eq!(r.statuses[0].code, OK, "the pool had a slot");
    // The refused request's release (its take was given back).
    c.release(domain, pooled).await;
    assert_eq!(
        c.ask(with_user("b")).await.overall_code,
        OK,
        "the refused request held no slot"
    );
    let r = c.ask(with_user("c")).await;
    assert_eq!(r.overall_code, OVER, "2 held: its release freed none");
    assert_eq!(r.statuses[0].code, OVER, "refused by the pool");
    c.release(domain, pooled).await;
    // An admitted request's release frees its slot.
    c.release(domain, pooled).await;
    assert_eq!(c.ask(with_user("d")).await.overall_code, OK, "a slot freed");
}

/// A reset frees the slots; the releases of the takes before it free
/// nothing taken after.
async fn reset(c: &mut Clients, debug: SocketAddr, domain: &str) {
    let r: &[(&str, &str)] = &[("tenant", "r")];
    for _ in 0..3 {
        assert_eq!(c.take(domain, r).await, OK);
    }
    let body = serde_json::json!({
        "domain": domain,
        "descriptors": [{"entries": [{"key": "tenant", "value": "r"}]}],
    })
    .to_string();
    let (status, text) = post(debug, "/reset", &body).await;
    assert_eq!(status, 200, "{text}");
    for i in 0..3 {
        assert_eq!(c.take(domain, r).await, OK, "take {i} after the reset");
    }
    // The releases of the three taken before the reset.
    for _ in 0..3 {
        c.release(domain, r).await;
    }
    assert_eq!(
        c.take(domain, r).await,
        OVER,
        "3 taken after the reset are held"
    );
}

async fn every_case(settings: &[(&str, &str)], replicas: usize) {
    let domain = unique_domain("concurrency");
    let text = rules(&domain);
    let all = Tollgate::start_replicas(replicas, &[("r.yaml", text.as_str())], settings).await;
    let mut c = Clients::of(&all).await;
    held_refused_and_released(&mut c, &domain).await;
    in_a_list(&mut c, &domain).await;
    refused_elsewhere(&mut c, &domain).await;
    reset(&mut c, all[0].debug, &domain).await;
    expire(&mut c, &domain).await;
    for t in all {
        t.stop().await;
    }
}

#[tokio::test]
async fn slots_on_the_embedded_store() {
    every_case(&[], 1).await;
}

#[tokio::test]
async fn slots_on_redis_across_two_replicas() {
    let redis = RedisServer::start();
    let url = redis.url();
    every_case(&[("store", &url), ("redis.command_timeout_ms", "5000")], 2).await;
}

#[tokio::test]
async fn slots_on_a_redis_cluster_across_two_replicas() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    every_case(&[("store", &url), ("redis.command_timeout_ms", "5000")], 2).await;
}

/// Redis loses the set of slots (evicted, deleted) while its metadata
/// stays: nothing is held, whatever the metadata says, and the count
/// starts again from the set.
#[tokio::test]
async fn a_lost_set_of_slots_holds_nothing() {
    let redis = RedisServer::start();
    let url = redis.url();
    let domain = unique_domain("concurrency-lost");
    let text = rules(&domain);
    let t = Tollgate::start(
        &[("r.yaml", text.as_str())],
        &[("store", &url), ("redis.command_timeout_ms", "5000")],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    let mut c = Clients::of(std::slice::from_ref(&t)).await;
    for _ in 0..3 {
        assert_eq!(c.take(&domain, A).await, OK);
    }
    assert_eq!(c.take(&domain, A).await, OVER, "3 held");
    let keys = redis.cli(&["KEYS", "*"]);
    let sets: Vec<&str> = keys
        .lines()
        .filter(|k| redis.cli(&["TYPE", k]).trim() == "zset")
        .collect();
    assert_eq!(sets.len(), 1, "one set of slots in {keys}");
    redis.cli(&["DEL", sets[0]]);
    for i in 0..3 {
        assert_eq!(
            c.take(&domain, A).await,
            OK,
            "take {i} after the set was lost"
        );
    }
    assert_eq!(c.take(&domain, A).await, OVER, "3 held again");
    t.stop().await;
}

/// Each refusal of the rule loader, with its line.
#[test]
fn what_a_limit_in_flight_refuses_at_load() {
    let cases: &[(&str, &str)] = &[
        (
            "{algorithm: concurrency, unit: second, requests_per_unit: 5}",
            "concurrency needs max_duration",
        ),
        (
            "{algorithm: concurrency, unit: second, requests_per_unit: 5, max_duration: 0s}",
            "max_duration must be more than 0",
        ),
        (
            "{algorithm: concurrency, unit: second, requests_per_unit: 5, max_duration: 30}",
            "ms, s, m or h",
        ),
        (
            "{algorithm: fixed_window, unit: second, requests_per_unit: 5, max_duration: 30s}",
            "max_duration applies only to concurrency, not fixed_window",
        ),
        (
            "{algorithm: concurrency, unit: minute, requests_per_unit: 5, max_duration: 30s}",
            "unit must be second",
        ),
        (
            "{algorithm: concurrency, unit: second, unit_multiplier: 2, requests_per_unit: 5, max_duration: 30s}",
            "unit_multiplier has no place on concurrency",
        ),
        (
            "{algorithm: concurrency, unit: second, requests_per_unit: 5, max_duration: 30s, shards: 2}",
            "shards has no place on concurrency",
        ),
        (
            "{algorithm: concurrency, unit: second, requests_per_unit: 5, max_duration: 30s, usage_reports: true}",
            "usage_reports has no place on concurrency",
        ),
        (
            "{algorithm: concurrency, unit: second, requests_per_unit: 5, max_duration: 30s, lease: true}",
            "not concurrency: a slot is freed by a later call",
        ),
        (
            "{algorithm: concurrency, unit: day, requests_per_unit: 5, max_duration: 30s, timezone: UTC}",
            "timezone",
        ),
        (
            "{algorithm: concurrency, unit: second, requests_per_unit: 5, max_duration: 30s, burst: 3}",
            "burst applies only to token_bucket",
        ),
    ];
    for (limit, reason) in cases {
        // The flow form puts every key on the limit's line (4); the block
        // form below puts each on its own.
        let text = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {limit}\n");
        let errors = parse_file(Path::new("r.yaml"), &text, &LoadOptions::default())
            .expect_err(limit)
            .to_string();
        assert!(
            errors.contains("r.yaml:4: ") && errors.contains(reason),
            "{limit}: expected r.yaml:4: ...{reason}... in:\n{errors}"
        );
    }
    // Block form: the error is on the key's own line.
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      algorithm: concurrency\n      unit: second\n      requests_per_unit: 5\n      max_duration: 1.5s\n";
    let errors = parse_file(Path::new("r.yaml"), text, &LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(errors.contains("r.yaml:8: "), "{errors}");
    // A limit may not replace a count in flight: its take and release are
    // two requests. Refused at the replacing rule's descriptor.
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: concurrency, unit: second, requests_per_unit: 5, max_duration: 1s, name: c}\n  - key: p\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: c}]}\n";
    let errors = tollgate::rules::load_texts(
        vec![(std::path::PathBuf::from("r.yaml"), text.to_string())],
        &LoadOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        errors.contains("r.yaml:5: ") && errors.contains("a concurrency limit"),
        "{errors}"
    );
    let ok = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {algorithm: concurrency, unit: second, requests_per_unit: 5, max_duration: 500ms}\n";
    parse_file(Path::new("r.yaml"), ok, &LoadOptions::default()).unwrap();
}
