//! Rules from xDS: an ADS management server in the test (tonic, with the
//! `envoy-types` discovery service and the `RateLimitConfig` messages
//! written here from their field numbers) serves rule sets to a real
//! tollgate over loopback. Versions are ACKed with their nonce, an invalid
//! set is NACKed with its error while the old rules stay, health waits for
//! the first set, and a server that goes away and comes back is followed.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use support::tollgate::{Tollgate, descriptor as desc};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

// The resource, from its published field numbers.
#[derive(Clone, PartialEq, Message)]
struct RateLimitConfig {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    domain: String,
    #[prost(message, repeated, tag = "3")]
    descriptors: Vec<RateLimitDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
struct RateLimitDescriptor {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    value: String,
    #[prost(message, optional, tag = "3")]
    rate_limit: Option<RateLimitPolicy>,
    #[prost(message, repeated, tag = "4")]
    descriptors: Vec<RateLimitDescriptor>,
    #[prost(bool, tag = "5")]
    shadow_mode: bool,
    #[prost(message, optional, tag = "8")]
    metadata: Option<envoy_types::pb::google::protobuf::Struct>,
}

#[derive(Clone, PartialEq, Message)]
struct RateLimitPolicy {
    /// SECOND=1, MINUTE=2, HOUR=3, DAY=4, MONTH=5, YEAR=6, WEEK=7.
    #[prost(int32, tag = "1")]
    unit: i32,
    #[prost(uint32, tag = "2")]
    requests_per_unit: u32,
    #[prost(bool, tag = "3")]
    unlimited: bool,
    #[prost(string, tag = "4")]
    name: String,
}

const HOUR: i32 = 3;

fn config(domain: &str, key: &str, unit: i32, limit: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: format!("{domain}-rules"),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: key.into(),
            value: String::new(),
            rate_limit: Some(RateLimitPolicy {
                unit,
                requests_per_unit: limit,
                unlimited: false,
                name: String::new(),
            }),
            descriptors: Vec::new(),
            shadow_mode: false,
            metadata: None,
        }],
    }
}

fn response(version: &str, nonce: &str, configs: &[RateLimitConfig]) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.into(),
        resources: configs
            .iter()
            .map(|c| Any {
                type_url: TYPE_URL.into(),
                value: c.encode_to_vec(),
            })
            .collect(),
        type_url: TYPE_URL.into(),
        nonce: nonce.into(),
        ..Default::default()
    }
}

