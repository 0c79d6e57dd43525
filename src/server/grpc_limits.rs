//! tonic reports a request over its decoding limit as `OUT_OF_RANGE`
//! with its own wording, in the trailers; gRPC's convention (and what
//! callers look for) is `RESOURCE_EXHAUSTED`, and the message should
//! name the setting. This wrapper rewrites that one status.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http::{HeaderMap, HeaderValue, Request, Response};
use bytes::Bytes;
use http_body::Frame;
use tonic::body::Body;
use tonic::codegen::Service;
use tonic::server::NamedService;

use crate::storage::BoxFuture;

#[derive(Clone)]
pub struct MessageSizeStatus<S> {
    inner: S,
    max: usize,
}

impl<S> MessageSizeStatus<S> {
    pub fn new(inner: S, max: usize) -> Self {
        Self { inner, max }
    }
}

impl<S: NamedService> NamedService for MessageSizeStatus<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<Request<Body>> for MessageSizeStatus<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let call = self.inner.call(request);
        let max = self.max;
        Box::pin(async move {
            let mut response = call.await?;
            // A trailers-only answer carries the status in the headers.
            rewrite(response.headers_mut(), max);
            Ok(response.map(|body| Body::new(Trailers { inner: body, max })))
        })
    }
}

fn rewrite(headers: &mut HeaderMap, max: usize) {
    let too_large = headers.get("grpc-status").is_some_and(|s| s == "11")
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            // Percent-encoded on the wire.
            .is_some_and(|m| m.contains("too large") || m.contains("too%20large"));
    if too_large {
        headers.insert("grpc-status", HeaderValue::from_static("8"));
        let message = format!("request message over max_message_bytes={max}").replace(' ', "%20");
        if let Ok(v) = HeaderValue::from_str(&message) {
            headers.insert("grpc-message", v);
        }
    }
}

struct Trailers {
    inner: Body,
    max: usize,
}

impl http_body::Body for Trailers {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let max = self.max;
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(match frame.into_trailers() {
                Ok(mut trailers) => {
                    rewrite(&mut trailers, max);
                    Frame::trailers(trailers)
                }
                Err(frame) => frame,
            }))),
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
