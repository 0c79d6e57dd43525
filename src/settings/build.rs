//! The declared values composed into what the program reads, with the
//! checks that span several settings (TLS pairs, the Redis URL, the
//! standard OpenTelemetry variables standing in for unset settings).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::table::{self, Kind};
use super::values::{Values, bad};
use super::xds;
use super::{
    CacheConfig, FailurePolicy, GrpcTls, HeaderNames, HttpSettings, LogFormat, MetricsSettings,
    OtelSettings, RedisSettings, RequestLimits, RlqsSettings, Settings, SettingsError, Sources,
    StoreSetting,
};
use crate::limit::Algorithm;
use crate::limit::algorithms::Param;
use crate::storage::{BreakerConfig, RedisConfig};

/// The declared values composed into what the program reads, with the
/// checks that span several settings. Each value is read, and refused, in
/// a fixed order: the first refusal is the one reported.
pub(super) fn build(v: &Values<'_>) -> Result<Settings, SettingsError> {
    let rules_dir = rules_dir(v)?;
    let (on_store_error, on_overload) = failure_policies(v)?;
    let (usage_reports, count_refused) = counting(v)?;
    let names = header_names(v)?;
    let store = store_setting(v)?;
    let redis = redis_settings(v, &store)?;
    let (log, log_format) = log_settings(v)?;
    let metrics = MetricsSettings {
        enabled: v.bool("metrics.enabled")?,
        near_limit_ratio: v.get("metrics.near_limit_ratio")?,
        detailed_max_series: v.get("metrics.detailed_max_series")?,
    };
    let otel = otel_settings(v)?;
    let limits = request_limits(v)?;
    let over_limit_cache = CacheConfig {
        enabled: v.bool("over_limit_cache.enabled")?,
        max_entries: v.get("over_limit_cache.max_entries")?,
    };
    let grpc_tls = grpc_tls(v)?;
    Ok(Settings {
        grpc_addr: grpc_addr(v)?,
        http_addr: v.get("http_addr")?,
        debug_addr: debug_addr(v)?,
        debug_show_values: v.bool("debug_show_values")?,
        http: HttpSettings {
            header_read_timeout: v.millis("http.header_read_timeout_ms")?,
            idle_timeout: v.millis("http.idle_timeout_ms")?,
            max_connections: v.get("http.max_connections")?,
        },
        rules_dir,
        rules_reload: v.every("rules_reload_ms")?,
        default_algorithm: default_algorithm(v)?,
        on_store_error,
        on_overload,
        usage_reports,
        count_refused,
        lease: v.bool("lease")?,
        lease_max_limiters: v.get("lease.max_limiters")?,
        shadow_mode: v.bool("shadow_mode")?,
        rate_limit_headers: v.bool("rate_limit_headers")?.then_some(names),
        store,
        redis,
        deadline_margin: v.millis("deadline_margin_ms")?,
        rlqs: rlqs_settings(v)?,
        limits,
        max_log_limit: v.get("max_log_limit")?,
        xds: xds::xds_settings(v)?,
        merge_domain_config: v.bool("merge_domain_config")?,
        grpc_uds: v.opt_text("grpc_uds")?.map(PathBuf::from),
        grpc_max_connection_age: v.every("grpc_max_connection_age_ms")?,
        grpc_max_connection_age_grace: v.every("grpc_max_connection_age_grace_ms")?,
        response_dynamic_metadata: v.bool("response_dynamic_metadata")?,
        memory_max_limiters: v.get("memory.max_limiters")?,
        memory_max_bytes: v.get("memory.max_bytes")?,
        over_limit_cache,
        grpc_tls,
        startup_wait: v.millis("startup_wait_ms")?,
        shutdown_drain: v.millis("shutdown_drain_ms")?,
        shutdown_grace: v.millis("shutdown_grace_ms")?,
        log,
        log_format,
        metrics,
        otel,
        warnings: Vec::new(),
    })
}

/// `default_algorithm`: one a rule that names none can run, with no key
/// of its own that the rule must give (a limit in flight needs its
/// `max_duration`).
fn default_algorithm(v: &Values<'_>) -> Result<Algorithm, SettingsError> {
    let algorithm: Algorithm = v.get("default_algorithm")?;
    if algorithm.spec().param == Param::MaxDuration {
        return Err(bad(
            v.src,
            "default_algorithm",
            algorithm.as_str(),
            "a rule must name it, with its max_duration",
        ));
    }
    Ok(algorithm)
}

