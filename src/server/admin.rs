//! The HTTP surfaces, split by audience. The public router (on
//! `http_addr`) serves what probes, Prometheus and the reference service's
//! users expect there: `/healthcheck`, `/metrics`, `POST /json`. The debug
//! router (on `debug_addr`, loopback by default) serves the views that show
//! rules, the quota shares and the heaviest limiters: `/rlconfig`,
//! `/debug/rlqs` and `/debug/hotkeys`, with descriptor and bucket values as
//! digests unless `debug_show_values` is set.

use std::sync::Arc;

use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::engine::Engine;
use crate::observe::Telemetry;
use crate::reload;
use crate::rlqs::{Assignment, QuotaService};
use crate::rules::RuleSet;
use crate::service::RateLimiter;
use crate::storage::hotkeys;

/// The public router: health, metrics and the JSON form of the protocol.
pub fn public(
    engine: &Engine,
    limiter: RateLimiter,
    telemetry: Option<Arc<Telemetry>>,
    draining: watch::Receiver<bool>,
    rules_ready: watch::Receiver<bool>,
    max_message_bytes: usize,
) -> axum::Router {
    let ready_store = engine.store().clone();
    let router = axum::Router::new().route(
        "/healthcheck",
        axum::routing::get(move || {
            let store = ready_store.clone();
            let draining = *draining.borrow();
            let rules_ready = *rules_ready.borrow();
            async move {
                if draining {
                    (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
                } else if !rules_ready {
                    (StatusCode::SERVICE_UNAVAILABLE, "no rules from xDS yet\n")
                } else if store.is_ready() {
                    (StatusCode::OK, "OK\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "store not ready\n")
                }
            }
        }),
    );
    // A JSON form of ShouldRateLimit, for trying rules with curl.
    let router = router.route(
        "/json",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let limiter = limiter.clone();
            async move { json_call(&limiter, headers, body, max_message_bytes).await }
        }),
    );
    // The debug views answer here only with where they moved.
    let moved = || async {
        (
            StatusCode::NOT_FOUND,
            "moved to the debug listener (debug_addr, loopback by default: 127.0.0.1:6070)\n",
        )
    };
    let router = router
        .route("/rlconfig", axum::routing::get(moved))
        .route("/debug/hotkeys", axum::routing::get(moved))
        .route("/reset", axum::routing::any(moved));
    match telemetry {
        Some(t) => router.route(
            "/metrics",
            axum::routing::get(move || {
                let t = t.clone();
                async move {
                    (
                        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                        t.prometheus_text(),
                    )
                }
            }),
        ),
        None => router,
    }
}

/// The debug router: the rules in force and the heaviest limiters.
pub fn debug(
    engine: &Engine,
    reloads: reload::ReloadCounts,
    quota: QuotaService,
    show_values: bool,
) -> axum::Router {
    // The rules in force, as the reference service's /rlconfig shows them;
    // the headers count reloads, so a refused edit is visible too.
    let rules = engine.rules().clone();
    let default = engine.options().default_algorithm;
    let defaults = crate::rules::Defaults {
        algorithm: default,
        lease: engine.options().lease,
    };
    let router = axum::Router::new().route(
        "/rlconfig",
        axum::routing::get(move |uri: Uri, headers: HeaderMap| {
            let rules = rules.clone();
            let reloads = reloads.clone();
            async move {
                let counts = [
                    ("x-rules-reloaded", reloads.loaded().to_string()),
                    ("x-rules-refused", reloads.refused().to_string()),
                ];
                if wants_json(&uri, &headers) {
                    let body = rules_json(&rules.current(), &reloads, defaults);
                    (counts, json_response(StatusCode::OK, &body)).into_response()
                } else {
                    (counts, rules.current().describe(defaults)).into_response()
                }
            }
        }),
    );
    // The shares this replica's quota streams hold.
    let router = router.route(
        "/debug/rlqs",
        axum::routing::get(move || {
            let quota = quota.clone();
            async move { json_response(StatusCode::OK, &quota_json(&quota, show_values)) }
        }),
    );
    // The heaviest limiters of this replica, to tell which rule to shard.
    let hot_store = engine.store().clone();
    router.route(
        "/debug/hotkeys",
        axum::routing::get(move || {
            let store = hot_store.clone();
            async move {
                match store.hot_keys() {
                    Some(report) => {
                        json_response(StatusCode::OK, &hot_keys_json(&report, show_values))
                    }
                    None => json_response(
                        StatusCode::NOT_FOUND,
                        &serde_json::json!({"error": "no hot-key tracker"}),
                    ),
                }
            }
        }),
    )
}

