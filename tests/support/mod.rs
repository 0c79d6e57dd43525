//! Shared by the integration tests: real Redis processes and small helpers.
//! Each test binary uses part of it.
#![allow(dead_code)]

pub mod envoy;
pub mod helm;
pub mod process;
pub mod redis;
pub mod tollgate;

use std::sync::atomic::{AtomicU64, Ordering};

/// A domain no other test case uses, so cases never share counters (also
/// across runs against a long-lived Redis).
pub fn unique_domain(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{name}-{}-{nanos:x}-{n}", std::process::id())
}

/// A loopback port free at the moment of the call, for a server that
/// binds it itself.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` over HTTP/1.1 on a fresh connection: the status and body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    http_exchange(addr, &request, std::time::Duration::from_secs(10)).await
}

/// `POST path` with a JSON body over HTTP/1.1 on a fresh connection: the
/// status and body.
pub async fn http_post(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, String) {
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    http_exchange(addr, &request, std::time::Duration::from_secs(30)).await
}

/// Sends `request` on a fresh connection and reads the whole answer
/// (within `wait`): its status and body.
async fn http_exchange(
    addr: std::net::SocketAddr,
    request: &str,
    wait: std::time::Duration,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(wait, s.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_string())
}

/// Waits, when the wall clock is in the last 10 s of an hour, until the
/// next hour has begun: a burst after it stays in one hour-long window.
pub async fn away_from_an_hour_boundary() {
    tokio::time::sleep(wait_past_an_hour_boundary()).await;
}

/// Waits, when fewer than `span` are left in the current UTC hour, until
/// the next hour has begun, so that `span` from now stays in one
/// hour-long window. Returns the hour (since the epoch) it stays in: a
/// caller whose work ran longer than `span` compares it with
/// [`hour_now`] after it, to know what its check may assume.
pub async fn within_one_hour(span: std::time::Duration) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let left = 3_600_000 - (now.as_millis() as u64) % 3_600_000;
    if u128::from(left) < span.as_millis() {
        tokio::time::sleep(std::time::Duration::from_millis(left + 1_000)).await;
    }
    hour_now()
}

/// The current UTC hour, counted from the epoch.
pub fn hour_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 3600
}

/// Waits, within the last two minutes of a UTC day, until the next day
/// has begun: the next two minutes stay in one day-long window.
pub async fn away_from_a_day_boundary() {
    let day = 86_400_000_000u64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let left = day - now % day;
    if left < 120_000_000 {
        tokio::time::sleep(std::time::Duration::from_micros(left + 1_000_000)).await;
    }
}

/// How long to wait so that the next few seconds stay in one hour.
pub fn wait_past_an_hour_boundary() -> std::time::Duration {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    if secs % 3600 > 3590 {
        std::time::Duration::from_secs(3600 - secs % 3600 + 1)
    } else {
        std::time::Duration::ZERO
    }
}