/// `rules_dir`, which must be a readable directory when set.
fn rules_dir(v: &Values<'_>) -> Result<Option<PathBuf>, SettingsError> {
    let rules_dir = v.opt_text("rules_dir")?.map(PathBuf::from);
    if let Some(dir) = &rules_dir
        && !Path::new(dir).is_dir()
    {
        return Err(bad(
            v.src,
            "rules_dir",
            &dir.display().to_string(),
            "not a readable directory",
        ));
    }
    Ok(rules_dir)
}

/// `on_store_error`, and `on_overload`, which follows it unless set: past
/// max_in_flight no count can be made in time, as when the store fails,
/// so the same answer unless the operator says otherwise.
fn failure_policies(v: &Values<'_>) -> Result<(FailurePolicy, FailurePolicy), SettingsError> {
    let on_store_error: FailurePolicy = v.get("on_store_error")?;
    let on_overload = v.opt("on_overload")?.unwrap_or(on_store_error);
    Ok((on_store_error, on_overload))
}

/// `usage_reports` and `count_refused`, which cannot be false together
/// with `usage_reports=true`.
fn counting(v: &Values<'_>) -> Result<(Option<bool>, bool), SettingsError> {
    let usage_reports = v.flag("usage_reports")?;
    let count_refused = v.bool("count_refused")?;
    if !count_refused && usage_reports == Some(true) {
        return Err(bad(
            v.src,
            "count_refused",
            "false",
            "cannot go with usage_reports=true: a limiter that records every reported cost does not give back what another descriptor refused",
        ));
    }
    Ok((usage_reports, count_refused))
}

/// The rate-limit response headers' names, each a valid HTTP header name
/// (read whether or not `rate_limit_headers` is on).
fn header_names(v: &Values<'_>) -> Result<HeaderNames, SettingsError> {
    let header = |name: &'static str| -> Result<String, SettingsError> {
        let h: String = v.get(name)?;
        let valid = !h.is_empty()
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_!#$%&'*+.^`|~".contains(&b));
        if valid {
            Ok(h)
        } else {
            Err(bad(v.src, name, &h, "not a valid HTTP header name"))
        }
    };
    Ok(HeaderNames {
        limit: header("header_limit")?,
        remaining: header("header_remaining")?,
        reset: header("header_reset")?,
    })
}

/// `store`: memory (the default), or a Redis URL of a known scheme.
fn store_setting(v: &Values<'_>) -> Result<StoreSetting, SettingsError> {
    Ok(match v.opt_text("store")?.as_deref().map(str::trim) {
        None | Some("memory") => StoreSetting::Memory,
        Some(url) => {
            let known = [
                "redis://",
                "rediss://",
                "redis-cluster://",
                "redis-sentinel://",
            ];
            if !known.iter().any(|p| url.starts_with(p)) {
                return Err(bad(
                    v.src,
                    "store",
                    url,
                    "expected memory or a URL starting with redis://, rediss://, redis-cluster:// or redis-sentinel://",
                ));
            }
            StoreSetting::Redis(url.to_string())
        }
    })
}

/// The bounds on one request's size and on store calls in flight.
fn request_limits(v: &Values<'_>) -> Result<RequestLimits, SettingsError> {
    Ok(RequestLimits {
        max_descriptors: v.get("max_descriptors")?,
        max_entries: v.get("max_entries")?,
        max_key_bytes: v.get("max_key_bytes")?,
        max_value_bytes: v.get("max_value_bytes")?,
        max_message_bytes: v.get("max_message_bytes")?,
        max_in_flight: v.get("max_in_flight")?,
    })
}

/// The quota service's settings: assignments' lifetime (whole seconds,
/// rounded up), burst, idle buckets abandoned, and its bounds.
fn rlqs_settings(v: &Values<'_>) -> Result<RlqsSettings, SettingsError> {
    Ok(RlqsSettings {
        assignment_ttl_secs: v.get::<u64>("rlqs.assignment_ttl_ms")?.div_ceil(1000),
        burst: v.get("rlqs.burst")?,
        abandon_after: v.every("rlqs.abandon_after_ms")?,
        max_buckets: v.get("rlqs.max_buckets")?,
        max_total_buckets: v.get("rlqs.max_total_buckets")?,
        max_streams: v.get("rlqs.max_streams")?,
    })
}

