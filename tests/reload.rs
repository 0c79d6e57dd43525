//! Rule reloads that cannot hurt the server: files nested far too deep are
//! refused (by a running server and by `tollgate validate`) without a stack
//! overflow; a symlink loop in the rules directory costs no CPU or memory
//! and later edits still apply; a file caught mid-write is never applied;
//! a ConfigMap's atomic swap is. Real files, real gRPC, the real binary
//! where the process is what is measured.

mod support;

use support::free_port;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::process::{Proc, tollgate_bin};
use support::tollgate::{Tollgate, descriptor};
use tonic::transport::Channel;

/// One rule file: `domain`, a descriptor `key` limited to `rpu` per hour.
fn rule_file(domain: &str, key: &str, rpu: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: {key}\n    rate_limit: {{unit: hour, requests_per_unit: {rpu}}}\n"
    )
}

/// A file of `depth` levels of block mappings, one space of indentation
/// per level (as in `tests/rules.rs`): the 65th level starts on line 66.
fn block_mappings(depth: usize) -> String {
    let mut text = String::from("domain: deep\n");
    for level in 0..depth - 1 {
        text.push_str(&" ".repeat(level));
        text.push_str("n:\n");
    }
    text.push_str(&" ".repeat(depth - 1));
    text.push_str("n: end\n");
    text
}

/// Flow lists `depth` deep, on line 2.
fn flow_lists(depth: usize) -> String {
    format!(
        "domain: deep\ndescriptors: {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

/// The limit (requests per unit) the server gives `key` of `domain`;
/// `None` when it answers without one. Panics if it does not answer within
/// 10 s.
async fn limit_of(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    key: &str,
) -> Option<u32> {
    let call = client.should_rate_limit(RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![descriptor(&[(key, "v")])],
        hits_addend: 0,
    });
    let response = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the server answers within 10 s")
        .expect("the server answers")
        .into_inner();
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

/// Asks until the limit is `want`, for up to `within`.
async fn wait_for_limit(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    key: &str,
    want: u32,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let now = limit_of(client, domain, key).await;
        if now == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{domain}/{key} still limited to {now:?}, not {want}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The reload counts `/rlconfig` reports: (loaded, refused).
async fn reload_counts(debug: SocketAddr) -> (u64, u64) {
    let (status, body) = support::http_get(debug, "/rlconfig?format=json").await;
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let count = |name: &str| {
        json["reloads"][name]
            .as_u64()
            .unwrap_or_else(|| panic!("no reloads.{name} in {body}"))
    };
    (count("reloaded"), count("refused"))
}

/// Waits until at least `n` reloads were refused.
async fn wait_for_refusals(debug: SocketAddr, n: u64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (_, refused) = reload_counts(debug).await;
        if refused >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{refused} refusals after {within:?}, expected {n}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Files nested 1,500 and 5,000 levels deep, block and flow, dropped into
/// a running server's rules directory: each is refused and counted, the
/// server keeps answering with its old rules, and a good edit afterwards
/// still applies. Before the depth bound, the first one overflowed the
/// reload task's stack and aborted the process.
#[tokio::test]
async fn deep_files_are_refused_and_the_old_rules_stay() {
    let t = Tollgate::start(&[("keep.yaml", &rule_file("keep", "k", 5))], &[]).await;
    let mut client = t.client().await;
    assert_eq!(limit_of(&mut client, "keep", "k").await, Some(5));

    let deep = t.rules.path().join("deep.yaml");
    for (n, text) in [block_mappings(1500), block_mappings(5000), flow_lists(5000)]
        .iter()
        .enumerate()
    {
        std::fs::write(&deep, text).unwrap();
        wait_for_refusals(t.debug, n as u64 + 1, Duration::from_secs(20)).await;
        assert!(!t.is_stopped(), "the server is still running");
        assert_eq!(limit_of(&mut client, "keep", "k").await, Some(5));
        assert_eq!(limit_of(&mut client, "deep", "n").await, None);
    }
    // A poll may also have caught a file half written, refused as well.
    let (loaded, refused) = reload_counts(t.debug).await;
    assert_eq!(loaded, 0);
    assert!(refused >= 3, "{refused}");

    // The watcher still works.
    std::fs::remove_file(&deep).unwrap();
    std::fs::write(t.rules.path().join("keep.yaml"), rule_file("keep", "k", 6)).unwrap();
    wait_for_limit(&mut client, "keep", "k", 6, Duration::from_secs(20)).await;
    t.stop().await;
}

/// `tollgate validate` (the real binary) on files 1,500 and 5,000 levels
/// deep: it exits 1 (not by a signal) and names each file and line. Its
/// main thread overflowed at 5,000 levels before.
#[test]
fn validate_refuses_deep_files_without_crashing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("deep_1500.yaml"), block_mappings(1500)).unwrap();
    std::fs::write(dir.path().join("deep_5000.yaml"), block_mappings(5000)).unwrap();
    std::fs::write(dir.path().join("flow_5000.yaml"), flow_lists(5000)).unwrap();
    std::fs::write(dir.path().join("fine.yaml"), rule_file("fine", "k", 1)).unwrap();
    let out = Command::new(tollgate_bin())
        .args(["validate", &dir.path().display().to_string()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
    for (file, line) in [
        ("deep_1500.yaml", 66),
        ("deep_5000.yaml", 66),
        ("flow_5000.yaml", 2),
    ] {
        let want = format!("{}:{line}: ", dir.path().join(file).display());
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&want) && l.ends_with(": nested deeper than 64 levels")),
            "no {want}...nested deeper than 64 levels in:\n{stderr}"
        );
    }
    assert!(stderr.contains("3 error(s)"), "{stderr}");
}

/// User plus system CPU time of process `pid` so far.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses and may
    // hold spaces: state is the first, utime the 12th and stime the 13th.
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .expect("a /proc stat line")
        .1
        .split(' ')
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_secs_f64(ticks as f64 / clock_ticks_per_second() as f64)
}

fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        // Linux's USER_HZ everywhere it runs today.
        .unwrap_or(100)
}

/// Resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in:\n{status}"))
}

/// A symlink loop (`a -> .`, `b -> .`) in the rules directory of a running
/// `tollgate serve` polling every 50 ms: over 8 s its CPU time and resident
/// memory stay flat, and an edit elsewhere in the directory still applies.
/// Before, the watcher's walk never ended: a core at 100%, memory growing,
/// edits never seen.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_loop_costs_nothing_and_edits_still_apply() {
    use std::os::unix::fs::symlink;
    let rules = tempfile::tempdir().unwrap();
    std::fs::write(rules.path().join("limits.yaml"), rule_file("loop", "k", 5)).unwrap();
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let debug = format!("127.0.0.1:{}", free_port());
    let dir = rules.path().display().to_string();
    let server = Proc::spawn(
        &["serve"],
        &[
            ("TOLLGATE_GRPC_ADDR", grpc.as_str()),
            ("TOLLGATE_HTTP_ADDR", http.as_str()),
            ("TOLLGATE_DEBUG_ADDR", debug.as_str()),
            ("TOLLGATE_RULES_DIR", dir.as_str()),
            ("TOLLGATE_RULES_RELOAD_MS", "50"),
            ("TOLLGATE_SHUTDOWN_DRAIN_MS", "0"),
        ],
    );
    let pid = server.child.id();
    let grpc: SocketAddr = grpc.parse().unwrap();
    let debug: SocketAddr = debug.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut client = loop {
        if let Ok(c) = RateLimitServiceClient::connect(format!("http://{grpc}")).await {
            break c;
        }
        assert!(Instant::now() < deadline, "tollgate never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(limit_of(&mut client, "loop", "k").await, Some(5));

    symlink(".", rules.path().join("a")).unwrap();
    symlink(".", rules.path().join("b")).unwrap();
    // A few polls walk the loop before the measurement starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (cpu_before, rss_before, started) = (cpu_time(pid), rss_kib(pid), Instant::now());

    std::fs::write(rules.path().join("limits.yaml"), rule_file("loop", "k", 7)).unwrap();
    wait_for_limit(&mut client, "loop", "k", 7, Duration::from_secs(7)).await;
    let window = Duration::from_secs(8);
    tokio::time::sleep(window.saturating_sub(started.elapsed())).await;

    let elapsed = started.elapsed();
    let cpu = cpu_time(pid) - cpu_before;
    let rss_after = rss_kib(pid);
    eprintln!(
        "symlink loop: {cpu:?} CPU in {elapsed:?}; VmRSS {rss_before} KiB -> {rss_after} KiB"
    );
    // An idle server polling a small directory 20 times a second uses a
    // few percent of a core at most, even on a busy machine; the old walk
    // used all of one.
    assert!(
        cpu < elapsed / 5,
        "{cpu:?} of CPU in {elapsed:?} with a symlink loop in the rules directory"
    );
    assert!(
        rss_after < rss_before + 16 * 1024,
        "resident memory grew from {rss_before} KiB to {rss_after} KiB"
    );
    assert_eq!(reload_counts(debug).await, (1, 0), "one edit, one reload");
    drop(server);
}

/// A rule file rewritten slowly, as a copy over a slow disk or a network
/// mount would: truncated to `domain: half\ndescriptors:` (a valid empty
/// domain), then one descriptor appended every 10 ms for about six polls,
/// the guarded one last. Every state on the way is a valid file without
/// the guarded limit, and each lasts less than a poll. Checks hammered at
/// the server throughout all carry the limit, old or new: no state on the
/// way was applied, and exactly one reload (the finished file) happened.
#[tokio::test]
async fn half_written_file_is_never_applied() {
    let t = Tollgate::start(
        &[("half.yaml", &rule_file("half", "guarded", 1000))],
        &[("rules_reload_ms", "100")],
    )
    .await;
    let mut client = t.client().await;
    assert_eq!(limit_of(&mut client, "half", "guarded").await, Some(1000));

    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(AtomicU64::new(0));
    let hammer = {
        let (stop, answers, mut client) = (stop.clone(), answers.clone(), t.client().await);
        tokio::spawn(async move {
            let mut without = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match limit_of(&mut client, "half", "guarded").await {
                    Some(1000 | 2000) => {}
                    other => without.push(other),
                }
                answers.fetch_add(1, Ordering::Relaxed);
            }
            without
        })
    };

    let path = t.rules.path().join("half.yaml");
    let started = Instant::now();
    std::fs::write(&path, "domain: half\ndescriptors:\n").unwrap();
    for i in 0..60 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        append(
            &path,
            &format!("  - key: filler{i}\n    rate_limit: {{unit: hour, requests_per_unit: 1}}\n"),
        );
    }
    let written_in = started.elapsed();
    append(
        &path,
        "  - key: guarded\n    rate_limit: {unit: hour, requests_per_unit: 2000}\n",
    );
    wait_for_limit(
        &mut client,
        "half",
        "guarded",
        2000,
        Duration::from_secs(20),
    )
    .await;
    // A little longer: a wrongly applied state would show in the answers.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let without = hammer.await.unwrap();

    let answered = answers.load(Ordering::Relaxed);
    eprintln!("half-written file: {answered} answers while it was written in {written_in:?}");
    assert!(
        written_in > Duration::from_millis(200),
        "the write spans polls"
    );
    assert!(answered >= 20, "only {answered} checks during the write");
    assert!(
        without.is_empty(),
        "{} of {answered} answers without the guarded limit, the first {:?}",
        without.len(),
        &without[..without.len().min(5)]
    );
    assert_eq!(
        reload_counts(t.debug).await,
        (1, 0),
        "only the finished file"
    );
    t.stop().await;
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    // One write call, so a poll sees whole descriptors.
    f.write_all(text.as_bytes()).unwrap();
}

