//! Serving an HTTP router with bounds a slow or idle client cannot get
//! around: a request's headers must arrive within `header_read_timeout`, a
//! connection with no request for `idle_timeout` is closed, and at most
//! `max_connections` are open at once. A connection past the cap is closed
//! as soon as it is accepted, so it holds no file descriptor: a flood of
//! HTTP clients cannot take the descriptors the gRPC listener needs.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tower::ServiceExt as _;

pub use crate::observe::HttpCounts;

/// The bounds of one HTTP listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl HttpLimits {
    /// These limits with `max_connections` at most a quarter of the
    /// process's open-file limit (at least 16), so that the public and the
    /// debug listener together hold at most half the descriptors and the
    /// gRPC listener and Redis connections keep the rest. Returns the soft
    /// limit when it lowered the cap.
    pub fn within_open_files(self) -> (HttpLimits, Option<u64>) {
        self.within(open_file_limit())
    }

    fn within(self, open_files: Option<u64>) -> (HttpLimits, Option<u64>) {
        match open_files {
            Some(n) => {
                let cap = usize::try_from(n / 4).unwrap_or(usize::MAX).max(16);
                if cap < self.max_connections {
                    let limits = HttpLimits {
                        max_connections: cap,
                        ..self
                    };
                    (limits, Some(n))
                } else {
                    (self, None)
                }
            }
            None => (self, None),
        }
    }
}

/// The soft limit on open files, from `/proc/self/limits` (Linux); `None`
/// where it cannot be read or is unlimited.
fn open_file_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// When the connection last finished a request, and how many it is
/// answering now.
struct Activity {
    started: Instant,
    last_done_ms: AtomicU64,
    in_flight: AtomicUsize,
}

impl Activity {
    fn idle_since(&self) -> Option<Instant> {
        (self.in_flight.load(Ordering::Acquire) == 0).then(|| {
            self.started + Duration::from_millis(self.last_done_ms.load(Ordering::Acquire))
        })
    }
}

/// A request in progress on a connection: its end marks the connection
/// active, answered or dropped.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let ms = self.0.started.elapsed().as_millis() as u64;
        self.0.last_done_ms.store(ms, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `router` on `listener` until `stop` resolves, then lets each
/// open connection finish its request and returns once all are closed (the
/// caller bounds that wait by its grace period).
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: HttpLimits,
    counts: Arc<HttpCounts>,
    stop: impl Future<Output = ()>,
) {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (closing_tx, closing_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of descriptors or a connection reset before accept:
                // wait a little instead of spinning on the error.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            // Reap finished connections as they end.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let (stream, peer) = stream;
        let Ok(permit) = open.clone().try_acquire_owned() else {
            counts.refused.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        };
        tasks.spawn(connection(
            stream,
            peer,
            permit,
            router.clone(),
            limits,
            counts.clone(),
            closing_rx.clone(),
        ));
    }
    drop(listener);
    let _ = closing_tx.send(true);
    while tasks.join_next().await.is_some() {}
}

/// Serves one accepted connection from `peer` while holding its `permit`:
/// closes it when idle past `limits.idle_timeout`, and gracefully once
/// `closing` changes.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    permit: OwnedSemaphorePermit,
    router: axum::Router,
    limits: HttpLimits,
    counts: Arc<HttpCounts>,
    mut closing: watch::Receiver<bool>,
) {
    let _permit = permit;
    let activity = Arc::new(Activity {
        started: Instant::now(),
        last_done_ms: AtomicU64::new(0),
        in_flight: AtomicUsize::new(0),
    });
    let seen = activity.clone();
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        seen.in_flight.fetch_add(1, Ordering::AcqRel);
        // Who asked, for handlers that log it (`POST /reset`).
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        let busy = Busy(seen.clone());
        let router = router.clone();
        async move {
            let response: Response<Body> = router
                .oneshot(request.map(Body::new))
                .await
                .unwrap_or_else(|never: Infallible| match never {});
            drop(busy);
            Ok::<_, Infallible>(response)
        }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut shutting_down = false;
    loop {
        let idle_end = activity
            .idle_since()
            .map_or(Instant::now() + limits.idle_timeout, |since| {
                since + limits.idle_timeout
            });
        tokio::select! {
            _ = connection.as_mut() => break,
            _ = closing.changed(), if !shutting_down => {
                connection.as_mut().graceful_shutdown();
                shutting_down = true;
            }
            _ = tokio::time::sleep_until(idle_end), if !shutting_down => {
                if activity.idle_since().is_some_and(|s| s.elapsed() >= limits.idle_timeout) {
                    counts.idle_closed.fetch_add(1, Ordering::Relaxed);
                    connection.as_mut().graceful_shutdown();
                    shutting_down = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max: usize) -> HttpLimits {
        HttpLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: max,
        }
    }

    #[test]
    fn the_cap_is_a_quarter_of_the_open_file_limit_at_least_sixteen() {
        assert_eq!(limits(256).within(Some(1024)), (limits(256), None));
        assert_eq!(limits(256).within(Some(512)), (limits(128), Some(512)));
        assert_eq!(limits(256).within(Some(20)), (limits(16), Some(20)));
        assert_eq!(limits(256).within(None), (limits(256), None));
        assert_eq!(limits(8).within(Some(20)), (limits(8), None));
    }

    #[test]
    fn this_process_has_a_readable_open_file_limit() {
        assert!(open_file_limit().is_some_and(|n| n > 0));
    }
}
