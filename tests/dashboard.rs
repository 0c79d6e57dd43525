//! The Grafana dashboard (`helm/tollgate/dashboards/tollgate.json`) and the
//! chart's alerts, held to what tollgate exports: every PromQL expression
//! parses (promql-parser, once Grafana's variables have values), and every
//! metric it reads, with every label it filters or groups by, is on the
//! `/metrics` of a live tollgate after traffic on a real Redis (and on the
//! embedded store, for that store's panels). A renamed metric, label or
//! label value fails here. The JSON itself is checked for what Grafana 10
//! and 11 need to import it.
//!
//! Needs redis-server, and helm 3 to render the alerts (see tests/helm.rs).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{self, Expr, VectorSelector};
use serde_json::Value;
use support::helm::{helm, parse_manifests, root, template};
use support::redis::RedisServer;
use support::tollgate::{Tollgate, descriptor};

const DASHBOARD: &str = "helm/tollgate/dashboards/tollgate.json";

/// Grafana 10.0's schema: Grafana 10 and 11 load it as it is and migrate
/// it forward in memory.
const SCHEMA_VERSION: u64 = 38;

/// The datasource every panel and query names: the `datasource` variable.
const DATASOURCE_UID: &str = "${datasource}";

/// Values for Grafana's variables, as a query would be sent.
const VARIABLES: &[(&str, &str)] = &[
    ("$__rate_interval", "2m"),
    ("${datasource}", "prometheus"),
    ("$namespace", "tollgate"),
    ("$pod", "tollgate-.*"),
];

/// Labels Prometheus adds to every series it scrapes from a pod (target
/// labels of the ServiceMonitor); tollgate never exports them.
const TARGET_LABELS: &[&str] = &["namespace", "pod"];

/// Metrics the chart's alerts read from another exporter, with the labels
/// that exporter gives them.
const EXTERNAL: &[(&str, &[&str])] = &[
    // kube-state-metrics
    ("kube_pod_status_ready", &["namespace", "pod", "condition"]),
];

// --------------------------------------------------------------- queries ---

/// One PromQL expression and where it comes from.
struct Query {
    from: String,
    expr: String,
    /// A dashboard panel's query: it must follow the namespace and pod
    /// variables.
    panel: bool,
}

fn dashboard_text() -> String {
    std::fs::read_to_string(root().join(DASHBOARD)).unwrap()
}

fn dashboard() -> Value {
    serde_json::from_str(&dashboard_text()).expect("the dashboard is JSON")
}

/// Every panel, those inside collapsed rows included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("a panels list") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner);
        }
    }
    out
}

/// The panels' queries, and the metric selectors of the variables'
/// `label_values(SELECTOR, label)` queries (as `count by (label)
/// (SELECTOR)`, which reads the same series and label).
fn dashboard_queries(d: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    for p in panels(d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(Query {
                from: format!("panel {} {:?} query {}", p["id"], p["title"], t["refId"]),
                expr: t["expr"].as_str().expect("every query has an expr").into(),
                panel: true,
            });
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"].as_str().expect("a Prometheus query");
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {}: not label_values(...): {q}", v["name"]));
        let (selector, label) = inner.rsplit_once(',').unwrap();
        out.push(Query {
            from: format!("variable {}", v["name"]),
            expr: format!("count by ({}) ({selector})", label.trim()),
            panel: false,
        });
    }
    out
}

/// The chart's alerting and recording rules, rendered by helm.
fn chart_rule_queries() -> Vec<Query> {
    let yaml = template(
        &helm(3),
        &[
            "--set",
            "metrics.enabled=true",
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--api-versions",
            "monitoring.coreos.com/v1",
        ],
    )
    .unwrap_or_else(|e| panic!("helm template: {e}"));
    let objects = parse_manifests(&yaml);
    let rule = objects
        .iter()
        .find(|o| o["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let mut out = Vec::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            let name = r["alert"].as_str().or(r["record"].as_str()).unwrap();
            out.push(Query {
                from: format!("PrometheusRule {name}"),
                expr: r["expr"].as_str().unwrap().into(),
                panel: false,
            });
        }
    }
    assert!(!out.is_empty(), "the chart has alerts");
    out
}

/// The expression as Prometheus receives it from Grafana.
fn substitute(expr: &str) -> String {
    let mut out = expr.to_string();
    for (name, value) in VARIABLES {
        out = out.replace(name, value);
    }
    out
}

