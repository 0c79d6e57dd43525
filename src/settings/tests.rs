//! The settings: names, variables, sources, errors, Kubernetes service
//! links, the standard OpenTelemetry variables, and the tables.

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
    assert_eq!(s.grpc_addr.unwrap().port(), 8081);
    assert_eq!(s.http_addr.port(), 8080);
    assert_eq!(s.default_algorithm, Algorithm::SlidingWindowCounter);
    assert_eq!(s.store, StoreSetting::Memory);
    assert_eq!(
        s.redis.connection.command_timeout,
        Duration::from_millis(500)
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
    assert_eq!(s.grpc_addr, Some("127.0.0.1:9001".parse().unwrap()));
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

/// `count_refused=false` charges a limiter only with requests answered
/// OK; usage reports are recorded whatever the answer: not both.
#[test]
fn count_refused_false_excludes_usage_reports() {
    let s = Settings::load(&env(&[("TOLLGATE_COUNT_REFUSED", "false")])).unwrap();
    assert!(!s.count_refused);
    assert!(Settings::load(&env(&[])).unwrap().count_refused);
    let err = Settings::load(&env(&[
        ("TOLLGATE_COUNT_REFUSED", "false"),
        ("TOLLGATE_USAGE_REPORTS", "true"),
    ]))
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("count_refused=false is not valid: cannot go with usage_reports=true"),
        "{err}"
    );
    let err = Settings::load(&env(&[("TOLLGATE_COUNT_REFUSED", "no way")]))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("count_refused=no way is not valid"),
        "{err}"
    );
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
    assert_eq!(s.grpc_addr, Some("127.0.0.1:9999".parse().unwrap()));
    assert_eq!(
        s.warnings,
        [
            "TOLLGATE_GRPC_ADR is not a tollgate setting; ignored (did you mean TOLLGATE_GRPC_ADDR?)",
            "TOLLGATE_REDIS__POOLSIZE is not a tollgate setting; ignored (did you mean TOLLGATE_REDIS__POOL_SIZE?)",
        ]
    );
}

#[test]
fn strays_name_the_nearest_setting() {
    let warning = |var: &str| {
        let s = Settings::load(&env(&[(var, "1")])).unwrap();
        assert_eq!(s.warnings.len(), 1, "{var}: {:?}", s.warnings);
        s.warnings[0].clone()
    };
    for (stray, near) in [
        ("TOLLGATE_GRPC_PORTT", "TOLLGATE_GRPC_ADDR"),
        ("TOLLGATE_REDIS_POOL_SIZE", "TOLLGATE_REDIS__POOL_SIZE"),
        ("TOLLGATE_STOR", "TOLLGATE_STORE"),
        ("TOLLGATE_MAX_LOG_LIMT", "TOLLGATE_MAX_LOG_LIMIT"),
        (
            "TOLLGATE_OVER_LIMIT_CACHE_ENABLED",
            "TOLLGATE_OVER_LIMIT_CACHE__ENABLED",
        ),
    ] {
        assert_eq!(
            warning(stray),
            format!("{stray} is not a tollgate setting; ignored (did you mean {near}?)")
        );
    }
    // Nothing near: no guess.
    assert_eq!(
        warning("TOLLGATE_COMPLETELY_UNRELATED_THING"),
        "TOLLGATE_COMPLETELY_UNRELATED_THING is not a tollgate setting; ignored"
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
    for key in keys() {
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

/// Each declared setting is read when the settings are built: none is
/// declared and forgotten, and every default passes its own check.
#[test]
fn every_declared_setting_is_read_and_its_default_valid() {
    let (_, read) = load(&Sources::default()).unwrap();
    for setting in table::SETTINGS {
        assert!(
            read.contains(setting.name),
            "{} is never read",
            setting.name
        );
        if let Some(d) = setting.default {
            assert_eq!(table::check(setting.kind, d), Ok(()), "{}", setting.name);
        }
    }
    let mut names: Vec<&str> = keys().collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), table::SETTINGS.len(), "a name declared twice");
}

/// The engine's and the store's own defaults are the declared ones.
#[test]
fn declared_defaults_match_the_code_that_uses_them() {
    let default = |name: &str| table::find(name).unwrap().default.unwrap();
    assert_eq!(
        default("max_value_bytes"),
        crate::storage::keys::DEFAULT_MAX_VALUE_BYTES.to_string()
    );
    assert_eq!(
        default("redis.key_prefix"),
        crate::storage::keys::DEFAULT_PREFIX
    );
    assert_eq!(
        default("over_limit_cache.max_entries"),
        CacheConfig::default().max_entries.to_string()
    );
}

#[test]
fn an_error_names_the_flag_as_the_command_line_spells_it() {
    let mut src = Sources::default();
    src.overrides
        .push(("rules_dir".into(), "/no/such/rules/dir".into()));
    let err = Settings::load(&src).unwrap_err().to_string();
    assert!(
        err.starts_with("rules_dir=/no/such/rules/dir is not valid")
            && err.ends_with("(set by flag --rules)"),
        "{err}"
    );
}
