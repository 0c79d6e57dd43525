//! The N-bucket sliding window counter: a scripted Poisson sequence over
//! real gRPC on a real Redis, and the shipped simulation's table, read from
//! `tollgate simulate`.

mod support;
// The simulation's own arrival times and trailing-window count, so the
// scripted traffic is made and measured as the simulation's is.
#[path = "../src/cmd/simulate/timeline.rs"]
mod timeline;

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::redis::RedisServer;
use support::tollgate::{Tollgate, descriptor};
use support::unique_domain;
use timeline::{max_in_trailing_window, poisson_arrivals};

const LIMIT: u64 = 100;
const SECOND: u64 = 1_000_000;

/// Poisson arrivals at twice the limit (fixed seed) for a few seconds,
/// each call deciding a 60-bucket and a 2-bucket counter on the same
/// timeline. The 60-bucket one never admits more than 1.05x the limit in
/// any true trailing second. Times are this process's: Redis decides each
/// call within its round trip, so the bound is checked on the calls known
/// to be decided inside a second (sent and answered in it), which a busy
/// machine's long round trips cannot push over; the middle of each call
/// places it for the log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_buckets_stay_within_five_percent_under_poisson_traffic() {
    let server = RedisServer::start();
    let domain = unique_domain("buckets");
    // The algorithm is named: this measures admission semantics (a rule
    // without one records refused hits too).
    let rules = format!(
        r#"
domain: {domain}
descriptors:
  - key: b60
    rate_limit: {{unit: second, requests_per_unit: {LIMIT}, buckets: 60, algorithm: sliding_window_counter}}
  - key: b2
    rate_limit: {{unit: second, requests_per_unit: {LIMIT}, algorithm: sliding_window_counter}}
"#
    );
    let url = server.url();
    let t = Tollgate::start(
        &[("rules.yaml", &rules)],
        &[
            ("store", url.as_str()),
            ("redis.command_timeout_ms", "2000"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    let client = t.client().await;

    let arrivals = poisson_arrivals(42, 2.0 * LIMIT as f64, 5 * SECOND);
    let request = RateLimitRequest {
        domain: domain.clone(),
        descriptors: vec![descriptor(&[("b60", "x")]), descriptor(&[("b2", "x")])],
        hits_addend: 0,
    };
    // Open loop: each call leaves at its time, whether or not earlier ones
    // have been answered, so a slow answer does not bunch up the sequence.
    let start = Instant::now();
    let mut calls = Vec::with_capacity(arrivals.len());
    let mut late = 0;
    for &at in &arrivals {
        let due = start + Duration::from_micros(at);
        if Instant::now() > due + Duration::from_millis(20) {
            late += 1;
        }
        tokio::time::sleep_until(due.into()).await;
        let mut client = client.clone();
        let request = request.clone();
        calls.push(tokio::spawn(async move {
            let before = start.elapsed().as_micros() as u64;
            let r = client
                .should_rate_limit(request)
                .await
                .expect("tollgate answers")
                .into_inner();
            let after = start.elapsed().as_micros() as u64;
            let ok = |i: usize| r.statuses[i].code == Code::Ok as i32;
            (before, after, ok(0), ok(1))
        }));
    }
    let (mut admitted60, mut admitted2) = (Vec::new(), Vec::new());
    let mut spans60 = Vec::new();
    let mut refused60 = 0;
    for call in calls {
        let (before, after, ok60, ok2) = call.await.expect("the call task ends");
        let when = (before + after) / 2;
        if ok60 {
            admitted60.push(when);
            spans60.push((before, after));
        } else {
            refused60 += 1;
        }
        if ok2 {
            admitted2.push(when);
        }
    }
    admitted60.sort_unstable();
    admitted2.sort_unstable();
    let max60 = max_in_trailing_window(&admitted60, SECOND);
    let max2 = max_in_trailing_window(&admitted2, SECOND);
    let within60 = max_surely_within(&spans60, SECOND);
    eprintln!(
        "{} arrivals ({late} late by over 20 ms): 60 buckets admitted {} (largest second {max60}, \
         {within60} surely decided in one), 2 buckets admitted {} (largest second {max2})",
        arrivals.len(),
        admitted60.len(),
        admitted2.len()
    );
    // The load really pressed on the limit: about half was refused, and the
    // counter admitted close to the limit every second.
    assert!(
        refused60 as u64 > arrivals.len() as u64 / 4,
        "{refused60} refused"
    );
    assert!(
        admitted60.len() as u64 >= 4 * LIMIT,
        "{} admitted in 5 s",
        admitted60.len()
    );
    assert!(
        within60 * 100 <= LIMIT * 105,
        "60 buckets admitted {within60} in one trailing second (limit {LIMIT})"
    );
    t.stop().await;
}

/// The most calls of `spans` (sent, answered; micros) that were both sent
/// and answered within one `window`: those the store surely decided in it.
fn max_surely_within(spans: &[(u64, u64)], window: u64) -> u64 {
    spans
        .iter()
        .map(|&(from, _)| {
            let inside =
                |&&(sent, answered): &&(u64, u64)| sent >= from && answered <= from + window;
            spans.iter().filter(inside).count() as u64
        })
        .max()
        .unwrap_or(0)
}

/// One line of `tollgate simulate`'s table: the largest count admitted in
/// any trailing window, per load.
#[derive(Debug, Clone, Copy)]
struct Row {
    buckets: u8,
    poisson_1x: u64,
    poisson_2x: u64,
    burst: u64,
    timed: u64,
}

/// Runs `tollgate simulate` and reads its table: the header line names the
/// arguments, then one row per bucket count, each cell `N (M.MMx)`.
fn simulate(limit: u64, windows: u64, seed: u64) -> Vec<Row> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["simulate", "--limit", &limit.to_string()])
        .args(["--windows", &windows.to_string()])
        .args(["--seed", &seed.to_string()])
        .env_clear()
        .output()
        .expect("the binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "limit {limit}/s, {windows} windows per load, seed {seed}"
        )),
        "{stdout}"
    );
    stdout
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| buckets"))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            // The count before its multiple of the limit.
            let n = |i: usize| -> u64 {
                cells[i]
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("cell {i} of {row:?}"))
            };
            Row {
                buckets: cells[1].parse().unwrap_or_else(|_| panic!("{row:?}")),
                poisson_1x: n(2),
                poisson_2x: n(3),
                burst: n(4),
                timed: n(5),
            }
        })
        .collect()
}

