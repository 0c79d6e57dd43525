//! Wiring: build the engine from settings, then serve gRPC (RLS, health,
//! reflection) and HTTP on listeners the caller bound, until `shutdown`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::http::StatusCode;
use futures_util::FutureExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::ServingStatus;

use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::clock::{Clock, SystemClock};
use crate::engine::{Engine, EngineOptions, RulesHandle};
use crate::observe::{self, ObservedStore, Telemetry};
use crate::proto::{FILE_DESCRIPTOR_SET, RateLimitServiceServer};
use crate::reload;
use crate::rules::{self, RuleSet};
use crate::service::{RateLimiter, ServiceOptions};
use crate::settings::{Settings, StoreSetting};
use crate::storage::hotkeys::{self, HotKeyStore, HotKeys};
use crate::storage::{
    Breaker, Coalescing, Gate, MemoryBounds, MemoryStore, OverLimitCache, RedisStore, Sharded,
    Store,
};

/// The health service names answered besides the overall "".
pub const HEALTH_SERVICES: [&str; 3] = [
    "",
    "ratelimit",
    "envoy.service.ratelimit.v3.RateLimitService",
];

/// How often the store's housekeeping runs.
const MAINTAIN_EVERY: Duration = Duration::from_secs(5);

mod limits {
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
            let message =
                format!("request message over max_message_bytes={max}").replace(' ', "%20");
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
                Poll::Ready(Some(Ok(frame))) => {
                    Poll::Ready(Some(Ok(match frame.into_trailers() {
                        Ok(mut trailers) => {
                            rewrite(&mut trailers, max);
                            Frame::trailers(trailers)
                        }
                        Err(frame) => frame,
                    })))
                }
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
}

/// Loads rules and opens the store. Rule errors are fatal at startup (a
/// reload with errors is not); an unreachable Redis is not: the store keeps
/// connecting and health says NOT_SERVING meanwhile.
pub async fn build_engine(settings: &Settings, clock: Arc<dyn Clock>) -> anyhow::Result<Engine> {
    let rules = match &settings.rules_dir {
        Some(dir) => {
            rules::load_dir(dir, &rule_options(settings)).map_err(|e| anyhow::anyhow!("{e}"))?
        }
        None => RuleSet::default(),
    };
    match &settings.rules_dir {
        Some(dir) => {
            let mut names: Vec<&str> = rules.domains.keys().map(String::as_str).collect();
            names.sort_unstable();
            tracing::info!(dir = %dir.display(), domains = ?names, "rules loaded");
        }
        None => tracing::warn!("no rules directory: every descriptor is OK without a limit"),
    }
    let store = build_store(settings, clock.clone()).await?;
    tracing::info!(
        store = store.kind(),
        default_algorithm = %settings.default_algorithm,
        on_store_error = %settings.on_store_error,
        "store opened"
    );
    Ok(Engine::new(
        RulesHandle::new(rules),
        store,
        clock,
        EngineOptions {
            default_algorithm: settings.default_algorithm,
            on_store_error: settings.on_store_error,
            on_overload: settings.on_overload,
            shadow_mode: settings.shadow_mode,
            max_log_limit: settings.max_log_limit,
            near_limit_ratio: settings.metrics.near_limit_ratio,
            detailed_metric_max_series: settings.metrics.detailed_max_series,
            max_value_bytes: settings.limits.max_value_bytes,
            usage_reports: settings.usage_reports,
        },
    ))
}

/// What rule files are checked against, at startup and on every reload.
pub fn rule_options(settings: &Settings) -> rules::LoadOptions {
    rules::LoadOptions {
        default_algorithm: settings.default_algorithm,
        max_log_limit: settings.max_log_limit,
    }
}

/// The backend, then the layers that hold for every store: the over-limit
/// cache, and the hot-key tracker above it (so it sees the calls the cache
/// answers too).
async fn build_store(settings: &Settings, clock: Arc<dyn Clock>) -> anyhow::Result<Arc<dyn Store>> {
    let backend: Arc<dyn Store> = match &settings.store {
        StoreSetting::Memory => Arc::new(MemoryStore::with_bounds(
            clock.clone(),
            MemoryBounds {
                max_limiters: settings.memory_max_limiters,
                max_bytes: settings.memory_max_bytes,
            },
        )),
        StoreSetting::Redis(url) => {
            let store = RedisStore::connect(settings.redis.connection.clone())
                .await
                .map_err(|e| anyhow::anyhow!("store={url} is not usable: {e}"))?;
            let breaker: Arc<dyn Store> = Arc::new(Breaker::with_clock(
                store,
                settings.redis.breaker,
                clock.clone(),
            ));
            // Above the breaker: a batch is one call, one success or failure.
            if settings.redis.coalesce {
                Arc::new(Coalescing::new(breaker))
            } else {
                breaker
            }
        }
    };
    // The in-flight gate below the cache: refusals the cache answers never
    // wait for a slot. Shards above the cache: a full shard's refusals are
    // answered locally while the others are tried.
    let gated: Arc<dyn Store> = Arc::new(Gate::new(backend, settings.limits.max_in_flight));
    let cached = OverLimitCache::wrap(gated, clock.clone(), settings.over_limit_cache);
    let sharded: Arc<dyn Store> = Arc::new(Sharded::new(cached));
    let tracker = HotKeys::new(hotkeys::DEFAULT_CAPACITY, hotkeys::DEFAULT_WINDOW_MICROS);
    Ok(Arc::new(HotKeyStore::new(sharded, clock, tracker)))
}

