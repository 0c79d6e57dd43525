//! `tollgate bench` against tollgate itself (in-process, on the embedded
//! store), run as the real binary and read from its JSON report: the report
//! adds up, a tight hot-key limit is refused, latency percentiles are
//! ordered; against a closed port the bench reports errors and ends; a bad
//! address does not start.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::sync::oneshot;
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

/// How the load is offered: the flags that choose it.
fn closed(concurrency: usize) -> Vec<String> {
    vec!["--concurrency".into(), concurrency.to_string()]
}

fn open(rate: f64, max_in_flight: usize) -> Vec<String> {
    vec![
        "--rate".into(),
        rate.to_string(),
        "--max-in-flight".into(),
        max_in_flight.to_string(),
    ]
}

/// `tollgate bench` on a hot key for 1 s after 200 ms of warm-up, over 2
/// connections, with `load` and then `extra` flags.
fn args(addr: &str, load: &[String], extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "bench",
        "--addr",
        addr,
        "--domain",
        "bench",
        "--descriptor",
        "k=hot",
        "--duration",
        "1",
        "--warmup",
        "0.2",
        "--connections",
        "2",
        "--json",
    ]
    .map(String::from)
    .to_vec();
    args.extend_from_slice(load);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// What the binary said and how it exited.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs the binary, failing the test if it does not end in `within`.
async fn tollgate(args: &[String], within: Duration) -> Run {
    let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(within, child.wait_with_output())
        .await
        .expect("the bench ended in time")
        .unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The report of a bench that started: exit 0 and one line of JSON.
async fn bench(args: &[String], within: Duration) -> Value {
    let run = tollgate(args, within).await;
    assert_eq!(run.code, Some(0), "the bench started: {}", run.stderr);
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    serde_json::from_str(&run.stdout).unwrap()
}

fn n(r: &Value, field: &str) -> u64 {
    r[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {r}"))
}

fn assert_consistent(r: &Value) {
    let errors: u64 = r["errors_by_code"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(n(r, "errors"), errors, "{r}");
    assert_eq!(
        n(r, "requests"),
        n(r, "ok") + n(r, "over_limit") + n(r, "errors"),
        "{r}"
    );
    let l = &r["latency_us"];
    let [p50, p90, p99, p999, max] = ["p50", "p90", "p99", "p999", "max"].map(|p| n(l, p));
    assert!(p50 <= p90 && p90 <= p99, "{r}");
    assert!(p99 <= p999 && p999 <= max, "{r}");
}

/// 1 s of a 100/s hot key: some calls pass, most are refused, none fail.
fn assert_hot_key(r: &Value) {
    assert_consistent(r);
    assert!(n(r, "ok") > 0, "{r}");
    assert!(n(r, "over_limit") > 0, "{r}");
    assert_eq!(n(r, "errors"), 0, "{r}");
    assert!(n(&r["latency_us"], "p50") > 0, "{r}");
    // 100/s over a measured ~1 s (plus the warm-up's window): never 300.
    assert!(n(r, "ok") < 300, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_on_a_hot_key() {
    let server = start().await;
    let r = bench(
        &args(&server.addr, &closed(8), &[]),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(r["mode"], "closed", "{r}");
    assert_eq!(n(&r, "concurrency"), 8, "{r}");
    assert_hot_key(&r);
    assert!(n(&r, "requests") > 300, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_on_a_hot_key() {
    let server = start().await;
    let r = bench(
        &args(&server.addr, &open(500.0, 100), &[]),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(r["mode"], "open", "{r}");
    assert_eq!(n(&r, "max_in_flight"), 100, "{r}");
    assert_hot_key(&r);
    // The timetable sends 500/s whatever the answers; allow for the
    // boundary and a few drops on a loaded test machine.
    assert!((400..=510).contains(&n(&r, "requests")), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_count_bounds_the_run() {
    let server = start().await;
    // --requests without --duration: the count alone ends the run.
    let mut args = args(
        &server.addr,
        &closed(4),
        &["--requests", "250", "--keys", "50"],
    );
    let at = args.iter().position(|a| a == "--duration").unwrap();
    args.drain(at..at + 2);
    let at = args.iter().position(|a| a == "--warmup").unwrap();
    args[at + 1] = "0".into();
    let r = bench(&args, Duration::from_secs(20)).await;
    assert_consistent(&r);
    assert_eq!(n(&r, "requests"), 250, "{r}");
    assert_eq!(n(&r, "keys"), 50, "{r}");
    // 50 keys of 100/s each: 5 calls per key never reach the limit.
    assert_eq!((n(&r, "ok"), n(&r, "over_limit")), (250, 0), "{r}");
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
    for load in [closed(4), open(200.0, 10)] {
        let r = bench(
            &args(&addr, &load, &["--timeout-ms", "200"]),
            Duration::from_secs(10),
        )
        .await;
        assert_consistent(&r);
        assert_eq!((n(&r, "ok"), n(&r, "over_limit")), (0, 0), "{r}");
        assert!(n(&r, "errors") > 0, "{r}");
        assert!(r["errors_by_code"].get("UNAVAILABLE").is_some(), "{r}");
    }
}

#[tokio::test]
async fn a_bad_address_does_not_start() {
    let run = tollgate(
        &args("not an address", &closed(1), &[]),
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(run.code, Some(1), "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stdout, "", "no report");
    assert!(
        run.stderr
            .starts_with("tollgate bench: --addr not an address"),
        "{}",
        run.stderr
    );
}