/// A descriptor value as the debug views show it by default: enough of its
/// SHA-256 to tell values apart and to match one a client is known to
/// send, nothing that reads back. The empty value stays empty.
/// `/debug/rlqs`: every bucket's last assignment on this replica's open
/// quota streams (values as digests unless `show_values`), and the ledger
/// as the stream's last report saw it.
fn quota_json(quota: &QuotaService, show_values: bool) -> serde_json::Value {
    let buckets: Vec<serde_json::Value> = quota
        .shares()
        .into_iter()
        .map(|v| {
            let bucket: serde_json::Map<String, serde_json::Value> = v
                .bucket
                .iter()
                .map(|(k, val)| (k.clone(), shown(val, show_values).into()))
                .collect();
            let assignment = match v.assignment {
                Assignment::AllowAll => serde_json::json!({"blanket_rule": "ALLOW_ALL"}),
                Assignment::DenyAll => serde_json::json!({"blanket_rule": "DENY_ALL"}),
                Assignment::TokenBucket {
                    max_tokens,
                    tokens_per_fill,
                    fill_secs,
                } => serde_json::json!({"token_bucket": {
                    "max_tokens": max_tokens,
                    "tokens_per_fill": tokens_per_fill,
                    "fill_interval_s": fill_secs,
                }}),
            };
            serde_json::json!({
                "stream": v.stream,
                "domain": v.domain,
                "bucket": bucket,
                "rule": v.rule,
                "assignment": assignment,
                "ledger_holders": v.holders,
                "ledger_tokens_in_force": v.granted_total,
            })
        })
        .collect();
    let stats = quota.stats().snapshot();
    serde_json::json!({
        "streams": stats.streams_open,
        "buckets": buckets,
    })
}

/// A descriptor value as the debug listener shows it: a digest
/// ([`masked`]) unless `show_values`.
pub(super) fn shown(value: &str, show_values: bool) -> String {
    if show_values {
        value.to_string()
    } else {
        masked(value)
    }
}

/// A descriptor's entries as `[{"key", "value"}]`, values [`shown`].
pub(super) fn entries_json(
    entries: &[(String, String)],
    show_values: bool,
) -> Vec<serde_json::Value> {
    entries
        .iter()
        .map(|(key, value)| serde_json::json!({"key": key, "value": shown(value, show_values)}))
        .collect()
}

pub fn masked(value: &str) -> String {
    if value.is_empty() {
        return String::new();
    }
    let digest = Sha256::digest(value.as_bytes());
    let mut out = String::from("sha256:");
    for b in &digest[..8] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

fn wants_json(uri: &Uri, headers: &HeaderMap) -> bool {
    let by_query = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "format=json"));
    let by_accept = headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/json"));
    by_query || by_accept
}

pub(super) fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    let mut text = body.to_string();
    text.push('\n');
    (status, [(CONTENT_TYPE, "application/json")], text).into_response()
}

/// `/debug/hotkeys`: rates per second over the trailing window, shares
/// between 0 and 1. Descriptor values are client data (API keys, client
/// addresses, paths with tokens): shown as digests unless `show_values`.
fn hot_keys_json(report: &hotkeys::Report, show_values: bool) -> serde_json::Value {
    let keys: Vec<serde_json::Value> = report
        .hot_keys
        .iter()
        .map(|k| {
            let entries = entries_json(&k.limiter.entries, show_values);
            serde_json::json!({
                "limiter": {
                    "domain": &*k.limiter.domain,
                    "entries": entries,
                    "algorithm": k.limiter.algorithm.as_str(),
                    "limit": k.limiter.limit,
                    "unit": k.limiter.window.unit().as_str(),
                    "unitMultiplier": k.limiter.window.multiplier(),
                    "shards": k.limiter.shard.count,
                },
                "rate": k.rate,
                "rateError": k.rate_error,
                "share": k.share,
                "overLimitShare": k.over_limit_share,
            })
        })
        .collect();
    serde_json::json!({
        "windowSeconds": report.window_seconds,
        "totalRate": report.total_rate,
        "hotKeys": keys,
    })
}