fn redis_settings(v: &Values<'_>, store: &StoreSetting) -> Result<RedisSettings, SettingsError> {
    let src = v.src;
    let key_prefix: String = v.get("redis.key_prefix")?;
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
    let tls_cert_file = v.file("redis.tls_cert_file")?;
    let tls_key_file = v.file("redis.tls_key_file")?;
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
            url: match store {
                StoreSetting::Redis(url) => url.clone(),
                StoreSetting::Memory => String::new(),
            },
            username: v.opt_text("redis.username")?,
            password: v.opt_text("redis.password")?,
            tls_ca_file: v.file("redis.tls_ca_file")?,
            tls_cert_file,
            tls_key_file,
            pool_size: v.get("redis.pool_size")?,
            batch_max: v.get("redis.batch_max")?,
            batch_lanes: v.get("redis.batch_lanes")?,
            connect_timeout: v.millis("redis.connect_timeout_ms")?,
            command_timeout: v.millis("redis.command_timeout_ms")?,
            key_prefix,
        },
        breaker: BreakerConfig {
            failure_threshold: v.get("redis.breaker_failures")?,
            cooldown: v.millis("redis.breaker_cooldown_ms")?,
        },
        coalesce: v.bool("redis.coalesce")?,
    };
    if let StoreSetting::Redis(url) = store
        && let Err(reason) = redis.connection.validate()
    {
        return Err(bad(
            src,
            "store",
            &crate::storage::redis::redact(url),
            reason,
        ));
    }
    Ok(redis)
}

/// A standard variable stands in for a setting left unset; its errors
/// name the variable.
fn foreign(v: &Values<'_>, name: &'static str, var: &str) -> Option<(String, String)> {
    if v.is_given(name) {
        return v.given.get(name).map(|x| (x.clone(), String::new()));
    }
    v.src.env.get(var).map(|x| (x.clone(), var.to_string()))
}

fn bad_foreign(src: &Sources, name: &str, var: &str, value: &str, reason: String) -> SettingsError {
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
}

fn log_settings(v: &Values<'_>) -> Result<(String, LogFormat), SettingsError> {
    let src = v.src;
    let (log, log_var) = match foreign(v, "log", "RUST_LOG") {
        Some(found) => found,
        None => (v.get("log")?, String::new()),
    };
    tracing_subscriber::EnvFilter::try_new(&log)
        .map_err(|e| bad_foreign(src, "log", &log_var, &log, e.to_string()))?;
    let format = match v.get::<String>("log_format")?.trim() {
        "json" => LogFormat::Json,
        _ => LogFormat::Text,
    };
    Ok((log, format))
}

