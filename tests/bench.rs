//! `tollgate bench` against tollgate itself, in-process on the embedded
//! store: the report adds up, a tight hot-key limit is refused, latency
//! percentiles are ordered; and against a closed port the bench reports
//! errors and ends.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate::bench::{BenchConfig, Load, Report, run};
use tollgate::settings::{Settings, Sources};

// The algorithm is named: a rule without one records refused hits too
// (usage reports), which under a flood admits nothing until the flood
// stops; this bench wants a limit that admits its share while flooded.
const RULES: &str = "\
domain: bench
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: sliding_window_counter}
";

/// A running tollgate; stops when dropped.
struct Server {
    addr: String,
    _stop: oneshot::Sender<()>,
    _rules: tempfile::TempDir,
}

async fn start() -> Server {
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("bench.yaml"), RULES).unwrap();
    let src = Sources {
        overrides: vec![("rules_dir".into(), rules.path().display().to_string())],
        ..Sources::default()
    };
    let settings = Settings::load(&src).unwrap();
    let engine = tollgate::server::build_engine(&settings, Arc::new(tollgate::clock::SystemClock))
        .await
        .unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap().to_string();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        tollgate::server::run(&settings, engine, grpc, http, async {
            let _ = rx.await;
        })
        .await
    });
    Server {
        addr,
        _stop: tx,
        _rules: rules,
    }
}

fn config(addr: &str, load: Load) -> BenchConfig {
    let mut cfg = BenchConfig::new(addr, "bench", vec![vec![("k".into(), "hot".into())]]);
    cfg.load = load;
    cfg.duration = Some(Duration::from_secs(1));
    cfg.warmup = Duration::from_millis(200);
    cfg.connections = 2;
    cfg
}

/// Runs the bench, failing the test if it does not end in `within`.
async fn bench(cfg: &BenchConfig, within: Duration) -> Report {
    tokio::time::timeout(within, run(cfg))
        .await
        .expect("the bench ended in time")
        .expect("the bench started")
}

fn assert_consistent(r: &Report) {
    let text = r.render();
    assert_eq!(r.total(), r.ok + r.over_limit + r.error_count(), "{text}");
    let l = r.latency;
    assert!(l.p50 <= l.p90 && l.p90 <= l.p99, "{text}");
    assert!(l.p99 <= l.p999 && l.p999 <= l.max, "{text}");
    let json = r.to_json();
    assert!(!json.contains('\n'), "{json}");
    assert!(
        json.contains(&format!("\"requests\":{}", r.total())),
        "{json}"
    );
}

/// 1 s of a 100/s hot key: some calls pass, most are refused, none fail.
fn assert_hot_key(r: &Report) {
    let text = r.render();
    assert_consistent(r);
    assert!(r.ok > 0, "{text}");
    assert!(r.over_limit > 0, "{text}");
    assert_eq!(r.error_count(), 0, "{text}");
    assert!(r.latency.p50 > 0, "{text}");
    // 100/s over a measured ~1 s (plus the warm-up's window): never 300.
    assert!(r.ok < 300, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_on_a_hot_key() {
    let server = start().await;
    let cfg = config(&server.addr, Load::Closed { concurrency: 8 });
    let r = bench(&cfg, Duration::from_secs(20)).await;
    assert_hot_key(&r);
    assert!(r.total() > 300, "{}", r.render());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_on_a_hot_key() {
    let server = start().await;
    let cfg = config(
        &server.addr,
        Load::Open {
            rate: 500.0,
            max_in_flight: 100,
        },
    );
    let r = bench(&cfg, Duration::from_secs(20)).await;
    assert_hot_key(&r);
    // The timetable sends 500/s whatever the answers; allow for the
    // boundary and a few drops on a loaded test machine.
    assert!((400..=510).contains(&r.total()), "{}", r.render());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_count_bounds_the_run() {
    let server = start().await;
    let mut cfg = config(&server.addr, Load::Closed { concurrency: 4 });
    cfg.duration = None;
    cfg.requests = Some(250);
    cfg.warmup = Duration::ZERO;
    cfg.keys = 50;
    let r = bench(&cfg, Duration::from_secs(20)).await;
    assert_consistent(&r);
    assert_eq!(r.total(), 250, "{}", r.render());
    // 50 keys of 100/s each: 5 calls per key never reach the limit.
    assert_eq!((r.ok, r.over_limit), (250, 0), "{}", r.render());
}

async fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_port_reports_errors_and_ends() {
    let addr = closed_port().await;
    for load in [
        Load::Closed { concurrency: 4 },
        Load::Open {
            rate: 200.0,
            max_in_flight: 10,
        },
    ] {
        let mut cfg = config(&addr, load);
        cfg.timeout = Duration::from_millis(200);
        let r = bench(&cfg, Duration::from_secs(10)).await;
        assert_consistent(&r);
        assert_eq!((r.ok, r.over_limit), (0, 0), "{}", r.render());
        assert!(r.error_count() > 0, "{}", r.render());
        assert!(r.errors.contains_key("UNAVAILABLE"), "{}", r.render());
    }
}

#[tokio::test]
async fn a_bad_address_does_not_start() {
    let cfg = config("not an address", Load::Closed { concurrency: 1 });
    assert!(run(&cfg).await.is_err());
}