fn parse(q: &Query) -> Result<Expr, String> {
    let expr = substitute(&q.expr);
    if expr.contains('$') {
        return Err(format!("{}: a variable without a value: {expr}", q.from));
    }
    parser::parse(&expr).map_err(|e| format!("{}: {e}\n  {expr}", q.from))
}

// ------------------------------------------------------ what a query reads ---

/// A metric an expression reads, with the labels it filters by (and the
/// values it asks for with `=`) or groups by.
#[derive(Debug)]
struct Use {
    metric: String,
    labels: BTreeSet<String>,
    equals: Vec<(String, String)>,
    matchers: Vec<Matcher>,
}

/// The metrics `expr` reads; `problems` gets what is wrong beyond syntax.
fn uses(expr: &Expr, problems: &mut Vec<String>) -> Vec<Use> {
    let mut out = Vec::new();
    walk(expr, &BTreeSet::new(), &mut out, problems);
    out
}

/// `grouping`: the labels that aggregations and vector matching above this
/// node name, which the series below must carry.
fn walk(e: &Expr, grouping: &BTreeSet<String>, out: &mut Vec<Use>, problems: &mut Vec<String>) {
    match e {
        Expr::Aggregate(a) => {
            let mut g = grouping.clone();
            if let Some(m) = &a.modifier {
                g.extend(m.labels().labels.iter().cloned());
            }
            walk(&a.expr, &g, out, problems);
            if let Some(p) = &a.param {
                walk(p, grouping, out, problems);
            }
        }
        Expr::Binary(b) => {
            let mut g = grouping.clone();
            if let Some(m) = &b.modifier {
                if let Some(l) = &m.matching {
                    g.extend(l.labels().labels.iter().cloned());
                }
                if let Some(l) = m.card.labels() {
                    g.extend(l.labels.iter().cloned());
                }
            }
            walk(&b.lhs, &g, out, problems);
            walk(&b.rhs, &g, out, problems);
        }
        Expr::Unary(u) => walk(&u.expr, grouping, out, problems),
        Expr::Paren(p) => walk(&p.expr, grouping, out, problems),
        Expr::Subquery(s) => walk(&s.expr, grouping, out, problems),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {}
        Expr::VectorSelector(v) => out.push(selector(v, grouping, problems)),
        Expr::MatrixSelector(m) => out.push(selector(&m.vs, grouping, problems)),
        Expr::Call(c) => {
            if matches!(c.func.name, "label_replace" | "label_join") {
                problems.push(format!(
                    "{}: makes labels this test cannot follow",
                    c.func.name
                ));
            }
            let start = out.len();
            for a in &c.args.args {
                walk(a, grouping, out, problems);
            }
            // A quantile needs the buckets, kept apart by `le`.
            if c.func.name == "histogram_quantile" {
                for u in &out[start..] {
                    if !u.metric.ends_with("_bucket") || !u.labels.contains("le") {
                        problems.push(format!(
                            "histogram_quantile over {} without its `le` buckets",
                            u.metric
                        ));
                    }
                }
            }
        }
        Expr::Extension(_) => problems.push("an extension expression".into()),
    }
}

fn selector(v: &VectorSelector, grouping: &BTreeSet<String>, problems: &mut Vec<String>) -> Use {
    let mut matchers: Vec<Matcher> = v.matchers.matchers.clone();
    if !v.matchers.or_matchers.is_empty() {
        problems.push(format!("{v}: `or` inside a selector"));
    }
    let by_name = matchers
        .iter()
        .find(|m| m.name == "__name__" && m.op == MatchOp::Equal)
        .map(|m| m.value.clone());
    let metric = v.name.clone().or(by_name).unwrap_or_else(|| {
        problems.push(format!("{v}: a selector without a metric name"));
        String::new()
    });
    matchers.retain(|m| m.name != "__name__");
    Use {
        metric,
        labels: matchers
            .iter()
            .map(|m| m.name.clone())
            .chain(grouping.iter().cloned())
            .collect(),
        equals: matchers
            .iter()
            .filter(|m| m.op == MatchOp::Equal)
            .map(|m| (m.name.clone(), m.value.clone()))
            .collect(),
        matchers,
    }
}

// -------------------------------------------------------- what is exported ---