/// A Kubernetes ConfigMap mount, swapped as the kubelet does: a new
/// timestamped directory, a new `..data` link renamed over the old one,
/// the old directory removed. The walks still follow the links, the new
/// limit applies, and the domain is loaded once.
#[cfg(unix)]
#[tokio::test]
async fn configmap_swap_is_applied() {
    use std::os::unix::fs::symlink;
    let t = Tollgate::start(&[], &[]).await;
    let mut client = t.client().await;
    // The watcher starts with the server: the mount is made after it looked.
    assert_eq!(limit_of(&mut client, "cm", "k").await, None);
    let root = t.rules.path();
    let first = root.join("..2026_01_01_00_00_00.000000001");
    std::fs::create_dir(&first).unwrap();
    std::fs::write(first.join("limits.yaml"), rule_file("cm", "k", 5)).unwrap();
    symlink(first.file_name().unwrap(), root.join("..data")).unwrap();
    symlink("..data/limits.yaml", root.join("limits.yaml")).unwrap();
    wait_for_limit(&mut client, "cm", "k", 5, Duration::from_secs(20)).await;

    let second = root.join("..2026_01_01_00_01_00.000000002");
    std::fs::create_dir(&second).unwrap();
    std::fs::write(second.join("limits.yaml"), rule_file("cm", "k", 7)).unwrap();
    symlink(second.file_name().unwrap(), root.join("..data_tmp")).unwrap();
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    std::fs::remove_dir_all(&first).unwrap();
    wait_for_limit(&mut client, "cm", "k", 7, Duration::from_secs(20)).await;

    let (_, text) = support::http_get(t.debug, "/rlconfig").await;
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("cm.k: 7/hour"), "{text}");
    assert_eq!(reload_counts(t.debug).await.1, 0);
    t.stop().await;
}

