//! Microbenchmarks of one decision's own cost: time and allocations per
//! decision on the embedded store, and per key built for Redis.
//!
//! `cargo bench --bench decision` measures; `cargo bench --bench decision --
//! --test` runs every benchmark once (what CI does). Allocations are counted
//! by divan's counting global allocator, so the "alloc" rows are exact
//! per-iteration counts, not samples.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::{Clock, ManualClock};
use tollgate::engine::{Descriptor, Engine, EngineOptions, Request, RulesHandle};
use tollgate::limit::{Algorithm, Unit};
use tollgate::rules::{LoadOptions, RuleSet, parse_file};
use tollgate::storage::keys::{KeyBuilder, Role};
use tollgate::storage::lease::Leasing;
use tollgate::storage::{Hit, MemoryStore, Store};

#[global_allocator]
static ALLOC: divan::AllocProfiler = divan::AllocProfiler::system();

fn main() {
    divan::main();
}

/// The rates (a count in flight, held by slots until released, has no
/// rate for this load).
const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
    Algorithm::TokenBucket,
];

/// The rules `scripts/bench.sh` serves: one rule per algorithm under
/// `algo=<name>`, keyed by `user`, with a limit never reached.
fn rules() -> RuleSet {
    rules_of("second")
}

/// The same rules over windows of `unit`.
fn rules_of(unit: &str) -> RuleSet {
    let mut text = String::from("domain: bench\ndescriptors:\n");
    for a in ALGORITHMS {
        text.push_str(&format!(
            "  - key: algo\n    value: {}\n    descriptors:\n      - key: user\n        rate_limit: {{unit: {unit}, requests_per_unit: 1000000000, algorithm: {}}}\n",
            a.as_str(),
            a.as_str()
        ));
    }
    let options = LoadOptions {
        max_log_limit: u32::MAX,
        ..LoadOptions::default()
    };
    let domain =
        parse_file(Path::new("bench.yaml"), &text, &options).expect("the bench rules are valid");
    let mut set = RuleSet::default();
    set.domains.insert(domain.name.clone(), domain);
    set
}

fn request(algorithm: Algorithm, user: &str) -> Request {
    Request {
        domain: "bench".to_owned(),
        descriptors: vec![Descriptor {
            entries: vec![
                ("algo".to_owned(), algorithm.as_str().to_owned()),
                ("user".to_owned(), user.to_owned()),
            ],
            ..Descriptor::default()
        }],
        hits: 1,
        deadline: None,
    }
}

/// One decision through the engine on the embedded store, as the gRPC
/// handler makes it (the request already decoded), with and without a
/// caller's deadline (a deadline arms a timer).
#[divan::bench(args = ALGORITHMS, consts = [false, true])]
fn engine_memory<const DEADLINE: bool>(bencher: divan::Bencher, algorithm: Algorithm) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    // A clock that moves: the log's entries expire instead of piling up.
    let clock = Arc::new(ManualClock::at_secs(1_000));
    let store = Arc::new(MemoryStore::new(clock.clone() as Arc<dyn Clock>));
    let engine = Engine::new(
        RulesHandle::new(rules()),
        store,
        clock.clone(),
        EngineOptions::default(),
    );
    let mut req = request(algorithm, "u-1");
    bencher.bench_local(|| {
        clock.advance_micros(10);
        if DEADLINE {
            req.deadline = Some(tokio::time::Instant::now() + Duration::from_millis(20));
        }
        let response = rt.block_on(engine.should_rate_limit(&req));
        divan::black_box(response.expect("a decision"));
    });
}

/// One decision answered from a lease (the default path of every rule on
/// Redis, here over the embedded store so only tollgate's own work is
/// timed): the engine over the lease layer, 100,000 users in turn (as
/// `scripts/bench.sh` sends them: a table too big for the CPU's caches),
/// each leased after its first hits. Minute windows, as `scripts/bench.sh`
/// leases them (`LEASE_UNIT=minute`).
#[divan::bench(args = ALGORITHMS, sample_count = 500, sample_size = 20)]
fn engine_leased(bencher: divan::Bencher, algorithm: Algorithm) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let clock = Arc::new(ManualClock::at_secs(1_000));
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(clock.clone() as Arc<dyn Clock>));
    let store = Arc::new(Leasing::new(memory, clock.clone() as Arc<dyn Clock>));
    let engine = Engine::new(
        RulesHandle::new(rules_of("minute")),
        store.clone(),
        clock.clone(),
        EngineOptions::default(),
    );
    let requests: Vec<Request> = (0..100_000)
        .map(|u| request(algorithm, &format!("u-{u}")))
        .collect();
    // Warm: each user's demand seen, and leased.
    for _ in 0..3 {
        for req in &requests {
            clock.advance_micros(1);
            rt.block_on(engine.should_rate_limit(req))
                .expect("a decision");
        }
    }
    let before = store.counts();
    let mut next = 0;
    bencher.bench_local(|| {
        clock.advance_micros(1);
        next = (next + 1) % requests.len();
        let response = rt.block_on(engine.should_rate_limit(&requests[next]));
        divan::black_box(response.expect("a decision"));
    });
    let after = store.counts();
    let (local, calls) = (
        after.local - before.local,
        after.store_calls - before.store_calls,
    );
    assert!(
        local > 10 * calls,
        "the timed decisions are leased: {local} local, {calls} store calls"
    );
}

/// Building the Redis keys of one limiter (what every Redis call does
/// before it sends anything).
#[divan::bench(args = ALGORITHMS)]
fn redis_keys(bencher: divan::Bencher, algorithm: Algorithm) {
    let builder = KeyBuilder::default();
    let entries = vec![
        ("algo".to_owned(), algorithm.as_str().to_owned()),
        ("user".to_owned(), "u-1234".to_owned()),
    ];
    let hit = Hit {
        domain: "bench",
        entries: &entries,
        algorithm,
        limit: 1_000_000_000,
        window: Unit::Second.into(),
        hits: 1,
        negative: false,
        usage_reports: false,
        buckets: tollgate::limit::DEFAULT_BUCKETS,
        burst: 0,
        shard: tollgate::storage::Shard::NONE,
        receipt: false,
        also: &[],
        lease: false,
        ahead: tollgate::storage::Ahead::NONE,
    };
    bencher.bench_local(|| {
        let limiter = builder.limiter(divan::black_box(&hit));
        let keys = match algorithm {
            Algorithm::SlidingWindowLog => {
                vec![limiter.key(Role::LogSet), limiter.key(Role::LogMeta)]
            }
            _ => vec![limiter.key(Role::State)],
        };
        divan::black_box((limiter.tag().len(), keys));
    });
}
