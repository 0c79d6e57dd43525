//! Settings: one typed struct, read from a YAML file, then `TOLLGATE_*`
//! environment variables, then command-line flags (later wins), and validated
//! before anything binds a port.
//!
//! | setting | env | default | meaning |
//! |---|---|---|---|
//! | `grpc_addr` | `TOLLGATE_GRPC_ADDR` | `0.0.0.0:8081` | RLS gRPC listen address |
//! | `http_addr` | `TOLLGATE_HTTP_ADDR` | `0.0.0.0:8080` | HTTP (`/healthcheck`) listen address |
//! | `rules_dir` | `TOLLGATE_RULES_DIR` | none | directory of rule files; none = no rules |
//! | `rules_reload_ms` | `TOLLGATE_RULES_RELOAD_MS` | `2000` | how often the rules directory is checked for changes (a change applies once two checks in a row see it); 0 = never |
//! | `default_algorithm` | `TOLLGATE_DEFAULT_ALGORITHM` | `sliding_window_counter` | algorithm of rules that name none |
//! | `on_store_error` | `TOLLGATE_ON_STORE_ERROR` | `error` | `error`, `allow` or `deny` when the store fails |
//! | `on_overload` | `TOLLGATE_ON_OVERLOAD` | as `on_store_error` | `error` (`RESOURCE_EXHAUSTED`), `allow` or `deny` for a store call past `max_in_flight`; answers the over-limit cache gives locally never wait for it |
//! | `usage_reports` | `TOLLGATE_USAGE_REPORTS` | unset | `usage_reports` of rules that do not say: `true` records every positive cost, also past the limit (costs reported after the response); `false` only admitted hits. Unset: rules that name no algorithm record every cost, as the reference does; rules that name one record admitted hits |
//! | `shadow_mode` | `TOLLGATE_SHADOW_MODE` | `false` | count, but always answer OK overall |
//! | `rate_limit_headers` | `TOLLGATE_RATE_LIMIT_HEADERS` | `false` | add `RateLimit-*` response headers |
//! | `header_limit` / `header_remaining` / `header_reset` | `TOLLGATE_HEADER_*` | `RateLimit-Limit` ... | their names |
//! | `store` | `TOLLGATE_STORE` | `memory` | `memory` or a Redis URL (`redis://`, `rediss://`, `redis-cluster://`, `redis-sentinel://`) |
//! | `redis.username` / `redis.password` | `TOLLGATE_REDIS__USERNAME` ... | none | credentials (override the URL's) |
//! | `redis.tls_ca_file` / `tls_cert_file` / `tls_key_file` | `TOLLGATE_REDIS__TLS_CA_FILE` ... | none | TLS files |
//! | `redis.pool_size` | `TOLLGATE_REDIS__POOL_SIZE` | `4` | connections per node |
//! | `redis.connect_timeout_ms` | `TOLLGATE_REDIS__CONNECT_TIMEOUT_MS` | `1000` | connect timeout |
//! | `redis.command_timeout_ms` | `TOLLGATE_REDIS__COMMAND_TIMEOUT_MS` | `500` | upper bound on one Redis call; the caller's own deadline (`grpc-timeout`) shortens it. 500 ms is about 2.5x the slowest answer of a healthy Redis on a busy 2-core machine (47-205 ms measured; 10 ms failed a third of the calls): see `docs/benchmarks.md#overload` |
//! | `redis.key_prefix` | `TOLLGATE_REDIS__KEY_PREFIX` | `tg2` | prefix of every key |
//! | `redis.breaker_failures` | `TOLLGATE_REDIS__BREAKER_FAILURES` | `5` | consecutive failures that open the circuit |
//! | `redis.breaker_cooldown_ms` | `TOLLGATE_REDIS__BREAKER_COOLDOWN_MS` | `500` | how long it stays open before a probe |
//! | `redis.coalesce` | `TOLLGATE_REDIS__COALESCE` | `true` | while a limiter's script call is in flight, queue further hits on it and decide them all in the next call |
//! | `deadline_margin_ms` | `TOLLGATE_DEADLINE_MARGIN_MS` | `2` | kept back from the caller's `grpc-timeout` for the answer's way back |
//! | `max_in_flight` | `TOLLGATE_MAX_IN_FLIGHT` | `8192` | store calls waiting at once; past it `on_overload` answers at once |
//! | `max_descriptors` | `TOLLGATE_MAX_DESCRIPTORS` | `64` | descriptors per request (`INVALID_ARGUMENT` past it) |
//! | `max_entries` | `TOLLGATE_MAX_ENTRIES` | `32` | entries per descriptor |
//! | `max_key_bytes` | `TOLLGATE_MAX_KEY_BYTES` | `256` | bytes of one entry key |
//! | `max_value_bytes` | `TOLLGATE_MAX_VALUE_BYTES` | `256` | longest entry value kept as it is in a limiter's identity; a longer one enters it as the SHA-256 of all its bytes. Never refused: values come from clients |
//! | `max_message_bytes` | `TOLLGATE_MAX_MESSAGE_BYTES` | `4194304` | bytes of one decoded request (`RESOURCE_EXHAUSTED` past it); 4 MiB, gRPC's default, which Envoy's own limits stay under |
//! | `max_log_limit` | `TOLLGATE_MAX_LOG_LIMIT` | `10000` | largest `requests_per_unit` a `sliding_window_log` limit may have |
//! | `memory.max_limiters` | `TOLLGATE_MEMORY__MAX_LIMITERS` | `1000000` | limiters the embedded store holds; least recently used evicted past it |
//! | `memory.max_bytes` | `TOLLGATE_MEMORY__MAX_BYTES` | `134217728` (128 MiB) | estimated bytes the embedded store's limiters take (identities, state, log members, map overhead); least recently used evicted past it. Half the Helm chart's 256 MiB memory limit: the rest is for the runtime, connections, the over-limit cache and the allocator's slack. At least 1 MiB |
//! | `over_limit_cache.enabled` | `TOLLGATE_OVER_LIMIT_CACHE__ENABLED` | `true` | once the store refuses a limiter until a reset, answer it locally until then, without the store |
//! | `over_limit_cache.max_entries` | `TOLLGATE_OVER_LIMIT_CACHE__MAX_ENTRIES` | `100000` | limiters the over-limit cache holds; least recently used evicted past it |
//! | `grpc_tls.cert_file` / `key_file` | `TOLLGATE_GRPC_TLS__CERT_FILE` ... | none | PEM certificate chain and key: serve gRPC over TLS |
//! | `grpc_tls.client_ca_file` | `TOLLGATE_GRPC_TLS__CLIENT_CA_FILE` | none | PEM CAs: require and verify client certificates (mTLS) |
//! | `grpc_tls.reload_ms` | `TOLLGATE_GRPC_TLS__RELOAD_MS` | `5000` | how often the TLS files are checked for changes; 0 = never |
//! | `startup_wait_ms` | `TOLLGATE_STARTUP_WAIT_MS` | `5000` | at startup, gRPC answers once the store is ready or after this long (then `on_store_error` applies to a store still down); 0 = at once. Five connect timeouts: enough for a healthy Redis on a busy machine |
//! | `shutdown_drain_ms` | `TOLLGATE_SHUTDOWN_DRAIN_MS` | `5000` | on SIGTERM: health says NOT_SERVING and calls are still answered this long |
//! | `shutdown_grace_ms` | `TOLLGATE_SHUTDOWN_GRACE_MS` | `5000` | then: listeners closed, in-flight calls get this long to finish |
//! | `log` | `TOLLGATE_LOG` (or `RUST_LOG`) | `info` | log filter (tracing `EnvFilter` syntax) |
//! | `log_format` | `TOLLGATE_LOG_FORMAT` | `text` | `text` or `json` (one object per line) |
//! | `metrics.enabled` | `TOLLGATE_METRICS__ENABLED` | `true` | serve `GET /metrics` (Prometheus text) on the HTTP address |
//! | `metrics.near_limit_ratio` | `TOLLGATE_METRICS__NEAR_LIMIT_RATIO` | `0.8` | share of a limit past which hits count as `near_limit` |
//! | `metrics.detailed_max_series` | `TOLLGATE_METRICS__DETAILED_MAX_SERIES` | `100` | distinct descriptor values a `detailed_metric` rule exports; the rest share the `_overflow` series |
//! | `otel.endpoint` | `TOLLGATE_OTEL__ENDPOINT` (or `OTEL_EXPORTER_OTLP_ENDPOINT`) | none | OTLP/gRPC collector (`http://host:4317`): traces and metrics are exported there; none = off |
//! | `otel.service_name` | `TOLLGATE_OTEL__SERVICE_NAME` (or `OTEL_SERVICE_NAME`) | `tollgate` | `service.name` of spans and metrics |
//! | `otel.sampling_ratio` | `TOLLGATE_OTEL__SAMPLING_RATIO` (or `OTEL_TRACES_SAMPLER_ARG`; `OTEL_TRACES_SAMPLER=always_on`/`always_off` mean 1/0) | `1.0` | share of new traces sampled (0 to 1); a caller's sampled flag is followed |
//! | `otel.metrics_interval_ms` | `TOLLGATE_OTEL__METRICS_INTERVAL_MS` (or `OTEL_METRIC_EXPORT_INTERVAL`) | `60000` | how often metrics are pushed over OTLP |

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
use serde::Deserialize;

