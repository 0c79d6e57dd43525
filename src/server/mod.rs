//! Wiring: build the engine from settings, then serve gRPC (RLS, RLQS,
//! health, reflection), the public HTTP surface and the debug one on listeners the
//! caller bound, until `shutdown`. `grpc` builds the gRPC face, `admin` the
//! HTTP routers, `listen` serves HTTP with its bounds, `lifecycle` starts
//! and stops.

mod admin;
mod conn_age;
mod grpc;
mod grpc_limits;
mod lifecycle;
pub mod listen;
mod reset;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures_util::FutureExt;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tonic_health::pb::health_server::{Health, HealthServer};

use crate::clock::{Clock, SystemClock};
use crate::engine::{Engine, EngineOptions, RulesHandle};
use crate::observe::{self, ObservedStore, Telemetry};
use crate::reload;
use crate::rlqs::{IdLimits, QuotaOptions, QuotaService};
use crate::rules::{self, RuleSet};
use crate::service::{RateLimiter, ServiceOptions};
use crate::settings::{Settings, StoreSetting};
use crate::storage::hotkeys::{self, HotKeyStore, HotKeys};
use crate::storage::{
    Breaker, Coalescing, Gate, MemoryBounds, MemoryStore, OverLimitCache, RedisStore, Sharded,
    Store, lease::Leasing,
};

pub use admin::masked;
pub use grpc::HEALTH_SERVICES;

/// How often the store's housekeeping runs.
const MAINTAIN_EVERY: Duration = Duration::from_secs(5);

/// Loads rules and opens the store. Rule errors are fatal at startup (a
/// reload with errors is not); an unreachable Redis is not: the store keeps
/// connecting and health says NOT_SERVING meanwhile.
pub async fn build_engine(settings: &Settings, clock: Arc<dyn Clock>) -> anyhow::Result<Engine> {
    // With xDS, rules come from the management server instead of files.
    let files = settings
        .rules_dir
        .as_ref()
        .filter(|_| settings.xds.is_none());
    let rules = match files {
        Some(dir) => {
            rules::load_dir(dir, &rule_options(settings)).map_err(|e| anyhow::anyhow!("{e}"))?
        }
        None => RuleSet::default(),
    };
    match files {
        _ if settings.xds.is_some() => {
            if settings.rules_dir.is_some() {
                tracing::warn!("xds.server_url is set: rules_dir is not read");
            }
        }
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
            count_refused: settings.count_refused,
            lease: settings.lease,
        },
    ))
}

