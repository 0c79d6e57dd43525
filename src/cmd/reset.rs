//! `tollgate reset`: resets the limiters of a domain's descriptors through
//! a running tollgate's debug listener (`POST /reset`), and prints what
//! was reset.

use std::time::Duration;

use anyhow::{Context, anyhow};
use axum::body::Body;
use hyper::Request;
use hyper_util::rt::TokioIo;

#[derive(Debug, clap::Args)]
pub struct ResetArgs {
    /// The debug listener of a tollgate replica (`debug_addr`), host:port.
    #[arg(long, default_value = "127.0.0.1:6070")]
    pub addr: String,
    /// The rate-limit domain.
    #[arg(long)]
    pub domain: String,
    /// Descriptor entries `k=v[,k2=v2...]`; repeat for several descriptors.
    #[arg(long = "descriptor", required = true)]
    pub descriptors: Vec<String>,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub timeout_ms: u64,
}

/// The answer: the HTTP status and the JSON body.
pub struct Answer {
    pub status: u16,
    pub body: serde_json::Value,
}

/// The body of `POST /reset`: the JSON form of a `RateLimitRequest`.
pub fn body(domain: &str, descriptors: &[Vec<(String, String)>]) -> String {
    let descriptors: Vec<serde_json::Value> = descriptors
        .iter()
        .map(|entries| {
            let entries: Vec<serde_json::Value> = entries
                .iter()
                .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
                .collect();
            serde_json::json!({ "entries": entries })
        })
        .collect();
    serde_json::json!({ "domain": domain, "descriptors": descriptors }).to_string()
}

/// Sends `body` to `addr`'s `POST /reset` within `timeout`.
pub async fn call(addr: &str, body: String, timeout: Duration) -> anyhow::Result<Answer> {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake")?;
        tokio::spawn(connection);
        let request = Request::post("/reset")
            .header(hyper::header::HOST, addr)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))?;
        let response = sender.send_request(request).await.context("POST /reset")?;
        let status = response.status().as_u16();
        let bytes = axum::body::to_bytes(Body::new(response.into_body()), 1 << 20)
            .await
            .map_err(|e| anyhow!("reading the answer: {e}"))?;
        let body = serde_json::from_slice(&bytes).map_err(|_| {
            anyhow!(
                "HTTP {status} from {addr}, not a reset answer: {}",
                String::from_utf8_lossy(&bytes).trim()
            )
        })?;
        Ok(Answer { status, body })
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| anyhow!("no answer from {addr} within {} ms", timeout.as_millis()))?
}

/// One line per limiter reset.
pub fn render(answer: &serde_json::Value) -> String {
    let mut out = String::new();
    let domain = answer["domain"].as_str().unwrap_or_default();
    for l in answer["reset"].as_array().into_iter().flatten() {
        let entries: Vec<String> = l["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                format!(
                    "{}={}",
                    e["key"].as_str().unwrap_or_default(),
                    e["value"].as_str().unwrap_or_default()
                )
            })
            .collect();
        let rule = match (l["rule"].as_str(), l["source"].as_str()) {
            (Some(rule), Some(source)) => format!("rule {rule} ({source})"),
            _ => "the caller's override".to_string(),
        };
        let shards = l["shards"].as_u64().unwrap_or(1);
        out.push_str(&format!(
            "reset {domain} {}: {rule}, {} {} per {}{}\n",
            entries.join(","),
            l["algorithm"].as_str().unwrap_or_default(),
            l["requestsPerUnit"],
            l["unit"].as_str().unwrap_or_default(),
            if shards > 1 {
                format!(", {shards} shards")
            } else {
                String::new()
            },
        ));
    }
    out
}
