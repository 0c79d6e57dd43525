//! Rules from an xDS management server: the second rule source, beside the
//! file watcher (`reload`). tollgate subscribes over the Aggregated
//! Discovery Service (state of the world) to
//! `ratelimit.config.ratelimit.v3.RateLimitConfig` resources, which is how
//! Envoy Gateway configures its global rate limiting.
//!
//! Every response is the whole set of rules: its resources are turned into
//! rule texts (`convert`) and loaded with the same checks, options and
//! counters as files, then swapped into the same `RulesHandle`. A set that
//! loads is ACKed (the response's version and nonce); one that does not is
//! NACKed with the error text and the version in force, and the previous
//! rules stay. A lost stream is opened again after a wait that doubles from
//! `xds.retry_initial_ms` to `xds.retry_max_ms`, with jitter, and starts
//! again from the first wait once a response arrived. Until the first set
//! is applied, `ready` stays false (health NOT_SERVING) unless
//! `xds.serve_without_config`.

mod convert;

use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::engine::RulesHandle;
use crate::proto::envoy::config::core::v3::{Node, node::UserAgentVersionType};
use crate::proto::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::proto::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use crate::proto::google::rpc::Status as RpcStatus;
use crate::reload::ReloadCounts;
use crate::rules::{self, LoadOptions};
use crate::settings::XdsSettings;

pub use convert::TYPE_URL;

/// The largest discovery response read (a whole rule set).
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// gRPC's INVALID_ARGUMENT, the code of a NACK's error.
const INVALID_ARGUMENT: i32 = 3;

/// Follows the management server until `stop` resolves.
pub async fn run(
    settings: XdsSettings,
    options: LoadOptions,
    handle: RulesHandle,
    counts: ReloadCounts,
    ready: watch::Sender<bool>,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut wait = settings.retry_initial;
    // The version in force, sent on a new stream and with every NACK.
    let mut version = String::new();
    let mut last_error = String::new();
    loop {
        let mut session = Session {
            settings: &settings,
            options: &options,
            handle: &handle,
            counts: &counts,
            ready: &ready,
            version: &mut version,
            answered: false,
        };
        let result = tokio::select! {
            _ = &mut stop => return,
            r = session.run() => r,
        };
        if session.answered {
            wait = settings.retry_initial;
        }
        let error = match result {
            Ok(()) => "the management server closed the stream".to_string(),
            Err(e) => e,
        };
        // Logged once per distinct failure, not per retry.
        if error != last_error {
            tracing::warn!(server = %settings.url, %error, "xDS stream lost; reconnecting");
            last_error = error;
        }
        let pause = jitter(wait);
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(pause) => {}
        }
        wait = (wait * 2).min(settings.retry_max);
    }
}

/// Between half and all of `wait`, so replicas that lost the server
/// together do not come back together.
fn jitter(wait: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    let share = (h.finish() % 1000) as u32;
    wait / 2 + wait / 2 * share / 1000
}

/// One stream to the management server.
struct Session<'a> {
    settings: &'a XdsSettings,
    options: &'a LoadOptions,
    handle: &'a RulesHandle,
    counts: &'a ReloadCounts,
    ready: &'a watch::Sender<bool>,
    version: &'a mut String,
    /// A response arrived on this stream.
    answered: bool,
}