/// Serves until `shutdown` resolves, then drains for up to
/// `settings.shutdown_grace`.
pub async fn run(
    settings: &Settings,
    engine: Engine,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    // Set first on shutdown: health says NOT_SERVING while calls are still
    // answered, so load balancers move away before the listeners close.
    let (drain_tx, drain_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let (reporter, health) = tonic_health::server::health_reporter();
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("building the reflection service")?;
    let max_message_bytes = settings.limits.max_message_bytes;
    let reloads = reload::ReloadCounts::default();
    let mut limiter = RateLimiter::new(
        engine.clone(),
        ServiceOptions {
            headers: settings.rate_limit_headers.clone(),
            limits: settings.limits,
            deadline_margin: settings.deadline_margin,
        },
    );
    let telemetry = if settings.metrics.enabled || settings.otel.is_some() {
        let telemetry = Telemetry::start(
            settings,
            observe::Sources {
                rules: engine.rules().clone(),
                engine: engine.stats().clone(),
                service: limiter.stats().clone(),
                store: engine.store().clone(),
                reloads: reloads.clone(),
            },
        )
        .context("starting metrics and traces")?;
        let instruments = telemetry.instruments().clone();
        let observed = ObservedStore::new(engine.store().clone(), instruments.clone());
        limiter = limiter
            .with_engine(engine.clone().with_store(Arc::new(observed)))
            .with_instruments(instruments);
        if let Some(otel) = &settings.otel {
            tracing::info!(
                endpoint = %otel.endpoint,
                sampling_ratio = otel.sampling_ratio,
                "exporting traces and metrics over OTLP"
            );
        }
        Some(Arc::new(telemetry))
    } else {
        None
    };
    let service =
        RateLimitServiceServer::new(limiter.clone()).max_decoding_message_size(max_message_bytes);
    let service = limits::MessageSizeStatus::new(service, max_message_bytes);

    // Health follows the store: SERVING only while it can answer.
    let store = engine.store().clone();
    let health_task = {
        let reporter = reporter.clone();
        let stop = stopped();
        let mut draining = drain_rx.clone();
        tokio::spawn(async move {
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
        })
    };

    let store = engine.store().clone();
    let mut stop = Box::pin(stopped());
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(MAINTAIN_EVERY) => store.maintain(),
            }
        }
    });

    if let (Some(dir), Some(every)) = (settings.rules_dir.clone(), settings.rules_reload) {
        tokio::spawn(reload::watch(
            dir,
            every,
            rule_options(settings),
            engine.rules().clone(),
            reloads.clone(),
            stopped(),
        ));
    }

    tracing::info!(
        addr = %grpc.local_addr()?,
        tls = settings.grpc_tls.is_some(),
        "gRPC listening"
    );
    // gRPC is accepted only once the store can answer (or the startup wait
    // is over): callers connecting meanwhile wait in the listen queue
    // instead of getting UNAVAILABLE from a store still connecting. HTTP
    // serves at once, its /healthcheck saying "store not ready".
    let startup = wait_ready(engine.store().clone(), settings.startup_wait);
    tracing::info!(addr = %http.local_addr()?, "HTTP listening");
    // Answers are small and each is awaited by a caller: send them at once
    // instead of waiting to fill a segment (Nagle).
    let routes = tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection)
        .add_service(service);
    let grpc_server = match &settings.grpc_tls {
        None => {
            let incoming = TcpListenerStream::new(grpc).map(|accepted| {
                if let Ok(tcp) = &accepted {
                    let _ = tcp.set_nodelay(true);
                }
                accepted
            });
            let serve = routes.serve_with_incoming_shutdown(incoming, stopped());
            startup.then(|()| serve).boxed()
        }
        Some(tls) => {
            let serve = routes
                .serve_with_incoming_shutdown(crate::tls::listen(grpc, tls, stopped())?, stopped());
            startup.then(|()| serve).boxed()
        }
    };
    let ready_store = engine.store().clone();
    let router = axum::Router::new().route(
        "/healthcheck",
        axum::routing::get(move || {
            let store = ready_store.clone();
            let draining = *drain_rx.borrow();
            async move {
                if draining {
                    (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
                } else if store.is_ready() {
                    (StatusCode::OK, "OK\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "store not ready\n")
                }
            }
        }),
    );
    // The rules in force, as the reference service's /rlconfig shows them;
    // the headers count reloads, so a refused edit is visible too.
    let rules = engine.rules().clone();
    let router = router.route(
        "/rlconfig",
        axum::routing::get(move |uri: Uri, headers: HeaderMap| {
            let rules = rules.clone();
            let reloads = reloads.clone();
            async move {
                let counts = [
                    ("x-rules-reloaded", reloads.loaded().to_string()),
                    ("x-rules-refused", reloads.refused().to_string()),
                ];
                if wants_json(&uri, &headers) {
                    let body = rules_json(&rules.current(), &reloads);
                    (counts, json_response(StatusCode::OK, &body)).into_response()
                } else {
                    (counts, rules.current().describe()).into_response()
                }
            }
        }),
    );
    // A JSON form of ShouldRateLimit, for trying rules with curl.
    let json_limiter = limiter.clone();
    let router = router.route(
        "/json",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let limiter = json_limiter.clone();
            async move { json_call(&limiter, headers, body, max_message_bytes).await }
        }),
    );
    // The heaviest limiters of this replica, to tell which rule to shard.
    let hot_store = engine.store().clone();
    let router = router.route(
        "/debug/hotkeys",
        axum::routing::get(move || {
            let store = hot_store.clone();
            async move {
                match store.hot_keys() {
                    Some(report) => json_response(StatusCode::OK, &hot_keys_json(&report)),
                    None => json_response(
                        StatusCode::NOT_FOUND,
                        &serde_json::json!({"error": "no hot-key tracker"}),
                    ),
                }
            }
        }),
    );
    let router = match &telemetry {
        Some(t) => {
            let t = t.clone();
            router.route(
                "/metrics",
                axum::routing::get(move || {
                    let t = t.clone();
                    async move {
                        (
                            [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                            t.prometheus_text(),
                        )
                    }
                }),
            )
        }
        None => router,
    };
    let http_server = axum::serve(http, router).with_graceful_shutdown(stopped());

    let grace = settings.shutdown_grace;
    let drain = settings.shutdown_drain;
    let servers = async move {
        let (g, h) = tokio::join!(grpc_server, http_server);
        g.context("gRPC server")?;
        h.context("HTTP server")?;
        anyhow::Ok(())
    };
    let result = drain_and_stop(
        servers,
        shutdown,
        drain_tx,
        stop_tx,
        health_task,
        drain,
        grace,
    )
    .await;
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    result
}

