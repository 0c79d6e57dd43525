//! What a rule costs: memory and load time of N generated rules, each with
//! its own value (one rule per tenant, as a control plane writes them).
//!
//! `cargo bench --bench rules` measures N = 1,000, 10,000 and 100,000;
//! `cargo bench --bench rules -- 1000000` (any sizes) measures others.
//! `cargo test --bench rules` (CI) measures 20,000 and 100,000 and fails
//! when a rule costs a serving replica more than 1 KiB of RSS. Per N:
//!
//! - `heap B/rule`: bytes the loaded rules hold on the heap, counted by this
//!   benchmark's global allocator (live bytes after `load_dir` less before,
//!   the parse's own garbage freed): what the rule structures themselves
//!   cost, whatever the allocator does with freed memory.
//! - `allocs/rule`: allocations made while loading, per rule (the parse's
//!   temporary ones included); `peak MB`: the most the heap held meanwhile.
//! - `load s`: `rules::load_dir` in this process, wall clock, and `cpu s`,
//!   the CPU time it took (every thread; 10 ms steps), which a busy
//!   machine changes less.
//! - `serve RSS B/rule`: the resident memory of a real `tollgate serve`
//!   with the N rules less one with a single rule, per rule (`VmRSS`:
//!   what a replica pays, allocator overhead and metrics included), once
//!   it has settled (no longer falling) after start, and `start s`, the
//!   time until it listens.
//! - `validate s`: a real `tollgate validate` of the directory.
//!
//! Linux only (`/proc`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tollgate::rules::{LoadOptions, load_dir};

/// The system allocator, counting live bytes, their peak and allocations.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to `System` unchanged; only counters are
// added around it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let live = if new_size >= layout.size() {
            LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size - layout.size()
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed) - (layout.size() - new_size)
        };
        PEAK.fetch_max(live, Ordering::Relaxed);
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// One file of `n` rules: `tenant` = `t<i>`, each with its own limit, in the
/// shape `examples/` and generated rule sets use.
fn write_rules(dir: &Path, n: usize) {
    use std::fmt::Write;
    let mut text = String::with_capacity(n * 120);
    text.push_str("domain: tenants\ndescriptors:\n");
    for i in 0..n {
        let _ = write!(
            text,
            "  - key: tenant\n    value: t{i}\n    rate_limit:\n      unit: second\n      requests_per_unit: {}\n",
            100 + i % 900
        );
    }
    std::fs::write(dir.join("tenants.yaml"), text).unwrap();
}

/// CPU seconds this process has used, every thread (`/proc/self/stat`,
/// in clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn vm_rss(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kib * 1024
}

/// `tollgate serve` on `dir` (embedded store, ports chosen by the system,
/// no debug listener): its resident bytes once it listens, and how long
/// that took.
fn serve_rss(dir: &Path) -> (usize, f64) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--rules"])
        .arg(dir)
        .env_clear()
        .envs([
            ("TOLLGATE_GRPC_ADDR", "127.0.0.1:0"),
            ("TOLLGATE_HTTP_ADDR", "127.0.0.1:0"),
            ("TOLLGATE_DEBUG_ADDR", "off"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    for line in out.lines() {
        if line.unwrap().contains("gRPC listening") {
            break;
        }
    }
    let took = started.elapsed().as_secs_f64();
    // What the replica keeps: jemalloc's background thread hands the
    // pages the load freed back within about a second (its
    // `dirty_decay_ms`, `.cargo/config.toml`), so wait until the resident
    // size has not fallen by 1% for a second, or 10 s.
    let mut rss = vm_rss(child.id());
    let mut steady_since = Instant::now();
    let waited = Instant::now();
    while steady_since.elapsed() < Duration::from_secs(1)
        && waited.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(100));
        let now = vm_rss(child.id());
        if now < rss - rss / 100 {
            steady_since = Instant::now();
        }
        rss = rss.min(now);
    }
    let _ = child.kill();
    let _ = child.wait();
    (rss, took)
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .filter_map(|a| a.replace(['_', ','], "").parse().ok())
        .collect();
    // `cargo bench` passes `--bench`; `cargo test --bench rules` (CI) runs
    // the sizes of the memory bound, and fails past it.
    let checked = sizes.is_empty() && !std::env::args().any(|a| a == "--bench");
    let sizes = match (sizes.is_empty(), checked) {
        (false, _) => sizes,
        (true, false) => vec![1_000, 10_000, 100_000],
        (true, true) => vec![20_000, 100_000],
    };
    let mut over = Vec::new();
    let options = LoadOptions::default();
    let base = tempfile::tempdir().unwrap();
    write_rules(base.path(), 1);
    let (base_rss, _) = serve_rss(base.path());
    println!(
        "{:>9} {:>12} {:>12} {:>9} {:>8} {:>6} {:>17} {:>8} {:>11}",
        "rules",
        "heap B/rule",
        "allocs/rule",
        "peak MB",
        "load s",
        "cpu s",
        "serve RSS B/rule",
        "start s",
        "validate s"
    );
    for n in sizes {
        let dir = tempfile::tempdir().unwrap();
        write_rules(dir.path(), n);

        let before = LIVE.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let allocs = ALLOCS.load(Ordering::Relaxed);
        let cpu = cpu_seconds();
        let started = Instant::now();
        let set = load_dir(dir.path(), &options).expect("the generated rules load");
        let load = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu;
        let heap = LIVE.load(Ordering::Relaxed) - before;
        let peak = PEAK.load(Ordering::Relaxed) - before;
        let allocs = ALLOCS.load(Ordering::Relaxed) - allocs;
        assert_eq!(set.rules().len(), n);
        drop(set);

        let (rss, start) = serve_rss(dir.path());
        let started = Instant::now();
        let status = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("validate")
            .arg(dir.path())
            .env_clear()
            .stdout(Stdio::null())
            .status()
            .unwrap();
        let validate = started.elapsed().as_secs_f64();
        assert!(status.success());
        let rss_per_rule = rss.saturating_sub(base_rss) as f64 / n as f64;
        println!(
            "{n:>9} {:>12.0} {:>12.1} {:>9.1} {load:>8.3} {cpu:>6.2} {rss_per_rule:>17.0} {start:>8.3} {validate:>11.3}",
            heap as f64 / n as f64,
            allocs as f64 / n as f64,
            peak as f64 / 1e6,
        );
        if rss_per_rule > MAX_RSS_PER_RULE {
            over.push(format!("{n} rules: {rss_per_rule:.0} B/rule"));
        }
    }
    assert!(
        !checked || over.is_empty(),
        "a serving replica's rules cost more than {MAX_RSS_PER_RULE} B each in RSS: {}",
        over.join(", ")
    );
}

/// What a rule may cost a serving replica, in resident bytes: checked at
/// 20,000 and 100,000 rules by `cargo test --bench rules` (CI).
const MAX_RSS_PER_RULE: f64 = 1024.0;