use crate::limit::{Algorithm, FailurePolicy};
use crate::storage::{BreakerConfig, CacheConfig, RedisConfig};
pub use crate::tls::GrpcTls;

/// Where a store's counters live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSetting {
    Memory,
    Redis(String),
}

/// How to reach Redis and when to stop trying for a while. The connection
/// part is the store's own [`RedisConfig`]; its `url` is filled from `store`
/// when that names Redis, and is empty otherwise.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    pub connection: RedisConfig,
    pub breaker: BreakerConfig,
    /// Hits on a limiter with a call in flight wait for the next call,
    /// which carries them all (`storage::coalesce`).
    pub coalesce: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

/// Bounds on one request and on the work in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
    pub max_message_bytes: usize,
    pub max_in_flight: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_descriptors: 64,
            max_entries: 32,
            max_key_bytes: 256,
            max_value_bytes: crate::storage::keys::DEFAULT_MAX_VALUE_BYTES,
            max_message_bytes: 4 << 20,
            max_in_flight: 8192,
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// What the exported metrics count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricsSettings {
    pub enabled: bool,
    pub near_limit_ratio: f64,
    pub detailed_max_series: usize,
}

/// OpenTelemetry export over OTLP/gRPC.
#[derive(Debug, Clone, PartialEq)]
pub struct OtelSettings {
    pub endpoint: String,
    pub service_name: String,
    pub sampling_ratio: f64,
    pub metrics_interval: Duration,
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub rules_dir: Option<PathBuf>,
    pub rules_reload: Option<Duration>,
    pub default_algorithm: Algorithm,
    pub on_store_error: FailurePolicy,
    /// What a store call past `max_in_flight` answers.
    pub on_overload: FailurePolicy,
    /// `usage_reports` of rules that do not say; `None`: by whether the
    /// rule names an algorithm.
    pub usage_reports: Option<bool>,
    pub shadow_mode: bool,
    /// `Some` when `RateLimit-*` headers are enabled.
    pub rate_limit_headers: Option<HeaderNames>,
    pub store: StoreSetting,
    pub redis: RedisSettings,
    /// Kept back from the caller's deadline for the answer's way back.
    pub deadline_margin: Duration,
    pub limits: RequestLimits,
    /// Largest `requests_per_unit` of a `sliding_window_log` limit.
    pub max_log_limit: u32,
    /// Limiters the embedded store holds before evicting the least recently used.
    pub memory_max_limiters: usize,
    /// Estimated bytes the embedded store holds before evicting the least
    /// recently used limiters.
    pub memory_max_bytes: usize,
    /// The local over-limit cache in front of the store.
    pub over_limit_cache: CacheConfig,
    pub grpc_tls: Option<GrpcTls>,
    /// Longest wait at startup for the store before gRPC answers.
    pub startup_wait: Duration,
    pub shutdown_drain: Duration,
    pub shutdown_grace: Duration,
    pub log: String,
    pub log_format: LogFormat,
    pub metrics: MetricsSettings,
    /// `Some` when an OTLP endpoint is set.
    pub otel: Option<OtelSettings>,
    /// Things worth a warning once logging is up (unknown `TOLLGATE_*`
    /// variables): settings are read before the logger exists.
    pub warnings: Vec<String>,
}

/// A setting with a bad value: `name=value is not valid: reason (set by
/// source)`, where the source is the variable, flag or file that gave it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SettingsError {
    pub name: String,
    pub value: String,
    pub reason: String,
    /// `TOLLGATE_X`, `flag --x`, `file f.yaml, key x`, or `default`.
    pub origin: String,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={} is not valid: {} (set by {})",
            self.name, self.value, self.reason, self.origin
        )
    }
}

