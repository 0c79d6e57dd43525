//! The model checker: random rule files from the whole grammar, random
//! traffic from several replicas, random faults, and an oracle that checks
//! every limiter's admitted hits against the bound `tollgate::guarantees`
//! promises for its rule (README's Guarantees table is the same list).
//!
//! - On the embedded store, on a virtual clock (Tokio's time paused and
//!   moved with it, so the leasing layer's housekeeping runs when the
//!   virtual clock says): many cases a second.
//! - On a real Redis and a 3+3 Redis Cluster, on the real clock, bounded
//!   in time.
//!
//! A failing case is shrunk (ops, then rules, dropped while it still
//! fails) and printed as a rule file and a trace, with the seed that
//! replays it: `TOLLGATE_MODEL_SEED=<seed> cargo test --test model`.
//! `TOLLGATE_MODEL_SECS` sets each store's budget (`scripts/model
//! --minutes N` runs it longer).

mod support;

#[path = "model/grammar.rs"]
mod grammar;
#[path = "model/oracle.rs"]
mod oracle;
#[path = "model/regressions.rs"]
mod regressions;
#[path = "model/world.rs"]
mod world;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use grammar::{Rules, pick};
use oracle::{Moment, Oracle};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use support::redis::{RedisCluster, RedisServer};
use tollgate::clock::{Clock, ManualClock, SystemClock};
use tollgate::engine::{Code, Response};
use tollgate::guarantees;
use tollgate::storage::{Coalescing, MemoryStore, RedisConfig, RedisStore, Store};
use world::{Call, Op, Req, World};

/// Where a case runs.
#[derive(Clone)]
enum Backend {
    /// The embedded store on a virtual clock.
    Virtual,
    /// A real Redis (or Cluster), connected once, on the real clock
    /// (each case has its own domain, so its own keys).
    Real(Arc<dyn Store>),
}

/// One case: its rules, its replicas and its ops.
#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    rules: Rules,
    replicas: usize,
    ops: Vec<Op>,
    /// The virtual clock's start (near a calendar boundary now and then).
    start: u64,
}

/// Combinations a run met, for its report.
#[derive(Default)]
struct Coverage {
    cases: u64,
    ops: u64,
    admitted: u64,
    /// Decisions the replicas answered from leases.
    leased: u64,
    refused_rule_files: u64,
    features: BTreeMap<String, u64>,
}

fn draw_case(seed: u64, real: bool) -> (Case, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut refused = 0;
    let domain = format!("model{seed}");
    let rules = loop {
        let rules = grammar::draw(&mut rng, &domain);
        match world::load(&rules) {
            Ok(_) => break rules,
            Err(e) => {
                // A combination load refuses: it must say where.
                let names_line = e.lines().all(|l| {
                    l.strip_prefix("model.yaml:")
                        .and_then(|rest| rest.split(':').next())
                        .is_some_and(|n| n.parse::<u32>().is_ok())
                });
                assert!(
                    names_line,
                    "a refused rule file names no file and line: {e}\n{}",
                    rules.yaml()
                );
                refused += 1;
            }
        }
    };
    let replicas = 1 + pick(&mut rng, 3);
    let len = if real {
        60 + pick(&mut rng, 120)
    } else {
        100 + pick(&mut rng, 300)
    };
    let ops = world::draw_ops(&mut rng, &rules, replicas, len);
    // 2026-12-01, a few seconds before 22:00 UTC (a calendar day's end
    // in Etc/GMT-2), 00:00 UTC or 05:00 UTC (Etc/GMT+5), or any time.
    let day = 1_796_083_200u64;
    let start_secs = match pick(&mut rng, 4) {
        0 => day + 22 * 3600 - 5,
        1 => day + 86_400 - 5,
        2 => day + 5 * 3600 - 5,
        _ => day + rng.next_u64() % 86_400,
    };
    let start = start_secs * 1_000_000 + rng.next_u64() % 1_000_000;
    (
        Case {
            seed,
            rules,
            replicas,
            ops,
            start,
        },
        refused,
    )
}