impl Session<'_> {
    async fn run(&mut self) -> Result<(), String> {
        let channel = endpoint(self.settings)?
            .connect()
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        // A rule set is the operator's, and may be larger than gRPC's
        // 4 MiB default.
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(MAX_RESPONSE_BYTES);
        let (tx, rx) = mpsc::channel(4);
        let first = DiscoveryRequest {
            version_info: self.version.clone(),
            node: Some(node(self.settings)),
            resource_names: Vec::new(),
            type_url: TYPE_URL.to_string(),
            response_nonce: String::new(),
            error_detail: None,
        };
        tx.send(first)
            .await
            .map_err(|_| "stream closed".to_string())?;
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        for (name, value) in &self.settings.headers {
            // Both checked when the settings were read.
            if let (Ok(name), Ok(value)) = (
                name.parse::<tonic::metadata::MetadataKey<tonic::metadata::Ascii>>(),
                value.parse(),
            ) {
                request.metadata_mut().insert(name, value);
            }
        }
        let mut responses = client
            .stream_aggregated_resources(request)
            .await
            .map_err(|s| format!("opening the stream: {}", s.message()))?
            .into_inner();
        tracing::info!(server = %self.settings.url, "xDS stream open");
        while let Some(response) = responses
            .message()
            .await
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        {
            self.answered = true;
            if response.type_url != TYPE_URL {
                // Only one type is subscribed to; anything else is ignored.
                continue;
            }
            let reply = self.apply(&response);
            tx.send(reply)
                .await
                .map_err(|_| "stream closed".to_string())?;
        }
        Ok(())
    }

    /// Loads one response's rules; the ACK or NACK to send back.
    fn apply(&mut self, response: &DiscoveryResponse) -> DiscoveryRequest {
        let loaded = convert::texts(&response.resources).and_then(|texts| {
            rules::load_texts(texts, self.options).map_err(|errors| errors.to_string())
        });
        let error_detail = match loaded {
            Ok(mut set) => {
                set.keep_stats(&self.handle.current());
                tracing::info!(
                    version = %response.version_info,
                    domains = set.len(),
                    "rules from xDS applied"
                );
                self.handle.replace(set);
                self.counts.count_loaded();
                *self.version = response.version_info.clone();
                self.ready.send_replace(true);
                None
            }
            Err(error) => {
                self.counts.count_refused();
                for line in error.lines() {
                    tracing::error!("{line}");
                }
                tracing::error!(
                    version = %response.version_info,
                    "rules from xDS refused (NACK); the previous rules stay in force"
                );
                Some(RpcStatus {
                    code: INVALID_ARGUMENT,
                    message: error,
                    details: Vec::new(),
                })
            }
        };
        DiscoveryRequest {
            version_info: self.version.clone(),
            node: None,
            resource_names: Vec::new(),
            type_url: TYPE_URL.to_string(),
            response_nonce: response.nonce.clone(),
            error_detail,
        }
    }
}

fn endpoint(s: &XdsSettings) -> Result<Endpoint, String> {
    let mut e = Endpoint::from_shared(s.url.clone())
        .map_err(|e| format!("xds.server_url {:?}: {e}", s.url))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        // A silent server is noticed: the stream fails and reconnects.
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    if let Some(tls) = &s.tls {
        let mut config = ClientTlsConfig::new();
        config = match &tls.ca_pem {
            Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &tls.server_name {
            config = config.domain_name(name.clone());
        }
        e = e
            .tls_config(config)
            .map_err(|e| format!("xDS TLS settings: {e}"))?;
    }
    Ok(e)
}

fn node(s: &XdsSettings) -> Node {
    Node {
        id: s.node_id.clone(),
        cluster: s.node_cluster.clone().unwrap_or_default(),
        metadata: s.node_metadata.as_ref().map(to_struct),
        user_agent_name: "tollgate".to_string(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").to_string(),
        )),
    }
}

fn to_struct(map: &serde_json::Map<String, serde_json::Value>) -> prost_types::Struct {
    use prost_types::value::Kind;
    fn value(v: &serde_json::Value) -> prost_types::Value {
        let kind = match v {
            serde_json::Value::Null => Kind::NullValue(0),
            serde_json::Value::Bool(b) => Kind::BoolValue(*b),
            serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
            serde_json::Value::String(s) => Kind::StringValue(s.clone()),
            serde_json::Value::Array(a) => Kind::ListValue(prost_types::ListValue {
                values: a.iter().map(value).collect(),
            }),
            serde_json::Value::Object(m) => Kind::StructValue(to_struct(m)),
        };
        prost_types::Value { kind: Some(kind) }
    }
    prost_types::Struct {
        fields: map.iter().map(|(k, v)| (k.clone(), value(v))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits are spread between half and all of the current one.
    #[test]
    fn jitter_stays_within_half_and_whole() {
        let wait = Duration::from_millis(1000);
        let waits: Vec<Duration> = (0..200).map(|_| jitter(wait)).collect();
        assert!(waits.iter().all(|w| *w >= wait / 2 && *w <= wait));
        let distinct: std::collections::HashSet<_> = waits.iter().collect();
        assert!(distinct.len() > 20, "{} distinct waits", distinct.len());
    }
}
