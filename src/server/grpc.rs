//! The gRPC face: the rate-limit service (RLS), the quota service (RLQS),
//! health following the store, and reflection (v1 and v1alpha), on one
//! listener, plain or TLS, and on a Unix socket when `grpc_uds` is set.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, Router};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};

use super::conn_age::{Aged, jittered};
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

/// Health follows the store: SERVING only while it can answer, the rules
/// are there (the first set from xDS arrived, unless
/// `xds.serve_without_config`) and the server is not draining;
/// NOT_SERVING once stopped.
pub(super) fn follow_store_health(
    store: Arc<dyn Store>,
    mut rules_ready: watch::Receiver<bool>,
    mut draining: watch::Receiver<bool>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> HealthTask<impl Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    let task = tokio::spawn(async move {
        tokio::pin!(stop);
        let mut last = None;
        loop {
            let status = if !*draining.borrow() && store.is_ready() && *rules_ready.borrow() {
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
                Ok(()) = rules_ready.changed() => {}
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

/// How long connections live: `age` (none: for ever) moved per
/// connection by [`jittered`], and the `grace` after it before the
/// connection is closed (none: calls may take as long as they take).
#[derive(Debug, Clone, Copy)]
struct Ages {
    age: Option<Duration>,
    grace: Option<Duration>,
}

/// Serves every connection `incoming` accepts on its own copy of
/// `router`, whose shutdown is the connection's own jittered age or the
/// server's `stop`, whichever comes first: tonic then sends GOAWAY and
/// waits for the connection's calls ([`Aged`] closes it at age + grace).
/// Stops accepting at `stop` and returns once every connection is closed,
/// as tonic's own server does.
async fn serve_each<I, IO, E>(
    router: Router,
    incoming: I,
    ages: Ages,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error>
where
    I: Stream<Item = Result<IO, E>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    E: std::fmt::Display,
{
    let stop = stop.shared();
    let mut incoming = Box::pin(incoming);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let io = tokio::select! {
            () = stop.clone() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = incoming.next() => match accepted {
                Some(Ok(io)) => io,
                // One failed accept (or handshake) is that client's; not
                // logged above trace, as nothing is per connection.
                Some(Err(e)) => {
                    tracing::trace!(error = %e, "gRPC connection not accepted");
                    continue;
                }
                None => break,
            },
        };
        let age = ages.age.map(jittered);
        let end = age.zip(ages.grace).map(|(age, grace)| age + grace);
        let stop = stop.clone();
        let gone = async move {
            match age {
                Some(age) => {
                    tokio::select! {
                        () = stop => {}
                        () = tokio::time::sleep(age) => {}
                    }
                }
                None => stop.await,
            }
        };
        // One connection, then nothing more: a stream that ended would
        // shut this connection's server down at once.
        let one = tokio_stream::once(Ok::<_, std::io::Error>(Aged::new(io, end)))
            .chain(tokio_stream::pending());
        let served = router.clone().serve_with_incoming_shutdown(one, gone);
        connections.spawn(async move {
            if let Err(e) = served.await {
                tracing::trace!(error = %e, "gRPC connection ended with an error");
            }
        });
    }
    // The listener closes here: nothing more is accepted while the open
    // connections drain.
    drop(incoming);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Reflection over every service served: RLS, health and reflection
/// itself, in both versions (`grpc.reflection.v1` and the older
/// `v1alpha`, which older grpcurl and several GUI clients still call).
fn reflection_builder() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // Registered here once each, so both versions list both.
        .include_reflection_service(false)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}

/// The router of one listener: health, reflection, RLS (refusing
/// messages over `max_message_bytes`) and RLQS (`quota`).
fn routes<H: Health>(
    health: HealthServer<H>,
    limiter: RateLimiter,
    quota: &MessageSizeStatus<RateLimitQuotaServiceServer<QuotaService>>,
    max_message_bytes: usize,
) -> anyhow::Result<Router> {
    let v1 = reflection_builder()
        .build_v1()
        .map_err(|e| anyhow::anyhow!("building the reflection service: {e}"))?;
    let v1alpha = reflection_builder()
        .build_v1alpha()
        .map_err(|e| anyhow::anyhow!("building the reflection service: {e}"))?;
    let service = RateLimitServiceServer::new(limiter).max_decoding_message_size(max_message_bytes);
    let service = MessageSizeStatus::new(service, max_message_bytes);
    anyhow::Ok(
        tonic::transport::Server::builder()
            .add_service(health)
            .add_service(v1)
            .add_service(v1alpha)
            .add_service(service)
            .add_service(quota.clone()),
    )
}

/// The services on the gRPC listener: RLS, RLQS and health.
pub(super) struct Services<H> {
    pub limiter: RateLimiter,
    pub quota: QuotaService,
    pub health: HealthServer<H>,
}

/// The gRPC server on `listener` (and on `uds`, a Unix socket, when
/// given): accepts once `startup` resolves, stops accepting when
/// `stopped()` resolves.
pub(super) fn serve<F, H>(
    settings: &Settings,
    services: Services<H>,
    listener: Option<TcpListener>,
    uds: Option<UnixListener>,
    startup: impl Future<Output = ()> + Send + 'static,
    stopped: &impl Fn() -> F,
) -> anyhow::Result<BoxFuture<'static, Result<(), tonic::transport::Error>>>
where
    F: Future<Output = ()> + Send + 'static,
    H: Health,
{
    let Services {
        limiter,
        quota,
        health,
    } = services;
    let max_message_bytes = settings.limits.max_message_bytes;
    let quota = MessageSizeStatus::new(
        RateLimitQuotaServiceServer::new(quota).max_decoding_message_size(max_message_bytes),
        max_message_bytes,
    );
    let router = |health, limiter| routes(health, limiter, &quota, max_message_bytes);
    // Each connection is sent away at its own age, and closed past its
    // grace (see `conn_age`).
    let ages = Ages {
        age: settings.grpc_max_connection_age,
        grace: settings.grpc_max_connection_age_grace,
    };
    let uds_server = match uds {
        Some(uds) => {
            let incoming = UnixListenerStream::new(uds);
            let router = router(health.clone(), limiter.clone())?;
            Some(serve_each(router, incoming, ages, stopped()).boxed())
        }
        None => None,
    };
    let tcp_server = match (listener, &settings.grpc_tls) {
        (None, _) => None,
        (Some(listener), None) => {
            // Answers are small and each is awaited by a caller: send them
            // at once instead of waiting to fill a segment (Nagle).
            let incoming = TcpListenerStream::new(listener).map(|accepted| {
                if let Ok(tcp) = &accepted {
                    let _ = tcp.set_nodelay(true);
                }
                accepted
            });
            let router = router(health, limiter)?;
            Some(serve_each(router, incoming, ages, stopped()).boxed())
        }
        (Some(listener), Some(tls)) => {
            let incoming = crate::tls::listen(listener, tls, stopped())?;
            let router = router(health, limiter)?;
            Some(serve_each(router, incoming, ages, stopped()).boxed())
        }
    };
    let both = async move {
        let (tcp, uds) = tokio::join!(
            async move {
                match tcp_server {
                    Some(s) => s.await,
                    None => Ok(()),
                }
            },
            async move {
                match uds_server {
                    Some(s) => s.await,
                    None => Ok(()),
                }
            }
        );
        tcp.and(uds)
    };
    Ok(startup.then(|()| both).boxed())
}
