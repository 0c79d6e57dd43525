//! What the quota service costs the server: 10 streams × 1,000 buckets
//! reporting every 5 s (Envoy's interval) against the real binary, on the
//! embedded store and on Redis; prints the CPU of tollgate and of
//! redis-server per second of wall time. A measurement, not part of the
//! suite (`--ignored`); `BENCH_BIN=target/release/tollgate` measures a
//! release build (docs/src/benchmarks/choices.md, RLQS).
//!
//!     cargo test --test rlqs_cost -- --ignored --nocapture

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use support::free_port;
use support::redis::RedisServer;
use tokio::sync::mpsc;
use tonic::Streaming;

const STREAMS: usize = 10;
const BUCKETS: usize = 1_000;
const ROUNDS: u32 = 6;
const EVERY: Duration = Duration::from_secs(5);

const RULES: &str = r#"
domain: cost
descriptors:
  - key: route
    value: api
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 1000}
"#;

fn ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at ")".
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line.
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn clock_ticks_per_second() -> u64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

struct Server {
    child: Child,
    grpc: u16,
    _rules: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(store: &str) -> Server {
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("cost.yaml"), RULES).unwrap();
    let bin = std::env::var("BENCH_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| support::process::tollgate_bin());
    let grpc = free_port();
    let child = Command::new(bin)
        .arg("serve")
        .env_clear()
        .env("TOLLGATE_GRPC_ADDR", format!("127.0.0.1:{grpc}"))
        .env("TOLLGATE_HTTP_ADDR", format!("127.0.0.1:{}", free_port()))
        .env("TOLLGATE_DEBUG_ADDR", "off")
        .env("TOLLGATE_RULES_DIR", rules.path())
        .env("TOLLGATE_STORE", store)
        .env("TOLLGATE_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Server {
        child,
        grpc,
        _rules: rules,
    }
}

struct Stream {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: Streaming<RateLimitQuotaResponse>,
    ids: Vec<BucketId>,
}

async fn open(port: u16, stream: usize) -> Stream {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut client = loop {
        match RateLimitQuotaServiceClient::connect(format!("http://127.0.0.1:{port}")).await {
            Ok(c) => break c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("tollgate did not start: {e}"),
        }
    };
    let (tx, rx) = mpsc::channel(4);
    let rx = client
        .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // Each stream reports the same 1,000 tenants: every ledger has ten
    // holders, as with ten Envoys behind one load balancer.
    let _ = stream;
    let ids = (0..BUCKETS)
        .map(|j| BucketId {
            bucket: [
                ("route".to_string(), "api".to_string()),
                ("tenant".to_string(), format!("t{j}")),
            ]
            .into_iter()
            .collect(),
        })
        .collect();
    Stream { tx, rx, ids }
}

impl Stream {
    async fn report(&mut self, round: u32) -> Duration {
        let usages = self
            .ids
            .iter()
            .enumerate()
            .map(|(j, id)| BucketQuotaUsage {
                bucket_id: Some(id.clone()),
                time_elapsed: Some(PbDuration {
                    seconds: if round == 0 { 0 } else { 5 },
                    nanos: 0,
                }),
                num_requests_allowed: (j as u64 * 7 + u64::from(round)) % 500,
                num_requests_denied: 0,
            })
            .collect();
        let started = Instant::now();
        self.tx
            .send(RateLimitQuotaUsageReports {
                domain: "cost".into(),
                bucket_quota_usages: usages,
            })
            .await
            .unwrap();
        let response = tokio::time::timeout(Duration::from_secs(30), self.rx.message())
            .await
            .expect("an answer within 30 s")
            .unwrap()
            .unwrap();
        assert_eq!(response.bucket_action.len(), BUCKETS);
        started.elapsed()
    }
}

async fn measure(name: &str, store: &str, redis_pid: Option<u32>) {
    let server = start(store);
    let pid = server.child.id();
    let mut streams = Vec::new();
    for s in 0..STREAMS {
        streams.push(open(server.grpc, s).await);
    }
    // The subscribing round, not measured.
    for s in &mut streams {
        s.report(0).await;
    }
    let hz = clock_ticks_per_second();
    let (t0, r0) = (ticks(pid), redis_pid.map(ticks));
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for round in 1..=ROUNDS {
        let tick = started + EVERY * (round - 1);
        tokio::time::sleep_until(tick.into()).await;
        // The ten Envoys report at the same moment: the worst case.
        let times =
            futures_util::future::join_all(streams.iter_mut().map(|s| s.report(round))).await;
        slowest = slowest.max(times.into_iter().max().unwrap());
    }
    tokio::time::sleep_until((started + EVERY * ROUNDS).into()).await;
    let wall = started.elapsed().as_secs_f64();
    let cpu = (ticks(pid) - t0) as f64 / hz as f64;
    let reports = f64::from(ROUNDS) * STREAMS as f64;
    let leases = reports * BUCKETS as f64;
    let mut line = format!(
        "{name}: {STREAMS} streams x {BUCKETS} buckets every {}s, {wall:.1}s: tollgate {:.2}% of a core ({:.1} us per bucket report), slowest report answered in {:.0} ms",
        EVERY.as_secs(),
        100.0 * cpu / wall,
        1e6 * cpu / leases,
        slowest.as_secs_f64() * 1e3,
    );
    if let (Some(rpid), Some(r0)) = (redis_pid, r0) {
        let rcpu = (ticks(rpid) - r0) as f64 / hz as f64;
        line.push_str(&format!(
            "; redis-server {:.2}% of a core ({:.1} us per lease)",
            100.0 * rcpu / wall,
            1e6 * rcpu / leases
        ));
    }
    println!("{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: 35 s of wall time per store"]
async fn ten_streams_of_a_thousand_buckets() {
    measure("memory", "memory", None).await;
    let redis = RedisServer::start();
    let rpid = redis_pid(redis.port());
    measure("redis", &redis.url(), Some(rpid)).await;
}

/// The pid of the redis-server listening on `port`.
fn redis_pid(port: u16) -> u32 {
    let info = support::redis::cli(port, &["INFO", "server"]);
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
