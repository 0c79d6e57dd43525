//! The gRPC face: the rate-limit service (RLS), the quota service (RLQS),
//! health following the store, and reflection, on one listener, plain or
//! TLS.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};

use super::grpc_limits::MessageSizeStatus;
use crate::proto::rlqs::RateLimitQuotaServiceServer;
use crate::proto::{FILE_DESCRIPTOR_SET, RateLimitServiceServer};
use crate::rlqs::QuotaService;
use crate::service::RateLimiter;
use crate::settings::Settings;
use crate::storage::Store;

/// The health service names answered besides the overall "".
pub const HEALTH_SERVICES: [&str; 4] = [
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
    "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
];

/// The health service, and the task that keeps it following the store.
pub(super) struct HealthTask<S> {
    pub service: HealthServer<S>,
    pub task: tokio::task::JoinHandle<()>,
}

/// Health follows the store: SERVING only while it can answer and the
/// server is not draining; NOT_SERVING once stopped.
pub(super) fn follow_store_health(
    store: Arc<dyn Store>,
    mut draining: watch::Receiver<bool>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> HealthTask<impl Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    let task = tokio::spawn(async move {
        tokio::pin!(stop);
        let mut last = None;
        loop {
            let status = if !*draining.borrow() && store.is_ready() {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            if last != Some(status) {
                for name in HEALTH_SERVICES {
                    reporter.set_service_status(name, status).await;
                }
                tracing::info!(store = store.kind(), ?status, "health");
                last = Some(status);
            }
            tokio::select! {
                _ = &mut stop => break,
                _ = draining.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        for name in HEALTH_SERVICES {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
    });
    HealthTask { service, task }
}

/// The gRPC server on `listener`: accepts once `startup` resolves, stops
/// accepting when `stopped()` resolves.
pub(super) fn serve<F>(
    settings: &Settings,
    limiter: RateLimiter,
    quota: QuotaService,
    health: HealthServer<impl Health>,
    listener: TcpListener,
    startup: impl Future<Output = ()> + Send + 'static,
    stopped: &impl Fn() -> F,
) -> anyhow::Result<BoxFuture<'static, Result<(), tonic::transport::Error>>>
where
    F: Future<Output = ()> + Send + 'static,
{
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| anyhow::anyhow!("building the reflection service: {e}"))?;
    let max_message_bytes = settings.limits.max_message_bytes;
    let service = RateLimitServiceServer::new(limiter).max_decoding_message_size(max_message_bytes);
    let service = MessageSizeStatus::new(service, max_message_bytes);
    let quota =
        RateLimitQuotaServiceServer::new(quota).max_decoding_message_size(max_message_bytes);
    let quota = MessageSizeStatus::new(quota, max_message_bytes);
    let routes = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection)
        .add_service(service)
        .add_service(quota);
    Ok(match &settings.grpc_tls {
        None => {
            // Answers are small and each is awaited by a caller: send them
            // at once instead of waiting to fill a segment (Nagle).
            let incoming = TcpListenerStream::new(listener).map(|accepted| {
                if let Ok(tcp) = &accepted {
                    let _ = tcp.set_nodelay(true);
                }
                accepted
            });
            let serve = routes.serve_with_incoming_shutdown(incoming, stopped());
            startup.then(|()| serve).boxed()
        }
        Some(tls) => {
            let incoming = crate::tls::listen(listener, tls, stopped())?;
            let serve = routes.serve_with_incoming_shutdown(incoming, stopped());
            startup.then(|()| serve).boxed()
        }
    })
}