/// Sample name -> label name -> the values seen.
type Exported = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The series of a Prometheus text page (sample names as exposed:
/// `_bucket`, `_sum`, `_count` for histograms).
fn exported(page: &str) -> Exported {
    let mut out = Exported::new();
    for line in page
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (name, labels) = match line.split_once('{') {
            Some((name, rest)) => (name, rest),
            None => (line.split_whitespace().next().unwrap(), ""),
        };
        let series = out.entry(name.to_string()).or_default();
        // name="value" pairs, values with \" \\ \n escapes, up to `}`.
        let mut rest = labels;
        while let Some((label, after)) = rest.split_once("=\"") {
            let label = label.trim_start_matches(',').trim();
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next() {
                    Some((_, '\\')) => {
                        if let Some((_, c)) = chars.next() {
                            value.push(if c == 'n' { '\n' } else { c });
                        }
                    }
                    Some((i, '"')) => break i,
                    Some((_, c)) => value.push(c),
                    None => panic!("unterminated label value in {line}"),
                };
            };
            series.entry(label.to_string()).or_default().insert(value);
            rest = &after[end + 1..];
            if rest.starts_with('}') {
                break;
            }
        }
    }
    out
}

/// What in `u` the exporters do not have.
fn missing(u: &Use, exported: &Exported) -> Vec<String> {
    if let Some((_, labels)) = EXTERNAL.iter().find(|(m, _)| *m == u.metric) {
        return u
            .labels
            .iter()
            .filter(|l| !labels.contains(&l.as_str()))
            .map(|l| format!("{}: no label {l} (another exporter's metric)", u.metric))
            .collect();
    }
    let Some(series) = exported.get(&u.metric) else {
        return vec![format!("no metric {} on /metrics", u.metric)];
    };
    let mut out = Vec::new();
    for label in &u.labels {
        if TARGET_LABELS.contains(&label.as_str()) {
            continue;
        }
        if !series.contains_key(label) {
            out.push(format!(
                "{}: no label {label} (it has {:?})",
                u.metric,
                series.keys().collect::<Vec<_>>()
            ));
        }
    }
    for (label, value) in &u.equals {
        if TARGET_LABELS.contains(&label.as_str()) {
            continue;
        }
        if let Some(values) = series.get(label)
            && !values.contains(value)
        {
            out.push(format!(
                "{}: no series with {label}=\"{value}\" (seen {values:?})",
                u.metric
            ));
        }
    }
    out
}

/// Everything wrong with `queries` against `exported`: syntax, and what
/// they read that is not there.
fn problems(queries: &[Query], exported: &Exported) -> Vec<String> {
    let mut all = Vec::new();
    for q in queries {
        let expr = match parse(q) {
            Ok(e) => e,
            Err(e) => {
                all.push(e);
                continue;
            }
        };
        let mut found = Vec::new();
        let uses = uses(&expr, &mut found);
        for u in &uses {
            found.extend(missing(u, exported));
        }
        all.extend(found.into_iter().map(|p| format!("{}: {p}", q.from)));
    }
    all
}

// ---------------------------------------------------------------- traffic ---

const RULES: &str = r#"
domain: dash
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  - key: path
    value: /login
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 20}
"#;

fn req(entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "dash".into(),
        descriptors: vec![descriptor(entries)],
        hits_addend: 0,
    }
}

/// Decisions within and over limits, near a limit, a shadow-mode refusal,
/// refusals answered by the over-limit cache, and concurrent calls on one
/// limiter (coalesced on Redis). Returns the OVER_LIMIT answers.
async fn traffic(t: &Tollgate) -> usize {
    let mut over = 0;
    for _ in 0..8 {
        if t.ask(req(&[("user", "alice")])).await.overall_code == Code::OverLimit as i32 {
            over += 1;
        }
    }
    for _ in 0..3 {
        t.ask(req(&[("path", "/login")])).await;
    }
    let calls = (0..40).map(|_| async { t.ask(req(&[("hot", "x")])).await.overall_code });
    for code in futures_util::future::join_all(calls).await {
        if code == Code::OverLimit as i32 {
            over += 1;
        }
    }
    // A request tollgate refuses as invalid (no descriptors).
    let mut client = t.client().await;
    let invalid = client
        .should_rate_limit(RateLimitRequest {
            domain: "dash".into(),
            descriptors: vec![],
            hits_addend: 0,
        })
        .await;
    assert!(invalid.is_err(), "no descriptors is invalid");
    over
}

async fn scrape(t: &Tollgate) -> String {
    let (status, page) = support::http_get(t.http, "/metrics").await;
    assert_eq!(status, 200, "{page}");
    page
}

