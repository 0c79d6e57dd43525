//! What tollgate shows of itself: metrics, traces and logs.
//!
//! OpenTelemetry instruments are the single source of metrics. Two readers
//! read them: a Prometheus exporter behind `GET /metrics`, and, when an
//! OTLP endpoint is set, a periodic reader pushing the same instruments to
//! the collector. Counts that already exist elsewhere (rule stats, engine,
//! service and store counters, reload counts) are read by observable
//! instruments at collection time, never copied on the request path; only
//! latencies are recorded per request, with label sets fixed in advance.
//!
//! Traces: a span per `ShouldRateLimit`, parented on the caller's W3C
//! `traceparent` or B3 headers, with a child span per store call
//! ([`ObservedStore`]). Spans go to the OTLP endpoint in batches.

pub mod catalog;
mod engine;
mod lease;
mod log;
mod propagation;
mod quota;
mod rules;
mod store;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use opentelemetry::metrics::{BoundHistogram, Histogram, Meter, MeterProvider as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};

use crate::engine::{EngineStats, RulesHandle};
use crate::reload::ReloadCounts;
use crate::settings::{OtelSettings, Settings};
use crate::storage::{NodeId, Store};

pub use log::{error_chain, logger};
pub use propagation::extract;
pub use store::ObservedStore;

/// Latency buckets in seconds: from a fast in-memory decision to a store
/// call timing out.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// Calls the gRPC face failed before or around the engine, counted
/// instead of logged. Declared here, below the service that counts them,
/// so telemetry reads them without knowing the service.
#[derive(Debug, Default)]
pub struct ServiceStats {
    /// Refused with `INVALID_ARGUMENT` (bad or oversized requests).
    pub invalid: std::sync::atomic::AtomicU64,
    /// Failed with `RESOURCE_EXHAUSTED`: a store call past `max_in_flight`
    /// with `on_overload: error`.
    pub overloaded: std::sync::atomic::AtomicU64,
}

/// Where the observable instruments read their counts.
#[derive(Clone)]
pub struct Sources {
    pub rules: RulesHandle,
    pub engine: Arc<EngineStats>,
    pub service: Arc<ServiceStats>,
    /// The store as the engine sees it, before any metrics wrapper.
    pub store: Arc<dyn Store>,
    pub reloads: ReloadCounts,
    /// What the HTTP listeners turned away.
    pub http: Arc<HttpCounts>,
    /// The quota service's counters.
    pub quota: Arc<crate::rlqs::QuotaStats>,
}

/// What the HTTP listeners turned away, counted by the server's listeners
/// and read here; declared below both.
#[derive(Debug, Default)]
pub struct HttpCounts {
    /// Connections closed at once because `max_connections` were open.
    pub refused: std::sync::atomic::AtomicU64,
    /// Connections closed after `idle_timeout` without a request.
    pub idle_closed: std::sync::atomic::AtomicU64,
}

/// Instruments recorded on the request path. The common label sets are
/// bound once, so recording them skips the SDK's attribute lookup.
pub struct Instruments {
    pub request_duration: Histogram<f64>,
    pub request_ok: BoundHistogram<f64>,
    pub request_over_limit: BoundHistogram<f64>,
    pub request_descriptors: BoundHistogram<u64>,
    pub store_duration: Histogram<f64>,
    /// `outcome="ok"` per node, bound on a node's first call (a store has
    /// a handful of nodes).
    store_ok: RwLock<HashMap<NodeId, BoundHistogram<f64>>>,
    pub store_errors: opentelemetry::metrics::Counter<u64>,
    /// `Some` when traces are exported.
    pub tracer: Option<SdkTracer>,
    /// Whether a call without a sampled caller context can be sampled: at
    /// ratio 0 such calls skip the tracer altogether.
    pub sample_new: bool,
}

impl Instruments {
    /// The bound `outcome="ok"` series of `node`.
    pub fn store_ok(&self, backend: &'static str, node: &NodeId) -> BoundHistogram<f64> {
        if let Some(b) = self
            .store_ok
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
        {
            return b.clone();
        }
        let mut map = self.store_ok.write().unwrap_or_else(|e| e.into_inner());
        map.entry(node.clone())
            .or_insert_with(|| {
                self.store_duration.bind(&[
                    KeyValue::new("backend", backend),
                    KeyValue::new("node", node_label(node)),
                    KeyValue::new("outcome", "ok"),
                ])
            })
            .clone()
    }
}

/// A node's label; the name is shared, so this clones a pointer.
pub fn node_label(node: &NodeId) -> opentelemetry::StringValue {
    match node.shared_name() {
        Some(name) => opentelemetry::StringValue::from(name),
        None => opentelemetry::StringValue::from("sole"),
    }
}