/// The management server: each new stream's sender is handed to the test,
/// and every request it receives is forwarded to the test.
#[derive(Clone)]
struct Ads {
    streams: mpsc::UnboundedSender<mpsc::Sender<Result<DiscoveryResponse, Status>>>,
    requests: mpsc::UnboundedSender<DiscoveryRequest>,
    /// The `authorization` metadata of the latest stream.
    authorization: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(8);
        *self.authorization.lock().unwrap() = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        let _ = self.streams.send(tx);
        let mut inbound = request.into_inner();
        let requests = self.requests.clone();
        tokio::spawn(async move {
            while let Some(Ok(r)) = inbound.next().await {
                let _ = requests.send(r);
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

struct Server {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(addr: SocketAddr, ads: Ads) -> Server {
        Server::start_with(addr, ads, None).await
    }

    /// With `tls`, over mutual TLS.
    async fn start_with(
        addr: SocketAddr,
        ads: Ads,
        tls: Option<tonic::transport::ServerTlsConfig>,
    ) -> Server {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).unwrap();
        }
        let task = tokio::spawn(async move {
            builder
                .add_service(AggregatedDiscoveryServiceServer::new(ads))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                )
                .await
                .unwrap();
        });
        Server {
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>, what: &str) -> T {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no {what} within 20 s"))
        .unwrap()
}

async fn health(t: &Tollgate) -> i32 {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let ch = tonic::transport::Channel::from_shared(format!("http://{}", t.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

fn req(domain: &str, key: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![desc(&[(key, "v")])],
        hits_addend: 0,
    }
}

async fn reloads(t: &Tollgate) -> (u64, u64) {
    let (_, json) = support::http_get(t.debug, "/rlconfig?format=json").await;
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    (
        v["reloads"]["loaded"].as_u64().unwrap(),
        v["reloads"]["refused"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_from_ads_acked_nacked_and_followed_across_restarts() {
    support::away_from_an_hour_boundary().await;
    let addr: SocketAddr = format!("127.0.0.1:{}", support::free_port())
        .parse()
        .unwrap();
    let (streams_tx, mut streams) = mpsc::unbounded_channel();
    let (requests_tx, mut requests) = mpsc::unbounded_channel();
    let ads = Ads {
        streams: streams_tx,
        requests: requests_tx,
        authorization: Default::default(),
    };
    let server = Server::start(addr, ads.clone()).await;
    // A rules directory is given too: with xDS it is not read.
    let t = Tollgate::start(
        &[("files.yaml", "domain: files\ndescriptors:\n  - key: k\n")],
        &[
            ("xds.server_url", &addr.to_string()),
            ("xds.node_id", "tollgate-test-1"),
            ("xds.node_metadata", r#"{"gateway": "eg", "replica": 1}"#),
            ("xds.headers", r#"{"Authorization": "Bearer t0ken"}"#),
            ("xds.retry_initial_ms", "100"),
            ("xds.retry_max_ms", "400"),
        ],
    )
    .await;

    // The subscription: node, type, nothing in force yet.
    let stream = next(&mut streams, "stream").await;
    let first = next(&mut requests, "first request").await;
    assert_eq!(first.type_url, TYPE_URL);
    assert_eq!(first.version_info, "");
    assert_eq!(first.response_nonce, "");
    let node = first.node.expect("a node");
    assert_eq!(node.id, "tollgate-test-1");
    let metadata = node.metadata.expect("node metadata");
    assert!(metadata.fields.contains_key("gateway"), "{metadata:?}");
    assert_eq!(
        ads.authorization.lock().unwrap().as_deref(),
        Some("Bearer t0ken")
    );
    // No rules yet: health says NOT_SERVING (2), and so does the HTTP
    // health check (Envoy Gateway's readiness probe); calls get no limit.
    assert_eq!(health(&t).await, 2);
    let (status, body) = support::http_get(t.http, "/healthcheck").await;
    assert_eq!((status, body.as_str()), (503, "no rules from xDS yet\n"));
    assert!(
        t.ask(req("files", "k")).await.statuses[0]
            .current_limit
            .is_none()
    );

    // Version 1: applied, ACKed with its version and nonce.
    stream
        .send(Ok(response("1", "n1", &[config("x", "k", HOUR, 1)])))
        .await
        .unwrap();
    let ack = next(&mut requests, "ACK of 1").await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("1", "n1")
    );
    assert!(ack.error_detail.is_none());
    t.wait_serving(Duration::from_secs(10)).await;
    assert_eq!(support::http_get(t.http, "/healthcheck").await.0, 200);
    let codes: Vec<i32> = [
        t.ask(req("x", "k")).await.overall_code,
        t.ask(req("x", "k")).await.overall_code,
    ]
    .to_vec();
    assert_eq!(codes, vec![Code::Ok as i32, Code::OverLimit as i32]);

    // Version 2, two domains: ACKed, the new limit in force.
    stream
        .send(Ok(response(
            "2",
            "n2",
            &[config("x", "k", HOUR, 5), config("y", "k", HOUR, 7)],
        )))
        .await
        .unwrap();
    let ack = next(&mut requests, "ACK of 2").await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("2", "n2")
    );
    assert!(ack.error_detail.is_none());
    let r = t.ask(req("y", "k")).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        7
    );

    // Version 3 has no unit: NACKed with the error, version 2 stays.
    stream
        .send(Ok(response("3", "n3", &[config("x", "k", 0, 9)])))
        .await
        .unwrap();
    let nack = next(&mut requests, "NACK of 3").await;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("2", "n3")
    );
    let error = nack.error_detail.expect("the error");
    assert_eq!(error.code, 3);
    assert!(
        error.message.contains("xds/x-rules")
            && error.message.contains("descriptors[0].rate_limit.unit"),
        "{}",
        error.message
    );
    let r = t.ask(req("y", "k")).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        7
    );
    assert_eq!(reloads(&t).await, (2, 1));

    // The server goes away; tollgate keeps answering on version 2.
    drop(stream);
    server.stop().await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let r = t.ask(req("y", "k")).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        7
    );
    // It comes back: a new stream says which version is in force.
    while requests.try_recv().is_ok() {}
    let server = Server::start(addr, ads).await;
    let stream = next(&mut streams, "stream after the restart").await;
    let again = next(&mut requests, "request after the restart").await;
    assert_eq!(again.version_info, "2");
    assert_eq!(again.node.expect("a node").id, "tollgate-test-1");
    stream
        .send(Ok(response("4", "n4", &[config("y", "k", HOUR, 8)])))
        .await
        .unwrap();
    let ack = next(&mut requests, "ACK of 4").await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("4", "n4")
    );
    let r = t.ask(req("y", "k")).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        8
    );
    assert_eq!(reloads(&t).await, (3, 1));
    t.stop().await;
    server.stop().await;
}

/// With `xds.serve_without_config`, health says SERVING before any rules
/// arrive (here: from a server that never answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_without_config_is_an_opt_in() {
    let addr = format!("127.0.0.1:{}", support::free_port());
    let t = Tollgate::start(
        &[],
        &[
            ("xds.server_url", &addr),
            ("xds.serve_without_config", "true"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(10)).await;
    t.stop().await;
}

/// Settings are checked before anything starts.
#[test]
fn bad_xds_settings_are_refused() {
    use tollgate::settings::{Settings, Sources};
    let load = |pairs: &[(&str, &str)]| {
        Settings::load(&Sources {
            overrides: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Sources::default()
        })
    };
    let e = load(&[
        ("xds.server_url", "127.0.0.1:1"),
        ("xds.node_metadata", "[1]"),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("xds.node_metadata"), "{e}");
    let e = load(&[
        ("xds.server_url", "127.0.0.1:1"),
        ("xds.headers", r#"{"bad name": "x"}"#),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("xds.headers"), "{e}");
    // A header's value may be a token: never in errors or Debug output.
    let e = load(&[
        ("xds.server_url", "127.0.0.1:1"),
        ("xds.headers", r#"{"authorization": "s3cret", "x": 1}"#),
    ])
    .unwrap_err();
    assert!(!e.to_string().contains("s3cret"), "{e}");
    let s = load(&[
        ("xds.server_url", "127.0.0.1:1"),
        ("xds.headers", r#"{"authorization": "s3cret"}"#),
    ])
    .unwrap();
    let shown = format!("{:?}", s.xds);
    assert!(
        shown.contains("authorization") && !shown.contains("s3cret"),
        "{shown}"
    );
    let e = load(&[("xds.server_url", "ftp://x:1")]).unwrap_err();
    assert!(e.to_string().contains("xds.server_url"), "{e}");
    let s = load(&[("xds.server_url", "127.0.0.1:18000")]).unwrap();
    let x = s.xds.expect("xds settings");
    assert_eq!(x.url, "http://127.0.0.1:18000");
    assert!(x.tls.is_none());
    let s = load(&[("xds.server_url", "cp.example:443"), ("xds.tls", "true")]).unwrap();
    assert_eq!(s.xds.unwrap().url, "https://cp.example:443");
    assert!(load(&[]).unwrap().xds.is_none());
}

/// The environment Envoy Gateway gives its rate-limit deployment, in
/// tollgate's settings: the management server over mutual TLS with the
/// pod's certificate, the node id Envoy Gateway keys its snapshot by, and
/// health not waiting for the first set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gateway_settings_over_mutual_tls() {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    support::away_from_an_hour_boundary().await;
    let dir = tempfile::tempdir().unwrap();
    let files = support::redis::TlsFiles::generate(dir.path());
    let read = |p: &std::path::Path| std::fs::read(p).unwrap();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            read(&files.server_cert),
            read(&files.server_key),
        ))
        .client_ca_root(Certificate::from_pem(read(&files.ca_cert)));
    let addr: SocketAddr = format!("127.0.0.1:{}", support::free_port())
        .parse()
        .unwrap();
    let (streams_tx, mut streams) = mpsc::unbounded_channel();
    let (requests_tx, mut requests) = mpsc::unbounded_channel();
    let ads = Ads {
        streams: streams_tx,
        requests: requests_tx,
        authorization: Default::default(),
    };
    let server = Server::start_with(addr, ads, Some(tls)).await;
    let path = |p: &std::path::Path| p.display().to_string();
    let t = Tollgate::start(
        &[],
        &[
            ("xds.server_url", &addr.to_string()),
            ("xds.node_id", "envoy-ratelimit"),
            ("xds.tls", "true"),
            ("xds.tls_ca_file", &path(&files.ca_cert)),
            ("xds.tls_cert_file", &path(&files.client_cert)),
            ("xds.tls_key_file", &path(&files.client_key)),
            ("xds.serve_without_config", "true"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(10)).await;
    let stream = next(&mut streams, "stream over mTLS").await;
    let first = next(&mut requests, "first request").await;
    assert_eq!(first.node.unwrap().id, "envoy-ratelimit");
    stream
        .send(Ok(response("1", "n1", &[config("eg", "k", HOUR, 1)])))
        .await
        .unwrap();
    let ack = next(&mut requests, "ACK").await;
    assert!(ack.error_detail.is_none());
    assert_eq!(t.ask(req("eg", "k")).await.overall_code, Code::Ok as i32);
    assert_eq!(
        t.ask(req("eg", "k")).await.overall_code,
        Code::OverLimit as i32
    );
    t.stop().await;
    drop(stream);
    server.stop().await;
}

/// The same protocol against a management server in Python, with
/// envoy-data-plane's discovery messages: the subscription, an ACK and a
/// NACK as a third implementation reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_management_server_sees_acks_and_nacks() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    support::helm::require_python_module("grpc", "grpcio");
    support::helm::require_python_module("envoy_data_plane", "envoy-data-plane");
    support::away_from_an_hour_boundary().await;
    let port = support::free_port();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/python/ads_server.py");
    let mut child = Command::new("python3")
        .arg(script)
        .arg(port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (lines_tx, mut lines) = mpsc::unbounded_channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    assert_eq!(next(&mut lines, "python listening").await, "listening");
    let t = Tollgate::start(
        &[],
        &[
            ("xds.server_url", &format!("127.0.0.1:{port}")),
            ("xds.node_id", "py-node"),
        ],
    )
    .await;
    assert_eq!(
        next(&mut lines, "subscription").await,
        "subscribed node=py-node type=True"
    );
    assert_eq!(
        next(&mut lines, "ACK").await,
        "answer version=1 nonce=n1 error=False"
    );
    assert_eq!(
        next(&mut lines, "NACK").await,
        "answer version=1 nonce=n2 code=3 names-unit=True"
    );
    // Version 1 stays in force: 1 per hour.
    assert_eq!(t.ask(req("py", "k")).await.overall_code, Code::Ok as i32);
    assert_eq!(
        t.ask(req("py", "k")).await.overall_code,
        Code::OverLimit as i32
    );
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success());
    t.stop().await;
}
