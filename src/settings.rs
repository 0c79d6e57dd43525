//! Settings: one typed struct, read from a YAML file, then `TOLLGATE_*`
//! environment variables, then command-line flags (later wins), and validated
//! before anything binds a port.
//!
//! | setting | env | default | meaning |
//! |---|---|---|---|
//! | `grpc_addr` | `TOLLGATE_GRPC_ADDR` | `0.0.0.0:8081` | RLS gRPC listen address |
//! | `http_addr` | `TOLLGATE_HTTP_ADDR` | `0.0.0.0:8080` | HTTP (`/healthcheck`) listen address |
//! | `rules_dir` | `TOLLGATE_RULES_DIR` | none | directory of rule files; none = no rules |
//! | `rules_reload_ms` | `TOLLGATE_RULES_RELOAD_MS` | `2000` | how often the rules directory is checked for changes; 0 = never |
//! | `default_algorithm` | `TOLLGATE_DEFAULT_ALGORITHM` | `sliding_window_counter` | algorithm of rules that name none |
//! | `on_store_error` | `TOLLGATE_ON_STORE_ERROR` | `error` | `error`, `allow` or `deny` when the store fails |
//! | `shadow_mode` | `TOLLGATE_SHADOW_MODE` | `false` | count, but always answer OK overall |
//! | `rate_limit_headers` | `TOLLGATE_RATE_LIMIT_HEADERS` | `false` | add `RateLimit-*` response headers |
//! | `header_limit` / `header_remaining` / `header_reset` | `TOLLGATE_HEADER_*` | `RateLimit-Limit` ... | their names |
//! | `store` | `TOLLGATE_STORE` | `memory` | `memory` or a Redis URL (`redis://`, `rediss://`, `redis-cluster://`, `redis-sentinel://`) |
//! | `redis.username` / `redis.password` | `TOLLGATE_REDIS__USERNAME` ... | none | credentials (override the URL's) |
//! | `redis.tls_ca_file` / `tls_cert_file` / `tls_key_file` | `TOLLGATE_REDIS__TLS_CA_FILE` ... | none | TLS files |
//! | `redis.pool_size` | `TOLLGATE_REDIS__POOL_SIZE` | `4` | connections per node |
//! | `redis.connect_timeout_ms` | `TOLLGATE_REDIS__CONNECT_TIMEOUT_MS` | `1000` | connect timeout |
//! | `redis.command_timeout_ms` | `TOLLGATE_REDIS__COMMAND_TIMEOUT_MS` | `10` | bound on every Redis call (Envoy waits 20 ms by default) |
//! | `redis.key_prefix` | `TOLLGATE_REDIS__KEY_PREFIX` | `tg1` | prefix of every key |
//! | `redis.breaker_failures` | `TOLLGATE_REDIS__BREAKER_FAILURES` | `5` | consecutive failures that open the circuit |
//! | `redis.breaker_cooldown_ms` | `TOLLGATE_REDIS__BREAKER_COOLDOWN_MS` | `500` | how long it stays open before a probe |
//! | `shutdown_grace_ms` | `TOLLGATE_SHUTDOWN_GRACE_MS` | `5000` | drain time on SIGTERM |
//! | `log` | `TOLLGATE_LOG` | `info` | log filter (tracing `EnvFilter` syntax) |

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
use serde::Deserialize;

use crate::limit::{Algorithm, FailurePolicy};
use crate::storage::{BreakerConfig, RedisConfig};

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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
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
    pub shadow_mode: bool,
    /// `Some` when `RateLimit-*` headers are enabled.
    pub rate_limit_headers: Option<HeaderNames>,
    pub store: StoreSetting,
    pub redis: RedisSettings,
    pub shutdown_grace: Duration,
    pub log: String,
}

/// A setting with a bad value: `name=value is not valid: reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SettingsError {
    pub name: String,
    pub value: String,
    pub reason: String,
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={} is not valid: {}",
            self.name, self.value, self.reason
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
    shadow_mode: Option<String>,
    rate_limit_headers: Option<String>,
    header_limit: Option<String>,
    header_remaining: Option<String>,
    header_reset: Option<String>,
    store: Option<String>,
    #[serde(default)]
    redis: RawRedis,
    shutdown_grace_ms: Option<String>,
    log: Option<String>,
}

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
            .filter(|(k, _)| k.starts_with("TOLLGATE_"))
            .collect()
    }
}

impl Settings {
    pub fn load(sources: &Sources) -> Result<Settings, SettingsError> {
        let mut builder = Config::builder();
        if let Some(file) = &sources.file {
            let text = std::fs::read_to_string(file).map_err(|e| SettingsError {
                name: "config".into(),
                value: file.display().to_string(),
                reason: e.to_string(),
            })?;
            builder = builder.add_source(File::from_str(&text, FileFormat::Yaml));
        }
        builder = builder.add_source(
            Environment::with_prefix("TOLLGATE")
                .prefix_separator("_")
                .separator("__")
                .source(Some(sources.env.clone().into_iter().collect())),
        );
        for (k, v) in &sources.overrides {
            builder = builder
                .set_override(k.as_str(), v.as_str())
                .map_err(|e| bad(k, v, e))?;
        }
        let raw: Raw = builder
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| SettingsError {
                name: "config".into(),
                value: sources
                    .file
                    .as_ref()
                    .map(|f| f.display().to_string())
                    .unwrap_or_default(),
                reason: e.to_string(),
            })?;
        raw.validate()
    }
}

