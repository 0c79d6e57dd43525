//! The HTTP listeners' bounds, over real sockets: headers that never finish
//! and idle connections are closed, connections past `http.max_connections`
//! are closed at accept, and a flood of HTTP clients against the binary
//! under a low open-file limit leaves gRPC deciding.

mod support;

use support::free_port;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::process::Proc;
use support::tollgate::{Tollgate, descriptor};
use support::{http_get, unique_domain};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn rules(domain: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 1000\n"
    )
}

/// Reads until the server closes the connection (within `within`),
/// returning what it sent and how long the close took.
async fn read_until_closed(s: &mut TcpStream, within: Duration) -> (String, Duration) {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(within.saturating_sub(start.elapsed()), s.read(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "still open after {within:?}, having sent {:?}",
                    String::from_utf8_lossy(&out)
                )
            });
        match read {
            Ok(0) | Err(_) => return (String::from_utf8_lossy(&out).into_owned(), start.elapsed()),
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// The value of `tollgate_http_connections_closed_total{reason}` in
/// `/metrics`.
async fn closed(http: SocketAddr, reason: &str) -> f64 {
    let (status, text) = http_get(http, "/metrics").await;
    assert_eq!(status, 200, "{text}");
    let label = format!("reason=\"{reason}\"");
    text.lines()
        .find(|l| l.starts_with("tollgate_http_connections_closed_total") && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no closed count for {reason} in {text}"))
}

async fn decide_ok(client: &mut RateLimitServiceClient<tonic::transport::Channel>, domain: &str) {
    let answer = client
        .should_rate_limit(RateLimitRequest {
            domain: domain.to_string(),
            descriptors: vec![descriptor(&[("k", "v")])],
            hits_addend: 1,
        })
        .await
        .expect("a decision")
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32);
}

#[tokio::test]
async fn headers_that_never_finish_are_closed_after_the_header_timeout_on_both_listeners() {
    let domain = unique_domain("slowheaders");
    let t = Tollgate::start(
        &[("r.yaml", &rules(&domain))],
        &[("http.header_read_timeout_ms", "300")],
    )
    .await;
    for addr in [t.http, t.debug] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        let (sent, took) = read_until_closed(&mut s, Duration::from_secs(15)).await;
        assert!(!sent.contains("200 OK"), "{addr}: answered {sent:?}");
        assert!(
            took >= Duration::from_millis(250),
            "{addr}: closed after {took:?}"
        );
    }
    // A request that does finish is still answered.
    assert_eq!(http_get(t.http, "/healthcheck").await.0, 200);
    t.stop().await;
}

#[tokio::test]
async fn a_connection_idle_past_the_idle_timeout_is_closed_and_counted() {
    let domain = unique_domain("idle");
    let t = Tollgate::start(
        &[("r.yaml", &rules(&domain))],
        &[("http.idle_timeout_ms", "300")],
    )
    .await;
    let before = closed(t.http, "idle").await;
    // One answered request on a kept-alive connection, then silence.
    let mut s = TcpStream::connect(t.http).await.unwrap();
    s.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (sent, took) = read_until_closed(&mut s, Duration::from_secs(15)).await;
    assert!(sent.starts_with("HTTP/1.1 200"), "{sent:?}");
    assert!(took >= Duration::from_millis(250), "closed after {took:?}");
    // A connection that never sends a byte is closed as well.
    let mut quiet = TcpStream::connect(t.http).await.unwrap();
    let (sent, _) = read_until_closed(&mut quiet, Duration::from_secs(15)).await;
    assert!(sent.is_empty() || !sent.contains("200"), "{sent:?}");
    assert!(closed(t.http, "idle").await >= before + 1.0);
    t.stop().await;
}

#[tokio::test]
async fn past_max_connections_http_is_closed_at_accept_and_grpc_still_decides() {
    let domain = unique_domain("maxconn");
    let t = Tollgate::start(
        &[("r.yaml", &rules(&domain))],
        &[("http.max_connections", "4")],
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(t.http).await.unwrap();
        // A started request holds its connection open.
        s.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    // Let the server accept all four before the fifth arrives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fifth = TcpStream::connect(t.http).await.unwrap();
    let _ = fifth
        .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let (sent, took) = read_until_closed(&mut fifth, Duration::from_secs(10)).await;
    assert!(
        sent.is_empty(),
        "the fifth connection was answered: {sent:?}"
    );
    assert!(took < Duration::from_secs(5), "closed after {took:?}");

    let mut client = t.client().await;
    decide_ok(&mut client, &domain).await;

    // Once the held connections go, HTTP answers again and counts refusals.
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = TcpStream::connect(t.http).await.unwrap();
        s.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let (sent, _) = read_until_closed(&mut s, Duration::from_secs(10)).await;
        if sent.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "HTTP never answered again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(closed(t.http, "refused").await >= 1.0);
    t.stop().await;
}

#[tokio::test]
async fn a_flood_of_slow_http_clients_under_a_low_open_file_limit_leaves_grpc_deciding() {
    let domain = unique_domain("fdflood");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), rules(&domain)).unwrap();
    let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (grpc_s, http_s) = (grpc.to_string(), http.to_string());
    let rules_dir = dir.path().display().to_string();
    // 128 descriptors in all; the default http.max_connections (256) is
    // more than the process could open.
    let p = Proc::spawn_with_open_files(
        &["serve"],
        &[
            ("TOLLGATE_GRPC_ADDR", &grpc_s),
            ("TOLLGATE_HTTP_ADDR", &http_s),
            ("TOLLGATE_RULES_DIR", &rules_dir),
            // Held connections stay past the whole test: only the cap
            // keeps descriptors free for gRPC.
            ("TOLLGATE_HTTP__HEADER_READ_TIMEOUT_MS", "120000"),
            ("TOLLGATE_HTTP__IDLE_TIMEOUT_MS", "120000"),
        ],
        128,
    );
    p.wait_for_line("HTTP listening", Duration::from_secs(30));
    let line = p.wait_for_line("http.max_connections lowered", Duration::from_secs(5));
    assert!(line.contains("32"), "{line}");

    // 2,000 slow clients, each sending half a request: far more than the
    // process's limit. Those past the cap are closed at accept, so a write
    // may fail; what matters is that none of them starves gRPC.
    let mut flood = Vec::new();
    for _ in 0..2000 {
        let mut s = TcpStream::connect(http).await.unwrap();
        let _ = s
            .write_all(b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n")
            .await;
        flood.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A new gRPC connection is accepted and decides, repeatedly.
    for _ in 0..3 {
        let channel = tonic::transport::Channel::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .expect("a new gRPC connection while HTTP is flooded");
        let mut client = RateLimitServiceClient::new(channel);
        decide_ok(&mut client, &domain).await;
    }
    assert!(
        p.lines().iter().all(|l| !l.contains("panicked")),
        "{:#?}",
        p.lines()
    );
    drop(flood);
}
