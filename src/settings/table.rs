//! Every setting, declared once: its name in the settings file, its default,
//! the values it takes, and what it means. The variable that sets it, the
//! list of known names (which tells a mistyped `TOLLGATE_*` variable from a
//! Kubernetes service link), the checks a given value meets and the
//! settings reference people read (`crate::reference`) are all derived from
//! [`SETTINGS`]; tests/reference.rs checks hand-written tables against it.

pub use super::kind::{Kind, Setting, check, parse_bool};

const fn s(
    name: &'static str,
    default: Option<&'static str>,
    kind: Kind,
    meaning: &'static str,
) -> Setting {
    Setting {
        name,
        default,
        kind,
        meaning,
    }
}

const POLICY: Kind = Kind::Choice(&["error", "allow", "deny"]);
const ALGORITHM: Kind = Kind::Choice(&[
    "fixed_window",
    "sliding_window_counter",
    "sliding_window_log",
    "token_bucket",
]);
const fn count(min: u64, max: u64) -> Kind {
    Kind::Count { min, max }
}

/// The one declaration of every setting, in the order people read them.
pub const SETTINGS: &[Setting] = &[
    s(
        "grpc_addr",
        Some("0.0.0.0:8081"),
        Kind::Text,
        "RLS gRPC listen address; `off`: gRPC only on `grpc_uds`",
    ),
    s(
        "grpc_uds",
        None,
        Kind::Text,
        "path of a Unix socket to serve gRPC on as well (RLS, health, reflection; plaintext even with `grpc_tls`), or only there with `grpc_addr=off`; a stale socket file there is replaced, a socket something listens on never",
    ),
    s(
        "grpc_max_connection_age_ms",
        Some("86400000"),
        Kind::Millis,
        "a gRPC connection older than this is asked to go away (HTTP/2 GOAWAY), so long-lived Envoy connections spread over replicas added since; each connection's age is moved by up to 10% either way, so connections opened together do not all go at once; 24 hours, as the reference service (whose gRPC server adds the same ±10%); 0 = never",
    ),
    s(
        "grpc_max_connection_age_grace_ms",
        Some("3600000"),
        Kind::Millis,
        "how long calls on a connection past its age may finish before it is closed (one hour, as the reference service); 0 = no limit",
    ),
    s(
        "http_addr",
        Some("0.0.0.0:8080"),
        Kind::Addr,
        "HTTP listen address: `/healthcheck`, `/metrics`, `POST /json`",
    ),
    s(
        "debug_addr",
        Some("127.0.0.1:6070"),
        Kind::Text,
        "debug HTTP listen address: `/rlconfig`, `/debug/hotkeys`, `/debug/rlqs`, `POST /reset`; loopback by default (reach it with `kubectl port-forward`); empty or `off`: not served",
    ),
    s(
        "debug_show_values",
        Some("false"),
        Kind::Bool,
        "show descriptor values in `/debug/hotkeys` as they are; otherwise as digests (`sha256:` and 16 hex digits), since they are client data (API keys, addresses, paths with tokens)",
    ),
    s(
        "http.header_read_timeout_ms",
        Some("10000"),
        Kind::AtLeast(1),
        "a request's headers must arrive within this, on the HTTP and debug listeners, or the connection is closed (slow clients)",
    ),
    s(
        "http.idle_timeout_ms",
        Some("60000"),
        Kind::AtLeast(1),
        "an HTTP connection with no request for this long is closed; longer than Prometheus's usual scrape interval, so scrapes keep their connection",
    ),
    s(
        "http.max_connections",
        Some("256"),
        count(1, 1 << 20),
        "open connections per HTTP listener (at most a quarter of the open-file limit); past it a new one is closed at once, so HTTP clients never take the file descriptors gRPC needs",
    ),
    s(
        "rules_dir",
        None,
        Kind::Text,
        "directory of rule files; unset: no rules",
    ),
    s(
        "rules_reload_ms",
        Some("2000"),
        Kind::Millis,
        "how often the rules directory is checked for changes (a change applies once two checks in a row see it); 0 = never",
    ),
    s(
        "default_algorithm",
        Some("sliding_window_counter"),
        ALGORITHM,
        "algorithm of rules that name none",
    ),
    s(
        "on_store_error",
        Some("error"),
        POLICY,
        "`error`, `allow` or `deny` when the store fails",
    ),
    s(
        "on_overload",
        None,
        POLICY,
        "`error` (`RESOURCE_EXHAUSTED`), `allow` or `deny` for a store call past `max_in_flight`; unset: as `on_store_error`. Answers the over-limit cache gives locally never wait for it",
    ),
    s(
        "usage_reports",
        None,
        Kind::Bool,
        "`usage_reports` of rules that do not say: `true` records every positive cost, also past the limit (costs reported after the response); `false` only admitted hits. Unset: rules that name no algorithm record every cost, as the reference does; rules that name one record admitted hits",
    ),
    s(
        "count_refused",
        Some("true"),
        Kind::Bool,
        "`count_refused` of rules that do not say: `false` charges a limiter only with requests answered OK (what a request another descriptor refuses charged is taken back); `true` charges every hit it admits, as the reference does. Not with `usage_reports=true`",
    ),
    s(
        "lease",
        Some("true"),
        Kind::Bool,
        "`lease` of rules that do not say: `true` decides the fixed-window, sliding-counter, sliding-log and token-bucket limiters that may be leased (plain windows, not sharded, not a list, no usage reports, counting refused requests) from quota each replica leases from the store, so most hits cost no store call; the limit is never passed. Other rules are decided in the store, and `/rlconfig` says why. `false`: every rule that does not say `lease: true` is decided in the store on every hit",
    ),
    s(
        "lease.max_limiters",
        Some("200000"),
        count(1, u64::MAX),
        "leased limiters one replica holds leases and demand estimates of (about 370 bytes each and 80 more while one holds reservations ahead, so some 90 MB at most at the default; `tollgate_lease_bytes` is what they take); past it a new limiter's hits go to the store as without leases (neither refused nor admitted unchecked), counted in `tollgate_lease_past_cap_hits_total`, until limiters idle for two minutes are forgotten",
    ),
    s(
        "shadow_mode",
        Some("false"),
        Kind::Bool,
        "count, but always answer OK overall",
    ),
    s(
        "rate_limit_headers",
        Some("false"),
        Kind::Bool,
        "add `RateLimit-*` response headers",
    ),
    s(
        "header_limit",
        Some("RateLimit-Limit"),
        Kind::Text,
        "name of the limit header",
    ),
    s(
        "header_remaining",
        Some("RateLimit-Remaining"),
        Kind::Text,
        "name of the remaining header",
    ),
    s(
        "header_reset",
        Some("RateLimit-Reset"),
        Kind::Text,
        "name of the reset header",
    ),
    s(
        "store",
        Some("memory"),
        Kind::Text,
        "`memory` or a Redis URL (`redis://`, `rediss://`, `redis-cluster://`, `redis-sentinel://`)",
    ),
    s(
        "redis.username",
        None,
        Kind::Text,
        "Redis user (overrides the URL's)",
    ),
    s(
        "redis.password",
        None,
        Kind::Text,
        "Redis password (overrides the URL's)",
    ),
    s(
        "redis.tls_ca_file",
        None,
        Kind::Text,
        "PEM CAs that sign the Redis servers' certificates",
    ),
    s(
        "redis.tls_cert_file",
        None,
        Kind::Text,
        "PEM client certificate for Redis",
    ),
    s(
        "redis.tls_key_file",
        None,
        Kind::Text,
        "PEM client key for Redis",
    ),
    s(
        "redis.pool_size",
        Some("4"),
        count(1, 256),
        "connections per node",
    ),
    s(
        "redis.batch_lanes",
        Some("1"),
        count(1, 256),
        "script batches in flight per node at most (a call sent alone counts as one); calls that come meanwhile queue and go out together when one ends: one lane makes the biggest batches (least CPU for tollgate and Redis under load), more lanes answer sooner at moderate load",
    ),
    s(
        "redis.batch_max",
        Some("64"),
        count(1, 1024),
        "script calls to one node sent as one `EVALSHA` at most; a batch is whatever queued while the node's earlier batches were in flight (`redis.batch_lanes`; no timer); 1: batching off, every call sent at once on its own",
    ),
    s(
        "redis.connect_timeout_ms",
        Some("1000"),
        Kind::Millis,
        "connect timeout",
    ),
    s(
        "redis.command_timeout_ms",
        Some("500"),
        Kind::AtLeast(1),
        "upper bound on one Redis call in milliseconds; the caller's own deadline (`grpc-timeout`) shortens it. 500 ms is about 2.5x the slowest answer of a healthy Redis on a busy 2-core machine (47-205 ms measured; 10 ms failed a third of the calls): see `docs/src/benchmarks/choices.md`",
    ),
    s(
        "redis.key_prefix",
        Some("tg2"),
        Kind::Text,
        "prefix of every key",
    ),
    s(
        "redis.breaker_failures",
        Some("5"),
        count(0, u32::MAX as u64),
        "consecutive failures that open the circuit",
    ),
    s(
        "redis.breaker_cooldown_ms",
        Some("500"),
        Kind::Millis,
        "how long it stays open before a probe",
    ),
    s(
        "redis.coalesce",
        Some("true"),
        Kind::Bool,
        "while a limiter's script call is in flight, queue further hits on it and decide them all in the next call",
    ),
    s(
        "rlqs.assignment_ttl_ms",
        Some("15000"),
        Kind::Count {
            min: 1_000,
            max: 3_600_000,
        },
        "how long a quota assignment (RLQS) holds in Envoy, rounded up to whole seconds (Envoy reads only the seconds): three of Envoy's 5 s report intervals, so one lost report does not drop a share; a stream that stops reporting gives its share back this long (plus 1 s) after its last report",
    ),
    s(
        "rlqs.burst",
        Some("1"),
        Kind::Number {
            min: 0.0,
            max: 100.0,
            open_min: true,
        },
        "`max_tokens` of a quota token bucket as a multiple of the stream's share of one window: 1 lets a stream spend its whole window's share at once, so one window can admit up to (1 + burst) times the limit in the worst case",
    ),
    s(
        "rlqs.abandon_after_ms",
        Some("60000"),
        Kind::Millis,
        "a quota bucket reported idle (nothing allowed or denied) for this long gets `abandon_action`, so Envoy stops reporting it; 0 = never",
    ),
    s(
        "rlqs.max_buckets",
        Some("10000"),
        count(1, 1 << 24),
        "buckets one quota stream may have answered at once; reports of more are skipped (and counted), the others answered",
    ),
    s(
        "rlqs.max_total_buckets",
        Some("100000"),
        count(1, 1 << 24),
        "buckets all quota streams of a replica may have answered at once; past it, reports of new buckets are skipped (and counted, as `too_many_buckets`), the buckets already answered still are",
    ),
    s(
        "rlqs.max_streams",
        Some("10000"),
        count(1, 1 << 20),
        "quota streams open on a replica at once; a new one past it is refused with `RESOURCE_EXHAUSTED` (counted in `tollgate_rlqs_streams_refused_total`): Envoy opens it again at its next report, through the load balancer",
    ),
    s(
        "deadline_margin_ms",
        Some("2"),
        Kind::Millis,
        "kept back from the caller's `grpc-timeout` for the answer's way back",
    ),
    s(
        "max_in_flight",
        Some("8192"),
        count(1, 1 << 20),
        "store calls waiting at once (decisions and quota leases); past it `on_overload` answers at once",
    ),
    s(
        "max_descriptors",
        Some("64"),
        count(1, 4096),
        "descriptors per request (`INVALID_ARGUMENT` past it)",
    ),
    s(
        "max_entries",
        Some("32"),
        count(1, 1024),
        "entries per descriptor",
    ),
    s(
        "max_key_bytes",
        Some("256"),
        count(1, 1 << 20),
        "bytes of one entry key",
    ),
    s(
        "max_value_bytes",
        Some("256"),
        count(1, 1 << 20),
        "longest entry value kept as it is in a limiter's identity; a longer one enters it as the SHA-256 of all its bytes. Never refused: values come from clients",
    ),
    s(
        "max_message_bytes",
        Some("4194304"),
        count(64, 64 << 20),
        "bytes of one decoded request (`RESOURCE_EXHAUSTED` past it); 4 MiB, gRPC's default, which Envoy's own limits stay under",
    ),
    s(
        "xds.server_url",
        None,
        Kind::Text,
        "an xDS management server, `host:port` (or `http://` / `https://host:port`): rules come from it over ADS (resources `ratelimit.config.ratelimit.v3.RateLimitConfig`) instead of `rules_dir`",
    ),
    s(
        "xds.node_id",
        Some("tollgate"),
        Kind::Text,
        "the node id tollgate gives the management server",
    ),
    s(
        "xds.node_cluster",
        None,
        Kind::Text,
        "the node cluster tollgate gives the management server",
    ),
    s(
        "xds.node_metadata",
        None,
        Kind::Text,
        "the node metadata, a JSON object (`{\"gateway\": \"eg\"}`)",
    ),
    s(
        "xds.headers",
        None,
        Kind::Text,
        "gRPC metadata sent on the xDS stream, a JSON object of strings (`{\"authorization\": \"Bearer ...\"}`)",
    ),
    s(
        "xds.tls",
        Some("false"),
        Kind::Bool,
        "connect to the management server over TLS (also when the URL is `https://`); the system's roots unless `xds.tls_ca_file`",
    ),
    s(
        "xds.tls_ca_file",
        None,
        Kind::Text,
        "PEM CA certificates the management server's certificate must chain to (implies TLS)",
    ),
    s(
        "xds.tls_cert_file",
        None,
        Kind::Text,
        "PEM client certificate for mutual TLS (with `xds.tls_key_file`)",
    ),
    s(
        "xds.tls_key_file",
        None,
        Kind::Text,
        "PEM private key of `xds.tls_cert_file`",
    ),
    s(
        "xds.tls_server_name",
        None,
        Kind::Text,
        "the name the management server's certificate must carry, when not the URL's host",
    ),
    s(
        "xds.retry_initial_ms",
        Some("500"),
        count(1, 3_600_000),
        "first wait before reconnecting to the management server; doubled after each failure, with jitter",
    ),
    s(
        "xds.retry_max_ms",
        Some("30000"),
        count(1, 3_600_000),
        "longest wait between reconnections to the management server",
    ),
    s(
        "xds.serve_without_config",
        Some("false"),
        Kind::Bool,
        "gRPC health and `/healthcheck` say ready before the first rules arrive from the management server (calls are answered meanwhile either way, without limits)",
    ),
    s(
        "merge_domain_config",
        Some("false"),
        Kind::Bool,
        "rule files naming the same domain are merged into it (a descriptor both define is still an error); `false`: a domain defined twice is an error",
    ),
    s(
        "response_dynamic_metadata",
        Some("false"),
        Kind::Bool,
        "answers carry `dynamic_metadata`: the domain, the descriptors' entries and the merged `metadata` of the rules that answered OK",
    ),
    s(
        "max_log_limit",
        Some("10000"),
        Kind::AtLeast(1),
        "largest `requests_per_unit` a `sliding_window_log` limit may have",
    ),
    s(
        "memory.max_limiters",
        Some("1000000"),
        count(1, u64::MAX),
        "limiters the embedded store holds; least recently used evicted past it",
    ),
    s(
        "memory.max_bytes",
        Some("134217728"),
        count(1 << 20, u64::MAX),
        "estimated bytes the embedded store's limiters take (identities, state, log members, map overhead); least recently used evicted past it. 128 MiB, half the Helm chart's 256 MiB memory limit: the rest is for the runtime, connections, the over-limit cache, the lease layer (`lease.max_limiters`, some 90 MB at most by default, reached only by 200,000 limiters hit within two minutes) and the allocator's slack",
    ),
    s(
        "over_limit_cache.enabled",
        Some("true"),
        Kind::Bool,
        "once the store refuses a limiter until a reset, answer it locally until then, without the store",
    ),
    s(
        "over_limit_cache.max_entries",
        Some("100000"),
        count(1, 100_000_000),
        "limiters the over-limit cache holds; least recently used evicted past it",
    ),
    s(
        "grpc_tls.cert_file",
        None,
        Kind::Text,
        "PEM certificate chain: serve gRPC over TLS (with `grpc_tls.key_file`)",
    ),
    s(
        "grpc_tls.key_file",
        None,
        Kind::Text,
        "PEM private key of that certificate",
    ),
    s(
        "grpc_tls.client_ca_file",
        None,
        Kind::Text,
        "PEM CAs: require and verify client certificates (mTLS)",
    ),
    s(
        "grpc_tls.reload_ms",
        Some("5000"),
        Kind::Millis,
        "how often the TLS files are checked for changes; 0 = never",
    ),
    s(
        "startup_wait_ms",
        Some("5000"),
        Kind::Millis,
        "at startup, gRPC answers once the store is ready or after this long (then `on_store_error` applies to a store still down); 0 = at once. Five connect timeouts: enough for a healthy Redis on a busy machine",
    ),
    s(
        "shutdown_drain_ms",
        Some("5000"),
        Kind::Millis,
        "on SIGTERM: health says NOT_SERVING and calls are still answered this long",
    ),
    s(
        "shutdown_grace_ms",
        Some("5000"),
        Kind::Millis,
        "then: listeners closed, in-flight calls get this long to finish",
    ),
    s(
        "log",
        Some("info"),
        Kind::Text,
        "log filter (tracing `EnvFilter` syntax); `RUST_LOG` stands in when unset",
    ),
    s(
        "log_format",
        Some("text"),
        Kind::Choice(&["text", "json"]),
        "`text` or `json` (one object per line)",
    ),
    s(
        "metrics.enabled",
        Some("true"),
        Kind::Bool,
        "serve `GET /metrics` (Prometheus text) on the HTTP address",
    ),
    s(
        "metrics.near_limit_ratio",
        Some("0.8"),
        Kind::Number {
            min: 0.0,
            max: 1.0,
            open_min: true,
        },
        "share of a limit past which hits count as `near_limit`",
    ),
    s(
        "metrics.detailed_max_series",
        Some("100"),
        count(1, 10_000),
        "distinct descriptor values a `detailed_metric` or `value_to_metric` rule exports; the rest share the `_overflow` series",
    ),
    s(
        "otel.endpoint",
        None,
        Kind::Text,
        "OTLP/gRPC collector (`http://host:4317`): traces and metrics are exported there; unset = off. `OTEL_EXPORTER_OTLP_ENDPOINT` stands in when unset",
    ),
    s(
        "otel.service_name",
        Some("tollgate"),
        Kind::Text,
        "`service.name` of spans and metrics; `OTEL_SERVICE_NAME` stands in when unset",
    ),
    s(
        "otel.sampling_ratio",
        Some("1.0"),
        Kind::Number {
            min: 0.0,
            max: 1.0,
            open_min: false,
        },
        "share of new traces sampled (0 to 1); a caller's sampled flag is followed. `OTEL_TRACES_SAMPLER_ARG` stands in when unset; `OTEL_TRACES_SAMPLER=always_on`/`always_off` mean 1/0",
    ),
    s(
        "otel.metrics_interval_ms",
        Some("60000"),
        Kind::AtLeast(10),
        "how often metrics are pushed over OTLP, in milliseconds; `OTEL_METRIC_EXPORT_INTERVAL` stands in when unset",
    ),
];

/// The variable prefix.
pub const ENV_PREFIX: &str = "TOLLGATE_";

pub use super::flags::{FLAGS, flag};

/// The variable that sets `name`: `redis.pool_size` -> `TOLLGATE_REDIS__POOL_SIZE`.
pub fn env_name(name: &str) -> String {
    format!("{ENV_PREFIX}{}", name.replace('.', "__").to_uppercase())
}

/// The declaration of `name`, if it is a setting.
pub fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}