fn bad(name: &str, value: &str, reason: impl fmt::Display) -> SettingsError {
    SettingsError {
        name: name.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn parse<T: FromStr>(name: &str, value: &Option<String>, default: T) -> Result<T, SettingsError>
where
    T::Err: fmt::Display,
{
    match value {
        None => Ok(default),
        Some(v) => v.trim().parse().map_err(|e| bad(name, v, e)),
    }
}

fn millis(name: &str, value: &Option<String>, default: u64) -> Result<Duration, SettingsError> {
    parse::<u64>(name, value, default).map(Duration::from_millis)
}

impl Raw {
    fn validate(self) -> Result<Settings, SettingsError> {
        let grpc_addr = parse("grpc_addr", &self.grpc_addr, ([0, 0, 0, 0], 8081).into())?;
        let http_addr = parse("http_addr", &self.http_addr, ([0, 0, 0, 0], 8080).into())?;
        let rules_dir = self.rules_dir.filter(|d| !d.is_empty()).map(PathBuf::from);
        if let Some(dir) = &rules_dir
            && !Path::new(dir).is_dir()
        {
            return Err(bad(
                "rules_dir",
                &dir.display().to_string(),
                "not a readable directory",
            ));
        }
        let reload = millis("rules_reload_ms", &self.rules_reload_ms, 2000)?;
        let default_algorithm = parse(
            "default_algorithm",
            &self.default_algorithm,
            Algorithm::SlidingWindowCounter,
        )?;
        let on_store_error = parse("on_store_error", &self.on_store_error, FailurePolicy::Error)?;
        let shadow_mode = parse("shadow_mode", &self.shadow_mode, false)?;
        let headers_on = parse("rate_limit_headers", &self.rate_limit_headers, false)?;
        let header =
            |name: &str, v: Option<String>, default: &str| -> Result<String, SettingsError> {
                let v = v.unwrap_or_else(|| default.to_string());
                let valid = !v.is_empty()
                    && v.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_!#$%&'*+.^`|~".contains(&b));
                if valid {
                    Ok(v)
                } else {
                    Err(bad(name, &v, "not a valid HTTP header name"))
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
                        "store",
                        url,
                        "expected memory or a URL starting with redis://, rediss://, redis-cluster:// or redis-sentinel://",
                    ));
                }
                StoreSetting::Redis(url.to_string())
            }
        };
        let r = self.redis;
        let pool_size = parse("redis.pool_size", &r.pool_size, 4usize)?;
        if !(1..=256).contains(&pool_size) {
            return Err(bad(
                "redis.pool_size",
                &pool_size.to_string(),
                "must be between 1 and 256",
            ));
        }
        let command_timeout = millis("redis.command_timeout_ms", &r.command_timeout_ms, 10)?;
        if command_timeout.is_zero() {
            return Err(bad("redis.command_timeout_ms", "0", "must be at least 1"));
        }
        let connect_timeout = millis("redis.connect_timeout_ms", &r.connect_timeout_ms, 1000)?;
        let key_prefix = r
            .key_prefix
            .unwrap_or_else(|| crate::storage::keys::DEFAULT_PREFIX.into());
        if key_prefix.is_empty()
            || key_prefix.contains(['{', '}'])
            || key_prefix.contains(char::is_whitespace)
        {
            return Err(bad(
                "redis.key_prefix",
                &key_prefix,
                "must be non-empty, without braces or spaces",
            ));
        }
        let file = |name: &str, v: Option<String>| -> Result<Option<PathBuf>, SettingsError> {
            match v.filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(v) if Path::new(&v).is_file() => Ok(Some(PathBuf::from(v))),
                Some(v) => Err(bad(name, &v, "no such file")),
            }
        };
        let tls_cert_file = file("redis.tls_cert_file", r.tls_cert_file)?;
        let tls_key_file = file("redis.tls_key_file", r.tls_key_file)?;
        if tls_cert_file.is_some() != tls_key_file.is_some() {
            return Err(bad(
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
                failure_threshold: parse("redis.breaker_failures", &r.breaker_failures, 5u32)?,
                cooldown: millis("redis.breaker_cooldown_ms", &r.breaker_cooldown_ms, 500)?,
            },
        };
        if let StoreSetting::Redis(url) = &store
            && let Err(reason) = redis.connection.validate()
        {
            return Err(bad("store", &crate::storage::redis::redact(url), reason));
        }
        let log = self.log.unwrap_or_else(|| "info".into());
        tracing_subscriber::EnvFilter::try_new(&log).map_err(|e| bad("log", &log, e))?;
        Ok(Settings {
            grpc_addr,
            http_addr,
            rules_dir,
            rules_reload: (!reload.is_zero()).then_some(reload),
            default_algorithm,
            on_store_error,
            shadow_mode,
            rate_limit_headers: headers_on.then_some(names),
            store,
            redis,
            shutdown_grace: millis("shutdown_grace_ms", &self.shutdown_grace_ms, 5000)?,
            log,
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
            Duration::from_millis(10)
        );
        assert!(s.rate_limit_headers.is_none());
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
            assert!(!err.contains("secret"), "a password leaked: {err}");
        }
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