/// The rules in force as JSON, sorted by domain and path: each with the
/// algorithm it runs (`algorithmSetBy` says whether the rule names it or
/// `default_algorithm` gives it) and its position; whitelists too.
fn rules_json(
    rules: &RuleSet,
    reloads: &reload::ReloadCounts,
    defaults: crate::rules::Defaults,
) -> serde_json::Value {
    let default = defaults.algorithm;
    let whitelists = rules.whitelists();
    let mut list = rules.rules();
    list.sort_by(|a, b| (a.0, &a.1.path).cmp(&(b.0, &b.1.path)));
    // The limits after the first of a `rate_limits:` list.
    let listed: std::collections::HashSet<*const crate::rules::Rule> = list
        .iter()
        .flat_map(|(_, r)| r.more.iter().map(|m| m as *const _))
        .collect();
    let mut rules: Vec<(String, String, serde_json::Value)> = list
        .into_iter()
        .map(|(domain, r)| {
            let in_list = listed.contains(&(r as *const _));
            let lease = r.lease_state(default, defaults.lease, in_list);
            let mut v = serde_json::json!({
                "domain": domain,
                "rule": r.path,
                "name": r.name,
                "buckets": r.buckets,
                "burst": r.burst,
                "maxDuration": r.max_duration.map(crate::limit::algorithms::duration_text),
                "shards": r.shards,
                "onStoreError": r.on_store_error.map(|p| p.to_string()),
                "countRefused": r.count_refused,
                "lease": r.lease,
                "leased": lease.clone().unwrap_or(false),
                "leaseOffBecause": lease.err(),
                "replaces": r.replaces,
                "shadowMode": r.shadow_mode,
                "quotaMode": r.quota_mode,
                "detailedMetric": r.detailed_metric,
                "valueToMetric": r.value_to_metric,
                "shareThreshold": r.share_threshold,
                "metadata": r.metadata.as_deref(),
                "source": r.source.to_string(),
            });
            limit_json(&mut v, r, default);
            (domain.to_string(), r.path.clone(), v)
        })
        .collect();
    for (domain, path, source) in whitelists {
        let v = serde_json::json!({
            "domain": domain,
            "rule": path,
            "whitelist": true,
            "source": source,
        });
        rules.push((domain.to_string(), path, v));
    }
    rules.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let rules: Vec<serde_json::Value> = rules.into_iter().map(|(_, _, v)| v).collect();
    serde_json::json!({
        "rules": rules,
        // Named as the headers name them.
        "reloads": { "reloaded": reloads.loaded(), "refused": reloads.refused() },
    })
}

/// A rule's limit, in its JSON entry of `/rlconfig`.
fn limit_json(v: &mut serde_json::Value, r: &crate::rules::Rule, default: crate::limit::Algorithm) {
    use crate::rules::LimitSpec;
    match &r.limit {
        LimitSpec::Unlimited => v["unlimited"] = true.into(),
        LimitSpec::PerUnit {
            requests_per_unit,
            window,
        } => {
            v["requestsPerUnit"] = (*requests_per_unit).into();
            v["unit"] = window.unit().as_str().into();
            v["unitMultiplier"] = window.multiplier().into();
            v["windowSeconds"] = window.seconds().into();
            if let Some(zone) = window.zone() {
                v["timezone"] = zone.name().into();
            }
            v["algorithm"] = r.algorithm.unwrap_or(default).as_str().into();
            v["algorithmSetBy"] = if r.algorithm.is_some() {
                "rule"
            } else {
                "default_algorithm"
            }
            .into();
        }
    }
}

/// `POST /json`: 200 with the response when OK, 429 when OVER_LIMIT, 400
/// with the reason for bad input; other failures by their gRPC status.
async fn json_call(
    limiter: &RateLimiter,
    headers: HeaderMap,
    body: Bytes,
    max_bytes: usize,
) -> Response {
    let error = |status: StatusCode, grpc: &str, message: String| {
        json_response(
            status,
            &serde_json::json!({ "error": message, "grpcStatus": grpc }),
        )
    };
    if body.len() > max_bytes {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RESOURCE_EXHAUSTED",
            format!(
                "request of {} bytes, over max_message_bytes={max_bytes}",
                body.len()
            ),
        );
    }
    let request = match crate::json::parse_request(&body) {
        Ok(r) => r,
        Err(reason) => return error(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", reason),
    };
    // HTTP headers serve as metadata: `grpc-timeout`, `traceparent`, B3.
    let metadata = tonic::metadata::MetadataMap::from_headers(headers);
    match limiter.decide(&metadata, request).await {
        Ok(response) => {
            let status = if response.overall_code
                == crate::proto::rate_limit_response::Code::OverLimit as i32
            {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            json_response(status, &crate::json::response(&response))
        }
        Err(s) => {
            let status = match s.code() {
                tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
                tonic::Code::ResourceExhausted | tonic::Code::Unavailable => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                tonic::Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(
                status,
                crate::service::code_name(s.code()),
                s.message().to_string(),
            )
        }
    }
}
