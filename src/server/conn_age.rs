//! The hard end of an old gRPC connection. tonic sends GOAWAY once a
//! connection reaches `grpc_max_connection_age` and then waits for its
//! calls; this wrapper closes the connection itself once the grace after
//! that age has passed too, whatever is still in flight (gRPC's own
//! server-side connection management: GOAWAY at the age, close after the
//! grace). tonic's own grace option closes at age + grace without the
//! GOAWAY, so it is not used.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::Connected;

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