fn otel_settings(v: &Values<'_>) -> Result<Option<OtelSettings>, SettingsError> {
    let src = v.src;
    // Checked even without an endpoint: a bad value is an error, not
    // ignored until the day an endpoint is set.
    let service_name = match foreign(v, "otel.service_name", "OTEL_SERVICE_NAME") {
        Some((name, _)) => name,
        None => v.get("otel.service_name")?,
    };
    let sampling_ratio = otel_sampling_ratio(v)?;
    let interval = match foreign(v, "otel.metrics_interval_ms", "OTEL_METRIC_EXPORT_INTERVAL") {
        None => v.get::<u64>("otel.metrics_interval_ms")?,
        Some((x, var)) => match table::check(kind_of("otel.metrics_interval_ms"), &x) {
            Ok(()) => x.trim().parse::<u64>().unwrap_or(60_000),
            Err(reason) => {
                return Err(bad_foreign(
                    src,
                    "otel.metrics_interval_ms",
                    &var,
                    &x,
                    reason,
                ));
            }
        },
    };
    if let Some(protocol) = src.env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        && protocol.trim() != "grpc"
    {
        return Err(bad_foreign(
            src,
            "otel.endpoint",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            protocol,
            "only grpc (OTLP/gRPC) is supported".into(),
        ));
    }
    v.text("otel.endpoint")?;
    Ok(
        match foreign(v, "otel.endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT") {
            None => None,
            Some((endpoint, _)) if endpoint.trim().is_empty() => None,
            Some((endpoint, var)) => {
                let endpoint = endpoint.trim().to_string();
                if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                    return Err(bad_foreign(
                        src,
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
        },
    )
}

/// `otel.sampling_ratio`, or what OTEL_TRACES_SAMPLER and
/// OTEL_TRACES_SAMPLER_ARG say instead.
fn otel_sampling_ratio(v: &Values<'_>) -> Result<f64, SettingsError> {
    let src = v.src;
    // OTEL_TRACES_SAMPLER names a ratio when it fixes one; a caller's
    // sampled flag is followed whichever it names.
    let fixed_ratio = match src.env.get("OTEL_TRACES_SAMPLER").map(|x| x.trim()) {
        None | Some("parentbased_traceidratio" | "traceidratio") => None,
        Some("always_on" | "parentbased_always_on") => Some(1.0),
        Some("always_off" | "parentbased_always_off") => Some(0.0),
        Some(other) => {
            return Err(bad_foreign(
                src,
                "otel.sampling_ratio",
                "OTEL_TRACES_SAMPLER",
                other,
                "expected parentbased_traceidratio, traceidratio, always_on, always_off or their parentbased_ forms".into(),
            ));
        }
    };
    let sampler_arg = match (v.is_given("otel.sampling_ratio"), fixed_ratio) {
        (false, Some(_)) => None,
        _ => foreign(v, "otel.sampling_ratio", "OTEL_TRACES_SAMPLER_ARG"),
    };
    Ok(match sampler_arg {
        None => fixed_ratio.map_or_else(|| v.get("otel.sampling_ratio"), Ok)?,
        Some((x, var)) => match table::check(kind_of("otel.sampling_ratio"), &x) {
            Ok(()) => x.trim().parse::<f64>().unwrap_or(1.0),
            Err(reason) => return Err(bad_foreign(src, "otel.sampling_ratio", &var, &x, reason)),
        },
    })
}

fn kind_of(name: &str) -> Kind {
    table::find(name).map_or(Kind::Text, |s| s.kind)
}

fn grpc_tls(v: &Values<'_>) -> Result<Option<GrpcTls>, SettingsError> {
    let src = v.src;
    let cert_file = v.file("grpc_tls.cert_file")?;
    let key_file = v.file("grpc_tls.key_file")?;
    let client_ca_file = v.file("grpc_tls.client_ca_file")?;
    let reload = v.every("grpc_tls.reload_ms")?;
    let tls = match (cert_file, key_file) {
        (Some(cert_file), Some(key_file)) => Some(GrpcTls {
            cert_file,
            key_file,
            client_ca_file,
            reload,
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
    if let Some(tls) = &tls
        && let Err(e) = crate::tls::server_config(tls)
    {
        return Err(bad(src, e.setting, &e.file.display().to_string(), e.reason));
    }
    Ok(tls)
}

/// `debug_addr`: an address, or empty or `off` for none.
/// `off` (or empty) serves gRPC only on the Unix socket, which must then
/// be set.
fn grpc_addr(v: &Values<'_>) -> Result<Option<std::net::SocketAddr>, SettingsError> {
    let uds = v.opt_text("grpc_uds")?;
    match v.opt_text("grpc_addr")?.as_deref().map(str::trim) {
        None | Some("off") if uds.is_some() => Ok(None),
        None | Some("off") => Err(bad(
            v.src,
            "grpc_addr",
            "off",
            "gRPC must be served somewhere: set grpc_uds to turn the TCP listener off",
        )),
        Some(addr) => addr
            .parse()
            .map(Some)
            .map_err(|e| bad(v.src, "grpc_addr", addr, e)),
    }
}

fn debug_addr(v: &Values<'_>) -> Result<Option<std::net::SocketAddr>, SettingsError> {
    match v.opt_text("debug_addr")?.as_deref().map(str::trim) {
        None | Some("off") => Ok(None),
        Some(addr) => addr
            .parse()
            .map(Some)
            .map_err(|e| bad(v.src, "debug_addr", addr, e)),
    }
}