/// Settings as read, every leaf a string, so that every bad value gets the
/// same `name=value is not valid` error whichever source it came from.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    grpc_addr: Option<String>,
    http_addr: Option<String>,
    rules_dir: Option<String>,
    rules_reload_ms: Option<String>,
    default_algorithm: Option<String>,
    on_store_error: Option<String>,
    on_overload: Option<String>,
    usage_reports: Option<String>,
    shadow_mode: Option<String>,
    rate_limit_headers: Option<String>,
    header_limit: Option<String>,
    header_remaining: Option<String>,
    header_reset: Option<String>,
    store: Option<String>,
    #[serde(default)]
    redis: RawRedis,
    deadline_margin_ms: Option<String>,
    max_in_flight: Option<String>,
    max_descriptors: Option<String>,
    max_entries: Option<String>,
    max_key_bytes: Option<String>,
    max_value_bytes: Option<String>,
    max_message_bytes: Option<String>,
    max_log_limit: Option<String>,
    #[serde(default)]
    memory: RawMemory,
    #[serde(default)]
    over_limit_cache: RawOverLimitCache,
    #[serde(default)]
    grpc_tls: RawGrpcTls,
    startup_wait_ms: Option<String>,
    shutdown_drain_ms: Option<String>,
    shutdown_grace_ms: Option<String>,
    log: Option<String>,
    log_format: Option<String>,
    #[serde(default)]
    metrics: RawMetrics,
    #[serde(default)]
    otel: RawOtel,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    enabled: Option<String>,
    near_limit_ratio: Option<String>,
    detailed_max_series: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOtel {
    endpoint: Option<String>,
    service_name: Option<String>,
    sampling_ratio: Option<String>,
    metrics_interval_ms: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverLimitCache {
    enabled: Option<String>,
    max_entries: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMemory {
    max_limiters: Option<String>,
    max_bytes: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrpcTls {
    cert_file: Option<String>,
    key_file: Option<String>,
    client_ca_file: Option<String>,
    reload_ms: Option<String>,
}

/// Every setting's name, as written in the settings file; `TOLLGATE_` plus
/// the name upper-cased with `.` as `__` is its variable.
pub const KEYS: &[&str] = &[
    "grpc_addr",
    "http_addr",
    "rules_dir",
    "rules_reload_ms",
    "default_algorithm",
    "on_store_error",
    "on_overload",
    "usage_reports",
    "shadow_mode",
    "rate_limit_headers",
    "header_limit",
    "header_remaining",
    "header_reset",
    "store",
    "redis.username",
    "redis.password",
    "redis.tls_ca_file",
    "redis.tls_cert_file",
    "redis.tls_key_file",
    "redis.pool_size",
    "redis.connect_timeout_ms",
    "redis.command_timeout_ms",
    "redis.key_prefix",
    "redis.breaker_failures",
    "redis.breaker_cooldown_ms",
    "redis.coalesce",
    "deadline_margin_ms",
    "max_in_flight",
    "max_descriptors",
    "max_entries",
    "max_key_bytes",
    "max_value_bytes",
    "max_message_bytes",
    "max_log_limit",
    "memory.max_limiters",
    "memory.max_bytes",
    "over_limit_cache.enabled",
    "over_limit_cache.max_entries",
    "grpc_tls.cert_file",
    "grpc_tls.key_file",
    "grpc_tls.client_ca_file",
    "grpc_tls.reload_ms",
    "startup_wait_ms",
    "shutdown_drain_ms",
    "shutdown_grace_ms",
    "log",
    "log_format",
    "metrics.enabled",
    "metrics.near_limit_ratio",
    "metrics.detailed_max_series",
    "otel.endpoint",
    "otel.service_name",
    "otel.sampling_ratio",
    "otel.metrics_interval_ms",
];

/// The standard OpenTelemetry variables read as fallbacks of `otel.*`,
/// and `RUST_LOG` of `log` (tollgate's own names win).
const FOREIGN_ENV: &[&str] = &[
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_SERVICE_NAME",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_TRACES_SAMPLER",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_METRIC_EXPORT_INTERVAL",
    "RUST_LOG",
];

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    username: Option<String>,
    password: Option<String>,
    tls_ca_file: Option<String>,
    tls_cert_file: Option<String>,
    tls_key_file: Option<String>,
    pool_size: Option<String>,
    connect_timeout_ms: Option<String>,
    command_timeout_ms: Option<String>,
    key_prefix: Option<String>,
    breaker_failures: Option<String>,
    breaker_cooldown_ms: Option<String>,
    coalesce: Option<String>,
}

/// Where settings come from. Tests pass their own environment map so they
/// never touch the process environment.
#[derive(Debug, Default, Clone)]
pub struct Sources {
    pub file: Option<PathBuf>,
    pub env: HashMap<String, String>,
    /// Flag values by setting name (`grpc_addr`, `redis.pool_size`...).
    pub overrides: Vec<(String, String)>,
}

impl Sources {
    /// The process environment's `TOLLGATE_*` variables.
    pub fn process_env() -> HashMap<String, String> {
        std::env::vars()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX) || FOREIGN_ENV.contains(&k.as_str()))
            .collect()
    }

    /// Which source gave setting `name` its value (flags win over variables,
    /// variables over the file), for error messages.
    fn origin(&self, name: &str) -> String {
        if self.overrides.iter().any(|(k, _)| k == name) {
            return format!("flag --{}", name.replace(['_', '.'], "-"));
        }
        let var = env_name(name);
        if self.env.contains_key(&var) {
            return var;
        }
        match &self.file {
            Some(file) => format!("file {}, key {name}", file.display()),
            None => "default".into(),
        }
    }
}

const ENV_PREFIX: &str = "TOLLGATE_";

/// Default bound on one Redis call when the caller states no deadline. See
/// `docs/benchmarks.md` ("Overload"): on a busy 2-core machine the slowest
/// answers of a healthy Redis took 47-205 ms; 10 ms failed a third of them.
pub const DEFAULT_COMMAND_TIMEOUT_MS: u64 = 500;

/// The variable that sets `name`: `redis.pool_size` -> `TOLLGATE_REDIS__POOL_SIZE`.
pub fn env_name(name: &str) -> String {
    format!("{ENV_PREFIX}{}", name.replace('.', "__").to_uppercase())
}

/// What a `TOLLGATE_*` variable is to us.
#[derive(Debug, PartialEq, Eq)]
enum EnvVar {
    /// Sets this setting.
    Setting(&'static str),
    /// Put there by Kubernetes for a Service whose name starts with
    /// `tollgate` (service links): not ours, ignored without a word.
    ServiceLink,
    Unknown,
}

fn classify_env(var: &str, value: &str) -> EnvVar {
    let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
        return EnvVar::Unknown;
    };
    if let Some(key) = KEYS.iter().find(|k| env_name(k) == var) {
        return EnvVar::Setting(key);
    }
    // The kubelet's service-link names, for a Service `tollgate[-x]` with
    // ports: X_SERVICE_HOST, X_SERVICE_PORT, X_SERVICE_PORT_<NAME>, X_PORT
    // (tcp://ip:port), X_PORT_<n>_<PROTO>, and that with _PROTO/_PORT/_ADDR.
    let words: Vec<&str> = rest.split('_').collect();
    let is_proto = |w: &str| matches!(w, "TCP" | "UDP" | "SCTP");
    let is_number = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit());
    for (i, w) in words.iter().enumerate() {
        let tail = &words[i + 1..];
        match (*w, tail) {
            ("SERVICE", ["HOST"]) | ("SERVICE", ["PORT", ..]) => return EnvVar::ServiceLink,
            ("PORT", [])
                if ["tcp://", "udp://", "sctp://"]
                    .iter()
                    .any(|p| value.starts_with(p)) =>
            {
                return EnvVar::ServiceLink;
            }
            ("PORT", [n, proto]) if is_number(n) && is_proto(proto) => {
                return EnvVar::ServiceLink;
            }
            ("PORT", [n, proto, "PROTO" | "PORT" | "ADDR"]) if is_number(n) && is_proto(proto) => {
                return EnvVar::ServiceLink;
            }
            _ => {}
        }
    }
    EnvVar::Unknown
}