/// Resolves once `store` is ready, or after `limit`.
async fn wait_ready(store: Arc<dyn Store>, limit: Duration) {
    let started = tokio::time::Instant::now();
    if store.is_ready() {
        return;
    }
    tracing::info!(
        store = store.kind(),
        wait_ms = limit.as_millis() as u64,
        "waiting for the store before answering gRPC"
    );
    while !store.is_ready() {
        if started.elapsed() >= limit {
            tracing::warn!(
                store = store.kind(),
                "store not ready after the startup wait: answering gRPC, store failures follow on_store_error"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tracing::info!(
        store = store.kind(),
        waited_ms = started.elapsed().as_millis() as u64,
        "store ready"
    );
}

/// The two shutdown steps (see the module docs), once `shutdown` resolves.
async fn drain_and_stop(
    servers: impl Future<Output = anyhow::Result<()>>,
    shutdown: impl Future<Output = ()>,
    drain_tx: watch::Sender<bool>,
    stop_tx: watch::Sender<bool>,
    health_task: tokio::task::JoinHandle<()>,
    drain: Duration,
    grace: Duration,
) -> anyhow::Result<()> {
    tokio::pin!(servers);
    tokio::select! {
        r = &mut servers => return r,
        _ = shutdown => {}
    }
    tracing::info!(
        drain_ms = drain.as_millis() as u64,
        grace_ms = grace.as_millis() as u64,
        "draining: health is NOT_SERVING, calls are still answered"
    );
    let _ = drain_tx.send(true);
    tokio::select! {
        r = &mut servers => return r,
        _ = tokio::time::sleep(drain) => {}
    }
    tracing::info!("closing listeners; finishing calls in flight");
    let _ = stop_tx.send(true);
    let _ = health_task.await;
    match tokio::time::timeout(grace, servers).await {
        Ok(r) => r,
        Err(_) => {
            tracing::warn!("grace period over; dropping open calls");
            Ok(())
        }
    }
}

fn wants_json(uri: &Uri, headers: &HeaderMap) -> bool {
    let by_query = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "format=json"));
    let by_accept = headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/json"));
    by_query || by_accept
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    let mut text = body.to_string();
    text.push('\n');
    (status, [(CONTENT_TYPE, "application/json")], text).into_response()
}

/// `/debug/hotkeys`: rates per second over the trailing window, shares
/// between 0 and 1.
fn hot_keys_json(report: &hotkeys::Report) -> serde_json::Value {
    let keys: Vec<serde_json::Value> = report
        .hot_keys
        .iter()
        .map(|k| {
            let entries: Vec<serde_json::Value> = k
                .limiter
                .entries
                .iter()
                .map(|(key, value)| serde_json::json!({"key": key, "value": value}))
                .collect();
            serde_json::json!({
                "limiter": {
                    "domain": &*k.limiter.domain,
                    "entries": entries,
                    "algorithm": k.limiter.algorithm.as_str(),
                    "limit": k.limiter.limit,
                    "unit": k.limiter.unit.as_str(),
                    "shards": k.limiter.shard.count,
                },
                "rate": k.rate,
                "rateError": k.rate_error,
                "share": k.share,
                "overLimitShare": k.over_limit_share,
            })
        })
        .collect();
    serde_json::json!({
        "windowSeconds": report.window_seconds,
        "totalRate": report.total_rate,
        "hotKeys": keys,
    })
}

/// The rules in force as JSON, sorted by domain and path.
fn rules_json(rules: &RuleSet, reloads: &reload::ReloadCounts) -> serde_json::Value {
    use crate::rules::LimitSpec;
    let mut list = rules.rules();
    list.sort_by(|a, b| (a.0, &a.1.path).cmp(&(b.0, &b.1.path)));
    let rules: Vec<serde_json::Value> = list
        .into_iter()
        .map(|(domain, r)| {
            let mut v = serde_json::json!({
                "domain": domain,
                "rule": r.path,
                "name": r.name,
                "algorithm": r.algorithm.map(|a| a.as_str()),
                "buckets": r.buckets,
                "shards": r.shards,
                "onStoreError": r.on_store_error.map(|p| p.to_string()),
                "replaces": r.replaces,
                "shadowMode": r.shadow_mode,
                "quotaMode": r.quota_mode,
                "detailedMetric": r.detailed_metric,
                "source": r.source,
            });
            match &r.limit {
                LimitSpec::Unlimited => v["unlimited"] = true.into(),
                LimitSpec::PerUnit {
                    requests_per_unit,
                    unit,
                } => {
                    v["requestsPerUnit"] = (*requests_per_unit).into();
                    v["unit"] = unit.as_str().into();
                }
            }
            v
        })
        .collect();
    serde_json::json!({
        "rules": rules,
        "reloads": { "loaded": reloads.loaded(), "refused": reloads.refused() },
    })
}

/// `POST /json`: 200 with the response when OK, 429 when OVER_LIMIT, 400
/// with the reason for bad input; other failures by their gRPC status.
async fn json_call(
    limiter: &RateLimiter,
    headers: HeaderMap,
    body: Bytes,
    max_bytes: usize,
) -> Response {
    let error = |status: StatusCode, grpc: &str, message: String| {
        json_response(
            status,
            &serde_json::json!({ "error": message, "grpcStatus": grpc }),
        )
    };
    if body.len() > max_bytes {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RESOURCE_EXHAUSTED",
            format!(
                "request of {} bytes, over max_message_bytes={max_bytes}",
                body.len()
            ),
        );
    }
    let request = match crate::json::parse_request(&body) {
        Ok(r) => r,
        Err(reason) => return error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", reason),
    };
    // HTTP headers serve as metadata: `grpc-timeout`, `traceparent`, B3.
    let metadata = tonic::metadata::MetadataMap::from_headers(headers);
    match limiter.decide(&metadata, request).await {
        Ok(response) => {
            let status = if response.overall_code
                == crate::proto::rate_limit_response::Code::OverLimit as i32
            {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            json_response(status, &crate::json::response(&response))
        }
        Err(s) => {
            let status = match s.code() {
                tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
                tonic::Code::ResourceExhausted | tonic::Code::Unavailable => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                tonic::Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(
                status,
                crate::service::code_name(s.code()),
                s.message().to_string(),
            )
        }
    }
}

/// Builds the engine on the real clock and serves: what `tollgate serve` does.
pub async fn serve(
    settings: &Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let engine = build_engine(settings, Arc::new(SystemClock)).await?;
    let grpc = TcpListener::bind(settings.grpc_addr)
        .await
        .with_context(|| format!("binding gRPC address {}", settings.grpc_addr))?;
    let http = TcpListener::bind(settings.http_addr)
        .await
        .with_context(|| format!("binding HTTP address {}", settings.http_addr))?;
    run(settings, engine, grpc, http, shutdown).await
}