/// What rule files are checked against, at startup and on every reload.
pub fn rule_options(settings: &Settings) -> rules::LoadOptions {
    rules::LoadOptions {
        default_algorithm: settings.default_algorithm,
        max_log_limit: settings.max_log_limit,
        merge_domains: settings.merge_domain_config,
        count_refused: settings.count_refused,
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
    Ok(layers(backend, settings, clock))
}

/// The layers one replica puts over a backend it may share with others
/// (the embedded store or Redis): what `serve` runs, and what the model
/// checker (`tests/model.rs`) runs per replica over one shared backend.
pub fn layers(
    backend: Arc<dyn Store>,
    settings: &Settings,
    clock: Arc<dyn Clock>,
) -> Arc<dyn Store> {
    // The in-flight gate below the cache: refusals the cache answers never
    // wait for a slot. Shards above the cache: a full shard's refusals are
    // answered locally while the others are tried.
    let gated: Arc<dyn Store> = Arc::new(Gate::new(backend, settings.limits.max_in_flight));
    let cached = OverLimitCache::wrap(gated, clock.clone(), settings.over_limit_cache);
    let sharded: Arc<dyn Store> = Arc::new(Sharded::new(cached));
    let tracker = HotKeys::new(hotkeys::DEFAULT_CAPACITY, hotkeys::DEFAULT_WINDOW_MICROS);
    let tracked: Arc<dyn Store> = Arc::new(HotKeyStore::new(sharded, clock.clone(), tracker));
    // Outermost: a hit decided from a lease needs nothing below.
    Leasing::wrap_with(tracked, clock, settings.lease_max_limiters)
}

/// The quota service's options from the settings.
pub fn quota_options(settings: &Settings) -> QuotaOptions {
    QuotaOptions {
        assignment_ttl_secs: settings.rlqs.assignment_ttl_secs,
        burst: settings.rlqs.burst,
        abandon_after: settings.rlqs.abandon_after,
        max_buckets: settings.rlqs.max_buckets,
        max_total_buckets: settings.rlqs.max_total_buckets,
        max_streams: settings.rlqs.max_streams,
        ids: IdLimits {
            max_entries: settings.limits.max_entries,
            max_key_bytes: settings.limits.max_key_bytes,
            max_value_bytes: settings.limits.max_value_bytes,
        },
    }
}

/// The listeners a server answers on, bound by the caller (tests bind
/// port 0). No debug listener: the debug views are not served.
pub struct Listeners {
    /// `None`: gRPC only on `grpc_uds` (`grpc_addr=off`).
    pub grpc: Option<TcpListener>,
    pub http: TcpListener,
    pub debug: Option<TcpListener>,
    /// gRPC on a Unix socket as well (`grpc_uds`; see [`bind_uds`]).
    pub grpc_uds: Option<UnixListener>,
}

/// Binds the `grpc_uds` socket, replacing a socket file left there by an
/// earlier run (never any other kind of file, nor a socket something still
/// listens on).
pub fn bind_uds(path: &std::path::Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && meta.file_type().is_socket()
    {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "binding gRPC socket {}: another process is listening on it",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    UnixListener::bind(path).with_context(|| format!("binding gRPC socket {}", path.display()))
}

/// Serves gRPC and the public HTTP surface until `shutdown` resolves, then
/// drains for up to `settings.shutdown_grace`.
pub async fn run(
    settings: &Settings,
    engine: Engine,
    grpc: TcpListener,
    http: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let grpc_uds = settings.grpc_uds.as_deref().map(bind_uds).transpose()?;
    let listeners = Listeners {
        grpc: Some(grpc),
        http,
        debug: None,
        grpc_uds,
    };
    run_with(settings, engine, listeners, shutdown).await
}

/// Serves on every listener given until `shutdown` resolves, then drains
/// for up to `settings.shutdown_grace`: the services built, the telemetry
/// started, the background tasks spawned (rules from xDS, health, store
/// housekeeping, the rule directory's watcher), the listeners served, and
/// at the end the telemetry's buffers sent.
pub async fn run_with(
    settings: &Settings,
    engine: Engine,
    listeners: Listeners,
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

    let reloads = reload::ReloadCounts::default();
    let http_counts = Arc::new(listen::HttpCounts::default());
    let limiter = rate_limiter(settings, &engine);
    let quota = QuotaService::new(engine.clone(), quota_options(settings), drain_rx.clone());
    let (limiter, telemetry) =
        start_telemetry(settings, &engine, limiter, &quota, &reloads, &http_counts)?;
    let rules_ready = follow_xds(settings, &engine, &reloads, &stopped);
    let health_task = grpc::follow_store_health(
        engine.store().clone(),
        rules_ready.clone(),
        drain_rx.clone(),
        stopped(),
    );
    spawn_maintenance(engine.store().clone(), stopped());
    watch_rules_dir(settings, &engine, &reloads, &stopped);

    let faces = Faces {
        limiter,
        quota,
        health: health_task.service,
        telemetry: telemetry.clone(),
        reloads,
        http_counts,
        drain_rx,
        rules_ready,
    };
    let servers = serve_all(settings, &engine, listeners, faces, &stopped)?;
    let result = lifecycle::drain_and_stop(
        servers,
        shutdown,
        drain_tx,
        stop_tx,
        health_task.task,
        settings.shutdown_drain,
        settings.shutdown_grace,
    )
    .await;
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    result
}

/// The RLS service over `engine`, with the settings of its gRPC face.
fn rate_limiter(settings: &Settings, engine: &Engine) -> RateLimiter {
    RateLimiter::new(
        engine.clone(),
        ServiceOptions {
            headers: settings.rate_limit_headers.clone(),
            limits: settings.limits,
            deadline_margin: settings.deadline_margin,
            dynamic_metadata: settings.response_dynamic_metadata,
        },
    )
}

/// Starts metrics and traces when either is enabled, and puts them in
/// front of `limiter`: its store calls timed (and traced) by an
/// [`ObservedStore`], its calls recorded on the request instruments.
/// Returns the limiter, observed or as it was.
fn start_telemetry(
    settings: &Settings,
    engine: &Engine,
    limiter: RateLimiter,
    quota: &QuotaService,
    reloads: &reload::ReloadCounts,
    http_counts: &Arc<listen::HttpCounts>,
) -> anyhow::Result<(RateLimiter, Option<Arc<Telemetry>>)> {
    if !settings.metrics.enabled && settings.otel.is_none() {
        return Ok((limiter, None));
    }
    let telemetry = Telemetry::start(
        settings,
        observe::Sources {
            rules: engine.rules().clone(),
            engine: engine.stats().clone(),
            service: limiter.stats().clone(),
            store: engine.store().clone(),
            reloads: reloads.clone(),
            http: http_counts.clone(),
            quota: quota.stats().clone(),
        },
    )
    .context("starting metrics and traces")?;
    let instruments = telemetry.instruments().clone();
    let observed = ObservedStore::new(engine.store().clone(), instruments.clone());
    let limiter = limiter
        .with_engine(engine.clone().with_store(Arc::new(observed)))
        .with_instruments(instruments);
    if let Some(otel) = &settings.otel {
        tracing::info!(
            endpoint = %otel.endpoint,
            sampling_ratio = otel.sampling_ratio,
            "exporting traces and metrics over OTLP"
        );
    }
    Ok((limiter, Some(Arc::new(telemetry))))
}

/// With xDS, follows the management server's rules in a task of its own.
/// Returns whether rules are ready: health waits for the first set from
/// xDS unless told not to.
fn follow_xds<F>(
    settings: &Settings,
    engine: &Engine,
    reloads: &reload::ReloadCounts,
    stopped: &impl Fn() -> F,
) -> watch::Receiver<bool>
where
    F: Future<Output = ()> + Send + 'static,
{
    let (rules_ready_tx, rules_ready) =
        watch::channel(settings.xds.as_ref().is_none_or(|x| x.serve_without_config));
    if let Some(xds) = settings.xds.clone() {
        tracing::info!(server = %xds.url, node = %xds.node_id, "rules from xDS");
        tokio::spawn(crate::xds::run(
            xds,
            rule_options(settings),
            engine.rules().clone(),
            reloads.clone(),
            rules_ready_tx,
            stopped(),
        ));
    }
    rules_ready
}

/// Runs the store's housekeeping every [`MAINTAIN_EVERY`] until `stop`.
fn spawn_maintenance(store: Arc<dyn Store>, stop: impl Future<Output = ()> + Send + 'static) {
    let mut stop = Box::pin(stop);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(MAINTAIN_EVERY) => store.maintain(),
            }
        }
    });
}

