//! What tollgate shows of itself, end to end: `/metrics` after scripted
//! calls (exact per-rule counts, bounded series), spans and metrics received
//! by an OTLP collector running in this test, and `POST /json`.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use support::tollgate::{Tollgate, descriptor};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SHOP: &str = r#"
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window}
  - key: path
    value: /login
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: fixed_window}
  - key: ban
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 1000, algorithm: fixed_window}
"#;

fn req(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![descriptor(entries)],
        hits_addend: 0,
    }
}

/// One HTTP/1.1 exchange over a raw socket: (status, headers and body).
async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out))
        .await
        .expect("an HTTP answer within 10 s")
        .unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {out:?}"));
    (status, out)
}

fn body(response: &str) -> &str {
    response.split("\r\n\r\n").nth(1).unwrap_or("")
}

/// The samples of a Prometheus text page: `name{labels}` -> value, labels
/// sorted by name.
fn samples(page: &str) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
    let mut out = BTreeMap::new();
    for line in page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let mut map = BTreeMap::new();
        // Label values here never hold `",`.
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap();
            map.insert(k.to_string(), v.trim_matches('"').to_string());
        }
        out.insert((name.to_string(), map), value.parse().unwrap());
    }
    out
}

async fn scrape(t: &Tollgate) -> String {
    let (status, response) = http(t.http, "GET", "/metrics", "", "").await;
    assert_eq!(status, 200, "{response}");
    body(&response).to_string()
}