/// The metrics and trace pipelines of one server. Shut down at the end of
/// the server's life so that buffered spans and metrics are sent.
pub struct Telemetry {
    meters: SdkMeterProvider,
    tracers: Option<SdkTracerProvider>,
    registry: prometheus::Registry,
    instruments: Arc<Instruments>,
}

impl Telemetry {
    /// Builds the pipelines. Must run inside a tokio runtime: the OTLP
    /// exporters open their gRPC channels on it.
    pub fn start(settings: &Settings, sources: Sources) -> anyhow::Result<Telemetry> {
        let (registry, prometheus) = prometheus_reader()?;
        let service_name = settings
            .otel
            .as_ref()
            .map_or("tollgate".to_string(), |o| o.service_name.clone());
        let resource = Resource::builder().with_service_name(service_name).build();
        let mut meters = SdkMeterProvider::builder()
            .with_resource(resource.clone())
            .with_reader(prometheus);
        let mut tracers = None;
        if let Some(otel) = &settings.otel {
            meters = meters.with_reader(otlp_metrics(otel)?);
            tracers = Some(otlp_traces(otel, resource)?);
        }
        let meters = meters.build();
        let scope = InstrumentationScope::builder("tollgate")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        let meter = meters.meter_with_scope(scope.clone());
        register_observers(&meter, sources);
        let instruments = Arc::new(request_instruments(
            &meter,
            settings,
            tracers.as_ref(),
            scope,
        ));
        Ok(Telemetry {
            meters,
            tracers,
            registry,
            instruments,
        })
    }

    pub fn instruments(&self) -> &Arc<Instruments> {
        &self.instruments
    }

    /// Every metric in the Prometheus text format.
    pub fn prometheus_text(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        let families = self.registry.gather();
        if let Err(e) = prometheus::TextEncoder::new().encode(&families, &mut out) {
            return format!("# encoding failed: {e}\n");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    /// Sends what is buffered and stops the exporters. Blocks: the SDK's
    /// exporters run on their own threads, so it runs off the runtime.
    pub async fn shutdown(&self) {
        let tracers = self.tracers.clone();
        let meters = self.meters.clone();
        let done = tokio::task::spawn_blocking(move || {
            if let Some(t) = &tracers
                && let Err(e) = t.shutdown()
            {
                tracing::warn!("trace export at shutdown: {e}");
            }
            if let Err(e) = meters.shutdown() {
                tracing::warn!("metrics export at shutdown: {e}");
            }
        });
        if tokio::time::timeout(Duration::from_secs(10), done)
            .await
            .is_err()
        {
            tracing::warn!("telemetry export at shutdown did not finish within 10 s");
        }
    }
}

/// The registry `GET /metrics` reads, with the process collector in it,
/// and the exporter that carries the OpenTelemetry instruments into it.
fn prometheus_reader() -> anyhow::Result<(
    prometheus::Registry,
    opentelemetry_prometheus::PrometheusExporter,
)> {
    let registry = prometheus::Registry::new();
    // Process CPU, memory and open files, read from /proc at scrape.
    #[cfg(target_os = "linux")]
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
    let prometheus = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .without_target_info()
        .scope_info_enabled(false)
        .build()?;
    Ok((registry, prometheus))
}

/// The TLS settings of an https OTLP endpoint: verified against the
/// system's roots. `None` for a plain http endpoint.
fn otlp_tls(otel: &OtelSettings) -> Option<tonic::transport::ClientTlsConfig> {
    otel.endpoint
        .starts_with("https://")
        .then(|| tonic::transport::ClientTlsConfig::new().with_native_roots())
}

/// The reader pushing every instrument to the OTLP collector each
/// `metrics_interval`.
fn otlp_metrics(
    otel: &OtelSettings,
) -> anyhow::Result<PeriodicReader<opentelemetry_otlp::MetricExporter>> {
    let mut metrics = opentelemetry_otlp::MetricExporter::builder()
        .with_tonic()
        .with_endpoint(otel.endpoint.clone())
        .with_timeout(Duration::from_secs(5));
    if let Some(tls) = otlp_tls(otel) {
        metrics = metrics.with_tls_config(tls);
    }
    let metrics = metrics.build()?;
    Ok(PeriodicReader::builder(metrics)
        .with_interval(otel.metrics_interval)
        .build())
}

/// The trace pipeline: spans sent to the OTLP collector in batches. A
/// caller's sampling decision is followed; new traces are sampled at the
/// configured ratio.
fn otlp_traces(otel: &OtelSettings, resource: Resource) -> anyhow::Result<SdkTracerProvider> {
    let mut spans = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(otel.endpoint.clone())
        .with_timeout(Duration::from_secs(5));
    if let Some(tls) = otlp_tls(otel) {
        spans = spans.with_tls_config(tls);
    }
    let spans = spans.build()?;
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(otel.sampling_ratio)));
    Ok(SdkTracerProvider::builder()
        .with_resource(resource)
        .with_sampler(sampler)
        .with_batch_exporter(spans)
        .build())
}