/// With rules from files and `rules_reload` set, watches the rule
/// directory and swaps in changed rules that load.
fn watch_rules_dir<F>(
    settings: &Settings,
    engine: &Engine,
    reloads: &reload::ReloadCounts,
    stopped: &impl Fn() -> F,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let files = settings
        .rules_dir
        .clone()
        .filter(|_| settings.xds.is_none());
    if let (Some(dir), Some(every)) = (files, settings.rules_reload) {
        tokio::spawn(reload::watch(
            dir,
            every,
            rule_options(settings),
            engine.rules().clone(),
            reloads.clone(),
            stopped(),
        ));
    }
}

/// What the listeners serve, built before any of them starts.
struct Faces<H> {
    limiter: RateLimiter,
    quota: QuotaService,
    health: HealthServer<H>,
    telemetry: Option<Arc<Telemetry>>,
    reloads: reload::ReloadCounts,
    http_counts: Arc<listen::HttpCounts>,
    /// Set on shutdown, before the listeners close.
    drain_rx: watch::Receiver<bool>,
    /// Whether rules are ready (see [`follow_xds`]).
    rules_ready: watch::Receiver<bool>,
}

/// Starts serving on every listener: gRPC, the public HTTP surface and,
/// with a listener, the debug one. The future ends when all of them have;
/// a gRPC server's error is its error.
fn serve_all<F, H>(
    settings: &Settings,
    engine: &Engine,
    listeners: Listeners,
    faces: Faces<H>,
    stopped: &impl Fn() -> F,
) -> anyhow::Result<impl Future<Output = anyhow::Result<()>>>
where
    F: Future<Output = ()> + Send + 'static,
    H: Health,
{
    let Faces {
        limiter,
        quota,
        health,
        telemetry,
        reloads,
        http_counts,
        drain_rx,
        rules_ready,
    } = faces;
    log_grpc_listeners(settings, &listeners)?;
    // gRPC is accepted only once the store can answer (or the startup wait
    // is over): callers connecting meanwhile wait in the listen queue
    // instead of getting UNAVAILABLE from a store still connecting. HTTP
    // serves at once, its /healthcheck saying "store not ready".
    let startup = lifecycle::wait_ready(engine.store().clone(), settings.startup_wait);
    let grpc_server = grpc::serve(
        settings,
        grpc::Services {
            limiter: limiter.clone(),
            quota: quota.clone(),
            health,
        },
        listeners.grpc,
        listeners.grpc_uds,
        startup,
        stopped,
    )?;

    let limits = http_limits(settings);
    tracing::info!(addr = %listeners.http.local_addr()?, "HTTP listening");
    let reset_limiter = limiter.clone();
    let public = admin::public(
        engine,
        limiter,
        telemetry,
        drain_rx,
        rules_ready,
        settings.limits.max_message_bytes,
    );
    let http_server = listen::serve(
        listeners.http,
        public,
        limits,
        http_counts.clone(),
        stopped(),
    );
    let debug_server = match listeners.debug {
        Some(listener) => {
            tracing::info!(addr = %listener.local_addr()?, "debug HTTP listening (/rlconfig, /debug/hotkeys, /debug/rlqs, POST /reset)");
            let router = admin::debug(engine, reloads, quota, settings.debug_show_values)
                .merge(reset::router(reset_limiter, settings.debug_show_values));
            listen::serve(listener, router, limits, http_counts, stopped()).boxed()
        }
        None => futures_util::future::ready(()).boxed(),
    };
    Ok(async move {
        let (g, (), ()) = tokio::join!(grpc_server, http_server, debug_server);
        g.context("gRPC server")?;
        anyhow::Ok(())
    })
}