impl Settings {
    pub fn load(sources: &Sources) -> Result<Settings, SettingsError> {
        let file_error = |reason: String| SettingsError {
            name: "config".into(),
            value: sources
                .file
                .as_ref()
                .map(|f| f.display().to_string())
                .unwrap_or_default(),
            reason,
            origin: "flag --config".into(),
        };
        let mut builder = Config::builder();
        if let Some(file) = &sources.file {
            let text = std::fs::read_to_string(file).map_err(|e| file_error(e.to_string()))?;
            // The file alone first, so that its unknown keys are reported as
            // the file's (the merged view could not say where a key came from).
            Config::builder()
                .add_source(File::from_str(&text, FileFormat::Yaml))
                .build()
                .and_then(|c| c.try_deserialize::<Raw>())
                .map_err(|e| file_error(e.to_string()))?;
            builder = builder.add_source(File::from_str(&text, FileFormat::Yaml));
        }
        let mut warnings = Vec::new();
        let mut env = HashMap::new();
        let mut names: Vec<&String> = sources.env.keys().collect();
        names.sort();
        for var in names {
            if FOREIGN_ENV.contains(&var.as_str()) {
                continue;
            }
            let value = &sources.env[var];
            match classify_env(var, value) {
                EnvVar::Setting(_) => {
                    env.insert(var.clone(), value.clone());
                }
                EnvVar::ServiceLink => {}
                EnvVar::Unknown => {
                    warnings.push(format!("{var} is not a tollgate setting; ignored"))
                }
            }
        }
        builder = builder.add_source(
            Environment::with_prefix("TOLLGATE")
                .prefix_separator("_")
                .separator("__")
                .source(Some(env.into_iter().collect())),
        );
        for (k, v) in &sources.overrides {
            builder = builder
                .set_override(k.as_str(), v.as_str())
                .map_err(|e| bad(sources, k, v, e))?;
        }
        let raw: Raw = builder
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| SettingsError {
                name: "settings".into(),
                value: String::new(),
                reason: e.to_string(),
                origin: "flags or environment".into(),
            })?;
        let mut settings = raw.validate(sources)?;
        settings.warnings = warnings;
        Ok(settings)
    }
}

fn bad(src: &Sources, name: &str, value: &str, reason: impl fmt::Display) -> SettingsError {
    SettingsError {
        name: name.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
        origin: src.origin(name),
    }
}

fn parse<T: FromStr>(
    src: &Sources,
    name: &str,
    value: &Option<String>,
    default: T,
) -> Result<T, SettingsError>
where
    T::Err: fmt::Display,
{
    match value {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|e| bad(src, name, v, e)),
    }
}

fn millis(
    src: &Sources,
    name: &str,
    value: &Option<String>,
    default: u64,
) -> Result<Duration, SettingsError> {
    parse::<u64>(src, name, value, default).map(Duration::from_millis)
}

/// A count that must lie in `range`.
fn bounded(
    src: &Sources,
    name: &str,
    value: &Option<String>,
    default: usize,
    range: std::ops::RangeInclusive<usize>,
) -> Result<usize, SettingsError> {
    let n = parse(src, name, value, default)?;
    if range.contains(&n) {
        Ok(n)
    } else {
        Err(bad(
            src,
            name,
            &n.to_string(),
            format!("must be between {} and {}", range.start(), range.end()),
        ))
    }
}

