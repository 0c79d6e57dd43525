//! What a client controls is decided, never refused: descriptor values of
//! any length or encoding are limited like any other, a request up to the
//! message limit is decided, the in-flight gate answers by `on_overload`
//! (and never stands in front of a refusal the over-limit cache can give),
//! and gRPC answers only once the store is ready. Envoy lets a request
//! through on any error, so each of these was a way around every limit.
//! Real gRPC on loopback, the embedded store, real Redis and a real Redis
//! Cluster, and the real binary where startup matters.

mod support;

use support::free_port;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use support::process::Proc;
use support::redis::{RedisCluster, RedisServer};
use support::tollgate::{Tollgate, descriptor as desc};
use support::unique_domain;
use tonic::Code as GrpcCode;
use tonic::transport::Channel;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The request as raw bytes on the wire: what Envoy sends when a header
/// holds bytes that are not UTF-8 (a `string` field cannot carry them).
#[derive(Clone, PartialEq, prost::Message)]
struct RawRequest {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<RawEntry>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawEntry {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

async fn send_raw(channel: Channel, req: RawRequest) -> Result<RateLimitResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(PATH);
    let codec = tonic_prost::ProstCodec::<RawRequest, RateLimitResponse>::default();
    grpc.unary(tonic::Request::new(req), path, codec)
        .await
        .map(|r| r.into_inner())
}

fn raw(domain: &str, key: &str, value: &[u8]) -> RawRequest {
    RawRequest {
        domain: domain.into(),
        descriptors: vec![RawDescriptor {
            entries: vec![RawEntry {
                key: key.as_bytes().to_vec(),
                value: value.to_vec(),
            }],
        }],
    }
}

fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// `v` (any value) at 2 per hour; `w` values starting with `caf` at 1 per
/// hour.
fn value_rules(domain: &str) -> String {
    format!(
        r#"domain: {domain}
descriptors:
  - key: v
    rate_limit: {{unit: hour, requests_per_unit: 2}}
  - key: w
    value: "caf*"
    rate_limit: {{unit: hour, requests_per_unit: 1, algorithm: fixed_window}}
"#
    )
}

fn codes(r: &RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

/// Three calls on one value: OK, OK, OVER_LIMIT (a limit of 2).
async fn limited_exactly(client: &mut RateLimitServiceClient<Channel>, domain: &str, value: &str) {
    let mut got = Vec::new();
    for _ in 0..3 {
        let r = client
            .should_rate_limit(req(domain, vec![desc(&[("v", value)])]))
            .await
            .unwrap_or_else(|e| panic!("a value of {} bytes was refused: {e:?}", value.len()))
            .into_inner();
        got.push(r.overall_code);
    }
    assert_eq!(got, [OK, OK, OVER], "a value of {} bytes", value.len());
}

/// Every value scenario against one store (`settings` choose it).
async fn values_are_decided(settings: &[(&str, &str)]) {
    support::away_from_an_hour_boundary().await;
    let domain = unique_domain("values");
    let t = Tollgate::start(&[("v.yaml", &value_rules(&domain))], settings).await;
    t.wait_serving(Duration::from_secs(30)).await;
    let mut c = t.client().await;

    // Long values: limited exactly, whatever their length.
    for len in [4096, 16 * 1024, 61_000] {
        limited_exactly(&mut c, &domain, &"x".repeat(len)).await;
    }
    // Two long values differing only in their last byte are two limiters;
    // equal ones share one.
    let a = format!("{}a", "y".repeat(20_000));
    let b = format!("{}b", "y".repeat(20_000));
    limited_exactly(&mut c, &domain, &a).await;
    limited_exactly(&mut c, &domain, &b).await;
    // A value that looks like what a long one becomes inside is a third.
    limited_exactly(&mut c, &domain, "\u{1}sha256:00").await;

    // Bytes that are not UTF-8: decided and limited, each its own limiter,
    // and the valid text around them still matches a rule's pattern.
    let channel = Channel::from_shared(format!("http://{}", t.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    for value in [
        &b"\xff"[..],
        b"\xfe",
        b"caf\xe9",
        b"\xc3\x28 mixed \xa0\xa1",
    ] {
        let mut got = Vec::new();
        for _ in 0..3 {
            let r = send_raw(channel.clone(), raw(&domain, "v", value))
                .await
                .unwrap_or_else(|e| panic!("value {value:?} was refused: {e:?}"));
            assert!(r.statuses[0].current_limit.is_some(), "{r:?}");
            got.push(r.overall_code);
        }
        assert_eq!(got, [OK, OK, OVER], "value {value:?}");
    }
    let first = send_raw(channel.clone(), raw(&domain, "w", b"caf\xe9"))
        .await
        .unwrap();
    assert_eq!(first.overall_code, OK, "{first:?}");
    assert_eq!(
        first.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1,
        "caf* matches caf\\xe9"
    );
    let second = send_raw(channel.clone(), raw(&domain, "w", b"caf\xe9"))
        .await
        .unwrap();
    assert_eq!(second.overall_code, OVER, "{second:?}");

    // A 1 MiB message of 64 long values: every one decided.
    let big = req(
        &domain,
        (0..64)
            .map(|i| desc(&[("v", &format!("{i:02}{}", "z".repeat(16 * 1024)))]))
            .collect(),
    );
    for (round, want) in [(0, OK), (1, OK), (2, OVER)] {
        let r = c
            .should_rate_limit(big.clone())
            .await
            .unwrap_or_else(|e| panic!("a 1 MiB request was refused: {e:?}"))
            .into_inner();
        assert_eq!(r.overall_code, want, "round {round}");
        assert_eq!(codes(&r), vec![want; 64], "round {round}");
    }
    t.stop().await;
}

#[tokio::test]
async fn values_of_any_length_and_bytes_are_decided_on_the_embedded_store() {
    values_are_decided(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_of_any_length_and_bytes_are_decided_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    values_are_decided(&[("store", &url), ("redis.command_timeout_ms", "5000")]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_of_any_length_and_bytes_are_decided_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    values_are_decided(&[("store", &url), ("redis.command_timeout_ms", "5000")]).await;
}

/// Operator-side limits (what only Envoy's route configuration reaches)
/// stay clear errors: a key that is not UTF-8, too many descriptors.
#[tokio::test]
async fn operator_side_limits_stay_invalid_argument() {
    let domain = unique_domain("operator");
    let t = Tollgate::start(&[("v.yaml", &value_rules(&domain))], &[]).await;
    let channel = Channel::from_shared(format!("http://{}", t.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut bad_key = raw(&domain, "v", b"x");
    bad_key.descriptors[0].entries[0].key = b"k\xff".to_vec();
    let e = send_raw(channel.clone(), bad_key).await.unwrap_err();
    assert_eq!(e.code(), GrpcCode::InvalidArgument, "{e:?}");
    assert!(e.message().contains("key is not UTF-8"), "{e:?}");
    let mut c = t.client().await;
    let e = c
        .should_rate_limit(req(&domain, vec![desc(&[("v", "a")]); 65]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), GrpcCode::InvalidArgument, "{e:?}");
    assert!(e.message().contains("max_descriptors=64"), "{e:?}");
    t.stop().await;
}

fn pause(redis: &RedisServer, ms: u64) {
    assert_eq!(
        redis.cli(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"]),
        "OK",
        "CLIENT PAUSE"
    );
}

/// `k` at `limit` per hour, fixed window (its refusals are cached).
fn overload_rules(domain: &str, limit: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {limit}, algorithm: fixed_window}}\n"
    )
}

/// Holds `n` calls on Redis (paused) and returns their tasks.
fn hold(
    client: &RateLimitServiceClient<Channel>,
    domain: &str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<Result<tonic::Response<RateLimitResponse>, tonic::Status>>> {
    (0..n)
        .map(|i| {
            let mut c = client.clone();
            let r = req(domain, vec![desc(&[("k", &format!("held{i}"))])]);
            tokio::spawn(async move { c.should_rate_limit(r).await })
        })
        .collect()
}

/// Past `max_in_flight`, `on_overload` answers at once: allow, deny, and
/// by default whatever `on_store_error` says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_answers_by_on_overload() {
    let redis = RedisServer::start();
    let url = redis.url();
    type Extra<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Extra, Result<i32, GrpcCode>); 4] = [
        (&[("on_overload", "allow")], Ok(OK)),
        (&[("on_overload", "deny")], Ok(OVER)),
        (&[("on_store_error", "deny")], Ok(OVER)),
        (&[], Err(GrpcCode::ResourceExhausted)),
    ];
    for (extra, want) in cases {
        support::away_from_an_hour_boundary().await;
        let domain = unique_domain("overload");
        let mut settings = vec![
            ("store", url.as_str()),
            ("max_in_flight", "2"),
            ("redis.command_timeout_ms", "10000"),
        ];
        settings.extend_from_slice(extra);
        let t = Tollgate::start(&[("o.yaml", &overload_rules(&domain, 100))], &settings).await;
        t.wait_serving(Duration::from_secs(20)).await;
        let client = t.client().await;
        pause(&redis, 1500);
        let held = hold(&client, &domain, 2);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        let got = client
            .clone()
            .should_rate_limit(req(&domain, vec![desc(&[("k", "extra")])]))
            .await
            .map(|r| r.into_inner().overall_code)
            .map_err(|e| {
                assert!(e.message().contains("max_in_flight=2"), "{e:?}");
                e.code()
            });
        assert_eq!(got, want, "{extra:?}");
        assert!(
            started.elapsed() < Duration::from_millis(1000),
            "answered at once, not after Redis: {:?}",
            started.elapsed()
        );
        for h in held {
            let r = h.await.unwrap().expect("held calls are answered");
            assert_eq!(r.into_inner().overall_code, OK);
        }
        t.stop().await;
    }
}

/// A limiter the over-limit cache knows to be exhausted is refused locally
/// while every slot of the gate is taken: a flood on it gets OVER_LIMIT,
/// not the error Envoy would let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_refusals_skip_the_in_flight_gate() {
    support::away_from_an_hour_boundary().await;
    let redis = RedisServer::start();
    let domain = unique_domain("cachegate");
    let t = Tollgate::start(
        &[("o.yaml", &overload_rules(&domain, 1))],
        &[
            ("store", &redis.url()),
            ("max_in_flight", "2"),
            ("redis.command_timeout_ms", "10000"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    let mut client = t.client().await;
    let hot = || req(&domain, vec![desc(&[("k", "hot")])]);
    let first = client.should_rate_limit(hot()).await.unwrap().into_inner();
    assert_eq!(first.overall_code, OK);
    let second = client.should_rate_limit(hot()).await.unwrap().into_inner();
    assert_eq!(second.overall_code, OVER);

    pause(&redis, 1500);
    let held = hold(&client, &domain, 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..50 {
        let r = client.should_rate_limit(hot()).await.unwrap().into_inner();
        assert_eq!(r.overall_code, OVER, "{r:?}");
    }
    // A limiter the cache does not know still meets the gate.
    let e = client
        .should_rate_limit(req(&domain, vec![desc(&[("k", "cold")])]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), GrpcCode::ResourceExhausted, "{e:?}");
    for h in held {
        h.await.unwrap().expect("held calls are answered");
    }
    t.stop().await;
}

/// Starts the binary on fresh ports with `store`, and connects to its gRPC
/// port as soon as it listens. Returns the process, the connected channel
/// and when the process was started.
async fn start_and_connect(
    domain: &str,
    store: &str,
    extra: &[(&str, &str)],
) -> (Proc, Channel, Instant, tempfile::TempDir) {
    let rules_dir = tempfile::tempdir().unwrap();
    std::fs::write(rules_dir.path().join("r.yaml"), overload_rules(domain, 100)).unwrap();
    let grpc_addr = format!("127.0.0.1:{}", free_port());
    let http_addr = format!("127.0.0.1:{}", free_port());
    let dir = rules_dir.path().display().to_string();
    let mut env = vec![
        ("TOLLGATE_GRPC_ADDR", grpc_addr.as_str()),
        ("TOLLGATE_HTTP_ADDR", http_addr.as_str()),
        ("TOLLGATE_RULES_DIR", dir.as_str()),
        ("TOLLGATE_STORE", store),
    ];
    env.extend_from_slice(extra);
    let started = Instant::now();
    let p = Proc::spawn(&["serve"], &env);
    let addr: SocketAddr = grpc_addr.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Once the port takes connections, a call is answered by the server
    // (it waits in the listen queue until gRPC is served).
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{addr} never listened");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (p, channel, started, rules_dir)
}

/// On a healthy Redis the first call after startup is a decision: gRPC
/// answers once the store is connected, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_after_startup_is_a_decision() {
    let redis = RedisServer::start();
    for round in 0..3 {
        let domain = unique_domain("startup");
        let (p, channel, _, _dir) = start_and_connect(&domain, &redis.url(), &[]).await;
        let mut c = RateLimitServiceClient::new(channel);
        let answer = c
            .should_rate_limit(req(&domain, vec![desc(&[("k", "first")])]))
            .await;
        let r = answer.unwrap_or_else(|e| {
            panic!(
                "round {round}: the first answer was an error: {e:?}\n{:#?}",
                p.lines()
            )
        });
        assert_eq!(r.into_inner().overall_code, OK, "round {round}");
    }
}

/// With the store unreachable, gRPC still answers after the startup wait,
/// by `on_store_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_store_is_answered_after_the_startup_wait() {
    let domain = unique_domain("nostore");
    let store = format!("redis://127.0.0.1:{}", free_port());
    let (p, channel, started, _dir) = start_and_connect(
        &domain,
        &store,
        &[
            ("TOLLGATE_STARTUP_WAIT_MS", "1500"),
            ("TOLLGATE_ON_STORE_ERROR", "deny"),
        ],
    )
    .await;
    let r = RateLimitServiceClient::new(channel)
        .should_rate_limit(req(&domain, vec![desc(&[("k", "v")])]))
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{:#?}", p.lines()))
        .into_inner();
    assert_eq!(r.overall_code, OVER, "on_store_error=deny");
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "answered after {:?}, before the startup wait ended",
        started.elapsed()
    );
    p.wait_for_line(
        "store not ready after the startup wait",
        Duration::from_secs(5),
    );
}