/// Logs where gRPC listens: its address, its Unix socket, or both.
fn log_grpc_listeners(settings: &Settings, listeners: &Listeners) -> anyhow::Result<()> {
    if let Some(grpc) = &listeners.grpc {
        tracing::info!(
            addr = %grpc.local_addr()?,
            tls = settings.grpc_tls.is_some(),
            "gRPC listening"
        );
    }
    if let Some(uds) = &listeners.grpc_uds {
        tracing::info!(socket = ?uds.local_addr()?, "gRPC listening on a Unix socket");
    }
    Ok(())
}

/// The HTTP listeners' bounds, `max_connections` lowered (with a warning)
/// to a quarter of the open-file limit, so HTTP clients cannot take the
/// descriptors gRPC needs.
fn http_limits(settings: &Settings) -> listen::HttpLimits {
    let limits = listen::HttpLimits {
        header_read_timeout: settings.http.header_read_timeout,
        idle_timeout: settings.http.idle_timeout,
        max_connections: settings.http.max_connections,
    };
    let (limits, lowered) = limits.within_open_files();
    if let Some(open_files) = lowered {
        tracing::warn!(
            open_files,
            max_connections = limits.max_connections,
            "http.max_connections lowered to a quarter of the open-file limit, so HTTP clients cannot take the descriptors gRPC needs"
        );
    }
    limits
}

/// Builds the engine on the real clock, binds the configured addresses and
/// serves: what `tollgate serve` does.
pub async fn serve(
    settings: &Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let engine = build_engine(settings, Arc::new(SystemClock)).await?;
    let grpc = match settings.grpc_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding gRPC address {addr}"))?,
        ),
        None => None,
    };
    let http = TcpListener::bind(settings.http_addr)
        .await
        .with_context(|| format!("binding HTTP address {}", settings.http_addr))?;
    let debug = match settings.debug_addr {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding debug address {addr}"))?,
        ),
        None => None,
    };
    let grpc_uds = settings.grpc_uds.as_deref().map(bind_uds).transpose()?;
    let listeners = Listeners {
        grpc,
        http,
        debug,
        grpc_uds,
    };
    run_with(settings, engine, listeners, shutdown).await
}
