//! `POST /reset` on the debug listener: the body of `POST /json` (a domain
//! and descriptors), and every limiter those descriptors count on reset
//! ([`crate::engine::Engine::reset`]). Answers 200 with what was reset, 404
//! naming the domain or the descriptor that has no limiter, 400 for a
//! malformed body, 503 when the store failed. Descriptor values are shown
//! as digests unless `debug_show_values`, and always logged as digests.

use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::http::{Extensions, StatusCode};
use axum::response::Response;
use bytes::Bytes;

use crate::engine::{Request, ResetError, ResetLimiter};
use crate::service::RateLimiter;

use super::admin::{entries_json, json_response, shown};

pub(super) fn router(limiter: RateLimiter, show_values: bool) -> axum::Router {
    axum::Router::new().route(
        "/reset",
        axum::routing::post(move |extensions: Extensions, body: Bytes| {
            let limiter = limiter.clone();
            async move {
                let caller = extensions
                    .get::<ConnectInfo<SocketAddr>>()
                    .map(|c| c.0.to_string());
                reset(&limiter, caller.as_deref(), &body, show_values).await
            }
        }),
    )
}

async fn reset(
    limiter: &RateLimiter,
    caller: Option<&str>,
    body: &[u8],
    show_values: bool,
) -> Response {
    let error = |status: StatusCode, message: String| {
        json_response(status, &serde_json::json!({ "error": message }))
    };
    let request = match crate::json::parse_request(body) {
        Ok(message) => match limiter.request_of(message) {
            Ok(request) => request,
            Err(s) => return error(StatusCode::BAD_REQUEST, s.message().to_string()),
        },
        Err(reason) => return error(StatusCode::BAD_REQUEST, reason),
    };
    let caller = caller.unwrap_or("unknown");
    match limiter.engine().reset(&request).await {
        Ok(limiters) => {
            for l in &limiters {
                tracing::info!(
                    caller,
                    domain = %request.domain,
                    descriptor = %descriptor_text(&request, l.descriptor, false),
                    rule = l.rule.as_ref().map_or("", |r| r.path.as_str()),
                    "limiter reset"
                );
            }
            let reset: Vec<serde_json::Value> = limiters
                .iter()
                .map(|l| limiter_json(&request, l, show_values))
                .collect();
            json_response(
                StatusCode::OK,
                &serde_json::json!({ "domain": request.domain, "reset": reset }),
            )
        }
        Err(e) => {
            let status = match &e {
                ResetError::Invalid(_) => StatusCode::BAD_REQUEST,
                ResetError::UnknownDomain(_) | ResetError::NoLimit { .. } => StatusCode::NOT_FOUND,
                ResetError::Store { .. } => StatusCode::SERVICE_UNAVAILABLE,
            };
            let message = match &e {
                ResetError::NoLimit { index } => format!(
                    "descriptor {index} ({}) matches no rule with a limit in domain {:?}: nothing reset",
                    descriptor_text(&request, *index, show_values),
                    request.domain
                ),
                ResetError::UnknownDomain(_) => format!("{e}: nothing reset"),
                _ => e.to_string(),
            };
            error(status, message)
        }
    }
}

/// A descriptor as `key=value,key=value`, values as digests unless
/// `show_values`.
fn descriptor_text(request: &Request, index: usize, show_values: bool) -> String {
    request.descriptors[index]
        .entries
        .iter()
        .map(|(k, v)| format!("{k}={}", shown(v, show_values)))
        .collect::<Vec<_>>()
        .join(",")
}

fn limiter_json(request: &Request, l: &ResetLimiter, show_values: bool) -> serde_json::Value {
    let entries = entries_json(&request.descriptors[l.descriptor].entries, show_values);
    serde_json::json!({
        "descriptor": l.descriptor,
        "entries": entries,
        "rule": l.rule.as_ref().map(|r| r.path.as_str()),
        "name": l.rule.as_ref().and_then(|r| r.name.as_deref()),
        "source": l.rule.as_ref().map(|r| r.source.as_str()),
        "override": l.rule.is_none(),
        "algorithm": l.limit.algorithm.as_str(),
        "requestsPerUnit": l.limit.requests_per_unit,
        "unit": l.limit.window.unit().as_str(),
        "unitMultiplier": l.limit.window.multiplier(),
        "shards": l.limit.shards,
    })
}
