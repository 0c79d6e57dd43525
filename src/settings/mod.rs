//! Settings: read from a YAML file, then `TOLLGATE_*` environment
//! variables, then command-line flags (later wins), and validated before
//! anything binds a port.
//!
//! Every setting is declared once, in [`table::SETTINGS`]: its name, its
//! default, the values it takes and its meaning. Its variable is derived
//! from its name (`redis.pool_size` is `TOLLGATE_REDIS__POOL_SIZE`); a bad
//! value, from whichever source, is `name=value is not valid: reason (set
//! by SOURCE)`. The settings table with every default is `tollgate serve
//! --help`'s and the generated settings reference's
//! (`docs/src/reference/settings.md`, `crate::reference`); tests/reference.rs
//! holds hand-written tables of settings and the chart's values to it.
//! [`Settings`] is what the rest of the program reads: the declared
//! values, composed into the shapes the stores and listeners take, with
//! the checks that span several settings.

mod build;
mod env;
mod flags;
mod kind;
pub mod table;
mod values;
mod xds;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};

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
    /// The declared defaults.
    fn default() -> Self {
        let count = |name: &str| {
            table::find(name)
                .and_then(|s| s.default)
                .and_then(|d| d.parse().ok())
                .unwrap_or(0)
        };
        Self {
            max_descriptors: count("max_descriptors"),
            max_entries: count("max_entries"),
            max_key_bytes: count("max_key_bytes"),
            max_value_bytes: count("max_value_bytes"),
            max_message_bytes: count("max_message_bytes"),
            max_in_flight: count("max_in_flight"),
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
/// Where rules come from when they come over xDS (ADS, state of the world).
#[derive(Clone, PartialEq)]
pub struct XdsSettings {
    /// `http://host:port` or `https://host:port`.
    pub url: String,
    pub node_id: String,
    pub node_cluster: Option<String>,
    /// A JSON object.
    pub node_metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// gRPC metadata sent on the stream (lower-case names).
    pub headers: Vec<(String, String)>,
    /// `Some` for TLS.
    pub tls: Option<XdsTls>,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub serve_without_config: bool,
}

impl fmt::Debug for XdsSettings {
    // Header values (tokens) are not shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("XdsSettings")
            .field("url", &self.url)
            .field("node_id", &self.node_id)
            .field("node_cluster", &self.node_cluster)
            .field("node_metadata", &self.node_metadata)
            .field("headers", &headers)
            .field("tls", &self.tls)
            .field("retry_initial", &self.retry_initial)
            .field("retry_max", &self.retry_max)
            .field("serve_without_config", &self.serve_without_config)
            .finish()
    }
}

/// TLS to the management server; files already read.
#[derive(Clone, PartialEq)]
pub struct XdsTls {
    pub ca_pem: Option<Vec<u8>>,
    /// Client certificate and key (PEM), for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    pub server_name: Option<String>,
}

impl fmt::Debug for XdsTls {
    // No private key in Debug output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XdsTls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish()
    }
}

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

/// The quota service (RLQS): see `crate::rlqs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RlqsSettings {
    /// Whole seconds, at least 1.
    pub assignment_ttl_secs: u64,
    pub burst: f64,
    pub abandon_after: Option<Duration>,
    pub max_buckets: usize,
    pub max_total_buckets: u64,
    pub max_streams: u64,
}

/// Bounds on the HTTP listeners (see `server::listen`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpSettings {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