/// Connects to the test's Redis (or Cluster) as `serve` runs it: hits
/// of one limiter queued together go out as one call.
async fn connect(url: String) -> Arc<dyn Store> {
    let store = RedisStore::connect(RedisConfig {
        url,
        command_timeout: Duration::from_millis(2_000),
        ..RedisConfig::default()
    })
    .await
    .expect("valid settings");
    assert!(
        store.wait_ready(Duration::from_secs(20)).await,
        "the test's Redis answers"
    );
    Arc::new(Coalescing::new(Arc::new(store)))
}

static LEASED_RULE_HITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What one answer tells the oracle.
fn record(
    oracle: &mut Oracle,
    rules: &Rules,
    req: &Req,
    answer: &Result<Response, String>,
    at: Moment,
) -> u64 {
    // Hits given back make room whatever the answer: record them as sent.
    let matched: Vec<Option<usize>> = req
        .descriptors
        .iter()
        .map(|d| rules.find(&d.key, &d.value))
        .collect();
    let replaced: Vec<&str> = matched
        .iter()
        .flatten()
        .flat_map(|&r| rules.rules[r].replaces.iter().map(String::as_str))
        .collect();
    let mut admitted = 0;
    for (i, d) in req.descriptors.iter().enumerate() {
        let Some(r) = matched[i] else { continue };
        let rule = &rules.rules[r];
        let identity = rules.identity(r, &d.value);
        let cost = req.cost(d);
        let passed = matches!(answer, Ok(resp) if resp.overall == Code::Ok && resp.statuses[i].code == Code::Ok);
        for (k, limit) in rule.limits.iter().enumerate() {
            if replaced.contains(&limit.name.as_str()) {
                continue;
            }
            let promise = guarantees::promise(&rule.features(limit, false));
            let l = oracle.limiter((r, k, identity.clone()), limit, promise);
            if d.negative {
                l.given_back.push((at, cost));
            } else if passed && cost > 0 && !(rule.usage_reports && d.hits.is_some()) {
                l.admitted.push((at, cost));
                admitted += cost;
                if rule.lease {
                    LEASED_RULE_HITS.fetch_add(cost, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
    }
    admitted
}

fn reset_request(key: &str, value: &str) -> Req {
    Req {
        hits: 0,
        descriptors: vec![world::Desc {
            key: key.to_string(),
            value: value.to_string(),
            hits: None,
            negative: false,
        }],
    }
}

/// A reset gives the limiters of the rule it names their whole limit
/// back (recorded whatever it answered: a reset the model does not know
/// of could only make it expect less).
fn reset(oracle: &mut Oracle, rules: &Rules, key: &str, value: &str, at: Moment) {
    if let Some(rule) = rules.find(key, value) {
        let identity = rules.identity(rule, value);
        for (k, limit) in rules.rules[rule].limits.iter().enumerate() {
            let promise = guarantees::promise(&rules.rules[rule].features(limit, false));
            oracle
                .limiter((rule, k, identity.clone()), limit, promise)
                .resets
                .push(at);
        }
    }
}

fn check_answer(req: &Req, answer: &Result<Response, String>) -> Result<(), String> {
    match answer {
        Ok(resp) if resp.statuses.len() != req.descriptors.len() => Err(format!(
            "{} statuses for {} descriptors",
            resp.statuses.len(),
            req.descriptors.len()
        )),
        _ => Ok(()),
    }
}

struct Clocks {
    virtual_clock: Option<Arc<ManualClock>>,
}

impl Clocks {
    fn now(&self) -> u64 {
        match &self.virtual_clock {
            Some(c) => c.now_micros(),
            None => SystemClock.now_micros(),
        }
    }
}

/// Time passes: the virtual clock, and Tokio's with it (so the leasing
/// layer's housekeeping runs when it would); on the real clock a short
/// sleep.
async fn advance(clocks: &Clocks, micros: u64) {
    match &clocks.virtual_clock {
        Some(c) => {
            c.advance_micros(micros);
            tokio::time::advance(Duration::from_micros(micros)).await;
        }
        None => tokio::time::sleep(Duration::from_micros(micros.min(30_000))).await,
    }
}

/// Runs a case: `Err` with the violation (or the panic's message) when
/// the oracle finds one.
async fn run(case: &Case, backend: &Backend, coverage: &mut Coverage) -> Result<(), String> {
    let virtual_clock =
        matches!(backend, Backend::Virtual).then(|| Arc::new(ManualClock::at_micros(case.start)));
    let world_clock: Arc<dyn Clock> = match &virtual_clock {
        Some(c) => c.clone(),
        None => Arc::new(SystemClock),
    };
    let clocks = Clocks {
        virtual_clock: virtual_clock.clone(),
    };
    let backend_store: Arc<dyn Store> = match backend {
        Backend::Virtual => Arc::new(MemoryStore::new(world_clock.clone())),
        Backend::Real(store) => store.clone(),
    };
    let mut world = World::new(
        world_clock,
        backend_store,
        case.rules.clone(),
        case.replicas,
        case.seed,
    );
    let mut oracle = Oracle {
        replicas: case.replicas as u64,
        ..Oracle::default()
    };
    let domain = case.rules.domain.clone();
    let ask = |w: &World, r: usize, req: &Req| {
        let engine = w.replicas[r].engine.clone();
        let request = req.request(&domain);
        async move {
            engine
                .should_rate_limit(&request)
                .await
                .map_err(|e| e.to_string())
        }
    };
    for (n, op) in case.ops.iter().enumerate() {
        match op {
            Op::Advance(micros) => advance(&clocks, *micros).await,
            Op::Ask(r, req) => {
                let lo = clocks.now();
                let answer = ask(&world, *r, req).await;
                let at = Moment {
                    lo,
                    hi: clocks.now(),
                    seq: n,
                };
                check_answer(req, &answer).map_err(|e| format!("op {n}: {e}"))?;
                coverage.admitted += record(&mut oracle, &case.rules, req, &answer, at);
            }
            Op::Together(r, calls) => {
                let lo = clocks.now();
                let answers = futures_util::future::join_all(calls.iter().map(|c| {
                    let w = &world;
                    let domain = &domain;
                    async move {
                        match c {
                            Call::Ask(q) => Some(ask(w, *r, q).await),
                            Call::Reset(key, value) => {
                                let _ = w.replicas[*r]
                                    .engine
                                    .reset(&reset_request(key, value).request(domain))
                                    .await;
                                None
                            }
                        }
                    }
                }))
                .await;
                let at = Moment {
                    lo,
                    hi: clocks.now(),
                    seq: n,
                };
                for (c, answer) in calls.iter().zip(&answers) {
                    match (c, answer) {
                        (Call::Ask(req), Some(answer)) => {
                            check_answer(req, answer).map_err(|e| format!("op {n}: {e}"))?;
                            coverage.admitted += record(&mut oracle, &case.rules, req, answer, at);
                        }
                        (Call::Reset(key, value), _) => {
                            reset(&mut oracle, &case.rules, key, value, at)
                        }
                        _ => {}
                    }
                }
            }
            Op::Reset(r, key, value) => {
                let lo = clocks.now();
                let _ = world.replicas[*r]
                    .engine
                    .reset(&reset_request(key, value).request(&domain))
                    .await;
                let at = Moment {
                    lo,
                    hi: clocks.now(),
                    seq: n,
                };
                reset(&mut oracle, &case.rules, key, value, at);
            }
            Op::Reload(r) => world.reload(*r),
            Op::Crash(r) => world.crash(*r, n as u64 + 1),
            Op::Step(r, micros) => world.step(*r, *micros),
            Op::Faults(r, p) => world.faults(*r, *p),
            // On the real clock a slow store is slow in earnest: a few ms.
            Op::Slow(r, micros) => world.slow(
                *r,
                if virtual_clock.is_some() {
                    *micros
                } else {
                    (*micros).min(5_000)
                },
            ),
            Op::Flood(r, req, times) => {
                for _ in 0..*times {
                    let lo = clocks.now();
                    let answer = ask(&world, *r, req).await;
                    let at = Moment {
                        lo,
                        hi: clocks.now(),
                        seq: n,
                    };
                    check_answer(req, &answer).map_err(|e| format!("op {n}: {e}"))?;
                    coverage.admitted += record(&mut oracle, &case.rules, req, &answer, at);
                    advance(&clocks, 1_000).await;
                }
            }
        }
        coverage.ops += 1;
    }
    coverage.leased += world
        .replicas
        .iter()
        .filter_map(|r| r.engine.store().gauges().lease)
        .map(|l| l.local)
        .sum::<u64>();
    oracle.check()
}

fn note_features(case: &Case, coverage: &mut Coverage) {
    coverage.cases += 1;
    for rule in &case.rules.rules {
        for l in &rule.limits {
            let algorithm = l.algorithm.as_str();
            *coverage.features.entry(algorithm.to_string()).or_default() += 1;
            for (on, what) in [
                (rule.list, "in a list"),
                (rule.lease, "lease"),
                (rule.shards > 1, "shards"),
                (rule.shadow, "shadow_mode"),
                (rule.quota, "quota_mode"),
                (rule.count_refused == Some(false), "count_refused: false"),
                (rule.usage_reports, "usage_reports"),
                (l.zone.is_some(), "calendar"),
                (!rule.replaces.is_empty(), "replaces"),
                (
                    matches!(rule.value, grammar::Value::Wildcard { shared: true, .. }),
                    "share_threshold",
                ),
            ] {
                if on {
                    *coverage
                        .features
                        .entry(format!("{algorithm} + {what}"))
                        .or_default() += 1;
                }
            }
        }
    }
    for op in &case.ops {
        let what = match op {
            Op::Advance(_) | Op::Ask(..) => continue,
            Op::Together(_, calls) if calls.iter().any(|c| matches!(c, Call::Reset(..))) => {
                "fault: a reset among concurrent callers"
            }
            Op::Together(..) => "fault: concurrent callers",
            Op::Reset(..) => "fault: reset",
            Op::Reload(..) => "fault: reload",
            Op::Crash(..) => "fault: crash",
            Op::Step(..) => "fault: clock step",
            Op::Faults(..) => "fault: store errors",
            Op::Slow(..) => "fault: a slow store",
            Op::Flood(..) => "a client at its limit",
        };
        *coverage.features.entry(what.into()).or_default() += 1;
    }
}

/// A smaller case that still fails: ops dropped in chunks, then rules.
async fn shrink(mut case: Case, backend: &Backend, mut error: String) -> (Case, String) {
    let mut scratch = Coverage::default();
    let mut chunk = case.ops.len() / 2;
    while chunk >= 1 {
        let mut i = 0;
        while i < case.ops.len() {
            let mut smaller = case.clone();
            let end = (i + chunk).min(smaller.ops.len());
            smaller.ops.drain(i..end);
            let outcome = run(&smaller, backend, &mut scratch).await;
            if std::env::var("TOLLGATE_MODEL_DEBUG").is_ok() {
                eprintln!(
                    "shrink: {} ops -> {:?}",
                    smaller.ops.len(),
                    outcome.as_ref().err()
                );
            }
            match outcome {
                Err(e) => {
                    case = smaller;
                    error = e;
                }
                Ok(()) => i += chunk,
            }
        }
        chunk /= 2;
    }
    (case, error)
}

fn report(case: &Case, error: &str) -> String {
    let mut trace = String::new();
    for (i, op) in case.ops.iter().enumerate() {
        trace.push_str(&format!("  {i}: {}\n", abbreviate(&format!("{op:?}"))));
    }
    format!(
        "the model found a limit passed: {error}\n\
         replay: TOLLGATE_MODEL_SEED={} cargo test --test model\n\
         replicas: {}, virtual start {} µs\n--- model.yaml\n{}--- trace (shrunk)\n{trace}",
        case.seed,
        case.replicas,
        case.start,
        case.rules.yaml()
    )
}

/// A long value as `x{200}`: what matters is its length.
fn abbreviate(text: &str) -> String {
    let mut out = String::new();
    let mut run = 0;
    for c in text.chars().chain(std::iter::once('\0')) {
        if c == 'x' {
            run += 1;
            continue;
        }
        match run {
            0 => {}
            1..=8 => out.push_str(&"x".repeat(run)),
            _ => out.push_str(&format!("x{{{run}}}")),
        }
        run = 0;
        if c != '\0' {
            out.push(c);
        }
    }
    out
}

fn budget() -> Duration {
    let secs = std::env::var("TOLLGATE_MODEL_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(90);
    Duration::from_secs(secs)
}

/// Cases until the budget is spent (or the one seed asked for), each
/// failure shrunk and reported.
async fn explore(backend: Backend, budget: Duration) -> Coverage {
    let real = !matches!(backend, Backend::Virtual);
    let mut coverage = Coverage::default();
    let fixed: Option<u64> = std::env::var("TOLLGATE_MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok());
    let mut seeds = ChaCha8Rng::seed_from_u64(SystemClock.now_micros());
    let started = Instant::now();
    loop {
        let seed = fixed.unwrap_or_else(|| seeds.next_u64() >> 16);
        let (case, refused) = draw_case(seed, real);
        coverage.refused_rule_files += refused;
        note_features(&case, &mut coverage);
        if let Err(error) = run(&case, &backend, &mut coverage).await {
            let (small, error) = shrink(case, &backend, error).await;
            panic!("{}", report(&small, &error));
        }
        if fixed.is_some() || started.elapsed() >= budget {
            break;
        }
    }
    coverage
}

fn print(store: &str, c: &Coverage, took: Duration) {
    println!(
        "model on {store}: {} cases, {} ops, {} hits admitted ({} decisions from leases), {} rule files refused at load, in {:.0?}",
        c.cases, c.ops, c.admitted, c.leased, c.refused_rule_files, took
    );
    println!(
        "  hits admitted on leased rules: {}",
        LEASED_RULE_HITS.load(std::sync::atomic::Ordering::Relaxed)
    );
    for (what, n) in &c.features {
        println!("  {n:>6}  {what}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_embedded_store_on_a_virtual_clock() {
    let started = Instant::now();
    let c = explore(Backend::Virtual, budget()).await;
    print("the embedded store", &c, started.elapsed());
    assert!(c.cases > 0 && c.admitted > 0, "the model ran no traffic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_on_the_real_clock() {
    let redis = RedisServer::start();
    let started = Instant::now();
    let c = explore(Backend::Real(connect(redis.url()).await), budget() / 3).await;
    print("Redis", &c, started.elapsed());
    assert!(c.cases > 0 && c.admitted > 0, "the model ran no traffic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_on_the_real_clock() {
    let cluster = RedisCluster::start();
    let started = Instant::now();
    let c = explore(Backend::Real(connect(cluster.url()).await), budget() / 3).await;
    print("a 3+3 Redis Cluster", &c, started.elapsed());
    assert!(c.cases > 0 && c.admitted > 0, "the model ran no traffic");
}

/// Each defect the model found, as a small case: none passes a limit.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_defects_found_stay_fixed() {
    let mut failed = Vec::new();
    for r in regressions::all() {
        let case = Case {
            seed: 0,
            rules: r.rules,
            replicas: r.replicas,
            ops: r.ops,
            start: 1_796_083_200_000_000 + 400_000,
        };
        world::load(&case.rules).unwrap_or_else(|e| panic!("{}: {e}", r.name));
        if let Err(e) = run(&case, &Backend::Virtual, &mut Coverage::default()).await {
            failed.push(format!("{}: {e}", r.name));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// README's Guarantees table is the list the oracle reads.
#[test]
fn readme_states_the_promises_the_oracle_checks() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let table = guarantees::markdown();
    assert!(
        readme.contains(&table),
        "README's Guarantees table differs from tollgate::guarantees::markdown(); it should read:\n{table}"
    );
}