/// What a tollgate on Redis exports after traffic and a Redis outage
/// (store errors, an open circuit, error answers), merged with what a
/// tollgate on the embedded store exports after traffic.
async fn live_metrics() -> Exported {
    let mut redis = RedisServer::start();
    let files = [("dash.yaml", RULES)];
    let on_redis = Tollgate::start(
        &files,
        &[
            ("store", redis.url().as_str()),
            ("redis.command_timeout_ms", "200"),
        ],
    )
    .await;
    on_redis.wait_serving(Duration::from_secs(20)).await;
    support::away_from_an_hour_boundary().await;
    let over = traffic(&on_redis).await;
    // alice: 3 over 5; hot: 20 over 20.
    assert_eq!(over, 23, "OVER_LIMIT answers on Redis");

    redis.stop();
    let mut client = on_redis.client().await;
    for i in 0..10 {
        let answer = client
            .should_rate_limit(req(&[("user", &format!("down-{i}"))]))
            .await;
        assert!(answer.is_err(), "on_store_error=error fails the call");
    }
    let page = scrape(&on_redis).await;
    on_redis.stop().await;

    let embedded = Tollgate::start(&files, &[("store", "memory")]).await;
    embedded.wait_serving(Duration::from_secs(20)).await;
    support::away_from_an_hour_boundary().await;
    assert_eq!(traffic(&embedded).await, 23, "OVER_LIMIT answers, embedded");
    let embedded_page = scrape(&embedded).await;
    embedded.stop().await;

    let mut all = exported(&page);
    for (name, labels) in exported(&embedded_page) {
        let entry = all.entry(name).or_default();
        for (label, values) in labels {
            entry.entry(label).or_default().extend(values);
        }
    }
    all
}

// ------------------------------------------------------------------ tests ---

/// Every panel query, variable query and chart alert reads only metrics,
/// labels and label values a live tollgate exports; a renamed metric, label
/// or value is caught by the same check.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_query_reads_what_tollgate_exports() {
    support::redis::require_redis();
    let d = dashboard();
    let mut queries = dashboard_queries(&d);
    queries.extend(chart_rule_queries());
    let exported = live_metrics().await;

    // The scenario reached the series the store panels need.
    for name in [
        "tollgate_store_errors_total",
        "tollgate_store_circuit_open",
        "tollgate_coalesce_batches_total",
        "tollgate_over_limit_cache_hits_total",
        "tollgate_store_limiters",
    ] {
        assert!(exported.contains_key(name), "{name} after the scenario");
    }

    let found = problems(&queries, &exported);
    assert!(
        found.is_empty(),
        "{} problems:\n{}",
        found.len(),
        found.join("\n")
    );

    // The check is not lenient: a metric, a label and a value renamed in
    // the dashboard are each reported.
    let renamed = [
        (
            "tollgate_store_errors_total",
            "tollgate_store_error_total",
            "no metric tollgate_store_error_total",
        ),
        (
            "sum by (node, kind)",
            "sum by (node, reason)",
            "no label reason",
        ),
        (
            r#"outcome=\"ok\""#,
            r#"outcome=\"success\""#,
            r#"outcome="success""#,
        ),
    ];
    let text = dashboard_text();
    for (from, to, caught) in renamed {
        assert!(text.contains(from), "the dashboard has {from}");
        let changed: Value = serde_json::from_str(&text.replace(from, to)).unwrap();
        let found = problems(&dashboard_queries(&changed), &exported);
        assert!(
            found.iter().any(|p| p.contains(caught)),
            "{from} -> {to} is caught: {found:?}"
        );
    }
}

/// Every expression parses, panels follow the namespace and pod
/// variables, and a broken expression is refused by the parser.
#[test]
fn every_expression_parses_and_follows_the_variables() {
    let d = dashboard();
    let mut queries = dashboard_queries(&d);
    let panel_queries = queries.iter().filter(|q| q.panel).count();
    assert!(panel_queries >= 30, "{panel_queries} panel queries");
    queries.extend(chart_rule_queries());
    let mut found = Vec::new();
    for q in &queries {
        let expr = match parse(q) {
            Ok(e) => e,
            Err(e) => {
                found.push(e);
                continue;
            }
        };
        let mut problems = Vec::new();
        let uses = uses(&expr, &mut problems);
        if q.panel {
            assert!(!uses.is_empty(), "{}: reads no metric", q.from);
            for u in &uses {
                let has = |name: &str, ok: &dyn Fn(&MatchOp, &str) -> bool| {
                    u.matchers
                        .iter()
                        .any(|m| m.name == name && ok(&m.op, &m.value))
                };
                if !has("namespace", &|op, v| {
                    *op == MatchOp::Equal && v == "tollgate"
                }) || !has("pod", &|op, v| {
                    matches!(op, MatchOp::Re(_)) && v == "tollgate-.*"
                }) {
                    problems.push(format!(
                        "{}: not filtered by namespace=\"$namespace\", pod=~\"$pod\"",
                        u.metric
                    ));
                }
            }
        }
        found.extend(problems.into_iter().map(|p| format!("{}: {p}", q.from)));
    }
    assert!(found.is_empty(), "{}", found.join("\n"));

    let broken = Query {
        from: "broken".into(),
        expr: "sum(rate(tollgate_rule_hits_total{namespace=\"$namespace\"}[$__rate_interval])"
            .into(),
        panel: true,
    };
    assert!(
        parse(&broken).is_err(),
        "an unclosed parenthesis is refused"
    );
}