/// The instruments recorded on the request path, with their common label
/// sets bound, and the tracer when traces are exported.
fn request_instruments(
    meter: &Meter,
    settings: &Settings,
    tracers: Option<&SdkTracerProvider>,
    scope: InstrumentationScope,
) -> Instruments {
    let request_duration = meter
        .f64_histogram("tollgate.request.duration")
        .with_unit("s")
        .with_description("ShouldRateLimit calls by overall code and gRPC status")
        .with_boundaries(LATENCY_BUCKETS.to_vec())
        .build();
    let answered = |code: &'static str| {
        request_duration.bind(&[
            KeyValue::new("code", code),
            KeyValue::new("grpc_status", "OK"),
        ])
    };
    Instruments {
        request_ok: answered("ok"),
        request_over_limit: answered("over_limit"),
        request_duration,
        request_descriptors: meter
            .u64_histogram("tollgate.request.descriptors")
            .with_description("Descriptors per ShouldRateLimit call")
            .with_boundaries(vec![1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 32.0, 64.0])
            .build()
            .bind(&[]),
        store_ok: RwLock::default(),
        sample_new: settings.otel.as_ref().is_some_and(|o| o.sampling_ratio > 0.0),
        store_duration: meter
            .f64_histogram("tollgate.store.duration")
            .with_unit("s")
            .with_description("Store calls by backend, node and outcome")
            .with_boundaries(LATENCY_BUCKETS.to_vec())
            .build(),
        store_errors: meter
            .u64_counter("tollgate.store.errors")
            .with_description(
                "Failed store calls by backend, node and kind (timeout, unavailable, protocol, circuit_open)",
            )
            .build(),
        tracer: tracers.map(|t| t.tracer_with_scope(scope)),
    }
}

/// The instruments read at collection time, registered in a fixed order:
/// the quota and lease counts, the rules', the refusals, the engine's and
/// then the store's.
fn register_observers(meter: &Meter, s: Sources) {
    quota::register(meter, s.quota.clone());
    lease::register(meter, s.store.clone());
    rules::register_counts(meter, &s.rules);
    rules::register_set(meter, &s.rules, &s.reloads);
    register_refusals(meter, &s.service, &s.http);
    engine::register(meter, s.engine.clone());
    engine::register_cost_above_limit(meter, s.engine.clone(), s.rules.clone());
    register_store_nodes(meter, &s.store);
    register_store_memory(meter, &s.store);
    register_store_caches(meter, &s.store);
    register_store_evictions(meter, s.store);
}

/// What was turned away before the engine: gRPC calls refused on their
/// input or for overload, and HTTP connections closed by the server.
fn register_refusals(meter: &Meter, service: &Arc<ServiceStats>, http: &Arc<HttpCounts>) {
    let service = service.clone();
    meter
        .u64_observable_counter("tollgate.requests.refused")
        .with_description(
            "Calls failed on their input (invalid) or past max_in_flight with on_overload=error (overloaded)",
        )
        .with_callback(move |o| {
            use std::sync::atomic::Ordering::Relaxed;
            o.observe(
                service.invalid.load(Relaxed),
                &[KeyValue::new("reason", "invalid")],
            );
            o.observe(
                service.overloaded.load(Relaxed),
                &[KeyValue::new("reason", "overloaded")],
            );
        })
        .build();

    let http = http.clone();
    meter
        .u64_observable_counter("tollgate.http.connections_closed")
        .with_description(
            "HTTP connections the server closed: past max_connections (refused) or idle past idle_timeout (idle)",
        )
        .with_callback(move |o| {
            use std::sync::atomic::Ordering::Relaxed;
            o.observe(http.refused.load(Relaxed), &[KeyValue::new("reason", "refused")]);
            o.observe(http.idle_closed.load(Relaxed), &[KeyValue::new("reason", "idle")]);
        })
        .build();
}

