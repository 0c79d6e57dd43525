//! The age of a gRPC connection. Each connection is asked to go away
//! (HTTP/2 GOAWAY, then its calls finish) once it reaches its own age:
//! `grpc_max_connection_age` moved by up to a tenth either way
//! ([`jittered`]), as gRPC's own servers do (grpc-go, which the reference
//! service runs on, adds the same ±10%), so connections opened together,
//! as when a fleet of Envoys starts, are not all sent away at one moment
//! and do not all reconnect at the next. tonic's `max_connection_age` is
//! one age for every connection of a server, with no jitter, so it is not
//! used: `server::grpc` serves each connection with its own.
//!
//! [`Aged`] is the hard end: it closes the connection itself once the
//! grace after its age has passed too, whatever is still in flight (gRPC's
//! server-side connection management: GOAWAY at the age, close after the
//! grace). tonic's own grace option closes at age + grace without the
//! GOAWAY, so it is not used either.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

/// `age` moved by a uniformly random amount of at most a tenth of it
/// either way: from 90% to 110% of it.
pub(super) fn jittered(age: Duration) -> Duration {
    let tenth = age / 10;
    let span = u64::try_from(tenth.as_nanos() * 2).unwrap_or(u64::MAX);
    if span == 0 {
        return age;
    }
    (age - tenth) + Duration::from_nanos(random() % span.saturating_add(1))
}

/// A random number: a fresh randomly keyed hasher per call (std seeds
/// its keys from the system's randomness once per thread, then steps
/// them), over a counter. No clock, no extra dependency.
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// A connection that reads as closed and refuses writes past its end.
pub(super) struct Aged<T> {
    inner: T,
    end: Option<Pin<Box<Sleep>>>,
    ended: bool,
}

impl<T> Aged<T> {
    /// Ends `after` from now; `None` never.
    pub(super) fn new(inner: T, after: Option<Duration>) -> Self {
        Aged {
            inner,
            end: after.map(|d| Box::pin(tokio::time::sleep_until(Instant::now() + d))),
            ended: false,
        }
    }

    /// Whether the end has come; registers the task to be woken at it.
    fn over(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.ended
            && let Some(end) = &mut self.end
            && end.as_mut().poll(cx).is_ready()
        {
            self.ended = true;
        }
        self.ended
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Aged<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.over(cx) {
            // End of stream: the HTTP/2 connection ends with it.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Aged<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.over(cx) {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: Connected> Connected for Aged<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A connection idle in a read ends at its time: the read returns end
    /// of stream and writes fail; before it, bytes pass both ways.
    #[tokio::test(start_paused = true)]
    async fn ends_at_its_time_even_while_idle() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut aged = Aged::new(a, Some(Duration::from_secs(10)));
        b.write_all(b"hi").await.unwrap();
        let mut buf = [0u8; 2];
        aged.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hi");
        aged.write_all(b"ok").await.unwrap();
        let started = Instant::now();
        // Nothing more is sent: only the end wakes the read.
        let n = aged.read(&mut buf).await.unwrap();
        assert_eq!(n, 0);
        assert_eq!(started.elapsed(), Duration::from_secs(10) - Duration::ZERO);
        assert!(aged.write_all(b"late").await.is_err());
    }

    /// Every age is within a tenth of the setting, both sides are used,
    /// and ages spread over the whole span rather than bunching.
    #[test]
    fn jittered_ages_stay_within_a_tenth() {
        let age = Duration::from_secs(86_400);
        let ages: Vec<Duration> = (0..2_000).map(|_| jittered(age)).collect();
        let (low, high) = (age * 9 / 10, age * 11 / 10);
        assert!(ages.iter().all(|a| (low..=high).contains(a)));
        let min = ages.iter().min().unwrap();
        let max = ages.iter().max().unwrap();
        assert!(
            *min < age * 91 / 100 && *max > age * 109 / 100,
            "{min:?} {max:?}"
        );
        let below = ages.iter().filter(|a| **a < age).count();
        assert!(
            (800..1_200).contains(&below),
            "{below} of 2000 below the age"
        );
        // Too short to move: the age itself.
        assert_eq!(jittered(Duration::from_nanos(5)), Duration::from_nanos(5));
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn without_an_end_it_never_ends() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut aged = Aged::new(a, None);
        tokio::time::sleep(Duration::from_secs(86_400)).await;
        b.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(aged.read(&mut buf).await.unwrap(), 1);
    }
}