/// Validated settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `None`: gRPC only on `grpc_uds`.
    pub grpc_addr: Option<SocketAddr>,
    pub http_addr: SocketAddr,
    /// `None`: the debug views are not served.
    pub debug_addr: Option<SocketAddr>,
    pub debug_show_values: bool,
    pub http: HttpSettings,
    pub rules_dir: Option<PathBuf>,
    pub rules_reload: Option<Duration>,
    pub default_algorithm: Algorithm,
    pub on_store_error: FailurePolicy,
    /// What a store call past `max_in_flight` answers.
    pub on_overload: FailurePolicy,
    /// `usage_reports` of rules that do not say; `None`: by whether the
    /// rule names an algorithm.
    pub usage_reports: Option<bool>,
    /// `count_refused` of rules that do not say (and of request overrides).
    pub count_refused: bool,
    /// `lease` of rules that do not say (where a rule may lease).
    pub lease: bool,
    /// Leased limiters one replica holds (`lease.max_limiters`).
    pub lease_max_limiters: usize,
    pub shadow_mode: bool,
    /// `Some` when `RateLimit-*` headers are enabled.
    pub rate_limit_headers: Option<HeaderNames>,
    pub store: StoreSetting,
    pub redis: RedisSettings,
    /// Kept back from the caller's deadline for the answer's way back.
    pub deadline_margin: Duration,
    pub rlqs: RlqsSettings,
    pub limits: RequestLimits,
    /// Largest `requests_per_unit` of a `sliding_window_log` limit.
    pub max_log_limit: u32,
    /// A Unix socket gRPC is served on as well.
    pub grpc_uds: Option<PathBuf>,
    /// Age past which a gRPC connection is sent GOAWAY.
    pub grpc_max_connection_age: Option<Duration>,
    /// How long a connection past its age may finish its calls.
    pub grpc_max_connection_age_grace: Option<Duration>,
    /// Rules from an xDS management server instead of `rules_dir`.
    pub xds: Option<XdsSettings>,
    /// Files naming the same domain are merged into it.
    pub merge_domain_config: bool,
    /// Answers carry `dynamic_metadata` (the matched rules' `metadata`).
    pub response_dynamic_metadata: bool,
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

/// Every setting's name, as written in the settings file, derived from
/// the declaration.
pub fn keys() -> impl Iterator<Item = &'static str> {
    table::SETTINGS.iter().map(|s| s.name)
}

use env::{EnvVar, classify_env};
use table::ENV_PREFIX;
pub use table::env_name;
use values::{Values, bad, flatten};

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
            // The flag as the command line spells it (`--rules` sets
            // `rules_dir`).
            return match flags::flag(name) {
                Some(flag) => format!("flag {flag}"),
                None => format!("flag --{}", name.replace(['_', '.'], "-")),
            };
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

impl Settings {
    pub fn load(sources: &Sources) -> Result<Settings, SettingsError> {
        load(sources).map(|(settings, _)| settings)
    }
}

/// Reads the sources into one value per given setting, then builds the
/// settings from them; also says which settings were read (a test checks
/// that every declared one is).
fn load(sources: &Sources) -> Result<(Settings, HashSet<&'static str>), SettingsError> {
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
        let alone = Config::builder()
            .add_source(File::from_str(&text, FileFormat::Yaml))
            .build()
            .map_err(|e| file_error(e.to_string()))?;
        flatten(alone).map_err(file_error)?;
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
            EnvVar::Unknown => warnings.push(match env::nearest(var) {
                Some(near) => {
                    format!("{var} is not a tollgate setting; ignored (did you mean {near}?)")
                }
                None => format!("{var} is not a tollgate setting; ignored"),
            }),
        }
    }
    builder = builder.add_source(
        Environment::with_prefix("TOLLGATE")
            .prefix_separator("_")
            .separator("__")
            .source(Some(env.into_iter().collect())),
    );
    for (k, v) in &sources.overrides {
        if table::find(k).is_none() {
            return Err(bad(sources, k, v, "not a setting"));
        }
        builder = builder
            .set_override(k.as_str(), v.as_str())
            .map_err(|e| bad(sources, k, v, e))?;
    }
    let merged = builder.build().map_err(|e| SettingsError {
        name: "settings".into(),
        value: String::new(),
        reason: e.to_string(),
        origin: "flags or environment".into(),
    })?;
    let given = flatten(merged).map_err(|reason| SettingsError {
        name: "settings".into(),
        value: String::new(),
        reason,
        origin: "flags or environment".into(),
    })?;
    let values = Values {
        given,
        src: sources,
        read: Default::default(),
    };
    let mut settings = build::build(&values)?;
    settings.warnings = warnings;
    Ok((settings, values.read.into_inner()))
}

#[cfg(test)]
mod tests;