/// The value of the one series of `name` whose labels include `labels`.
fn value(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = samples(page)
        .into_iter()
        .filter(|((n, l), _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        found.len(),
        1,
        "{name} {labels:?}: expected one series, found {found:?} in:\n{page}"
    );
    found[0]
}

fn series(page: &str, name: &str) -> usize {
    samples(page).keys().filter(|(n, _)| n == name).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_each_rule_exactly() {
    let t = Tollgate::start(&[("shop.yaml", SHOP)], &[]).await;
    let mut c = t.client().await;
    let mut codes = Vec::new();
    for _ in 0..12 {
        let r = c.should_rate_limit(req("shop", &[("user", "alice")])).await;
        codes.push(r.unwrap().into_inner().overall_code);
    }
    let ok = Code::Ok as i32;
    let over = Code::OverLimit as i32;
    assert_eq!(codes, [[ok; 10].as_slice(), &[over; 2]].concat());
    for _ in 0..3 {
        // Shadow mode: over on the third, answered OK.
        let r = c
            .should_rate_limit(req("shop", &[("path", "/login")]))
            .await;
        assert_eq!(r.unwrap().into_inner().overall_code, ok);
    }
    let r = c.should_rate_limit(req("shop", &[("ban", "x")])).await;
    assert_eq!(r.unwrap().into_inner().overall_code, over);
    for _ in 0..2 {
        let r = c.should_rate_limit(req("nowhere", &[("user", "a")])).await;
        assert_eq!(r.unwrap().into_inner().overall_code, ok);
    }
    let invalid = c.should_rate_limit(req("", &[("user", "a")])).await;
    assert_eq!(invalid.unwrap_err().code(), tonic::Code::InvalidArgument);

    let page = scrape(&t).await;
    let rule = |name: &str, rule: &str| value(&page, name, &[("domain", "shop"), ("rule", rule)]);
    // Limit 10, near mark 8: hits 9 and 10 are near, 11 and 12 over.
    assert_eq!(rule("tollgate_rule_hits_total", "user"), 12.0);
    assert_eq!(rule("tollgate_rule_within_limit_total", "user"), 10.0);
    assert_eq!(rule("tollgate_rule_near_limit_total", "user"), 2.0);
    assert_eq!(rule("tollgate_rule_over_limit_total", "user"), 2.0);
    assert_eq!(rule("tollgate_rule_shadow_over_limit_total", "user"), 0.0);
    // Limit 2, near mark 1: the second hit is near, the third over (shadow).
    assert_eq!(rule("tollgate_rule_hits_total", "path_/login"), 3.0);
    assert_eq!(rule("tollgate_rule_within_limit_total", "path_/login"), 2.0);
    assert_eq!(rule("tollgate_rule_near_limit_total", "path_/login"), 1.0);
    assert_eq!(rule("tollgate_rule_over_limit_total", "path_/login"), 1.0);
    assert_eq!(
        rule("tollgate_rule_shadow_over_limit_total", "path_/login"),
        1.0
    );
    assert_eq!(rule("tollgate_rule_hits_total", "ban"), 1.0);
    assert_eq!(rule("tollgate_rule_over_limit_total", "ban"), 1.0);
    assert_eq!(rule("tollgate_rule_hits_total", "tenant"), 0.0);

    let requests = |code: &str, grpc: &str| {
        value(
            &page,
            "tollgate_request_duration_seconds_count",
            &[("code", code), ("grpc_status", grpc)],
        )
    };
    assert_eq!(requests("ok", "OK"), 15.0);
    assert_eq!(requests("over_limit", "OK"), 3.0);
    assert_eq!(requests("error", "INVALID_ARGUMENT"), 1.0);
    assert_eq!(
        value(&page, "tollgate_request_descriptors_count", &[]),
        19.0
    );
    assert_eq!(
        value(
            &page,
            "tollgate_requests_refused_total",
            &[("reason", "invalid")]
        ),
        1.0
    );
    // The ban and the unknown domain never reach the store.
    assert_eq!(
        value(
            &page,
            "tollgate_store_duration_seconds_count",
            &[("backend", "memory"), ("node", "sole"), ("outcome", "ok")]
        ),
        15.0
    );
    assert_eq!(value(&page, "tollgate_rules_loaded", &[]), 4.0);
    assert_eq!(value(&page, "tollgate_store_limiters", &[]), 2.0);
    assert_eq!(value(&page, "tollgate_store_evictions_total", &[]), 0.0);
    assert!(value(&page, "process_resident_memory_bytes", &[]) > 0.0);
    assert!(value(&page, "process_open_fds", &[]) > 0.0);

    // A reload that keeps the rule keeps its counts; a refused one is counted.
    let path = t.rules.path().join("shop.yaml");
    std::fs::write(
        &path,
        format!("{SHOP}\n  - key: extra\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"),
    )
    .unwrap();
    let page = eventually(&t, |p| value(p, "tollgate_rules_loaded", &[]) == 5.0).await;
    assert_eq!(
        value(
            &page,
            "tollgate_rules_reloads_total",
            &[("result", "success")]
        ),
        1.0
    );
    assert_eq!(
        value(&page, "tollgate_rule_hits_total", &[("rule", "user")]),
        12.0
    );
    std::fs::write(&path, "domain: shop\ndescriptors: [oops\n").unwrap();
    let page = eventually(&t, |p| {
        value(p, "tollgate_rules_reloads_total", &[("result", "failure")]) == 1.0
    })
    .await;
    assert_eq!(value(&page, "tollgate_rules_loaded", &[]), 5.0);
    t.stop().await;
}

/// A hit decided from a lease reaches no store: the lease metrics count
/// it, and the store's timer does not (it times the calls that asked for
/// leases, each once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_from_a_lease_is_counted_but_not_timed_as_a_store_call() {
    const LEASED: &str = r#"
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 100000, algorithm: fixed_window, lease: true}
"#;
    let t = Tollgate::start(&[("api.yaml", LEASED)], &[]).await;
    let mut c = t.client().await;
    for _ in 0..60 {
        let r = c.should_rate_limit(req("api", &[("tenant", "t1")])).await;
        assert_eq!(r.unwrap().into_inner().overall_code, Code::Ok as i32);
    }
    let page = scrape(&t).await;
    let local = value(&page, "tollgate_lease_local_decisions_total", &[]);
    let timed = value(
        &page,
        "tollgate_store_duration_seconds_count",
        &[("backend", "memory"), ("node", "sole"), ("outcome", "ok")],
    );
    assert!(
        value(&page, "tollgate_lease_taken_total", &[]) >= 1.0,
        "{page}"
    );
    assert!(local >= 30.0, "most hits decided from leases: {local}");
    assert_eq!(local + timed, 60.0, "every hit either local or timed once");
}