impl Raw {
    fn validate(self, src: &Sources) -> Result<Settings, SettingsError> {
        let grpc_addr = parse(
            src,
            "grpc_addr",
            &self.grpc_addr,
            ([0, 0, 0, 0], 8081).into(),
        )?;
        let http_addr = parse(
            src,
            "http_addr",
            &self.http_addr,
            ([0, 0, 0, 0], 8080).into(),
        )?;
        let rules_dir = self.rules_dir.filter(|d| !d.is_empty()).map(PathBuf::from);
        if let Some(dir) = &rules_dir
            && !Path::new(dir).is_dir()
        {
            return Err(bad(
                src,
                "rules_dir",
                &dir.display().to_string(),
                "not a readable directory",
            ));
        }
        let reload = millis(src, "rules_reload_ms", &self.rules_reload_ms, 2000)?;
        let default_algorithm = parse(
            src,
            "default_algorithm",
            &self.default_algorithm,
            Algorithm::SlidingWindowCounter,
        )?;
        let on_store_error = parse(
            src,
            "on_store_error",
            &self.on_store_error,
            FailurePolicy::Error,
        )?;
        // Past max_in_flight no count can be made in time, as when the
        // store fails: the same answer unless the operator says otherwise.
        let on_overload = parse(src, "on_overload", &self.on_overload, on_store_error)?;
        let usage_reports = match &self.usage_reports {
            None => None,
            Some(_) => Some(parse(src, "usage_reports", &self.usage_reports, false)?),
        };
        let shadow_mode = parse(src, "shadow_mode", &self.shadow_mode, false)?;
        let headers_on = parse(src, "rate_limit_headers", &self.rate_limit_headers, false)?;
        let header =
            |name: &str, v: Option<String>, default: &str| -> Result<String, SettingsError> {
                let v = v.unwrap_or_else(|| default.to_string());
                let valid = !v.is_empty()
                    && v.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_!#$%&'*+.^`|~".contains(&b));
                if valid {
                    Ok(v)
                } else {
                    Err(bad(src, name, &v, "not a valid HTTP header name"))
                }
            };
        let names = HeaderNames {
            limit: header("header_limit", self.header_limit, "RateLimit-Limit")?,
            remaining: header(
                "header_remaining",
                self.header_remaining,
                "RateLimit-Remaining",
            )?,
            reset: header("header_reset", self.header_reset, "RateLimit-Reset")?,
        };
        let store = match self.store.as_deref().map(str::trim) {
            None | Some("") | Some("memory") => StoreSetting::Memory,
            Some(url) => {
                let known = [
                    "redis://",
                    "rediss://",
                    "redis-cluster://",
                    "redis-sentinel://",
                ];
                if !known.iter().any(|p| url.starts_with(p)) {
                    return Err(bad(
                        src,
                        "store",
                        url,
                        "expected memory or a URL starting with redis://, rediss://, redis-cluster:// or redis-sentinel://",
                    ));
                }
                StoreSetting::Redis(url.to_string())
            }
        };
        let r = self.redis;
        let pool_size = parse(src, "redis.pool_size", &r.pool_size, 4usize)?;
        if !(1..=256).contains(&pool_size) {
            return Err(bad(
                src,
                "redis.pool_size",
                &pool_size.to_string(),
                "must be between 1 and 256",
            ));
        }
        let command_timeout = millis(
            src,
            "redis.command_timeout_ms",
            &r.command_timeout_ms,
            DEFAULT_COMMAND_TIMEOUT_MS,
        )?;
        if command_timeout.is_zero() {
            return Err(bad(
                src,
                "redis.command_timeout_ms",
                "0",
                "must be at least 1",
            ));
        }
        let connect_timeout = millis(src, "redis.connect_timeout_ms", &r.connect_timeout_ms, 1000)?;
        let key_prefix = r
            .key_prefix
            .unwrap_or_else(|| crate::storage::keys::DEFAULT_PREFIX.into());
        if key_prefix.is_empty()
            || key_prefix.contains(['{', '}'])
            || key_prefix.contains(char::is_whitespace)
        {
            return Err(bad(
                src,
                "redis.key_prefix",
                &key_prefix,
                "must be non-empty, without braces or spaces",
            ));
        }
        let file = |name: &str, v: Option<String>| -> Result<Option<PathBuf>, SettingsError> {
            match v.filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(v) if Path::new(&v).is_file() => Ok(Some(PathBuf::from(v))),
                Some(v) => Err(bad(src, name, &v, "no such file")),
            }
        };
        let tls_cert_file = file("redis.tls_cert_file", r.tls_cert_file)?;
        let tls_key_file = file("redis.tls_key_file", r.tls_key_file)?;
        if tls_cert_file.is_some() != tls_key_file.is_some() {
            return Err(bad(
                src,
                "redis.tls_cert_file",
                &format!("{tls_cert_file:?}"),
                "tls_cert_file and tls_key_file go together",
            ));
        }
        let redis = RedisSettings {
            connection: RedisConfig {
                url: match &store {
                    StoreSetting::Redis(url) => url.clone(),
                    StoreSetting::Memory => String::new(),
                },
                username: r.username.filter(|v| !v.is_empty()),
                password: r.password.filter(|v| !v.is_empty()),
                tls_ca_file: file("redis.tls_ca_file", r.tls_ca_file)?,
                tls_cert_file,
                tls_key_file,
                pool_size,
                connect_timeout,
                command_timeout,
                key_prefix,
            },
            breaker: BreakerConfig {
                failure_threshold: parse(src, "redis.breaker_failures", &r.breaker_failures, 5u32)?,
                cooldown: millis(
                    src,
                    "redis.breaker_cooldown_ms",
                    &r.breaker_cooldown_ms,
                    500,
                )?,
            },
            coalesce: parse(src, "redis.coalesce", &r.coalesce, true)?,
        };
        if let StoreSetting::Redis(url) = &store
            && let Err(reason) = redis.connection.validate()
        {
            return Err(bad(
                src,
                "store",
                &crate::storage::redis::redact(url),
                reason,
            ));
        }
        // A standard variable stands in for a setting left unset; its errors
        // name the variable.
        let foreign = |var: &str, value: &Option<String>| -> Option<(String, String)> {
            match value {
                Some(v) => Some((v.clone(), String::new())),
                None => src.env.get(var).map(|v| (v.clone(), var.to_string())),
            }
        };
        let bad_foreign = |name: &str, var: &str, value: &str, reason: String| {
            if var.is_empty() {
                bad(src, name, value, reason)
            } else {
                SettingsError {
                    name: var.to_string(),
                    value: value.to_string(),
                    reason,
                    origin: var.to_string(),
                }
            }
        };
        let (log, log_var) =
            foreign("RUST_LOG", &self.log).unwrap_or(("info".into(), String::new()));
        tracing_subscriber::EnvFilter::try_new(&log)
            .map_err(|e| bad_foreign("log", &log_var, &log, e.to_string()))?;
        let log_format = match self.log_format.as_deref().map(str::trim) {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => return Err(bad(src, "log_format", other, "expected text or json")),
        };
        let near_limit_ratio = parse(
            src,
            "metrics.near_limit_ratio",
            &self.metrics.near_limit_ratio,
            0.8f64,
        )?;
        if !(near_limit_ratio > 0.0 && near_limit_ratio <= 1.0) {
            return Err(bad(
                src,
                "metrics.near_limit_ratio",
                &near_limit_ratio.to_string(),
                "must be above 0 and at most 1",
            ));
        }
        let metrics = MetricsSettings {
            enabled: parse(src, "metrics.enabled", &self.metrics.enabled, true)?,
            near_limit_ratio,
            detailed_max_series: bounded(
                src,
                "metrics.detailed_max_series",
                &self.metrics.detailed_max_series,
                100,
                1..=10_000,
            )?,
        };
        // Checked even without an endpoint: a bad value is an error, not
        // ignored until the day an endpoint is set.
        let o = self.otel;
        let service_name = foreign("OTEL_SERVICE_NAME", &o.service_name)
            .map(|(v, _)| v)
            .unwrap_or_else(|| "tollgate".into());
        // OTEL_TRACES_SAMPLER names a ratio when it fixes one; a caller's
        // sampled flag is followed whichever it names.
        let fixed_ratio = match src.env.get("OTEL_TRACES_SAMPLER").map(|v| v.trim()) {
            None | Some("parentbased_traceidratio" | "traceidratio") => None,
            Some("always_on" | "parentbased_always_on") => Some(1.0),
            Some("always_off" | "parentbased_always_off") => Some(0.0),
            Some(other) => {
                return Err(bad_foreign(
                    "otel.sampling_ratio",
                    "OTEL_TRACES_SAMPLER",
                    other,
                    "expected parentbased_traceidratio, traceidratio, always_on, always_off or their parentbased_ forms".into(),
                ));
            }
        };
        let sampler_arg = match (&o.sampling_ratio, fixed_ratio) {
            (None, Some(_)) => None,
            _ => foreign("OTEL_TRACES_SAMPLER_ARG", &o.sampling_ratio),
        };
        let sampling_ratio = match sampler_arg {
            None => fixed_ratio.unwrap_or(1.0),
            Some((v, var)) => match v.trim().parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => r,
                Ok(_) => {
                    return Err(bad_foreign(
                        "otel.sampling_ratio",
                        &var,
                        &v,
                        "must be between 0 and 1".into(),
                    ));
                }
                Err(e) => {
                    return Err(bad_foreign("otel.sampling_ratio", &var, &v, e.to_string()));
                }
            },
        };
        let interval = match foreign("OTEL_METRIC_EXPORT_INTERVAL", &o.metrics_interval_ms) {
            None => 60_000,
            Some((v, var)) => match v.trim().parse::<u64>() {
                Ok(ms) if ms >= 10 => ms,
                Ok(_) => {
                    return Err(bad_foreign(
                        "otel.metrics_interval_ms",
                        &var,
                        &v,
                        "must be at least 10".into(),
                    ));
                }
                Err(e) => {
                    return Err(bad_foreign(
                        "otel.metrics_interval_ms",
                        &var,
                        &v,
                        e.to_string(),
                    ));
                }
            },
        };
        if let Some(protocol) = src.env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            && protocol.trim() != "grpc"
        {
            return Err(bad_foreign(
                "otel.endpoint",
                "OTEL_EXPORTER_OTLP_PROTOCOL",
                protocol,
                "only grpc (OTLP/gRPC) is supported".into(),
            ));
        }
        let otel = match foreign("OTEL_EXPORTER_OTLP_ENDPOINT", &o.endpoint) {
            None => None,
            Some((endpoint, _)) if endpoint.trim().is_empty() => None,
            Some((endpoint, var)) => {
                let endpoint = endpoint.trim().to_string();
                if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                    return Err(bad_foreign(
                        "otel.endpoint",
                        &var,
                        &endpoint,
                        "expected an http:// or https:// URL of an OTLP/gRPC collector".into(),
                    ));
                }
                Some(OtelSettings {
                    endpoint,
                    service_name,
                    sampling_ratio,
                    metrics_interval: Duration::from_millis(interval),
                })
            }
        };
        let d = RequestLimits::default();
        let limits = RequestLimits {
            max_descriptors: bounded(
                src,
                "max_descriptors",
                &self.max_descriptors,
                d.max_descriptors,
                1..=4096,
            )?,
            max_entries: bounded(
                src,
                "max_entries",
                &self.max_entries,
                d.max_entries,
                1..=1024,
            )?,
            max_key_bytes: bounded(
                src,
                "max_key_bytes",
                &self.max_key_bytes,
                d.max_key_bytes,
                1..=1 << 20,
            )?,
            max_value_bytes: bounded(
                src,
                "max_value_bytes",
                &self.max_value_bytes,
                d.max_value_bytes,
                1..=1 << 20,
            )?,
            max_message_bytes: bounded(
                src,
                "max_message_bytes",
                &self.max_message_bytes,
                d.max_message_bytes,
                64..=64 << 20,
            )?,
            max_in_flight: bounded(
                src,
                "max_in_flight",
                &self.max_in_flight,
                d.max_in_flight,
                1..=1 << 20,
            )?,
        };
        let max_log_limit = parse(src, "max_log_limit", &self.max_log_limit, 10_000u32)?;
        if max_log_limit == 0 {
            return Err(bad(src, "max_log_limit", "0", "must be at least 1"));
        }
        let memory_max_limiters = bounded(
            src,
            "memory.max_limiters",
            &self.memory.max_limiters,
            1_000_000,
            1..=usize::MAX,
        )?;
        // Below a megabyte the store would hold too little to be worth
        // running: a few thousand limiters, and short logs.
        let memory_max_bytes = bounded(
            src,
            "memory.max_bytes",
            &self.memory.max_bytes,
            128 << 20,
            1 << 20..=usize::MAX,
        )?;
        let over_limit_cache = CacheConfig {
            enabled: parse(
                src,
                "over_limit_cache.enabled",
                &self.over_limit_cache.enabled,
                true,
            )?,
            max_entries: bounded(
                src,
                "over_limit_cache.max_entries",
                &self.over_limit_cache.max_entries,
                CacheConfig::default().max_entries,
                1..=100_000_000,
            )?,
        };
        let t = self.grpc_tls;
        let cert_file = file("grpc_tls.cert_file", t.cert_file)?;
        let key_file = file("grpc_tls.key_file", t.key_file)?;
        let client_ca_file = file("grpc_tls.client_ca_file", t.client_ca_file)?;
        let tls_reload = millis(src, "grpc_tls.reload_ms", &t.reload_ms, 5000)?;
        let grpc_tls = match (cert_file, key_file) {
            (Some(cert_file), Some(key_file)) => Some(GrpcTls {
                cert_file,
                key_file,
                client_ca_file,
                reload: (!tls_reload.is_zero()).then_some(tls_reload),
            }),
            (None, None) if client_ca_file.is_none() => None,
            (None, None) => {
                return Err(bad(
                    src,
                    "grpc_tls.client_ca_file",
                    &format!("{}", client_ca_file.unwrap_or_default().display()),
                    "client verification needs grpc_tls.cert_file and grpc_tls.key_file",
                ));
            }
            (cert, _) => {
                let name = if cert.is_some() {
                    "grpc_tls.key_file"
                } else {
                    "grpc_tls.cert_file"
                };
                return Err(bad(
                    src,
                    name,
                    "",
                    "grpc_tls.cert_file and grpc_tls.key_file go together",
                ));
            }
        };
        // Load the files now, so that a bad certificate stops startup before
        // any port is bound, with the setting that named it.
        if let Some(tls) = &grpc_tls
            && let Err(e) = crate::tls::server_config(tls)
        {
            return Err(bad(src, e.setting, &e.file.display().to_string(), e.reason));
        }
        Ok(Settings {
            grpc_addr,
            http_addr,
            rules_dir,
            rules_reload: (!reload.is_zero()).then_some(reload),
            default_algorithm,
            on_store_error,
            on_overload,
            usage_reports,
            shadow_mode,
            rate_limit_headers: headers_on.then_some(names),
            store,
            redis,
            deadline_margin: millis(src, "deadline_margin_ms", &self.deadline_margin_ms, 2)?,
            limits,
            max_log_limit,
            memory_max_limiters,
            memory_max_bytes,
            over_limit_cache,
            grpc_tls,
            startup_wait: millis(src, "startup_wait_ms", &self.startup_wait_ms, 5000)?,
            shutdown_drain: millis(src, "shutdown_drain_ms", &self.shutdown_drain_ms, 5000)?,
            shutdown_grace: millis(src, "shutdown_grace_ms", &self.shutdown_grace_ms, 5000)?,
            log,
            log_format,
            metrics,
            otel,
            warnings: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Sources {
        Sources {
            env: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Sources::default()
        }
    }

    #[test]
    fn defaults() {
        let s = Settings::load(&Sources::default()).unwrap();
        assert_eq!(s.grpc_addr.port(), 8081);
        assert_eq!(s.http_addr.port(), 8080);
        assert_eq!(s.default_algorithm, Algorithm::SlidingWindowCounter);
        assert_eq!(s.store, StoreSetting::Memory);
        assert_eq!(
            s.redis.connection.command_timeout,
            Duration::from_millis(DEFAULT_COMMAND_TIMEOUT_MS)
        );
        assert!(s.rate_limit_headers.is_none());
        assert_eq!(s.limits, RequestLimits::default());
        assert!(s.grpc_tls.is_none());
        assert!(s.warnings.is_empty());
    }

    #[test]
    fn env_then_flags_win() {
        let mut src = env(&[
            ("TOLLGATE_DEFAULT_ALGORITHM", "fixed_window"),
            ("TOLLGATE_REDIS__POOL_SIZE", "8"),
            ("TOLLGATE_GRPC_ADDR", "127.0.0.1:9000"),
        ]);
        src.overrides
            .push(("grpc_addr".into(), "127.0.0.1:9001".into()));
        let s = Settings::load(&src).unwrap();
        assert_eq!(s.default_algorithm, Algorithm::FixedWindow);
        assert_eq!(s.redis.connection.pool_size, 8);
        assert_eq!(s.grpc_addr, "127.0.0.1:9001".parse().unwrap());
    }

    #[test]
    fn file_then_env() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tollgate.yaml");
        std::fs::write(
            &path,
            "store: redis://127.0.0.1:6379\nredis:\n  command_timeout_ms: 15\nshadow_mode: true\n",
        )
        .unwrap();
        let mut src = env(&[("TOLLGATE_SHADOW_MODE", "false")]);
        src.file = Some(path);
        let s = Settings::load(&src).unwrap();
        assert_eq!(
            s.store,
            StoreSetting::Redis("redis://127.0.0.1:6379".into())
        );
        assert_eq!(
            s.redis.connection.command_timeout,
            Duration::from_millis(15)
        );
        assert!(!s.shadow_mode);
    }

    #[test]
    fn bad_values_name_the_setting() {
        let cases = [
            (
                "TOLLGATE_GRPC_ADDR",
                "nowhere",
                "grpc_addr=nowhere is not valid",
            ),
            (
                "TOLLGATE_DEFAULT_ALGORITHM",
                "leaky",
                "default_algorithm=leaky is not valid",
            ),
            (
                "TOLLGATE_STORE",
                "mysql://x",
                "store=mysql://x is not valid",
            ),
            (
                "TOLLGATE_REDIS__POOL_SIZE",
                "0",
                "redis.pool_size=0 is not valid",
            ),
            (
                "TOLLGATE_REDIS__COMMAND_TIMEOUT_MS",
                "soon",
                "redis.command_timeout_ms=soon is not valid",
            ),
            (
                "TOLLGATE_ON_STORE_ERROR",
                "maybe",
                "on_store_error=maybe is not valid",
            ),
            (
                "TOLLGATE_RULES_DIR",
                "/no/such/dir",
                "rules_dir=/no/such/dir is not valid",
            ),
            (
                "TOLLGATE_SHADOW_MODE",
                "perhaps",
                "shadow_mode=perhaps is not valid",
            ),
            (
                "TOLLGATE_STORE",
                "redis://u:secret@127.0.0.1:notaport",
                "store=redis://***@127.0.0.1:notaport is not valid",
            ),
        ];
        for (k, v, want) in cases {
            let err = Settings::load(&env(&[(k, v)])).unwrap_err().to_string();
            assert!(err.starts_with(want), "{k}={v}: got {err}");
            assert!(
                err.ends_with(&format!("(set by {k})")),
                "{k}={v}: got {err}"
            );
            assert!(!err.contains("secret"), "a password leaked: {err}");
        }
    }

    #[test]
    fn errors_name_their_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.yaml");
        std::fs::write(&path, "redis:\n  pool_size: 0\nmax_entries: 0\n").unwrap();
        let mut src = Sources {
            file: Some(path.clone()),
            ..Sources::default()
        };
        let err = Settings::load(&src).unwrap_err().to_string();
        assert!(
            err.ends_with(&format!(
                "(set by file {}, key redis.pool_size)",
                path.display()
            )),
            "{err}"
        );
        src.overrides.push(("redis.pool_size".into(), "3".into()));
        src.overrides.push(("max_entries".into(), "-1".into()));
        let err = Settings::load(&src).unwrap_err().to_string();
        assert!(
            err.starts_with("max_entries=-1 is not valid")
                && err.ends_with("(set by flag --max-entries)"),
            "{err}"
        );
    }

    #[test]
    fn kubernetes_service_links_are_ignored_and_strays_warned() {
        let src = env(&[
            ("TOLLGATE_PORT", "tcp://10.0.0.1:8081"),
            ("TOLLGATE_SERVICE_HOST", "10.0.0.1"),
            ("TOLLGATE_SERVICE_PORT", "8081"),
            ("TOLLGATE_SERVICE_PORT_GRPC", "8081"),
            ("TOLLGATE_SERVICE_PORT_HTTP", "8080"),
            ("TOLLGATE_PORT_8081_TCP", "tcp://10.0.0.1:8081"),
            ("TOLLGATE_PORT_8081_TCP_ADDR", "10.0.0.1"),
            ("TOLLGATE_PORT_8081_TCP_PORT", "8081"),
            ("TOLLGATE_PORT_8081_TCP_PROTO", "tcp"),
            ("TOLLGATE_PORT_9090_UDP_ADDR", "10.0.0.1"),
            ("TOLLGATE_METRICS_SERVICE_HOST", "10.0.0.2"),
            ("TOLLGATE_METRICS_PORT", "tcp://10.0.0.2:9090"),
            ("TOLLGATE_METRICS_PORT_9090_TCP_PORT", "9090"),
            ("TOLLGATE_GRPC_ADDR", "127.0.0.1:9999"),
            ("TOLLGATE_GRPC_ADR", "127.0.0.1:1"),
            ("TOLLGATE_REDIS__POOLSIZE", "3"),
        ]);
        let s = Settings::load(&src).unwrap();
        assert_eq!(s.grpc_addr, "127.0.0.1:9999".parse().unwrap());
        assert_eq!(
            s.warnings,
            [
                "TOLLGATE_GRPC_ADR is not a tollgate setting; ignored",
                "TOLLGATE_REDIS__POOLSIZE is not a tollgate setting; ignored",
            ]
        );
    }

    #[test]
    fn observability_settings() {
        let s = Settings::load(&Sources::default()).unwrap();
        assert_eq!(s.log_format, LogFormat::Text);
        assert_eq!(
            s.metrics,
            MetricsSettings {
                enabled: true,
                near_limit_ratio: 0.8,
                detailed_max_series: 100,
            }
        );
        assert_eq!(s.otel, None);

        // The standard variables stand in for unset settings...
        let mut src = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_SERVICE_NAME", "edge-limits"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "15000"),
            ("RUST_LOG", "debug"),
            ("TOLLGATE_LOG_FORMAT", "json"),
        ]);
        let s = Settings::load(&src).unwrap();
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        assert_eq!(
            s.otel,
            Some(OtelSettings {
                endpoint: "http://collector:4317".into(),
                service_name: "edge-limits".into(),
                sampling_ratio: 0.25,
                metrics_interval: Duration::from_secs(15),
            })
        );
        assert_eq!((s.log.as_str(), s.log_format), ("debug", LogFormat::Json));
        // ...and tollgate's own names win.
        src.env
            .insert("TOLLGATE_OTEL__SAMPLING_RATIO".into(), "0".into());
        src.env.insert("TOLLGATE_LOG".into(), "warn".into());
        let s = Settings::load(&src).unwrap();
        assert_eq!(s.otel.unwrap().sampling_ratio, 0.0);
        assert_eq!(s.log, "warn");
        // The chart's variables: a named sampler with its argument.
        let chart = |sampler: &str| {
            let src = env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ("OTEL_TRACES_SAMPLER", sampler),
                ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
            ]);
            Settings::load(&src).unwrap().otel.unwrap().sampling_ratio
        };
        assert_eq!(chart("parentbased_traceidratio"), 0.01);
        assert_eq!(chart("always_off"), 0.0);
        assert_eq!(chart("parentbased_always_on"), 1.0);

        for (pairs, want) in [
            (
                &[
                    ("OTEL_TRACES_SAMPLER_ARG", "2"),
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317"),
                ][..],
                "OTEL_TRACES_SAMPLER_ARG=2 is not valid: must be between 0 and 1 (set by OTEL_TRACES_SAMPLER_ARG)",
            ),
            (
                &[("TOLLGATE_OTEL__SAMPLING_RATIO", "-1")][..],
                "otel.sampling_ratio=-1 is not valid: must be between 0 and 1",
            ),
            (
                &[("TOLLGATE_OTEL__ENDPOINT", "collector:4317")][..],
                "otel.endpoint=collector:4317 is not valid",
            ),
            (
                &[("TOLLGATE_METRICS__NEAR_LIMIT_RATIO", "0")][..],
                "metrics.near_limit_ratio=0 is not valid: must be above 0 and at most 1",
            ),
            (
                &[("TOLLGATE_METRICS__DETAILED_MAX_SERIES", "0")][..],
                "metrics.detailed_max_series=0 is not valid",
            ),
            (
                &[("TOLLGATE_LOG_FORMAT", "xml")][..],
                "log_format=xml is not valid: expected text or json",
            ),
            (&[("RUST_LOG", "[[")][..], "(set by RUST_LOG)"),
            (
                &[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")][..],
                "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf is not valid: only grpc",
            ),
            (
                &[("OTEL_TRACES_SAMPLER", "jaeger_remote")][..],
                "OTEL_TRACES_SAMPLER=jaeger_remote is not valid",
            ),
        ] {
            let err = Settings::load(&env(pairs)).unwrap_err().to_string();
            assert!(err.contains(want), "{pairs:?}: {err}");
        }
    }

    #[test]
    fn every_listed_key_is_a_setting() {
        // Each name in KEYS is accepted by the file parser and by its
        // variable (a value may still be refused, but never as unknown).
        for key in KEYS {
            let var = env_name(key);
            assert_eq!(classify_env(&var, "x"), EnvVar::Setting(key), "{var}");
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.yaml");
            let yaml = match key.split_once('.') {
                Some((outer, inner)) => format!("{outer}:\n  {inner}: \"\"\n"),
                None => format!("{key}: \"\"\n"),
            };
            std::fs::write(&path, yaml).unwrap();
            let src = Sources {
                file: Some(path),
                ..Sources::default()
            };
            if let Err(e) = Settings::load(&src) {
                assert!(!e.to_string().contains("unknown field"), "{key}: {e}");
            }
        }
    }

    #[test]
    fn limits_and_tls_settings() {
        let src = env(&[
            ("TOLLGATE_MAX_DESCRIPTORS", "5"),
            ("TOLLGATE_MAX_IN_FLIGHT", "7"),
            ("TOLLGATE_MEMORY__MAX_LIMITERS", "100"),
            ("TOLLGATE_MEMORY__MAX_BYTES", "16777216"),
            ("TOLLGATE_MAX_LOG_LIMIT", "50"),
        ]);
        let s = Settings::load(&src).unwrap();
        assert_eq!(s.limits.max_descriptors, 5);
        assert_eq!(s.limits.max_in_flight, 7);
        assert_eq!(s.memory_max_limiters, 100);
        assert_eq!(s.memory_max_bytes, 16 << 20);
        assert_eq!(
            Settings::load(&env(&[])).unwrap().memory_max_bytes,
            128 << 20
        );
        assert_eq!(s.max_log_limit, 50);
        assert_eq!(s.over_limit_cache, CacheConfig::default());
        assert!(s.over_limit_cache.enabled);
        let s = Settings::load(&env(&[
            ("TOLLGATE_OVER_LIMIT_CACHE__ENABLED", "false"),
            ("TOLLGATE_OVER_LIMIT_CACHE__MAX_ENTRIES", "10"),
        ]))
        .unwrap();
        assert_eq!(
            s.over_limit_cache,
            CacheConfig {
                enabled: false,
                max_entries: 10
            }
        );
        for (pair, want) in [
            (
                ("TOLLGATE_OVER_LIMIT_CACHE__MAX_ENTRIES", "0"),
                "over_limit_cache.max_entries=0 is not valid: must be between 1",
            ),
            (
                ("TOLLGATE_OVER_LIMIT_CACHE__MAX_ENTRIES", "lots"),
                "over_limit_cache.max_entries=lots is not valid",
            ),
            (
                ("TOLLGATE_OVER_LIMIT_CACHE__ENABLED", "maybe"),
                "over_limit_cache.enabled=maybe is not valid",
            ),
            (
                ("TOLLGATE_MEMORY__MAX_BYTES", "1000"),
                "memory.max_bytes=1000 is not valid: must be between 1048576",
            ),
            (
                ("TOLLGATE_MEMORY__MAX_BYTES", "256MiB"),
                "memory.max_bytes=256MiB is not valid",
            ),
        ] {
            let err = Settings::load(&env(&[pair])).unwrap_err().to_string();
            assert!(err.starts_with(want), "{err}");
        }
        let err = Settings::load(&env(&[("TOLLGATE_GRPC_TLS__CERT_FILE", "/etc/hostname")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("go together"), "{err}");
        let err = Settings::load(&env(&[("TOLLGATE_MAX_DESCRIPTORS", "0")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("max_descriptors=0 is not valid: must be between 1"),
            "{err}"
        );
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.yaml");
        std::fs::write(&path, "grpc_adr: 1.2.3.4:5\n").unwrap();
        let src = Sources {
            file: Some(path),
            ..Sources::default()
        };
        let err = Settings::load(&src).unwrap_err().to_string();
        assert!(err.contains("grpc_adr"), "{err}");
    }
}