/// The shipped simulation, shortened: more buckets never overshoot much more
/// than fewer (Poisson noise of a few hits allowed: at 2x the limit, 2 and 4
/// buckets are close), 60 buckets overshoot clearly less than 2, and no
/// counter ever admits twice the limit.
#[test]
fn simulation_overshoot_falls_with_more_buckets() {
    let rows = simulate(100, 60, 3);
    assert_eq!(
        rows.iter().map(|r| r.buckets).collect::<Vec<_>>(),
        [2, 4, 10, 30, 60]
    );
    for pair in rows.windows(2) {
        let (fewer, more) = (pair[0], pair[1]);
        for (a, b, what) in [
            (fewer.poisson_1x, more.poisson_1x, "Poisson 1x"),
            (fewer.poisson_2x, more.poisson_2x, "Poisson 2x"),
            (fewer.burst, more.burst, "boundary burst"),
        ] {
            assert!(
                b <= a + 5,
                "{what}: {} buckets admit {b}, {} buckets {a}",
                more.buckets,
                fewer.buckets
            );
        }
    }
    let (two, sixty) = (rows[0], rows[rows.len() - 1]);
    assert!(sixty.poisson_1x < two.poisson_1x, "{rows:?}");
    assert!(sixty.burst < two.burst, "{rows:?}");
    assert!(sixty.poisson_2x <= 105 && sixty.burst <= 105, "{rows:?}");
    for r in &rows {
        // Every figure is at least the limit (the load reaches it) and the
        // counter never lets through two full windows in one.
        for v in [r.poisson_1x, r.poisson_2x, r.burst, r.timed] {
            assert!((100..200).contains(&v), "{rows:?}");
        }
    }
}

/// `tollgate simulate` prints the table: a header and one row per bucket
/// count, each figure at least the limit.
#[test]
fn simulate_subcommand_prints_the_table() {
    let rows = simulate(50, 10, 5);
    assert_eq!(
        rows.iter().map(|r| r.buckets).collect::<Vec<_>>(),
        [2, 4, 10, 30, 60],
        "{rows:?}"
    );
    for r in &rows {
        for v in [r.poisson_1x, r.poisson_2x, r.burst, r.timed] {
            assert!((50..100).contains(&v), "{r:?}");
        }
    }
}