/// Scrapes until `done` holds (10 s at most).
async fn eventually(t: &Tollgate, done: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let page = scrape(t).await;
        if done(&page) {
            return page;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened:\n{page}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_values_never_add_series_and_detailed_rules_are_capped() {
    let t = Tollgate::start(
        &[("shop.yaml", SHOP)],
        &[("metrics.detailed_max_series", "5")],
    )
    .await;
    let mut c = t.client().await;
    let r = c.should_rate_limit(req("shop", &[("user", "first")])).await;
    assert_eq!(r.unwrap().into_inner().overall_code, Code::Ok as i32);
    let before = scrape(&t).await;

    // 10,000 distinct users, 50 descriptors per call.
    for batch in 0..200 {
        let descriptors = (0..50)
            .map(|i| descriptor(&[("user", &format!("u{}", batch * 50 + i))]))
            .collect();
        let r = c
            .should_rate_limit(RateLimitRequest {
                domain: "shop".into(),
                descriptors,
                hits_addend: 0,
            })
            .await;
        assert_eq!(r.unwrap().into_inner().overall_code, Code::Ok as i32);
    }
    let after = scrape(&t).await;
    assert_eq!(
        value(&after, "tollgate_rule_hits_total", &[("rule", "user")]),
        10_001.0
    );
    let names = |page: &str| -> Vec<(String, BTreeMap<String, String>)> {
        samples(page).into_keys().collect()
    };
    assert_eq!(names(&before), names(&after), "the series changed");

    // A detailed rule: five values get their own series, the rest share one.
    for i in 0..100 {
        let r = c
            .should_rate_limit(req("shop", &[("tenant", &format!("t{i}"))]))
            .await;
        assert_eq!(r.unwrap().into_inner().overall_code, Code::Ok as i32);
    }
    let page = scrape(&t).await;
    assert_eq!(series(&page, "tollgate_rule_detailed_hits_total"), 6);
    assert_eq!(
        value(
            &page,
            "tollgate_rule_detailed_hits_total",
            &[("rule", "tenant"), ("descriptor", "_overflow")]
        ),
        95.0
    );
    assert_eq!(
        value(
            &page,
            "tollgate_rule_detailed_hits_total",
            &[("rule", "tenant"), ("descriptor", "tenant_t0")]
        ),
        1.0
    );
    assert_eq!(
        value(&page, "tollgate_rule_hits_total", &[("rule", "tenant")]),
        100.0
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_round_trip_and_rlconfig_as_json() {
    let t = Tollgate::start(&[("shop.yaml", SHOP)], &[]).await;
    let call = |user: &'static str| {
        let body = format!(
            r#"{{"domain":"shop","descriptors":[{{"entries":[{{"key":"path","value":"/x"}}]}},{{"entries":[{{"key":"user","value":"{user}"}}]}}],"hitsAddend":6}}"#
        );
        async move {
            http(
                t.http,
                "POST",
                "/json",
                "Content-Type: application/json\r\n",
                &body,
            )
            .await
        }
    };
    let (status, response) = call("bob").await;
    assert_eq!(status, 200, "{response}");
    let json: serde_json::Value = serde_json::from_str(body(&response)).unwrap();
    assert_eq!(json["overallCode"], "OK");
    assert_eq!(json["statuses"][0], serde_json::json!({"code": "OK"}));
    assert_eq!(json["statuses"][1]["code"], "OK");
    assert_eq!(
        json["statuses"][1]["currentLimit"],
        serde_json::json!({"requestsPerUnit": 10, "unit": "HOUR"})
    );
    assert_eq!(json["statuses"][1]["limitRemaining"], 4);
    assert!(
        json["statuses"][1]["durationUntilReset"]
            .as_str()
            .is_some_and(|d| d.ends_with('s'))
    );

    let (status, response) = call("bob").await;
    assert_eq!(status, 429, "{response}");
    let json: serde_json::Value = serde_json::from_str(body(&response)).unwrap();
    assert_eq!(json["overallCode"], "OVER_LIMIT");
    assert_eq!(json["statuses"][1]["code"], "OVER_LIMIT");

    for (bad, reason) in [
        ("{", "invalid JSON"),
        (
            r#"{"domain":"shop","descriptors":[]}"#,
            "descriptors must not be empty",
        ),
        (
            r#"{"domain":"shop","descriptor":[]}"#,
            "unknown field `descriptor`",
        ),
    ] {
        let (status, response) = http(t.http, "POST", "/json", "", bad).await;
        assert_eq!(status, 400, "{bad}: {response}");
        let json: serde_json::Value = serde_json::from_str(body(&response)).unwrap();
        assert_eq!(json["grpcStatus"], "INVALID_ARGUMENT");
        assert!(
            json["error"].as_str().unwrap().contains(reason),
            "{bad}: {json}"
        );
    }

    let (status, response) = http(t.debug, "GET", "/rlconfig?format=json", "", "").await;
    assert_eq!(status, 200);
    let by_query: serde_json::Value = serde_json::from_str(body(&response)).unwrap();
    let (_, response) = http(
        t.debug,
        "GET",
        "/rlconfig",
        "Accept: application/json\r\n",
        "",
    )
    .await;
    let by_accept: serde_json::Value = serde_json::from_str(body(&response)).unwrap();
    assert_eq!(by_query, by_accept);
    let rules = by_query["rules"].as_array().unwrap();
    let rules: Vec<&str> = rules.iter().map(|r| r["rule"].as_str().unwrap()).collect();
    assert_eq!(rules, ["ban", "path_/login", "tenant", "user"]);
    assert_eq!(by_query["rules"][1]["shadowMode"], true);
    assert_eq!(by_query["rules"][3]["requestsPerUnit"], 10);
    assert_eq!(by_query["rules"][3]["algorithm"], "fixed_window");
    // Plain text stays the default.
    let (_, response) = http(t.debug, "GET", "/rlconfig", "", "").await;
    assert!(
        body(&response).contains("shop.user: 10/hour fixed_window"),
        "{response}"
    );
    t.stop().await;
}

/// An OTLP collector: keeps every span and metrics export it receives.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans = request
            .into_inner()
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        self.spans.lock().unwrap().extend(spans);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.metrics.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

impl Collector {
    /// The last exported value of a sum metric for the point with `rule`.
    fn rule_hits(&self, rule: &str) -> Option<i64> {
        use opentelemetry_proto::tonic::common::v1::any_value::Value;
        use opentelemetry_proto::tonic::metrics::v1::metric::Data;
        use opentelemetry_proto::tonic::metrics::v1::number_data_point;
        let exports = self.metrics.lock().unwrap();
        let mut last = None;
        for m in exports
            .iter()
            .flat_map(|e| &e.resource_metrics)
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .filter(|m| m.name == "tollgate.rule.hits")
        {
            let Some(Data::Sum(sum)) = &m.data else {
                continue;
            };
            for p in &sum.data_points {
                let is_rule = p.attributes.iter().any(|a| {
                    a.key == "rule"
                        && matches!(
                            a.value.as_ref().and_then(|v| v.value.as_ref()),
                            Some(Value::StringValue(s)) if s == rule
                        )
                });
                if is_rule && let Some(number_data_point::Value::AsInt(n)) = p.value {
                    last = Some(n);
                }
            }
        }
        last
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_follow_the_callers_context_and_metrics_reach_the_collector() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_collector, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .add_service(MetricsServiceServer::new(collector.clone()))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    let endpoint = format!("http://{addr}");
    // Sampling 0: only a caller's sampled context makes a trace.
    let t = Tollgate::start(
        &[("shop.yaml", SHOP)],
        &[
            ("otel.endpoint", endpoint.as_str()),
            ("otel.sampling_ratio", "0"),
            ("otel.metrics_interval_ms", "200"),
        ],
    )
    .await;
    let mut c = t.client().await;
    let calls: [(&str, &[(&str, &str)]); 4] = [
        (
            "0af7651916cd43dd8448eb211c80319c",
            &[(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            )],
        ),
        (
            "80f198ee56343ba864fe8b2a57d3eff7",
            &[("b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1")],
        ),
        (
            "463ac35c9f6413ad48485a3953bb6124",
            &[
                ("x-b3-traceid", "463ac35c9f6413ad48485a3953bb6124"),
                ("x-b3-spanid", "0020000000000001"),
                ("x-b3-sampled", "1"),
            ],
        ),
        // No context at sampling 0: no trace.
        ("", &[]),
    ];
    for (_, headers) in calls {
        let mut r = tonic::Request::new(req("shop", &[("user", "traced")]));
        for (k, v) in headers {
            r.metadata_mut().insert(*k, v.parse().unwrap());
        }
        let answer = c.should_rate_limit(r).await.unwrap().into_inner();
        assert_eq!(answer.overall_code, Code::Ok as i32);
    }

    // The periodic reader pushes the rule counts.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while collector.rule_hits("user") != Some(4) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no metric point with 4 hits reached the collector (last: {:?})",
            collector.rule_hits("user")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Stopping flushes the spans.
    t.stop().await;
    let spans = collector.spans.lock().unwrap().clone();
    let parents = ["b7ad6b7169203331", "e457b5a2e4d86bd1", "0020000000000001"];
    for ((trace, _), parent) in calls.iter().zip(parents) {
        let in_trace: Vec<&Span> = spans
            .iter()
            .filter(|s| hex(&s.trace_id) == *trace)
            .collect();
        let server = in_trace
            .iter()
            .find(|s| s.name == "ShouldRateLimit")
            .unwrap_or_else(|| panic!("no ShouldRateLimit span in trace {trace}: {spans:?}"));
        assert_eq!(hex(&server.parent_span_id), parent, "trace {trace}");
        let store = in_trace
            .iter()
            .find(|s| s.name == "store.hit")
            .unwrap_or_else(|| panic!("no store.hit span in trace {trace}"));
        assert_eq!(store.parent_span_id, server.span_id, "trace {trace}");
        let attr = |s: &Span, key: &str| {
            s.attributes
                .iter()
                .find(|a| a.key == key)
                .and_then(|a| a.value.clone())
                .and_then(|v| v.value)
        };
        use opentelemetry_proto::tonic::common::v1::any_value::Value;
        assert_eq!(
            attr(server, "tollgate.domain"),
            Some(Value::StringValue("shop".into()))
        );
        assert_eq!(
            attr(server, "tollgate.overall_code"),
            Some(Value::StringValue("ok".into()))
        );
        assert_eq!(
            attr(store, "tollgate.algorithm"),
            Some(Value::StringValue("fixed_window".into()))
        );
        assert_eq!(
            attr(store, "tollgate.store.outcome"),
            Some(Value::StringValue("ok".into()))
        );
    }
    // Three traced calls, two spans each; the untraced call made none.
    assert_eq!(spans.len(), 6, "{spans:?}");
    let _ = stop_collector.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_metrics_on_redis_through_an_outage() {
    support::redis::require_redis();
    let mut redis = support::redis::RedisServer::start();
    let url = redis.url();
    let t = Tollgate::start(
        &[("shop.yaml", SHOP)],
        &[
            ("store", url.as_str()),
            ("redis.command_timeout_ms", "200"),
            ("redis.breaker_failures", "3"),
            ("redis.breaker_cooldown_ms", "60000"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    let mut c = t.client().await;
    for _ in 0..5 {
        let r = c.should_rate_limit(req("shop", &[("user", "r")])).await;
        assert_eq!(r.unwrap().into_inner().overall_code, Code::Ok as i32);
    }
    let page = scrape(&t).await;
    let node = format!("127.0.0.1:{}", redis.port());
    assert_eq!(
        value(
            &page,
            "tollgate_store_duration_seconds_count",
            &[("backend", "redis"), ("node", &node), ("outcome", "ok")]
        ),
        5.0
    );
    assert!(
        value(
            &page,
            "tollgate_store_script_loads_total",
            &[("backend", "redis")]
        ) >= 1.0
    );
    assert_eq!(series(&page, "tollgate_store_errors_total"), 0, "{page}");

    redis.stop();
    for _ in 0..10 {
        let r = c.should_rate_limit(req("shop", &[("user", "r")])).await;
        assert_eq!(r.unwrap_err().code(), tonic::Code::Unavailable);
    }
    let page = scrape(&t).await;
    // Every failed call is counted once, under its node and kind; after
    // three failures the circuit refuses the rest without trying Redis.
    let errors: f64 = samples(&page)
        .into_iter()
        .filter(|((n, l), _)| {
            n == "tollgate_store_errors_total"
                && l.get("backend").map(String::as_str) == Some("redis")
                && l.get("node") == Some(&node)
        })
        .map(|(_, v)| v)
        .sum();
    assert_eq!(errors, 10.0, "{page}");
    assert!(
        value(
            &page,
            "tollgate_store_errors_total",
            &[("node", &node), ("kind", "circuit_open")]
        ) >= 1.0
    );
    assert_eq!(
        value(
            &page,
            "tollgate_store_circuit_open",
            &[("backend", "redis"), ("node", &node)]
        ),
        1.0
    );
    assert_eq!(
        value(
            &page,
            "tollgate_store_failures_answered_total",
            &[("policy", "error")]
        ),
        10.0
    );
    assert_eq!(
        value(
            &page,
            "tollgate_request_duration_seconds_count",
            &[("code", "error"), ("grpc_status", "UNAVAILABLE")]
        ),
        10.0
    );
    // Rule counts hold decided hits only.
    assert_eq!(
        value(&page, "tollgate_rule_hits_total", &[("rule", "user")]),
        5.0
    );
    t.stop().await;
}

/// Log output kept in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Captured {
    type Writer = Captured;

    fn make_writer(&'w self) -> Captured {
        self.clone()
    }
}

/// The circuit opens during a traced call: that line names the call's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_logged_inside_a_traced_call_carries_its_trace_id() {
    support::redis::require_redis();
    let captured = Captured::default();
    // The one test in this binary that installs a logger; other tests'
    // lines land here too and are told apart by message and trace id.
    tracing::subscriber::set_global_default(tollgate::observe::logger(
        tollgate::settings::LogFormat::Json,
        "info",
        captured.clone(),
        false,
    ))
    .unwrap();
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .add_service(MetricsServiceServer::new(collector.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut redis = support::redis::RedisServer::start();
    let url = redis.url();
    let t = Tollgate::start(
        &[("shop.yaml", SHOP)],
        &[
            ("store", url.as_str()),
            ("redis.command_timeout_ms", "200"),
            ("redis.breaker_failures", "1"),
            ("redis.breaker_cooldown_ms", "60000"),
            ("otel.endpoint", endpoint.as_str()),
            ("otel.sampling_ratio", "0"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    redis.stop();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut r = tonic::Request::new(req("shop", &[("user", "logged")]));
    r.metadata_mut().insert(
        "traceparent",
        format!("00-{trace}-00f067aa0ba902b7-01").parse().unwrap(),
    );
    let status = t.client().await.should_rate_limit(r).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    t.stop().await;
    server.abort();

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let opened: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["message"] == "store circuit opened")
        .filter(|v| {
            v["fields"]["node"]
                .as_str()
                .is_some_and(|n| n.ends_with(&format!(":{}", redis.port())))
        })
        .collect();
    assert_eq!(
        opened.len(),
        1,
        "the call was answered {status:?}; logged:\n{text}"
    );
    assert_eq!(opened[0]["span"]["trace_id"], trace, "{}", opened[0]);
    assert_eq!(opened[0]["level"], "WARN");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_be_turned_off() {
    let t = Tollgate::start(&[("shop.yaml", SHOP)], &[("metrics.enabled", "false")]).await;
    let r = t.ask(req("shop", &[("user", "x")])).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let (status, _) = http(t.http, "GET", "/metrics", "", "").await;
    assert_eq!(status, 404);
    // /json does not depend on metrics.
    let (status, _) = http(
        t.http,
        "POST",
        "/json",
        "",
        r#"{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"x"}]}]}"#,
    )
    .await;
    assert_eq!(status, 200);
    t.stop().await;
}