/// The JSON is a dashboard Grafana 10 and 11 import by hand or through the
/// sidecar: a schema version, the datasource as a variable used by every
/// panel and query, the namespace and pod variables, unique panel ids, and
/// a layout within the 24-column grid without overlaps.
#[test]
fn the_dashboard_is_importable() {
    let d = dashboard();
    assert_eq!(d["schemaVersion"], SCHEMA_VERSION);
    assert_eq!(d["uid"], "tollgate");
    assert!(d["title"].is_string());
    assert!(d["id"].is_null(), "no id: Grafana assigns one on import");
    assert!(
        d.get("__inputs").is_none(),
        "no import-time inputs: the sidecar loads the file as it is"
    );

    let vars: BTreeMap<&str, &Value> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["name"].as_str().unwrap(), v))
        .collect();
    assert_eq!(
        vars.keys().copied().collect::<Vec<_>>(),
        ["datasource", "namespace", "pod"]
    );
    assert_eq!(vars["datasource"]["type"], "datasource");
    assert_eq!(vars["datasource"]["query"], "prometheus");
    for name in ["namespace", "pod"] {
        let v = vars[name];
        assert_eq!(v["type"], "query", "{name}");
        assert_eq!(v["datasource"]["uid"], DATASOURCE_UID, "{name}");
        let q = v["query"]["query"].as_str().unwrap();
        assert!(
            q.starts_with("label_values(") && q.ends_with(&format!(", {name})")),
            "{name}: {q}"
        );
        assert_eq!(v["definition"].as_str(), Some(q), "{name}");
    }
    assert_eq!(vars["pod"]["multi"], true);
    assert_eq!(vars["pod"]["includeAll"], true);
    assert_eq!(vars["pod"]["allValue"], ".*");

    let all = panels(&d);
    let mut ids = BTreeSet::new();
    for p in &all {
        let id = p["id"].as_u64().unwrap_or_else(|| panic!("no id: {p}"));
        assert!(ids.insert(id), "panel id {id} twice");
        assert!(
            p["title"].as_str().is_some_and(|t| !t.is_empty()),
            "panel {id}: a title"
        );
        if p["type"] == "row" {
            assert!(p.get("targets").is_none(), "row {id} has no queries");
            continue;
        }
        assert!(
            p["description"].as_str().is_some_and(|t| !t.is_empty()),
            "panel {id}: a description"
        );
        let is_prometheus_variable =
            |ds: &Value| ds["type"] == "prometheus" && ds["uid"] == DATASOURCE_UID;
        assert!(
            is_prometheus_variable(&p["datasource"]),
            "panel {id}: datasource {}",
            p["datasource"]
        );
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {id}: queries");
        let mut refs = BTreeSet::new();
        for t in targets {
            assert!(is_prometheus_variable(&t["datasource"]), "panel {id}: {t}");
            assert!(
                refs.insert(t["refId"].as_str().unwrap()),
                "panel {id}: refIds"
            );
            assert!(t["expr"].as_str().is_some_and(|e| !e.is_empty()));
        }
    }

    // Rows in order, their panels below them, nothing overlapping. A
    // collapsed row's panels are laid out as if it were open.
    let mut taken: BTreeSet<(u64, u64)> = BTreeSet::new();
    for p in &all {
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().unwrap());
        assert!(w > 0 && h > 0 && x + w <= 24, "panel {}: {g}", p["id"]);
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    taken.insert((cx, cy)),
                    "panel {} overlaps at {cx},{cy}",
                    p["id"]
                );
            }
        }
    }
    let rows: Vec<&Value> = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .collect();
    assert!(rows.len() >= 5, "grouped in rows");
    assert_eq!(d["panels"][0]["type"], "row", "the first panel is a row");
}
