//! Staying correct under load and hostile input: caller deadlines, requests
//! in flight, input limits, the drain on shutdown, quiet outages, and
//! settings that Kubernetes puts in the environment. Real Redis, real gRPC,
//! and the real binary where the process boundary matters.

mod support;

use support::free_port;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::process::{Proc, tollgate_bin};
use support::redis::{RedisServer, command_calls};
use support::tollgate::{Tollgate, descriptor as desc};
use support::unique_domain;
use tonic::Code as GrpcCode;

fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

/// One rule file for `domain`: `k` limited at `rpu` per hour.
fn rules(domain: &str, rpu: u32, extra: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {rpu}{extra}}}\n"
    )
}

fn pause_redis(redis: &RedisServer, ms: u64) {
    let out = redis.cli(&["CLIENT", "PAUSE", &ms.to_string(), "ALL"]);
    assert_eq!(out, "OK", "CLIENT PAUSE");
}

/// A call whose deadline has already passed (the margin eats all of the
/// caller's `grpc-timeout`) is answered at once by the failure policy and
/// never reaches Redis.
#[tokio::test]
async fn expired_deadlines_are_answered_at_once_without_redis() {
    let redis = RedisServer::start();
    let domain = unique_domain("deadline");
    let t = Tollgate::start(
        &[("d.yaml", &rules(&domain, 100, ""))],
        &[
            ("store", &redis.url()),
            ("deadline_margin_ms", "5000"),
            ("on_store_error", "error"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    let mut client = t.client().await;
    // Without a deadline the call reaches Redis.
    let before = command_calls(redis.port(), "evalsha");
    let r = client
        .should_rate_limit(req(&domain, vec![desc(&[("k", "v")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(command_calls(redis.port(), "evalsha"), before + 1);

    // With a 1 s grpc-timeout and a 5 s margin, the deadline is already past.
    let mut request = tonic::Request::new(req(&domain, vec![desc(&[("k", "v")])]));
    request.set_timeout(Duration::from_secs(1));
    let started = Instant::now();
    let e = client.should_rate_limit(request).await.unwrap_err();
    assert_eq!(e.code(), GrpcCode::DeadlineExceeded, "{e:?}");
    assert!(e.message().contains("deadline passed"), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "answered at once"
    );
    assert_eq!(
        command_calls(redis.port(), "evalsha"),
        before + 1,
        "not sent to Redis"
    );
    t.stop().await;
}

/// A slow Redis (paused) against a caller deadline: the answer comes at the
/// caller's deadline less the margin, per policy, long before the (large)
/// command timeout; the breaker does not count it against Redis.
#[tokio::test]
async fn the_callers_deadline_bounds_the_store_call() {
    let redis = RedisServer::start();
    let domain = unique_domain("budget");
    let file = format!(
        "domain: {domain}\ndescriptors:\n  - key: strict\n    rate_limit: {{unit: hour, requests_per_unit: 5}}\n  - key: lenient\n    rate_limit: {{unit: hour, requests_per_unit: 5, on_store_error: allow}}\n"
    );
    let t = Tollgate::start(
        &[("d.yaml", &file)],
        &[
            ("store", &redis.url()),
            ("redis.command_timeout_ms", "10000"),
            ("redis.breaker_failures", "1"),
            ("deadline_margin_ms", "2700"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    let mut client = t.client().await;
    // Warm the connection.
    client
        .should_rate_limit(req(&domain, vec![desc(&[("lenient", "x")])]))
        .await
        .unwrap();

    pause_redis(&redis, 3000);
    // (The paused Redis answers nothing for 3 s; each call below is cut off
    // by the caller's deadline after 1.3 s.)
    let ask = |key: &'static str| {
        let mut request = tonic::Request::new(req(&domain, vec![desc(&[(key, "x")])]));
        request.set_timeout(Duration::from_millis(4000));
        request
    };
    // Server budget: 4000 - 2700 = 1300 ms; the client would give up at 4000.
    let started = Instant::now();
    let e = client.should_rate_limit(ask("strict")).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.code(), GrpcCode::DeadlineExceeded, "{e:?}");
    assert!(
        e.message().contains("deadline passed"),
        "ours, not the client's: {e:?}"
    );
    assert!(
        took >= Duration::from_millis(1200) && took < Duration::from_millis(3500),
        "{took:?}"
    );
    let started = Instant::now();
    let r = client
        .should_rate_limit(ask("lenient"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32, "allow policy");
    assert!(started.elapsed() < Duration::from_millis(3500));

    // Redis back: answers are real again. With breaker_failures=1 a counted
    // failure would have opened the circuit; the deadline cut-offs did not.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = client
        .should_rate_limit(req(&domain, vec![desc(&[("strict", "y")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 4);
    t.stop().await;
}

/// Burns one core until dropped: the suite must pass on a busy machine.
struct BusyCore(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl BusyCore {
    fn start() -> BusyCore {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut x: u64 = 0;
            while !flag.load(Ordering::Relaxed) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                std::hint::black_box(x);
            }
        });
        BusyCore(stop, Some(handle))
    }
}

impl Drop for BusyCore {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

/// The defaults on a busy machine: many concurrent callers without a
/// deadline, on many keys, with a core held busy: no errors at all, and the
/// limits still hold exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_machine_healthy_redis_no_errors_with_defaults() {
    let redis = RedisServer::start();
    let domain = unique_domain("busy");
    let t = Tollgate::start(
        &[(
            "d.yaml",
            &rules(&domain, 100, ", algorithm: sliding_window_log"),
        )],
        &[("store", &redis.url())],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    let _busy = BusyCore::start();
    let channel = t.client().await;
    let mut tasks = Vec::new();
    for caller in 0..64 {
        let mut client = channel.clone();
        let domain = domain.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0u32;
            for i in 0..40 {
                // Keys 0..=199 spread the load; each sees 64*40/200 ~ 13 hits.
                let key = format!("{}", (caller * 40 + i) % 200);
                let r = client
                    .should_rate_limit(req(&domain, vec![desc(&[("k", &key)])]))
                    .await
                    .map_err(|e| format!("caller {caller} call {i}: {e}"))?
                    .into_inner();
                if r.overall_code == Code::Ok as i32 {
                    ok += 1;
                }
            }
            Ok::<u32, String>(ok)
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap().expect("no call fails");
    }
    // Every key is far under its limit of 100: all admitted.
    assert_eq!(admitted, 64 * 40);
    t.stop().await;
}

/// Past `max_in_flight`, RESOURCE_EXHAUSTED at once; the held calls finish
/// when Redis comes back and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_max_in_flight_is_resource_exhausted_at_once() {
    let redis = RedisServer::start();
    let domain = unique_domain("inflight");
    let t = Tollgate::start(
        &[("d.yaml", &rules(&domain, 1000, ""))],
        &[
            ("store", &redis.url()),
            ("max_in_flight", "4"),
            ("redis.command_timeout_ms", "10000"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    let client = t.client().await;
    client
        .clone()
        .should_rate_limit(req(&domain, vec![desc(&[("k", "warm")])]))
        .await
        .unwrap();
    // Under fred's unresponsive-connection check (2 s).
    pause_redis(&redis, 1200);
    let mut held = Vec::new();
    for i in 0..4 {
        let mut c = client.clone();
        let domain = domain.clone();
        held.push(tokio::spawn(async move {
            c.should_rate_limit(req(&domain, vec![desc(&[("k", &format!("h{i}"))])]))
                .await
        }));
    }
    // Give the four time to be in flight (Redis holds them for 1.2 s).
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..6 {
        let started = Instant::now();
        let e = client
            .clone()
            .should_rate_limit(req(&domain, vec![desc(&[("k", "extra")])]))
            .await
            .unwrap_err();
        assert_eq!(e.code(), GrpcCode::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("max_in_flight=4"), "{e:?}");
        assert!(started.elapsed() < Duration::from_millis(500), "at once");
    }
    for h in held {
        let r = h
            .await
            .unwrap()
            .expect("held calls are answered")
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    let r = client
        .clone()
        .should_rate_limit(req(&domain, vec![desc(&[("k", "after")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    t.stop().await;
}

/// Every input limit the operator's Envoy configuration controls is an
/// error naming the limit, and the process keeps serving.
#[tokio::test]
async fn input_limits_name_the_limit() {
    let domain = unique_domain("limits");
    let t = Tollgate::start(
        &[("d.yaml", &rules(&domain, 10, ""))],
        &[
            ("max_descriptors", "3"),
            ("max_entries", "2"),
            ("max_key_bytes", "8"),
            ("max_value_bytes", "16"),
            ("max_message_bytes", "2048"),
        ],
    )
    .await;
    let mut c = t.client().await;
    let entries = |n: usize| RateLimitDescriptor {
        entries: (0..n)
            .map(|i| Entry {
                key: format!("k{i}"),
                value: "v".into(),
            })
            .collect(),
        ..Default::default()
    };
    let cases: Vec<(RateLimitRequest, GrpcCode, &str)> = vec![
        (
            req(&domain, vec![desc(&[("k", "v")]); 4]),
            GrpcCode::InvalidArgument,
            "4 descriptors, over max_descriptors=3",
        ),
        (
            req(&domain, vec![entries(3)]),
            GrpcCode::InvalidArgument,
            "descriptor 0: 3 entries, over max_entries=2",
        ),
        (
            req(
                &domain,
                vec![desc(&[("k", "v")]), desc(&[("a_long_key", "v")])],
            ),
            GrpcCode::InvalidArgument,
            "descriptor 1 entry 0: key of 10 bytes, over max_key_bytes=8",
        ),
        (
            req(&"d".repeat(4096), vec![desc(&[("k", "v")])]),
            GrpcCode::ResourceExhausted,
            "request message over max_message_bytes=2048",
        ),
    ];
    for (request, code, message) in cases {
        let e = c.should_rate_limit(request).await.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains(message), "want {message:?}: {e:?}");
    }
    // A value is the client's: past max_value_bytes it is decided all the
    // same (it enters the limiter as a digest), and limited.
    for want in [9, 8] {
        let r = c
            .should_rate_limit(req(&domain, vec![desc(&[("k", &"x".repeat(17))])]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(r.statuses[0].limit_remaining, want);
    }
    // At the limits exactly: served.
    let r = c
        .should_rate_limit(req(
            &domain,
            vec![
                desc(&[("k", &"x".repeat(16))]),
                entries(2),
                desc(&[("k1234567", "v")]),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 3);
    assert_eq!(r.statuses[0].limit_remaining, 9);
    t.stop().await;
}

/// A request override on a sliding-window-log default above
/// `max_log_limit` is refused: it would store one member per hit.
#[tokio::test]
async fn log_overrides_above_max_log_limit_are_refused() {
    let domain = unique_domain("logcap");
    let t = Tollgate::start(
        &[("d.yaml", &rules(&domain, 10, ""))],
        &[
            ("default_algorithm", "sliding_window_log"),
            ("max_log_limit", "1000"),
        ],
    )
    .await;
    let mut c = t.client().await;
    let with_override = |rpu: u32| {
        let mut d = desc(&[("k", "v")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: rpu,
            unit: 2,
        });
        req(&domain, vec![d])
    };
    let e = c
        .should_rate_limit(with_override(1_000_000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), GrpcCode::InvalidArgument);
    assert!(e.message().contains("max_log_limit=1000"), "{e:?}");
    assert!(e.message().contains("sliding_window_counter"), "{e:?}");
    let r = c
        .should_rate_limit(with_override(1000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 999);
    t.stop().await;
}

async fn health(addr: SocketAddr) -> Option<i32> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .ok()?;
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .ok()
        .map(|r| r.into_inner().status)
}

async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    out.split_whitespace().nth(1)?.parse().ok()
}

/// On shutdown: health turns NOT_SERVING first while calls are still
/// answered (on open and new connections) for the drain; then the listener
/// closes and the server ends.
#[tokio::test]
async fn drain_says_not_serving_while_still_answering() {
    let domain = unique_domain("drain");
    let mut t = Tollgate::start(
        &[("d.yaml", &rules(&domain, 100, ""))],
        &[("shutdown_drain_ms", "4000"), ("shutdown_grace_ms", "2000")],
    )
    .await;
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    let not_serving = tonic_health::pb::health_check_response::ServingStatus::NotServing as i32;
    assert_eq!(health(t.grpc).await, Some(serving));
    assert_eq!(http_status(t.http, "/healthcheck").await, Some(200));
    let mut open = t.client().await;
    let started = Instant::now();
    t.begin_stop();
    // NOT_SERVING well within the drain.
    let mut seen = false;
    while started.elapsed() < Duration::from_millis(3000) {
        if health(t.grpc).await == Some(not_serving) {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen, "health NOT_SERVING during the drain");
    assert_eq!(http_status(t.http, "/healthcheck").await, Some(503));
    // Still answering, on the open connection and on a new one.
    let r = open
        .should_rate_limit(req(&domain, vec![desc(&[("k", "v")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    let r = t
        .client()
        .await
        .should_rate_limit(req(&domain, vec![desc(&[("k", "v")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 98);
    assert!(
        started.elapsed() < Duration::from_millis(4000),
        "the checks ran inside the drain (took {:?}); the machine is too slow for this test",
        started.elapsed()
    );
    // Then the server ends (drain + grace at most) and refuses connections.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !t.is_stopped() {
        assert!(Instant::now() < deadline, "server did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_millis(4000),
        "drained first"
    );
    assert!(tokio::net::TcpStream::connect(t.grpc).await.is_err());
}

/// What the kubelet puts in every pod of a namespace with a Service named
/// `tollgate` (ports grpc 8081 and http 8080), and one stray variable.
const SERVICE_LINKS: &[(&str, &str)] = &[
    ("TOLLGATE_PORT", "tcp://10.96.0.10:8081"),
    ("TOLLGATE_SERVICE_HOST", "10.96.0.10"),
    ("TOLLGATE_SERVICE_PORT", "8081"),
    ("TOLLGATE_SERVICE_PORT_GRPC", "8081"),
    ("TOLLGATE_SERVICE_PORT_HTTP", "8080"),
    ("TOLLGATE_PORT_8081_TCP", "tcp://10.96.0.10:8081"),
    ("TOLLGATE_PORT_8081_TCP_PROTO", "tcp"),
    ("TOLLGATE_PORT_8081_TCP_PORT", "8081"),
    ("TOLLGATE_PORT_8081_TCP_ADDR", "10.96.0.10"),
    ("TOLLGATE_PORT_8080_TCP", "tcp://10.96.0.10:8080"),
    ("TOLLGATE_PORT_8080_TCP_PROTO", "tcp"),
    ("TOLLGATE_PORT_8080_TCP_PORT", "8080"),
    ("TOLLGATE_PORT_8080_TCP_ADDR", "10.96.0.10"),
];

async fn ask_over_grpc(addr: SocketAddr, domain: &str, value: &str) -> Result<i32, tonic::Status> {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let mut c = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    c.should_rate_limit(req(domain, vec![desc(&[("k", value)])]))
        .await
        .map(|r| r.into_inner().overall_code)
}

async fn wait_answering(addr: SocketAddr, domain: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while ask_over_grpc(addr, domain, "probe").await.is_err() {
        assert!(
            Instant::now() < deadline,
            "tollgate at {addr} never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kubernetes service-link variables do not stop the server; a stray
/// `TOLLGATE_*` variable is one warning naming it.
#[tokio::test]
async fn service_link_variables_start_and_serve() {
    let rules_dir = tempfile::tempdir().unwrap();
    let domain = "k8s";
    std::fs::write(rules_dir.path().join("r.yaml"), rules(domain, 10, "")).unwrap();
    let grpc = free_port();
    let grpc_addr = format!("127.0.0.1:{grpc}");
    let http_addr = format!("127.0.0.1:{}", free_port());
    let dir = rules_dir.path().display().to_string();
    let mut env = SERVICE_LINKS.to_vec();
    env.extend([
        ("TOLLGATE_GRPC_ADDR", grpc_addr.as_str()),
        ("TOLLGATE_HTTP_ADDR", http_addr.as_str()),
        ("TOLLGATE_RULES_DIR", dir.as_str()),
        ("TOLLGATE_SHUTDOWN_DRAIN_MS", "0"),
        ("TOLLGATE_RULES_RELOD_MS", "100"),
    ]);
    let p = Proc::spawn(&["serve"], &env);
    let addr: SocketAddr = grpc_addr.parse().unwrap();
    wait_answering(addr, domain).await;
    assert_eq!(
        ask_over_grpc(addr, domain, "x").await.unwrap(),
        Code::Ok as i32
    );
    let warning = p.wait_for_line("TOLLGATE_RULES_RELOD_MS", Duration::from_secs(5));
    assert!(
        warning.contains("WARN") && warning.contains("not a tollgate setting"),
        "{warning}"
    );
    let lines = p.lines();
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("TOLLGATE_PORT") || l.contains("SERVICE_HOST")),
        "service links are ignored silently: {lines:#?}"
    );
}

/// A bad value names the variable, flag or file that set it, and exits 64.
#[test]
fn settings_errors_name_their_source() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(tollgate_bin());
        cmd.args(args).env_clear();
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(&["serve"], &[("TOLLGATE_REDIS__POOL_SIZE", "0")]);
    assert!(
        e.contains("redis.pool_size=0 is not valid: must be between 1 and 256 (set by TOLLGATE_REDIS__POOL_SIZE)"),
        "{e}"
    );
    let e = run(&["serve", "--store", "mysql://x"], &[]);
    assert!(
        e.contains("store=mysql://x is not valid") && e.contains("(set by flag --store)"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.yaml");
    std::fs::write(&file, "max_in_flight: lots\n").unwrap();
    let e = run(&["serve", "--config", &file.display().to_string()], &[]);
    assert!(
        e.contains(&format!(
            "(set by file {}, key max_in_flight)",
            file.display()
        )),
        "{e}"
    );
    std::fs::write(&file, "max_in_fligth: 3\n").unwrap();
    let e = run(&["serve", "--config", &file.display().to_string()], &[]);
    assert!(
        e.contains("max_in_fligth") && e.contains(&file.display().to_string()),
        "{e}"
    );
}

/// A Redis outage under a stream of requests is a handful of log lines
/// (state changes), not one per request; the answers follow the policy.
#[tokio::test]
async fn an_outage_is_logged_once_not_per_request() {
    let domain = "quiet";
    let rules_dir = tempfile::tempdir().unwrap();
    std::fs::write(rules_dir.path().join("r.yaml"), rules(domain, 10, "")).unwrap();
    let grpc_addr = format!("127.0.0.1:{}", free_port());
    let http_addr = format!("127.0.0.1:{}", free_port());
    let dir = rules_dir.path().display().to_string();
    // Nothing listens on this port: Redis is down from the start.
    let store = format!("redis://127.0.0.1:{}", free_port());
    let p = Proc::spawn(
        &["serve"],
        &[
            ("TOLLGATE_GRPC_ADDR", &grpc_addr),
            ("TOLLGATE_HTTP_ADDR", &http_addr),
            ("TOLLGATE_RULES_DIR", &dir),
            ("TOLLGATE_STORE", &store),
            ("TOLLGATE_ON_STORE_ERROR", "allow"),
            ("TOLLGATE_SHUTDOWN_DRAIN_MS", "0"),
        ],
    );
    let addr: SocketAddr = grpc_addr.parse().unwrap();
    wait_answering(addr, domain).await;
    let before = p.lines().len();
    for i in 0..300 {
        let code = ask_over_grpc(addr, domain, &format!("v{}", i % 7))
            .await
            .unwrap();
        assert_eq!(code, Code::Ok as i32, "allow policy");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lines = p.lines();
    assert!(
        lines.len() - before <= 5,
        "300 failed calls logged {} lines: {:#?}",
        lines.len() - before,
        &lines[before..]
    );
}

/// The real binary drains on SIGTERM: NOT_SERVING at once, still answering,
/// then exit 0 after the drain.
#[tokio::test]
async fn sigterm_drains_then_exits() {
    let rules_dir = tempfile::tempdir().unwrap();
    std::fs::write(rules_dir.path().join("r.yaml"), rules("term", 10, "")).unwrap();
    let grpc_addr = format!("127.0.0.1:{}", free_port());
    let http_addr = format!("127.0.0.1:{}", free_port());
    let dir = rules_dir.path().display().to_string();
    let mut p = Proc::spawn(
        &["serve"],
        &[
            ("TOLLGATE_GRPC_ADDR", &grpc_addr),
            ("TOLLGATE_HTTP_ADDR", &http_addr),
            ("TOLLGATE_RULES_DIR", &dir),
            ("TOLLGATE_SHUTDOWN_DRAIN_MS", "2000"),
        ],
    );
    let addr: SocketAddr = grpc_addr.parse().unwrap();
    wait_answering(addr, "term").await;
    let http: SocketAddr = http_addr.parse().unwrap();
    assert_eq!(http_status(http, "/healthcheck").await, Some(200));
    let started = Instant::now();
    let kill = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    p.wait_for_line("draining", Duration::from_secs(5));
    assert_eq!(http_status(http, "/healthcheck").await, Some(503));
    assert_eq!(
        ask_over_grpc(addr, "term", "x").await.unwrap(),
        Code::Ok as i32
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = p.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "did not exit after the drain");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() >= Duration::from_millis(2000),
        "drained first"
    );
}