/// The remote store's node counts: open circuits, script loads, Cluster
/// redirects and batched script calls.
fn register_store_nodes(meter: &Meter, shared: &Arc<dyn Store>) {
    let store = shared.clone();
    meter
        .u64_observable_gauge("tollgate.store.circuit_open")
        .with_description("1 while calls to this node are refused by its open circuit")
        .with_callback(move |o| {
            let backend = store.kind();
            for (node, open) in store.gauges().circuits {
                let attrs = [
                    KeyValue::new("backend", backend),
                    KeyValue::new("node", node.to_string()),
                ];
                o.observe(u64::from(open), &attrs);
            }
        })
        .build();
    let store = shared.clone();
    meter
        .u64_observable_counter("tollgate.store.script_loads")
        .with_description("Times the Lua scripts were loaded into Redis (connects and reconnects)")
        .with_callback(move |o| {
            if let Some(n) = store.gauges().script_loads {
                o.observe(n, &[KeyValue::new("backend", store.kind())]);
            }
        })
        .build();
    let store = shared.clone();
    meter
        .u64_observable_counter("tollgate.store.redirects")
        .with_description("Redis Cluster: calls sent again because their slot had moved or was moving (MOVED, ASK, TRYAGAIN, CLUSTERDOWN)")
        .with_callback(move |o| {
            if let Some(n) = store.gauges().redirects {
                o.observe(n, &[KeyValue::new("backend", store.kind())]);
            }
        })
        .build();
    let store = shared.clone();
    meter
        .u64_observable_counter("tollgate.store.batches")
        .with_description("Redis: batches of several script calls sent as one EVALSHA (kind=batches) and the calls they carried (kind=calls)")
        .with_callback(move |o| {
            if let Some((batches, calls)) = store.gauges().batches {
                o.observe(batches, &[KeyValue::new("kind", "batches")]);
                o.observe(calls, &[KeyValue::new("kind", "calls")]);
            }
        })
        .build();
}

/// What the embedded store holds: its limiters and their bytes.
fn register_store_memory(meter: &Meter, shared: &Arc<dyn Store>) {
    let store = shared.clone();
    meter
        .u64_observable_gauge("tollgate.store.limiters")
        .with_description("Limiters held by the embedded store")
        .with_callback(move |o| {
            if let Some(n) = store.gauges().limiters {
                o.observe(n, &[]);
            }
        })
        .build();
    let store = shared.clone();
    meter
        .u64_observable_gauge("tollgate.store.bytes")
        .with_description("Bytes the embedded store's limiters take, by its estimate (bounded by memory.max_bytes)")
        .with_callback(move |o| {
            if let Some(n) = store.gauges().bytes {
                o.observe(n, &[]);
            }
        })
        .build();
}

/// The over-limit cache's and the coalescer's counts, then the entries
/// the over-limit cache holds.
fn register_store_caches(meter: &Meter, shared: &Arc<dyn Store>) {
    for (name, description, read) in [
        (
            "tollgate.over_limit_cache.hits",
            "Calls answered OVER_LIMIT by the local over-limit cache, without the store",
            (|c: &crate::storage::CacheCounts| c.hits) as fn(&crate::storage::CacheCounts) -> u64,
        ),
        (
            "tollgate.over_limit_cache.misses",
            "Calls the over-limit cache passed to the store",
            |c| c.misses,
        ),
        (
            "tollgate.over_limit_cache.evictions",
            "Limiters the over-limit cache forgot to stay within over_limit_cache.max_entries",
            |c| c.evictions,
        ),
    ] {
        let store = shared.clone();
        meter
            .u64_observable_counter(name)
            .with_description(description)
            .with_callback(move |o| {
                if let Some(c) = store.gauges().over_limit_cache {
                    o.observe(read(&c), &[]);
                }
            })
            .build();
    }
    for (name, description, read) in [
        (
            "tollgate.coalesce.batches",
            "Store calls that carried hits queued behind a call in flight",
            (|c: &crate::storage::CoalesceCounts| c.batches)
                as fn(&crate::storage::CoalesceCounts) -> u64,
        ),
        (
            "tollgate.coalesce.hits",
            "Hits decided in those calls",
            |c| c.coalesced_hits,
        ),
    ] {
        let store = shared.clone();
        meter
            .u64_observable_counter(name)
            .with_description(description)
            .with_callback(move |o| {
                if let Some(c) = store.gauges().coalesced {
                    o.observe(read(&c), &[]);
                }
            })
            .build();
    }
    let store = shared.clone();
    meter
        .u64_observable_gauge("tollgate.over_limit_cache.entries")
        .with_description("Limiters held by the over-limit cache")
        .with_callback(move |o| {
            if let Some(c) = store.gauges().over_limit_cache {
                o.observe(c.entries, &[]);
            }
        })
        .build();
}

/// The limiters the embedded store forgot to stay within its bounds.
fn register_store_evictions(meter: &Meter, store: Arc<dyn Store>) {
    meter
        .u64_observable_counter("tollgate.store.evictions")
        .with_description("Limiters the embedded store forgot to stay within memory.max_limiters and memory.max_bytes")
        .with_callback(move |o| {
            if let Some(n) = store.gauges().evictions {
                o.observe(n, &[]);
            }
        })
        .build();
}