/// The watcher's fingerprint over a symlink loop ends at once and lists
/// each file once, hidden ones included.
#[cfg(unix)]
#[test]
fn fingerprint_of_a_symlink_loop_lists_each_file_once() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("r.yaml"), rule_file("r", "k", 1)).unwrap();
    std::fs::create_dir(dir.path().join(".hidden")).unwrap();
    std::fs::write(dir.path().join(".hidden/x"), "x").unwrap();
    symlink(".", dir.path().join("a")).unwrap();
    symlink(".", dir.path().join("b")).unwrap();
    symlink("..", dir.path().join(".hidden/up")).unwrap();
    // On a thread, so that a walk that never ends fails the test rather
    // than hanging it.
    let (done, result) = std::sync::mpsc::channel();
    let root = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let _ = done.send(tollgate::reload::fingerprint(&root));
    });
    let files = result
        .recv_timeout(Duration::from_secs(10))
        .expect("the fingerprint is done within 10 s")
        .unwrap();
    let paths: Vec<_> = files.iter().map(|(p, _, _)| p.clone()).collect();
    assert_eq!(
        paths,
        [dir.path().join(".hidden/x"), dir.path().join("r.yaml")]
    );
}

/// A bad `unit_multiplier` is an operator's mistake with a file and line,
/// wherever rules are read: `serve` does not start on it (exit 1, the
/// error logged once), and a running server refuses the edit, logs the
/// same error and keeps the rules it had; a good multiplier then applies
/// (a window of 2 hours answers with its unit, HOUR).
#[tokio::test]
async fn a_bad_unit_multiplier_is_refused_at_start_and_on_reload() {
    let bad = "domain: mult\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: 9\n      unit_multiplier: 0\n";
    let good = |rpu: u32| {
        format!(
            "domain: mult\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: {rpu}\n      unit_multiplier: 2\n      algorithm: fixed_window\n"
        )
    };
    let error =
        "limits.yaml:7: descriptors[0].rate_limit.unit_multiplier: invalid unit multiplier of 0";
    let rules = tempfile::tempdir().unwrap();
    let file = rules.path().join("limits.yaml");
    let grpc = format!("127.0.0.1:{}", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let debug = format!("127.0.0.1:{}", free_port());
    let dir = rules.path().display().to_string();
    let env = [
        ("TOLLGATE_GRPC_ADDR", grpc.as_str()),
        ("TOLLGATE_HTTP_ADDR", http.as_str()),
        ("TOLLGATE_DEBUG_ADDR", debug.as_str()),
        ("TOLLGATE_RULES_DIR", dir.as_str()),
        ("TOLLGATE_RULES_RELOAD_MS", "50"),
        ("TOLLGATE_SHUTDOWN_DRAIN_MS", "0"),
    ];

    std::fs::write(&file, bad).unwrap();
    let mut refused = Proc::spawn(&["serve"], &env);
    let status = refused.child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{:#?}", refused.lines());
    refused.wait_for_line(error, Duration::from_secs(10));

    std::fs::write(&file, good(5)).unwrap();
    let server = Proc::spawn(&["serve"], &env);
    let grpc: SocketAddr = grpc.parse().unwrap();
    let debug: SocketAddr = debug.parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut client = loop {
        if let Ok(c) = RateLimitServiceClient::connect(format!("http://{grpc}")).await {
            break c;
        }
        assert!(Instant::now() < deadline, "tollgate never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(limit_of(&mut client, "mult", "k").await, Some(5));

    std::fs::write(&file, bad).unwrap();
    wait_for_refusals(debug, 1, Duration::from_secs(20)).await;
    server.wait_for_line(error, Duration::from_secs(10));
    assert_eq!(limit_of(&mut client, "mult", "k").await, Some(5));

    std::fs::write(&file, good(6)).unwrap();
    wait_for_limit(&mut client, "mult", "k", 6, Duration::from_secs(20)).await;
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: "mult".into(),
            descriptors: vec![descriptor(&[("k", "v")])],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let limit = response.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        limit.unit,
        envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit::Hour
            as i32
    );
    // The rest of a 2-hour window, aligned on even hours since the epoch.
    let reset = response.statuses[0]
        .duration_until_reset
        .as_ref()
        .unwrap()
        .seconds as u64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expected = 7_200 - now % 7_200;
    assert!(
        reset.abs_diff(expected) <= 2,
        "reset {reset} s, expected {expected}"
    );
    drop(server);
}
