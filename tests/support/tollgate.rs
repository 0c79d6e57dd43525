//! A tollgate server in-process on loopback port 0, for end-to-end tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate::clock::SystemClock;
use tollgate::settings::{Settings, Sources};
use tonic::transport::{Channel, ClientTlsConfig};

pub struct Tollgate {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    /// The debug listener (`/rlconfig`, `/debug/hotkeys`, `/debug/rlqs`).
    pub debug: SocketAddr,
    pub rules: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Tollgate {
    /// Starts tollgate on loopback port 0 with `files` (name, YAML) as rules
    /// and extra settings as `(name, value)` overrides.
    pub async fn start(files: &[(&str, &str)], settings: &[(&str, &str)]) -> Tollgate {
        let rules = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(rules.path().join(name), text).unwrap();
        }
        let mut overrides = vec![
            ("rules_dir".to_string(), rules.path().display().to_string()),
            ("rules_reload_ms".to_string(), "50".to_string()),
            // Tests stop servers at once; the drain has its own test.
            ("shutdown_drain_ms".to_string(), "0".to_string()),
        ];
        overrides.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let settings = Settings::load(&Sources {
            overrides,
            ..Sources::default()
        })
        .unwrap();
        let engine = tollgate::server::build_engine(&settings, Arc::new(SystemClock))
            .await
            .unwrap();
        let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let debug = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (grpc_addr, http_addr) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
        let debug_addr = debug.local_addr().unwrap();
        let grpc_uds = settings
            .grpc_uds
            .as_deref()
            .map(|p| tollgate::server::bind_uds(p).unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let listeners = tollgate::server::Listeners {
                grpc: Some(grpc),
                http,
                debug: Some(debug),
                grpc_uds,
            };
            tollgate::server::run_with(&settings, engine, listeners, async {
                let _ = stopped.await;
            })
            .await
        });
        Tollgate {
            grpc: grpc_addr,
            http: http_addr,
            debug: debug_addr,
            rules,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    /// A client over TLS (to `https://127.0.0.1:port`, so the server's
    /// certificate must name that address). Fails when the handshake does.
    pub async fn client_tls(
        &self,
        tls: ClientTlsConfig,
    ) -> Result<RateLimitServiceClient<Channel>, tonic::transport::Error> {
        let channel = Channel::from_shared(format!("https://{}", self.grpc))
            .expect("a valid URI")
            .tls_config(tls)?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(5))
            .connect()
            .await?;
        Ok(RateLimitServiceClient::new(channel))
    }

    pub async fn ask(&self, req: RateLimitRequest) -> RateLimitResponse {
        self.client()
            .await
            .should_rate_limit(req)
            .await
            .unwrap()
            .into_inner()
    }

    /// `n` replicas on the same rules and settings (so the same store),
    /// each SERVING.
    pub async fn start_replicas(
        n: usize,
        files: &[(&str, &str)],
        settings: &[(&str, &str)],
    ) -> Vec<Tollgate> {
        let mut replicas = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Tollgate::start(files, settings).await;
            t.wait_serving(Duration::from_secs(20)).await;
            replicas.push(t);
        }
        replicas
    }

    /// Waits until health says SERVING (the store is ready).
    pub async fn wait_serving(&self, timeout: Duration) {
        use tonic_health::pb::health_check_response::ServingStatus;
        use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(ch) = Channel::from_shared(format!("http://{}", self.grpc))
                .expect("a valid URI")
                .connect()
                .await
                && let Ok(r) = HealthClient::new(ch)
                    .check(HealthCheckRequest {
                        service: "ratelimit".into(),
                    })
                    .await
                && r.into_inner().status == ServingStatus::Serving as i32
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "tollgate at {} not SERVING within {timeout:?}",
                self.grpc
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends the shutdown signal (as SIGTERM would) without waiting.
    pub fn begin_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Whether the server task has ended.
    pub fn is_stopped(&self) -> bool {
        self.task.as_ref().is_none_or(|t| t.is_finished())
    }

    pub async fn stop(mut self) {
        self.begin_stop();
        tokio::time::timeout(Duration::from_secs(10), self.task.take().unwrap())
            .await
            .expect("tollgate stops within its grace period")
            .unwrap()
            .unwrap();
    }
}

/// A descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}
