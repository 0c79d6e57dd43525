//! Decisions from leased quota (`lease: true`). On a virtual clock, 1 to
//! 10 replicas (each a leasing layer of its own) share one store under
//! random demand, with replicas crashing (their leases lost) and
//! restarting: no window ever admits more than the limit, and once demand
//! settles at least 95% of min(demand, limit) is admitted; with Envoys'
//! quota shares (RLQS) on the same limits beside them, the bound is the
//! limit plus what the Envoys' buckets were given beyond their rates. Then
//! over real
//! gRPC: three replicas on one Redis and on a 3+3 Redis Cluster, flooded,
//! never pass the limit while most hits cost no store call.

mod support;

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use support::redis::{RedisCluster, RedisServer};
use support::tollgate::{Tollgate, descriptor};
use support::unique_domain;
use tollgate::clock::{Clock, ManualClock};
use tollgate::limit::{Algorithm, Unit, Window};
use tollgate::quota::bucket::Bucket;
use tollgate::quota::window::Fixed;
use tollgate::quota::{self, Counted, Report, Terms};
use tollgate::rlqs::bucket::token_bucket;
use tollgate::rlqs::filter::Filter;
use tollgate::storage::lease::Leasing;
use tollgate::storage::{Hit, LeaseCall, MemoryStore, RedisConfig, RedisStore, Shard, Store};

const LIMIT: u64 = 1_000;

/// What the replicas share: `keys` limiters of `limit` hits per `unit`,
/// hit on a virtual clock moved `step` microseconds at a time.
#[derive(Clone, Copy, Debug)]
struct Shape {
    algorithm: Algorithm,
    limit: u64,
    unit: Unit,
    keys: usize,
    step: u64,
    /// Demand is often tiny (a few hits a window per replica), so leases
    /// reserve hits in the next windows, and floods follow.
    quiet: bool,
}

/// One hot limiter of 1,000 a second.
const HOT: Shape = Shape {
    algorithm: Algorithm::FixedWindow,
    limit: LIMIT,
    unit: Unit::Second,
    keys: 1,
    step: 5_000,
    quiet: false,
};

/// Thirty cool limiters of 120 a minute: each replica hits each of them
/// less than once a second.
const COOL: Shape = Shape {
    algorithm: Algorithm::FixedWindow,
    limit: 120,
    unit: Unit::Minute,
    keys: 30,
    step: 50_000,
    quiet: false,
};

/// Twenty limiters of 1,000 a minute, each replica's demand on each
/// drawn per phase: idle, a few hits a minute (its leases reserve hits in
/// the next windows), or up to three times a fair share.
const QUIET: Shape = Shape {
    algorithm: Algorithm::FixedWindow,
    limit: LIMIT,
    unit: Unit::Minute,
    keys: 20,
    step: 50_000,
    quiet: true,
};

fn hit(entries: &[(String, String)]) -> Hit<'_> {
    hit_of(HOT, entries, true)
}

fn hit_of(shape: Shape, entries: &[(String, String)], lease: bool) -> Hit<'_> {
    Hit {
        domain: "lease",
        entries,
        algorithm: shape.algorithm,
        limit: shape.limit,
        window: shape.unit.into(),
        hits: 1,
        negative: false,
        usage_reports: false,
        buckets: 2,
        burst: 0,
        shard: Shard::NONE,
        receipt: false,
        also: &[],
        lease,
        ahead: tollgate::storage::Ahead::NONE,
    }
}

/// A leased hit on `layer`, which must be admitted.
/// One replica's leasing layer over the embedded store, on a virtual
/// clock.
fn one_replica() -> (Arc<ManualClock>, Leasing) {
    let clock = Arc::new(ManualClock::at_secs(1_000_020));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(clock.clone()));
    let layer = Leasing::new(store, clock.clone() as Arc<dyn Clock>);
    (clock, layer)
}

/// The shape's users, `<name><index>`, one entry each.
fn users(shape: Shape, name: &str) -> Vec<Vec<(String, String)>> {
    (0..shape.keys)
        .map(|k| vec![("user".to_string(), format!("{name}{k}"))])
        .collect()
}

async fn admit(layer: &Leasing, shape: Shape, entries: &[(String, String)]) {
    let d = layer.hit(hit_of(shape, entries, true)).await.unwrap();
    assert!(d.admitted, "{d:?}");
}

/// One token bucket of 1,000 a second (a burst of 1,000).
const BUCKET: Shape = Shape {
    algorithm: Algorithm::TokenBucket,
    limit: LIMIT,
    unit: Unit::Second,
    keys: 1,
    step: 5_000,
    quiet: false,
};

/// Thirty cool token buckets of 120 a minute.
const COOL_BUCKETS: Shape = Shape {
    algorithm: Algorithm::TokenBucket,
    limit: 120,
    unit: Unit::Minute,
    keys: 30,
    step: 50_000,
    quiet: false,
};

/// One sliding window counter of 1,000 a second (two buckets: each is
/// the window, so no aligned second passes the limit).
const COUNTER: Shape = Shape {
    algorithm: Algorithm::SlidingWindowCounter,
    ..HOT
};

/// Thirty cool sliding window counters of 120 a minute.
const COOL_COUNTERS: Shape = Shape {
    algorithm: Algorithm::SlidingWindowCounter,
    ..COOL
};

/// Twenty sliding window counters of 1,000 a minute (two buckets of a
/// minute), demand drawn per phase as [`QUIET`]'s.
const QUIET_COUNTERS: Shape = Shape {
    algorithm: Algorithm::SlidingWindowCounter,
    ..QUIET
};

/// One hot sliding window log of 1,000 a second.
const LOG: Shape = Shape {
    algorithm: Algorithm::SlidingWindowLog,
    ..HOT
};

/// Thirty cool sliding window logs of 120 a minute.
const COOL_LOGS: Shape = Shape {
    algorithm: Algorithm::SlidingWindowLog,
    ..COOL
};

/// One Envoy in [`run_with`]: a stream reporting every 5 s for its share
/// of every limiter, and its quota filter's bucket for each.
struct Quota {
    name: String,
    generation: u32,
    filters: Vec<Filter>,
    demand: Vec<u64>,
    owed: Vec<f64>,
    next_report: u64,
    shape: Shape,
}

impl Quota {
    fn new(shape: Shape, index: usize, generation: u32) -> Quota {
        Quota {
            name: format!("envoy.{index}.{generation}"),
            generation,
            // No assignment yet, or an expired one: nothing passes (what
            // Envoy does then is outside the server's reach).
            filters: (0..shape.keys).map(|_| Filter::new(false)).collect(),
            demand: vec![0; shape.keys],
            owed: vec![0.0; shape.keys],
            next_report: 0,
            shape,
        }
    }

    /// Reports each limiter's usage and applies the assignments: what each
    /// bucket was given beyond its rate by them.
    async fn report(
        &mut self,
        store: &dyn Store,
        entries: &[Vec<(String, String)>],
        now: u64,
    ) -> Vec<f64> {
        let window: Window = self.shape.unit.into();
        let limit = self.shape.limit;
        let terms = Terms {
            capacity: quota::capacity(limit, window),
            fill_secs: quota::fill_secs(window),
            hold_micros: 16_000_000,
        };
        let counted = match self.shape.algorithm {
            Algorithm::TokenBucket => Counted::Bucket(Bucket { limit, burst: 0 }),
            _ => Counted::Window(Fixed {
                limit,
                window_micros: window.micros(),
            }),
        };
        let mut more = Vec::with_capacity(entries.len());
        for (k, filter) in self.filters.iter_mut().enumerate() {
            let (allowed, denied) = filter.take_usage();
            let grant = store
                .lease(LeaseCall {
                    domain: "lease",
                    entries: &entries[k],
                    algorithm: self.shape.algorithm,
                    window,
                    holder: &self.name,
                    report: Report {
                        requests: allowed + denied,
                        elapsed_secs: 5,
                    },
                    terms,
                    counted: Some(counted),
                })
                .await
                .unwrap();
            let before = filter.gained();
            filter.assign(now, token_bucket(grant.tokens, window, 1.0), 15);
            more.push(filter.gained() - before);
        }
        self.next_report = now + 5_000_000;
        more
    }
}

/// The bound of a token bucket, checked hit by hit: the admitted hits of
/// all replicas, at the times they were admitted, must be what one
/// bucket of the shape's burst and rate admits (a reference bucket,
/// exact in integer units, never goes below empty). A fixed window's
/// bound is checked per window.
#[derive(Clone)]
struct Reference {
    bucket: bool,
    step: u128,
    k: u128,
    full: u128,
    debt: u128,
    last: u64,
    /// Tokens the bucket may be over (answers timed on their way back).
    slack: u128,
}

impl Reference {
    fn new(shape: Shape) -> Reference {
        let (step, k) = tollgate::limit::bucket_scale(shape.limit, shape.window_micros());
        Reference {
            bucket: shape.algorithm == Algorithm::TokenBucket,
            step: u128::from(step),
            k: u128::from(k),
            // The burst: the limit (the rule names none).
            full: u128::from(shape.limit) * u128::from(step),
            debt: 0,
            last: 0,
            slack: 0,
        }
    }

    fn admit(&mut self, now: u64, what: &str) {
        if !self.bucket {
            return;
        }
        let drained = u128::from(now.saturating_sub(self.last)) * self.k;
        self.debt = self.debt.saturating_sub(drained) + self.step;
        self.last = now;
        assert!(
            self.debt <= self.full + self.slack * self.step,
            "{what}: a hit admitted at {now} passes the bucket ({} tokens over)",
            (self.debt - self.full).div_ceil(self.step)
        );
    }
}

impl Shape {
    fn window_micros(self) -> u64 {
        Window::from(self.unit).micros()
    }
}

/// What a run saw: the admitted and demanded hits of each settled
/// limiter-window, the hits admitted without a store call, the store calls
/// made, and the hits asked and admitted in all.
struct Seen {
    settled: Vec<(u64, u64)>,
    local: u64,
    store_calls: u64,
    asked: u64,
    admitted: u64,
    /// Leased hits never used: forgotten at their end, or lost in a crash.
    unused: u64,
    /// Hits leases reserved in the windows after their own.
    reserved: u64,
}

/// One run: `replicas` replicas over `windows` windows of `shape`, each
/// with a demand per limiter (hits per window) drawn per phase of 3
/// windows; a crash drops a replica's layer (its leases are lost) and a
/// new one takes its place. Settled windows are the last two of each
/// phase. With `envoys` Envoys beside the replicas, each with its quota
/// filter's bucket per limiter, reporting every 5 s for a share of the
/// same limits (RLQS, on the same store): their hits count in the bound,
/// which allows what their buckets were given beyond their rates (first
/// fills, rebuilds). A crashed Envoy comes back as a new stream.
async fn run_with(
    seed: u64,
    replicas: usize,
    envoys: usize,
    windows: u64,
    shape: Shape,
    lease: bool,
) -> Seen {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // On a minute's boundary (and so a second's).
    let clock = Arc::new(ManualClock::at_secs(1_000_020));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(clock.clone()));
    let layer = || Leasing::new(store.clone(), clock.clone() as Arc<dyn Clock>);
    let mut layers: Vec<Leasing> = (0..replicas).map(|_| layer()).collect();
    let entries: Vec<Vec<(String, String)>> = (0..shape.keys)
        .map(|k| vec![("user".to_string(), format!("shared-{k}"))])
        .collect();
    let mut demand = vec![vec![0u64; shape.keys]; replicas];
    let mut buckets = vec![Reference::new(shape); shape.keys];
    // A log's bound is on every trailing window: each limiter's admitted
    // hits of the last window, checked at every admission.
    let mut trailing = vec![std::collections::VecDeque::<u64>::new(); shape.keys];
    let mut owed = vec![vec![0f64; shape.keys]; replicas];
    let mut quotas: Vec<Quota> = (0..envoys).map(|e| Quota::new(shape, e, 0)).collect();
    for (e, q) in quotas.iter_mut().enumerate() {
        q.next_report = clock.now_micros() + e as u64 * 700_000;
    }
    // Per limiter: what the Envoys' buckets were given beyond their rates,
    // in the current window (held when it began, and gained since) and in
    // the whole run.
    let mut free = vec![0f64; shape.keys];
    let mut gained = vec![0f64; shape.keys];
    let mut seen = Seen {
        settled: Vec::new(),
        local: 0,
        store_calls: 0,
        asked: 0,
        admitted: 0,
        unused: 0,
        reserved: 0,
    };
    let retire = |l: &Leasing, seen: &mut Seen| {
        seen.local += l.counts().local;
        seen.store_calls += l.counts().store_calls;
        let c = l.counts();
        seen.reserved += c.reserved_hits;
        // Taken, less what was spent or given back: expired or held at
        // a crash.
        seen.unused += c
            .taken_hits
            .saturating_sub(c.local + c.taken + c.returned_hits);
    };
    let steps_per_window = shape.window_micros() / shape.step;
    for window in 0..windows {
        if window % 3 == 0 {
            for d in demand.iter_mut().flatten() {
                // 0 to 3 times a fair share of the limit, sometimes idle.
                *d = match rng.next_u32() % 4 {
                    0 => 0,
                    1 if shape.quiet => u64::from(rng.next_u32() % 5),
                    _ => u64::from(rng.next_u32()) % (shape.limit * 3 / replicas as u64 + 1),
                };
            }
            for q in &mut quotas {
                for d in q.demand.iter_mut() {
                    *d = match rng.next_u32() % 4 {
                        0 => 0,
                        _ => {
                            u64::from(rng.next_u32())
                                % (shape.limit * 3 / (replicas + envoys) as u64 + 1)
                        }
                    };
                }
            }
        }
        let now = clock.now_micros();
        for (k, f) in free.iter_mut().enumerate() {
            *f = quotas.iter().map(|q| q.filters[k].tokens(now)).sum();
        }
        let mut admitted = vec![0u64; shape.keys];
        let mut asked = vec![0u64; shape.keys];
        for _ in 0..steps_per_window {
            if u64::from(rng.next_u32()) % (2 * steps_per_window) == 0 {
                // A replica crashes (about every other window) and another
                // starts in its place.
                let i = rng.next_u32() as usize % replicas;
                retire(&layers[i], &mut seen);
                layers[i] = layer();
            }
            for i in 0..replicas {
                for k in 0..shape.keys {
                    owed[i][k] += demand[i][k] as f64 / steps_per_window as f64;
                    while owed[i][k] >= 1.0 {
                        owed[i][k] -= 1.0;
                        asked[k] += 1;
                        let d = layers[i]
                            .hit(hit_of(shape, &entries[k], lease))
                            .await
                            .unwrap();
                        admitted[k] += u64::from(d.admitted);
                        if d.admitted && shape.algorithm == Algorithm::SlidingWindowLog {
                            let (now, w) = (clock.now_micros(), shape.window_micros());
                            let trail = &mut trailing[k];
                            while trail.front().is_some_and(|&t| t + w <= now) {
                                trail.pop_front();
                            }
                            trail.push_back(now);
                            assert!(
                                trail.len() as u64 <= shape.limit,
                                "seed {seed}, {replicas} replicas, limiter {k}: {} admitted in \
                                 the window up to {now}, limit {}",
                                trail.len(),
                                shape.limit
                            );
                        }
                        if d.admitted {
                            buckets[k].slack = gained[k].ceil() as u128;
                            buckets[k].admit(
                                clock.now_micros(),
                                &format!("seed {seed}, {replicas} replicas, limiter {k}"),
                            );
                        }
                    }
                }
            }
            for (e, q) in quotas.iter_mut().enumerate() {
                if u64::from(rng.next_u32()) % (4 * steps_per_window) == 0 {
                    // An Envoy restarts: a new stream, buckets without
                    // an assignment; the old stream's shares expire.
                    *q = Quota::new(shape, e, q.generation + 1);
                }
                let now = clock.now_micros();
                if now >= q.next_report {
                    for (k, more) in q
                        .report(&*store, &entries, now)
                        .await
                        .into_iter()
                        .enumerate()
                    {
                        free[k] += more;
                        gained[k] += more;
                    }
                }
                for k in 0..shape.keys {
                    q.owed[k] += q.demand[k] as f64 / steps_per_window as f64;
                    while q.owed[k] >= 1.0 {
                        q.owed[k] -= 1.0;
                        asked[k] += 1;
                        if q.filters[k].admit(now) {
                            admitted[k] += 1;
                            buckets[k].slack = gained[k].ceil() as u128;
                            buckets[k].admit(now, &format!("seed {seed}, envoy {e}, limiter {k}"));
                        }
                    }
                }
            }
            clock.advance_micros(shape.step);
            if clock.now_micros() % tollgate::storage::lease::IDLE_MICROS < shape.step {
                for l in &layers {
                    l.give_back_idle().await;
                }
            }
        }
        for k in 0..shape.keys {
            assert!(
                shape.algorithm == Algorithm::TokenBucket
                    || admitted[k] as f64 <= shape.limit as f64 + free[k],
                "seed {seed}, {replicas} replicas, {envoys} Envoys, window {window}, limiter {k}: \
                 {} admitted of {}, {:.1} given beyond the shares' rates",
                admitted[k],
                shape.limit,
                free[k]
            );
            if window % 3 != 0 {
                seen.settled.push((admitted[k], asked[k]));
            }
        }
        seen.asked += asked.iter().sum::<u64>();
        seen.admitted += admitted.iter().sum::<u64>();
    }
    for l in &layers {
        retire(l, &mut seen);
    }
    seen
}

/// Runs 12 seeds of `shape` (1 to 10 replicas) and checks the share of
/// min(demand, limit) admitted in settled windows and that at least
/// `local_share` of the admitted hits came from leases; the worst share
/// and the store calls per decision.
async fn property(shape: Shape, windows: u64, local_share: f64) -> (f64, f64) {
    property_with(shape, windows, local_share, 0, 0.95).await
}

/// [`property`] with 1 to `envoys` Envoys beside the replicas (none when
/// 0), settled windows admitting at least `least` of min(demand, limit).
async fn property_with(
    shape: Shape,
    windows: u64,
    local_share: f64,
    envoys: usize,
    least: f64,
) -> (f64, f64) {
    let mut worst = 1.0f64;
    let (mut calls, mut asked) = (0, 0);
    for seed in 0..12u64 {
        let replicas = 1 + (seed as usize * 7) % 10;
        let quotas = if envoys == 0 {
            0
        } else {
            1 + seed as usize % envoys
        };
        let seen = run_with(seed, replicas, quotas, windows, shape, true).await;
        let (admitted, mut wanted): (u64, u64) = seen
            .settled
            .iter()
            .map(|&(a, d)| (a, d.min(shape.limit)))
            .fold((0, 0), |(a, w), (x, y)| (a + x, w + y));
        if shape.algorithm != Algorithm::FixedWindow {
            // A bucket admits more than its rate after a lull (its
            // burst), a sliding counter less than its limit after a busy
            // window (the last one weighs): the mark is what the same
            // limiter admits without leases under the same demand.
            let plain = run_with(seed, replicas, quotas, windows, shape, false).await;
            wanted = plain.settled.iter().map(|&(a, _)| a).sum();
        }
        let share = if wanted == 0 {
            1.0
        } else {
            admitted as f64 / wanted as f64
        };
        let local = seen.local as f64 / seen.admitted.max(1) as f64;
        eprintln!(
            "{:?}/{} seed {seed}: {replicas} replicas, {quotas} Envoys, {admitted} of {wanted} admitted in \
             settled windows ({share:.3}); of {} admitted, {local:.3} from leases; \
             {:.3} store calls per decision (refusals included); {} leased hits unused, \
             {} reserved ahead",
            shape.unit,
            shape.keys,
            seen.admitted,
            seen.store_calls as f64 / seen.asked.max(1) as f64,
            seen.unused,
            seen.reserved
        );
        if shape.quiet {
            assert!(seen.reserved > 0, "seed {seed}: no hit was reserved ahead");
        }
        worst = worst.min(share);
        assert!(
            local >= local_share,
            "seed {seed}: leases decided {local:.3} of the admitted hits"
        );
        calls += seen.store_calls;
        asked += seen.asked;
    }
    assert!(
        worst >= least,
        "settled windows admitted {worst:.3} of min(demand, limit)"
    );
    (worst, calls as f64 / asked as f64)
}

/// Envoys and replicas on one count: 1 to 3 Envoys' quota shares (RLQS)
/// beside 1 to 10 replicas' leases of the same limits, on one store, with
/// both crashing: no window passes the limit plus what the Envoys'
/// buckets were given beyond their shares' rates (a bucket: the reference
/// bucket with that much slack).
#[tokio::test(flavor = "current_thread")]
async fn envoys_and_replicas_keep_one_count() {
    // Minute windows: demand holds three minutes, long against the 5 s a
    // share takes to follow it.
    property_with(QUIET, 12, 0.0, 3, 0.85).await;
    property_with(COOL, 6, 0.0, 3, 0.85).await;
    // A bucket's settled share is against the same run without leases.
    property_with(BUCKET, 12, 0.0, 3, 0.85).await;
    // Per-second windows whose demand changes every 3 s: shares cannot
    // follow (the bound is checked; what is admitted is not).
    property_with(HOT, 12, 0.0, 3, 0.0).await;
}

#[tokio::test(flavor = "current_thread")]
async fn leases_never_pass_the_limit_and_admit_what_is_asked() {
    property(HOT, 12, 0.5).await;
}

/// Token buckets: leased tokens keep their room in the bucket while the
/// lease lives, so the hits admitted from leases (whenever in the lease's
/// life they are spent) and those the bucket gives meanwhile are what one
/// bucket admits; checked hit by hit against a reference bucket.
#[tokio::test(flavor = "current_thread")]
async fn token_bucket_leases_never_pass_the_bucket() {
    property(BUCKET, 12, 0.0).await;
    property(COOL_BUCKETS, 6, 0.0).await;
}

/// Sliding window counters: a lease is hits recorded in the current
/// bucket, spent only while that bucket is current, and what is left at
/// its end goes back. No aligned window (here a bucket) passes the limit,
/// through crashes, and settled windows admit what the same counters
/// admit without leases. A counter flooded past its limit never starts a
/// bucket with room to lease (the last bucket weighs), so its hits are
/// mostly decided in the store, as are a cool counter's while its demand
/// keeps it within half its limit.
#[tokio::test(flavor = "current_thread")]
async fn sliding_counter_leases_never_pass_the_limit() {
    property(COUNTER, 12, 0.0).await;
    property(COOL_COUNTERS, 6, 0.2).await;
}

/// Sliding window logs: a lease's hits are stamped at the end of its
/// life, so they count in every trailing window a hit admitted from it
/// would count in, and what is left at its end goes back. No trailing
/// window passes the limit (checked at every admission), through
/// crashes, and settled windows admit nearly what the same logs admit
/// without leases.
#[tokio::test(flavor = "current_thread")]
async fn sliding_log_leases_never_pass_the_limit() {
    // A lease's hits count up to its life longer than their own would:
    // a flooded log admits a little less (measured 0.94 to 1.00 of the
    // same logs without leases).
    property_with(LOG, 12, 0.0, 0, 0.9).await;
    property(COOL_LOGS, 6, 0.1).await;
}

/// A give-back through a replica that leases restores the budget as it
/// would without leases: first into the lease in force, up to what was
/// spent of it (the store still counts the whole lease), the rest in the
/// store; a check and a give-back answer what the store has left plus
/// the lease's unused hits. Then the window admits exactly what is left.
/// On every algorithm that leases (a log's store gives back only hits
/// stamped by now, never those of a lease still in its life).
#[tokio::test(flavor = "current_thread")]
async fn a_give_back_through_a_lease_restores_the_budget() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
    ] {
        let (clock, layer) = one_replica();
        let shape = Shape {
            algorithm,
            limit: 1000,
            unit: Unit::Minute,
            keys: 1,
            step: 0,
            quiet: false,
        };
        let entries = vec![("user".to_string(), "back".to_string())];
        let leased = || hit_of(shape, &entries, true);
        for i in 0..300 {
            let d = layer.hit(leased()).await.unwrap();
            assert!(d.admitted, "{algorithm:?} hit {i}");
            clock.advance_micros(1_000);
        }
        let c = layer.counts();
        assert!(c.local > 200 && c.taken > 0, "{algorithm:?}: {c:?}");
        let mut given = 0;
        if algorithm == Algorithm::SlidingWindowLog {
            // The lease in force takes back what it spent (its record
            // still counts it): the store alone could not, but for the
            // one hit it admitted first.
            let before = layer
                .hit(Hit {
                    hits: 0,
                    ..leased()
                })
                .await
                .unwrap();
            let back = Hit {
                hits: 2,
                negative: true,
                ..leased()
            };
            let after = layer.hit(back).await.unwrap();
            assert_eq!(after.remaining, before.remaining + 2, "{algorithm:?}");
            given = 2;
            // A log's store gives back only hits stamped by now: those of
            // earlier leases still in their life are not (it admits
            // less). Past the life, and the last lease's rest back:
            let life = tollgate::limit::algorithms::sliding_log::lease_life(60_000_000);
            clock.advance_micros(life);
            layer.give_back_idle().await;
        }
        let check = layer
            .hit(Hit {
                hits: 0,
                ..leased()
            })
            .await
            .unwrap();
        assert_eq!(check.remaining, 700 + given, "{algorithm:?}: a check");
        let back = Hit {
            hits: 200 - given,
            negative: true,
            ..leased()
        };
        assert_eq!(
            layer.hit(back).await.unwrap().remaining,
            900,
            "{algorithm:?}: 200 given back"
        );
        // More than the lease in force spent goes back too, in the store
        // (here as a descriptor carrying its own cost, never leased).
        let more = Hit {
            hits: 100,
            negative: true,
            lease: false,
            ..leased()
        };
        assert_eq!(
            layer.hit(more).await.unwrap().remaining,
            1000,
            "{algorithm:?}: all given back"
        );
        let mut admitted = 0;
        for _ in 0..1_100 {
            admitted += u64::from(layer.hit(leased()).await.unwrap().admitted);
            clock.advance_micros(1_000);
        }
        assert_eq!(admitted, 1000, "{algorithm:?}: {:?}", layer.counts());
    }
}

/// Limiters each replica hits less than once a second still get leases
/// (the store has plenty left, so a lease holds a few of the next hits):
/// the bound and the admitted share hold, and most decisions need no
/// store call.
#[tokio::test(flavor = "current_thread")]
async fn cool_limiters_are_leased_too() {
    property(COOL, 6, 0.75).await;
}

/// Hits reserved in the next windows count in them: with demand often a
/// few hits a window (reserved ahead, idle replicas keeping what they
/// reserved) and floods after it, no window passes the limit, through
/// crashes, and settled windows admit what is asked.
#[tokio::test(flavor = "current_thread")]
async fn hits_reserved_ahead_never_pass_the_limit() {
    property(QUIET, 12, 0.5).await;
    property(QUIET_COUNTERS, 12, 0.3).await;
}

/// A limiter hit a few times a window reserves its next windows' hits
/// with its lease, so it asks the store about once every eight windows
/// rather than once in each: 200 limiters of 100,000 a minute, each hit 3
/// times a minute for 12 minutes, cost fewer than 0.3 store calls per
/// limiter and window (two calls in the first window, one in the ninth;
/// a call in each window without the reservations, 0.33 with three
/// windows reserved), and every hit is admitted. The housekeeping walk,
/// every second here, looks at each limiter a few times a window (at
/// window ends, when its lease and reservations end), not at each of the
/// window's 60 walks.
#[tokio::test(flavor = "current_thread")]
async fn limiters_hit_a_few_times_a_window_ask_once_in_several() {
    few_times_a_window(Algorithm::FixedWindow, 0.3, 0).await;
}

/// The same for sliding window counters (two buckets of a minute): a
/// counter reserves only once its demand has been seen over a bucket, so
/// its first two buckets take a call each as well (two in the first),
/// then one every eight: under 0.4 calls per limiter and bucket, against
/// at least one without the reservations. Their hits drift 7 s later
/// each minute (gaps of 13 to 27 s), so the long-run demand's start moves
/// as it ages, as it does under real traffic.
#[tokio::test(flavor = "current_thread")]
async fn counters_hit_a_few_times_a_bucket_ask_once_in_several() {
    few_times_a_window(Algorithm::SlidingWindowCounter, 0.4, 7).await;
}

async fn few_times_a_window(algorithm: Algorithm, most: f64, drift: u64) {
    let shape = Shape {
        algorithm,
        limit: 100_000,
        keys: 200,
        ..QUIET
    };
    let (clock, layer) = one_replica();
    let entries = users(shape, "u");
    let windows = 12;
    // Each limiter at 0, 20 and 40 s into a minute, offset by its index
    // (and `drift` seconds more each minute).
    for second in 0..windows * 60 {
        for (k, e) in entries.iter().enumerate() {
            if (second + k as u64 + drift * (second / 60)).is_multiple_of(20) {
                admit(&layer, shape, e).await;
            }
        }
        clock.advance_micros(1_000_000);
        layer.give_back_idle().await;
    }
    let c = layer.counts();
    let per = c.store_calls as f64 / (shape.keys as u64 * windows) as f64;
    eprintln!(
        "{algorithm}: {} store calls for {} hits: {per:.3} per limiter and window; {} local",
        c.store_calls,
        shape.keys as u64 * windows * 3,
        c.local
    );
    assert!(
        per < most,
        "{algorithm}: {per:.3} store calls per limiter and window"
    );
    let walked = c.walked as f64 / (shape.keys as u64 * windows) as f64;
    eprintln!("the walk looked at each limiter {walked:.1} times a window");
    assert!(
        walked < 6.0,
        "{algorithm}: {walked:.1} looks per limiter and window"
    );
    assert!(c.reserved_hits > 0, "{algorithm}: {c:?}");
}

/// A log hit less than once in its lease's life (a minute's log, life
/// 6 s, hit every 10 s) takes no lease: each hit is one store call, not
/// a lease and its give-back. A busier one (every 2 s: 3 hits a life)
/// still leases, with fewer calls than hits.
#[tokio::test(flavor = "current_thread")]
async fn a_log_hit_less_than_once_a_lease_life_takes_no_lease() {
    let shape = Shape {
        algorithm: Algorithm::SlidingWindowLog,
        limit: 1_000,
        keys: 20,
        ..QUIET
    };
    for (every, hits) in [(10, 60u64), (2, 300)] {
        let (clock, layer) = one_replica();
        let entries = users(shape, "u");
        for second in 0..hits * every {
            for (k, e) in entries.iter().enumerate() {
                if (second + k as u64).is_multiple_of(every) {
                    admit(&layer, shape, e).await;
                }
            }
            clock.advance_micros(1_000_000);
            layer.give_back_idle().await;
        }
        let c = layer.counts();
        let sent = shape.keys as u64 * hits;
        eprintln!(
            "hit every {every} s: {} store calls for {sent} hits, {} local",
            c.store_calls, c.local
        );
        if every == 10 {
            assert!(c.store_calls <= sent + shape.keys as u64, "{c:?}");
        } else {
            assert!(c.store_calls < sent, "{c:?}");
        }
    }
}

/// The wall clock in micros: windows are aligned on it (Redis runs on this
/// machine's clock).
fn wall_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// One call, timed on the wall clock just before it was sent and just
/// after its answer came: it was decided somewhere in between.
#[derive(Clone, Copy, Debug)]
struct Call {
    sent: u64,
    answered: u64,
    admitted: bool,
}

/// What one window saw of a flood's calls.
#[derive(Debug)]
struct Window1 {
    /// Calls sent and answered inside it.
    asked: u64,
    /// Of those, admitted: each was decided inside it.
    admitted: u64,
    /// Admitted calls that spanned one of its ends: decided in it or in a
    /// neighbour, so they count against neither.
    spanning: u64,
}

impl Window1 {
    fn of(calls: &[Call], from: u64, span: u64) -> Window1 {
        let to = from + span;
        let inside = |c: &&Call| c.sent >= from && c.answered < to;
        let spans = |c: &&Call| c.sent < to && c.answered >= from && !inside(c);
        Window1 {
            asked: calls.iter().filter(inside).count() as u64,
            admitted: calls.iter().filter(inside).filter(|c| c.admitted).count() as u64,
            spanning: calls.iter().filter(spans).filter(|c| c.admitted).count() as u64,
        }
    }
}

/// Checks admitted calls against a bucket of `limit` tokens that refills
/// `limit` every `period` micros: in any interval, the calls sent and
/// answered inside it (so decided inside it) are at most the burst plus
/// what refilled, plus `slack`. Each interval starts at a call's send and
/// ends at a call's answer, so a call slow to come back only leaves the
/// intervals it does not fit in; it never moves into another's.
fn bucket_holds(calls: &[Call], limit: u64, period: u64, slack: u64, what: &str) {
    let mut by_sent = calls.to_vec();
    by_sent.sort_unstable_by_key(|c| c.sent);
    // The answers of the calls sent at or after the current one, sorted.
    let mut answers: Vec<u64> = Vec::with_capacity(by_sent.len());
    for c in by_sent.iter().rev() {
        let at = answers.partition_point(|&a| a < c.answered);
        answers.insert(at, c.answered);
        for (k, &a) in answers.iter().enumerate() {
            let refilled =
                u128::from(a.saturating_sub(c.sent)) * u128::from(limit) / u128::from(period);
            let bound = u128::from(limit + slack) + refilled;
            assert!(
                (k as u128) < bound,
                "{what}: {} hits decided in {} us from {}, past the bucket's {bound}",
                k + 1,
                a - c.sent,
                c.sent
            );
        }
    }
}

/// The checks above still fail when a limit is passed: 301 hits sent and
/// answered inside one second count against it, and a bucket of 300 a
/// second cannot have decided 301 hits in a millisecond, however slow
/// the answers of others were.
#[test]
fn the_timed_checks_catch_a_limit_passed() {
    let call = |sent: u64, answered: u64| Call {
        sent,
        answered,
        admitted: true,
    };
    let mut calls: Vec<Call> = (0..301).map(|i| call(1_000 + i, 2_000 + i)).collect();
    // A slow call across the second's end counts against neither side.
    calls.push(call(999_000, 1_001_000));
    let w = Window1::of(&calls, 0, 1_000_000);
    assert_eq!((w.admitted, w.spanning), (301, 1));
    let passed = std::panic::catch_unwind(|| bucket_holds(&calls, 300, 1_000_000, 0, "test"));
    assert!(passed.is_err(), "301 hits in 1.3 ms passed a bucket of 300");
    // 300 of them, then one a refill later, are within it.
    let mut within: Vec<Call> = (0..300).map(|i| call(1_000 + i, 2_000 + i)).collect();
    within.push(call(1_000_000, 1_001_000));
    bucket_holds(&within, 300, 1_000_000, 0, "test");
}

/// Three replicas of one rule with `lease: true` on a real store, each
/// flooded by its own client at 1.5 times the limit for 3 s: no
/// second admits more than the limit, every second admits most of it, and
/// most hits were decided without a store call.
async fn replicas_share_one_limit(
    store: &[(&str, &str)],
    redis_port: Option<u16>,
    algorithm: Algorithm,
    lease: bool,
    fault: Option<Box<dyn FnOnce() + Send>>,
) -> f64 {
    const PER_SECOND: u64 = 300;
    let domain = unique_domain("leases");
    let rules = format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: second, requests_per_unit: {PER_SECOND}, algorithm: {algorithm}, lease: {lease}}}\n"
    );
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let t = Tollgate::start(&[("r.yaml", &rules)], store).await;
        t.wait_serving(Duration::from_secs(30)).await;
        replicas.push(Arc::new(t));
    }
    // `/rlconfig` says which rules lease.
    let (status, text) = support::http_get(replicas[0].debug, "/rlconfig").await;
    assert_eq!(status, 200);
    assert!(text.contains(&format!("lease={lease}")), "{text}");
    let evals_before = redis_port.map(|p| support::redis::command_calls(p, "evalsha"));
    // Start on a second's boundary, so whole seconds are counted.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    tokio::time::sleep(Duration::from_nanos(
        1_000_000_000 - u64::from(now.subsec_nanos()),
    ))
    .await;
    let start = std::time::Instant::now();
    let start_wall = wall_micros();
    let epoch_second = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // A fault starts a second into the flood, which then lasts 8 s, and
    // a second past the fault's end however long a busy machine makes it
    // (micros from the start; the most while the fault runs).
    let least: u64 = if fault.is_some() { 8 } else { 3 };
    let until = Arc::new(std::sync::atomic::AtomicU64::new(if fault.is_some() {
        u64::MAX
    } else {
        least * 1_000_000
    }));
    let fault = fault.map(|f| {
        let until = until.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let ran = tokio::task::spawn_blocking(f).await;
            let done = start.elapsed();
            let end = (least * 1_000_000).max(done.as_micros() as u64 + 1_000_000);
            // Set before a failed fault panics, so the floods end.
            until.store(end, std::sync::atomic::Ordering::SeqCst);
            ran.unwrap();
            done
        })
    });
    let floods: Vec<_> = replicas
        .iter()
        .map(|t| {
            let (t, domain, until) = (t.clone(), domain.clone(), until.clone());
            tokio::spawn(async move {
                let mut c = t.client().await;
                let mut calls = Vec::new();
                let rate = PER_SECOND / 2;
                while (start.elapsed().as_micros() as u64)
                    < until.load(std::sync::atomic::Ordering::SeqCst)
                {
                    let at = start + Duration::from_micros(calls.len() as u64 * 1_000_000 / rate);
                    tokio::time::sleep_until(at.into()).await;
                    let req = RateLimitRequest {
                        domain: domain.clone(),
                        descriptors: vec![descriptor(&[("user", "shared")])],
                        hits_addend: 0,
                    };
                    let sent = wall_micros();
                    let r = c.should_rate_limit(req).await.unwrap().into_inner();
                    calls.push(Call {
                        sent,
                        answered: wall_micros(),
                        admitted: r.overall_code == Code::Ok as i32,
                    });
                }
                calls
            })
        })
        .collect();
    let mut calls = Vec::new();
    for f in floods {
        calls.extend(f.await.unwrap());
    }
    // Whole seconds the flood lasted.
    let seconds = start.elapsed().as_secs();
    // How far the wall clock (which Redis counts windows by, and which
    // the seconds below are cut by) moved against the monotonic one (by
    // which a lease lives) during the flood: a step of the host's clock
    // shows here.
    let wall_step = (wall_micros() as i64 - start_wall as i64) - start.elapsed().as_micros() as i64;
    let asked = calls.len() as u64;
    let admitted: Vec<Call> = calls.iter().copied().filter(|c| c.admitted).collect();
    // Each second's hits: those sent and answered inside it (decided in
    // it, whatever the machine's speed), and those whose call spanned one
    // of its ends (decided in it or a neighbour).
    // A counter's buckets (here a second each) start its descriptor's
    // phase after the seconds, as the engine staggers them.
    let mut window = tollgate::limit::Window::of(tollgate::limit::Unit::Second);
    if algorithm.spec().staggered {
        window = window.staggered();
    }
    let entries = [("user".to_string(), "shared".to_string())];
    let phase = tollgate::limit::algorithms::sliding_counter::phase(&domain, &entries, window);
    let origin = epoch_second * 1_000_000 - phase;
    let windows: Vec<Window1> = (0..=seconds)
        .map(|s| Window1::of(&calls, origin + s * 1_000_000, 1_000_000))
        .collect();
    eprintln!("{algorithm}: per second {windows:?} of {asked} asked");
    if algorithm == Algorithm::TokenBucket {
        // Against one bucket of 300 a second (a burst of 300), allowing 3
        // tokens for rounding.
        bucket_holds(&admitted, PER_SECOND, 1_000_000, 3, "three replicas");
    } else {
        for (s, w) in windows.iter().enumerate() {
            assert!(
                w.admitted <= PER_SECOND,
                "second {s}: {} admitted of {PER_SECOND} ({w:?}); the wall clock moved {wall_step} µs against the monotonic one during the flood",
                w.admitted
            );
        }
    }
    if let Some(f) = fault {
        let done = f.await.unwrap();
        eprintln!("the fault ended {done:?} into the flood of {seconds} s");
        // Through failovers some seconds may admit less (calls waiting
        // for a new primary), never more.
        // A busy machine may send fewer calls than the flood's pace.
        let admitted = admitted.len() as u64;
        let could = (PER_SECOND * seconds).min(asked);
        assert!(
            admitted >= could * 7 / 10,
            "only {admitted} admitted in {seconds} s of {asked} asked ({windows:?})"
        );
    } else {
        // A second whose calls inside it asked for more than the limit
        // admits most of it; one that a busy machine left with fewer
        // calls tells nothing.
        for (s, w) in windows.iter().enumerate().take(seconds as usize) {
            if w.asked >= PER_SECOND {
                assert!(
                    w.admitted + w.spanning >= PER_SECOND * 8 / 10,
                    "second {s}: only {} admitted ({windows:?})",
                    w.admitted + w.spanning
                );
            } else {
                eprintln!(
                    "second {s}: only {} calls inside it, too few to tell",
                    w.asked
                );
            }
        }
    }
    let mut per = 0.0;
    if let (Some(port), Some(before)) = (redis_port, evals_before) {
        let calls = support::redis::command_calls(port, "evalsha") - before;
        per = calls as f64 / asked as f64;
        eprintln!(
            "lease: {lease}: {calls} script calls for {asked} decisions: {per:.3} per decision"
        );
    }
    for t in replicas {
        Arc::into_inner(t).unwrap().stop().await;
    }
    per
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_limit_on_redis() {
    let redis = RedisServer::start();
    let store = [("store", redis.url())];
    let store: Vec<(&str, &str)> = store.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let fixed = Algorithm::FixedWindow;
    let leased = replicas_share_one_limit(&store, Some(redis.port()), fixed, true, None).await;
    let plain = replicas_share_one_limit(&store, Some(redis.port()), fixed, false, None).await;
    assert!(
        leased * 3.0 < plain,
        "script calls per decision: {leased:.3} leased against {plain:.3} without"
    );
    let counter = Algorithm::SlidingWindowCounter;
    let leased = replicas_share_one_limit(&store, Some(redis.port()), counter, true, None).await;
    let plain = replicas_share_one_limit(&store, Some(redis.port()), counter, false, None).await;
    // Flooded past its limit, a counter has room only as its last bucket
    // loses weight, a few hits at a time: its hits are mostly decided in
    // the store (the bound is what this checks).
    eprintln!("sliding counter: script calls per decision {leased:.3} leased, {plain:.3} without");
    let log = Algorithm::SlidingWindowLog;
    let leased = replicas_share_one_limit(&store, Some(redis.port()), log, true, None).await;
    let plain = replicas_share_one_limit(&store, Some(redis.port()), log, false, None).await;
    // A log flooded past its limit has room only as its oldest hits
    // leave, a few at a time: as a counter, mostly decided in the store.
    eprintln!("sliding log: script calls per decision {leased:.3} leased, {plain:.3} without");
    let bucket = Algorithm::TokenBucket;
    let leased = replicas_share_one_limit(&store, Some(redis.port()), bucket, true, None).await;
    let plain = replicas_share_one_limit(&store, Some(redis.port()), bucket, false, None).await;
    eprintln!("token bucket: script calls per decision {leased:.3} leased, {plain:.3} without");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_limit_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let store = [("store", cluster.url())];
    let store: Vec<(&str, &str)> = store.iter().map(|(k, v)| (*k, v.as_str())).collect();
    replicas_share_one_limit(&store, None, Algorithm::FixedWindow, true, None).await;
    replicas_share_one_limit(&store, None, Algorithm::TokenBucket, true, None).await;
    // Every primary fails over to its replica in turn (a second apart),
    // under the flood.
    let replicas: Vec<u16> = cluster
        .node_ids()
        .into_iter()
        .filter(|(_, _, slots)| slots.is_none())
        .map(|(_, port, _)| port)
        .collect();
    assert_eq!(replicas.len(), 3, "{:?}", cluster.node_ids());
    let failovers = Box::new(move || {
        for port in replicas {
            assert_eq!(support::redis::cli(port, &["CLUSTER", "FAILOVER"]), "OK");
            support::redis::wait_until("the replica took over", Duration::from_secs(30), || {
                support::redis::cli(port, &["INFO", "replication"]).contains("role:master")
            });
            // A second of the flood on the new primary before the next.
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    replicas_share_one_limit(&store, None, Algorithm::FixedWindow, true, Some(failovers)).await;
}

/// A reset through the replica that holds a lease forgets it: after the
/// reset the window admits exactly its limit, not the limit plus what the
/// lease still held.
#[tokio::test(flavor = "current_thread")]
async fn a_reset_forgets_the_lease() {
    let clock = Arc::new(ManualClock::at_secs(2_000_000));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(clock.clone()));
    let layer = Leasing::new(store, clock.clone() as Arc<dyn Clock>);
    let entries = vec![("user".to_string(), "reset".to_string())];
    // 1,000 a second of demand: leases of a tenth of the limit (100);
    // after 150 hits the replica holds 50 unused.
    for _ in 0..150 {
        assert!(layer.hit(hit(&entries)).await.unwrap().admitted);
        clock.advance_micros(1_000);
    }
    assert!(layer.counts().local > 0, "{:?}", layer.counts());
    layer.reset(hit(&entries)).await.unwrap();
    let mut admitted = 0;
    for _ in 0..2 * LIMIT {
        admitted += u64::from(layer.hit(hit(&entries)).await.unwrap().admitted);
    }
    assert_eq!(admitted, LIMIT, "the whole limit after the reset, no more");
}

/// A store on `redis`, ready, with a command timeout of `timeout_ms`.
async fn redis_store(redis: &RedisServer, timeout_ms: u64) -> Arc<dyn Store> {
    let store = RedisStore::connect(RedisConfig {
        url: redis.url(),
        command_timeout: Duration::from_millis(timeout_ms),
        ..RedisConfig::default()
    })
    .await
    .expect("valid settings");
    assert!(store.wait_ready(Duration::from_secs(20)).await);
    Arc::new(store)
}

/// Hits that find a replica's lease spent while its next lease is on the
/// way wait for that one call rather than each ask for a lease of their
/// own: bursts of 50 concurrent hits on a real Redis cost a store call
/// or two each, not one per hit.
#[tokio::test(flavor = "current_thread")]
async fn concurrent_hits_wait_for_one_lease() {
    let redis = RedisServer::start();
    let store = redis_store(&redis, 500).await;
    let clock: Arc<dyn Clock> = Arc::new(tollgate::clock::SystemClock);
    let layer = Leasing::new(store, clock);
    let entries = vec![("user".to_string(), "burst".to_string())];
    // 1,000 a minute: leases of at most 100 hits.
    let shape = Shape {
        limit: 1_000,
        unit: Unit::Minute,
        ..COOL
    };
    // One hit first: the replica learns what the window has left.
    admit(&layer, shape, &entries).await;
    let before = layer.counts();
    for _ in 0..5 {
        let burst = (0..50).map(|_| layer.hit(hit_of(shape, &entries, true)));
        for d in futures_util::future::join_all(burst).await {
            assert!(d.unwrap().admitted);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = layer.counts();
    let calls = after.store_calls - before.store_calls;
    eprintln!("250 hits in bursts of 50: {calls} store calls; {after:?}");
    // Leases of about 100 hits: three, and one more if a window ended
    // during the bursts (its unused hits are forgotten, not given back).
    assert!(calls <= 6, "{calls} store calls for 250 hits: {after:?}");
    assert!(after.local - before.local >= 250 - calls, "{after:?}");
}

/// Users as Envoy sends them: 500 limiters of a billion a minute, each
/// hit at random about eight times a minute for six minutes, with the
/// walk every 250 ms. Some leases are spent by a window's last hit and
/// kept (receipt, no tokens) until it ends; still the walk looks at each
/// limiter a few times a window, not at each of the window's 240 walks.
#[tokio::test(flavor = "current_thread")]
async fn random_users_leave_the_walk_idle() {
    let shape = Shape {
        limit: 1_000_000_000,
        keys: 500,
        ..QUIET
    };
    let (clock, layer) = one_replica();
    let entries = users(shape, "u");
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let windows = 6;
    for _ in 0..windows * 240 {
        for e in &entries {
            if rng.next_u32() % 30 == 0 {
                admit(&layer, shape, e).await;
            }
        }
        clock.advance_micros(250_000);
        layer.give_back_idle().await;
    }
    let c = layer.counts();
    let walked = c.walked as f64 / (shape.keys as u64 * windows) as f64;
    eprintln!("the walk looked at each limiter {walked:.1} times a window; {c:?}");
    assert!(walked < 6.0, "{walked:.1} looks per limiter and window");
    assert!(c.local > c.store_calls * 4, "{c:?}");
}

/// On Redis: 50 limiters of 1,000 a second, each hit by one replica 4
/// times a second, reserve their next windows' hits with their leases,
/// so after the first second they cost the store well under one call per
/// limiter and second (each window needs one without the reservations;
/// here the first second's reservations cover the rest); and a plain client
/// flooding one of them mid-second gets what its window has left after
/// the replica's hits and reservations, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_reserved_ahead_on_redis() {
    let redis = RedisServer::start();
    let store = redis_store(&redis, 2_000).await;
    let clock: Arc<dyn Clock> = Arc::new(tollgate::clock::SystemClock);
    let layer = Leasing::new(store.clone(), clock.clone());
    let shape = Shape {
        limit: 1_000,
        unit: Unit::Second,
        keys: 50,
        ..QUIET
    };
    let domain = unique_domain("ahead");
    let entries: Vec<Vec<(String, String)>> = (0..shape.keys)
        .map(|k| vec![(domain.clone(), format!("u{k}"))])
        .collect();
    // 50 ms into a second.
    let into = clock.now_micros() % 1_000_000;
    tokio::time::sleep(Duration::from_micros(1_050_000 - into)).await;
    let start = tokio::time::Instant::now();
    let seconds = 6;
    let mut floods = Vec::new();
    let mut first = layer.counts();
    let mut first_at = wall_micros();
    // The replica's hits on the first limiter, timed.
    let mut own = Vec::new();
    for s in 0..seconds {
        for q in 0..4u64 {
            tokio::time::sleep_until(start + Duration::from_millis(s * 1_000 + q * 250)).await;
            if s == 1 && q == 0 {
                // The first second teaches the replica each limiter's demand.
                first = layer.counts();
                first_at = wall_micros();
            }
            for (k, e) in entries.iter().enumerate() {
                let sent = wall_micros();
                admit(&layer, shape, e).await;
                if k == 0 {
                    own.push(Call {
                        sent,
                        answered: wall_micros(),
                        admitted: true,
                    });
                }
            }
            if q == 1 && s >= 2 {
                // At about 0.35 s: 1,100 plain hits on the first limiter.
                let sent = wall_micros();
                let flood = (0..1_100).map(|_| store.hit(hit_of(shape, &entries[0], false)));
                let admitted = futures_util::future::join_all(flood)
                    .await
                    .into_iter()
                    .filter(|d| d.as_ref().is_ok_and(|d| d.admitted))
                    .count() as u64;
                floods.push((sent, wall_micros(), admitted));
            }
        }
    }
    let c = layer.counts();
    let calls = c.store_calls - first.store_calls;
    // The windows the schedule touched after the first: 5 on time, more
    // when a busy machine made it late (each needs its store call).
    let windows = wall_micros() / 1_000_000 - first_at / 1_000_000 + 1;
    let per = calls as f64 / (shape.keys as u64 * windows) as f64;
    eprintln!(
        "after the first second, {calls} store calls for {} hits in {windows} windows \
         ({per:.3} per limiter and window), {} reserved ahead; floods (sent, answered, \
         admitted) {floods:?}; {c:?}",
        shape.keys as u64 * (seconds - 1) * 4,
        c.reserved_hits
    );
    assert!(per < 0.4, "{per:.3} store calls per limiter and window");
    assert!(c.reserved_hits > 0, "{c:?}");
    let mut judged = 0;
    for (sent, answered, n) in floods {
        let window = sent / 1_000_000;
        if answered / 1_000_000 != window {
            eprintln!("a flood from {sent} to {answered} spanned two windows: it tells nothing");
            continue;
        }
        judged += 1;
        // The replica's hits decided in the flood's window count in it
        // too (from a lease of at most 10 hits, and a reservation of at
        // most 10); those a busy machine made late may count in the next.
        let w = Window1::of(&own, window * 1_000_000, 1_000_000);
        assert!(
            n + w.admitted <= shape.limit,
            "a flood got {n} beside {} of the replica's",
            w.admitted
        );
        assert!(n >= shape.limit - 4 - 20, "a flood got only {n}");
    }
    assert!(judged > 0, "every flood spanned two windows");
}

/// An idle lease taken while the window had plenty left stays until the
/// window ends when it holds at most a hundredth of the limit (giving it
/// back would cost a store call for nothing); a larger one goes back.
#[tokio::test(flavor = "current_thread")]
async fn small_idle_leases_are_kept_large_ones_given_back() {
    for (limit, kept) in [(1_000_000, true), (1_000, false)] {
        let clock = Arc::new(ManualClock::at_secs(3_000_000));
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(clock.clone()));
        let layer = Leasing::new(store, clock.clone() as Arc<dyn Clock>);
        let entries = vec![("user".to_string(), "idle".to_string())];
        let shape = Shape {
            limit,
            unit: Unit::Minute,
            ..COOL
        };
        // Ten hits a second for a second, then nothing for 15 s.
        for _ in 0..10 {
            admit(&layer, shape, &entries).await;
            clock.advance_micros(100_000);
        }
        let held = layer.counts();
        assert!(held.taken_hits > held.local + held.taken, "{held:?}");
        for _ in 0..60 {
            clock.advance_micros(250_000);
            layer.give_back_idle().await;
        }
        let c = layer.counts();
        eprintln!("limit {limit}: {c:?}");
        if kept {
            assert_eq!(c.returned_hits, 0, "{c:?}");
            assert_eq!(c.store_calls, held.store_calls, "{c:?}");
            // The next hit is still decided from it.
            layer.hit(hit_of(shape, &entries, true)).await.unwrap();
            assert_eq!(layer.counts().local, c.local + 1);
        } else {
            assert!(c.returned_hits > 0, "{c:?}");
        }
    }
}

/// A token bucket's hit admitted from a lease answers, as the store does,
/// the time until the bucket is full again (not the lease's life).
#[tokio::test(flavor = "current_thread")]
async fn a_bucket_lease_answers_the_time_until_full() {
    let clock = Arc::new(ManualClock::at_secs(4_000_000));
    let leased_store: Arc<dyn Store> = Arc::new(MemoryStore::new(clock.clone()));
    let plain: Arc<dyn Store> = Arc::new(MemoryStore::new(clock.clone()));
    let layer = Leasing::new(leased_store, clock.clone() as Arc<dyn Clock>);
    let entries = vec![("user".to_string(), "full".to_string())];
    // 100 a second, a burst of 100: a hit every 2 ms for 60 ms.
    let shape = Shape {
        limit: 100,
        ..BUCKET
    };
    for i in 0..30 {
        let a = layer.hit(hit_of(shape, &entries, true)).await.unwrap();
        let b = plain.hit(hit_of(shape, &entries, false)).await.unwrap();
        assert!(a.admitted && b.admitted);
        // Within the time of two tokens (10 ms each).
        assert!(
            a.reset_micros.abs_diff(b.reset_micros) <= 20_000,
            "hit {i}: leased {} µs, the bucket {} µs",
            a.reset_micros,
            b.reset_micros
        );
        clock.advance_micros(2_000);
    }
    assert!(layer.counts().local > 15, "{:?}", layer.counts());
}

/// One replica flooding a limit does not starve another that asks for a
/// tenth of it: the small one's first hit in each window takes a lease of
/// its demand until the window ends, before the flood drains the window.
/// Without leases the flood, asking first and fifty times as often,
/// takes almost all of each window.
#[tokio::test(flavor = "current_thread")]
async fn a_flood_on_one_replica_does_not_starve_a_small_one() {
    async fn shares(lease: bool) -> (u64, u64, u64) {
        let clock = Arc::new(ManualClock::at_secs(5_000_000));
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(clock.clone()));
        let flood = Leasing::new(store.clone(), clock.clone() as Arc<dyn Clock>);
        let small = Leasing::new(store, clock.clone() as Arc<dyn Clock>);
        let entries = vec![("user".to_string(), "shared".to_string())];
        // 1,000 a second; the flood asks 5,000 a second, the small
        // replica 100 (one hit every 10 ms), over 6 s; the first second
        // (no rates known yet) is not counted.
        let (mut small_asked, mut small_admitted, mut all_admitted) = (0, 0, 0);
        for ms in 0..6_000u64 {
            let counted = ms >= 1_000;
            for _ in 0..5 {
                let d = flood.hit(hit_of(HOT, &entries, lease)).await.unwrap();
                all_admitted += u64::from(d.admitted && counted);
            }
            if ms % 10 == 5 {
                let d = small.hit(hit_of(HOT, &entries, lease)).await.unwrap();
                small_asked += u64::from(counted);
                small_admitted += u64::from(d.admitted && counted);
                all_admitted += u64::from(d.admitted && counted);
            }
            clock.advance_micros(1_000);
        }
        (small_asked, small_admitted, all_admitted)
    }
    let (asked, leased, all) = shares(true).await;
    let (_, plain, plain_all) = shares(false).await;
    eprintln!(
        "small replica: {leased} of {asked} admitted with leases, {plain} without; \
         all: {all} and {plain_all} of 5 s x {LIMIT}"
    );
    assert!(all <= 5 * LIMIT && plain_all <= 5 * LIMIT);
    assert!(leased * 100 >= asked * 95, "{leased} of {asked}");
    assert!(plain * 2 < asked, "{plain} of {asked} without leases");
}

/// The walk looks only at limiters whose time has come: 64 busy limiters
/// (1,000 a minute, each hit every 2 s: leases of tens of hits, given
/// back only after a few of their gaps) among 20,000 quiet ones (a
/// billion a minute, each hit once a minute: small leases kept until
/// their window ends), the walk every 250 ms for six minutes. A busy
/// limiter spends its lease for a minute, so some limiter is nearly always
/// waiting to be looked at; still each limiter is looked at a few times a
/// window, not at each of the window's 240 walks.
#[tokio::test(flavor = "current_thread")]
async fn a_busy_limiter_does_not_make_the_walk_look_at_quiet_ones() {
    let busy = Shape {
        limit: 1_000,
        keys: 64,
        ..QUIET
    };
    let quiet = Shape {
        limit: 1_000_000_000,
        keys: 20_000,
        ..QUIET
    };
    let (clock, layer) = one_replica();
    let (busy_users, quiet_users) = (users(busy, "b"), users(quiet, "q"));
    let windows = 6;
    for tick in 0..windows * 240 {
        for (k, e) in busy_users.iter().enumerate() {
            if (tick + k) % 8 == 0 {
                admit(&layer, busy, e).await;
            }
        }
        for (k, e) in quiet_users.iter().enumerate() {
            if (tick + k) % 240 == 0 {
                admit(&layer, quiet, e).await;
            }
        }
        clock.advance_micros(250_000);
        layer.give_back_idle().await;
    }
    let c = layer.counts();
    let limiters = (busy.keys + quiet.keys) as u64;
    let walked = c.walked as f64 / (limiters * windows as u64) as f64;
    eprintln!("the walk looked at each limiter {walked:.1} times a window; {c:?}");
    assert!(walked < 6.0, "{walked:.1} looks per limiter and window");
    assert!(c.local > c.store_calls, "{c:?}");
}

/// A replica whose wall clock steps back 30 s in the middle of a window
/// (an NTP step, a VM resumed) never admits more than the limit in any
/// window of the store, which keeps its own clock (as Redis does): a
/// lease lives as long as the store's answer said, on this replica's
/// monotonic clock, however the wall clock steps. The replica takes
/// leases early in a window of 10 s, its clock steps back while it holds
/// one, and in the next window another client takes the whole limit from
/// the store while the replica goes on hitting.
#[tokio::test]
async fn a_wall_clock_step_back_does_not_extend_a_lease() {
    const WINDOW: u64 = 10_000_000;
    let t0 = 6_000_000 * 1_000_000;
    let store_clock = Arc::new(ManualClock::at_micros(t0 + 1_000_000));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(store_clock.clone()));
    let clock = Arc::new(ManualClock::at_micros(t0 + 1_000_000));
    let replica = Leasing::new(store.clone(), clock.clone() as Arc<dyn Clock>);
    let entries = vec![("user".to_string(), "stepped".to_string())];
    let shape = Shape {
        algorithm: Algorithm::FixedWindow,
        limit: 100,
        unit: Unit::Second,
        keys: 1,
        step: 0,
        quiet: false,
    };
    let h = Hit {
        window: tollgate::limit::Window::new(Unit::Second, 10).unwrap(),
        ..hit_of(shape, &entries, true)
    };
    // Admitted hits by the store's window.
    let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
    let tick = |micros: u64| {
        clock.advance_micros(micros);
        store_clock.advance_micros(micros);
    };
    let mut hits = 0;
    // Hits until the replica holds a lease with hits left.
    while hits < 100 {
        hits += 1;
        assert!(replica.hit(h).await.unwrap().admitted);
        *per_window
            .entry(store_clock.now_micros() / WINDOW)
            .or_default() += 1;
        tick(50_000);
        let c = replica.counts();
        if c.taken > 0 && c.taken_hits > hits {
            break;
        }
    }
    clock.step_wall_micros(-30_000_000);
    // The next window: another client takes all it can.
    tick(WINDOW - store_clock.now_micros() % WINDOW + 100_000);
    let window = store_clock.now_micros() / WINDOW;
    let direct = Hit { lease: false, ..h };
    for _ in 0..200 {
        if store.hit(direct).await.unwrap().admitted {
            *per_window.entry(window).or_default() += 1;
        }
    }
    for _ in 0..50 {
        if replica.hit(h).await.unwrap().admitted {
            *per_window
                .entry(store_clock.now_micros() / WINDOW)
                .or_default() += 1;
        }
        tick(20_000);
    }
    for (window, n) in &per_window {
        assert!(
            *n <= 100,
            "window {window}: {n} admitted of 100 ({per_window:?}, {:?})",
            replica.counts()
        );
    }
}

/// Distinct values a client sends on a leased rule in the memory test.
const VALUES: u64 = 150_000;
/// The lease map's cap in the memory test: below [`VALUES`], so that
/// values past it are seen too.
const MEMORY_CAP: u64 = 50_000;
/// What one held limiter may take of resident memory at most (measured:
/// about 370 bytes with keys of 12 bytes): the entry's size is held to it.
const BYTES_PER_LIMITER: u64 = 420;
/// The variable that makes the test binary's child run one side of
/// `a_client_s_values_keep_the_lease_map_bounded`: `lease` or `plain`.
const MEMORY_SIDE: &str = "TOLLGATE_TEST_LEASE_MEMORY_SIDE";

/// This process's resident memory, in bytes.
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Values in the memory test of limiters holding reservations ahead: as
/// many as the map holds, so that its table is as full as in the other.
const AHEAD_VALUES: u64 = MEMORY_CAP;
/// What a limiter's reservations may add to its resident memory at most:
/// the lease layer's run of them and the embedded store's seven counts
/// beside the counter's, about 80 bytes each with the allocator's own,
/// and 40 for what seven passes leave free in the heap. (A lease call's
/// channel kept for as long as the limiter took some 400 more.)
const AHEAD_BYTES: u64 = 200;

/// One side of the memory test, in a child process of its own (so the
/// other side's allocations do not count), leased or not (`lease`,
/// `plain`): [`VALUES`] distinct values on a fixed window of 10 a minute
/// through a leasing layer over the embedded store; or (`ahead-lease`,
/// `ahead-plain`) [`AHEAD_VALUES`] values on a sliding counter of 100,000
/// a minute, each hit every 20 s for two minutes, so that leases reserve
/// ahead. Prints what resident memory grew by.
#[tokio::test]
async fn lease_memory_side() {
    let Ok(side) = std::env::var(MEMORY_SIDE) else {
        return;
    };
    let clock = Arc::new(ManualClock::at_secs(7_000_020));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(clock.clone()));
    let layer =
        Leasing::with_max_limiters(store, clock.clone() as Arc<dyn Clock>, MEMORY_CAP as usize);
    let ahead = side.starts_with("ahead");
    let lease = side.ends_with("lease");
    let shape = Shape {
        algorithm: if ahead {
            Algorithm::SlidingWindowCounter
        } else {
            Algorithm::FixedWindow
        },
        limit: if ahead { 100_000 } else { 10 },
        unit: Unit::Minute,
        keys: 1,
        step: 0,
        quiet: false,
    };
    let (values, passes) = if ahead {
        (AHEAD_VALUES, 7)
    } else {
        (VALUES, 1)
    };
    let before = resident_bytes();
    let mut entries = vec![("api_key".to_string(), String::new())];
    for _ in 0..passes {
        for i in 0..values {
            entries[0].1 = format!("key-{i:012}");
            let d = layer.hit(hit_of(shape, &entries, lease)).await.unwrap();
            assert!(d.admitted, "value {i}: {d:?}");
            clock.advance_micros(20);
        }
        if ahead {
            clock.advance_micros(20_000_000 - values * 20);
            layer.give_back_idle().await;
        }
    }
    if !ahead {
        // Past the cap a limiter is decided in the store, exactly.
        entries[0].1 = "one-more".to_string();
        let mut admitted = 0;
        for _ in 0..15 {
            admitted += u64::from(
                layer
                    .hit(hit_of(shape, &entries, true))
                    .await
                    .unwrap()
                    .admitted,
            );
        }
        assert_eq!(admitted, 10, "{:?}", layer.counts());
    }
    let c = layer.counts();
    println!(
        "grew={} limiters={} past_cap={} bytes={} reserving={} store_bytes={}",
        resident_bytes().saturating_sub(before),
        c.limiters,
        c.past_cap,
        c.bytes,
        c.reserving,
        layer.gauges().bytes.unwrap_or(0)
    );
}

/// Runs one side of the memory test in a child process: (grew, limiters,
/// past_cap, bytes, reserving, the store's bytes).
fn memory_side(side: &str) -> (u64, u64, u64, u64, u64, u64) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "lease_memory_side",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(MEMORY_SIDE, side)
        .output()
        .expect("the test binary runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{side}: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find_map(|l| l.find("grew=").map(|at| l[at..].to_string()))
        .expect(&text);
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .unwrap()
            .parse()
            .unwrap()
    };
    (
        field("grew="),
        field("limiters="),
        field("past_cap="),
        field("bytes="),
        field("reserving="),
        field("store_bytes="),
    )
}

/// A client sending [`VALUES`] distinct values on a leased rule (random
/// API keys) grows tollgate's memory by what the same rule costs without
/// leases and at most [`BYTES_PER_LIMITER`] per limiter held: the lease
/// map holds at most `lease.max_limiters` limiters, and past it hits go
/// to the store as without leases (each admitted, and a limiter past the
/// cap is still limited exactly), counted. So the default cap's worst
/// case is bounded too, and `tollgate_lease_bytes` (what the layer counts
/// of itself) reads what it takes. Resident memory of a child process
/// per side, measured from /proc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_s_values_keep_the_lease_map_bounded() {
    let (leased, limiters, past_cap, counted, ..) =
        tokio::task::spawn_blocking(move || memory_side("lease"))
            .await
            .unwrap();
    let (plain, ..) = tokio::task::spawn_blocking(move || memory_side("plain"))
        .await
        .unwrap();
    let extra = leased.saturating_sub(plain);
    let per = extra / limiters.max(1);
    let default = tollgate::storage::lease::DEFAULT_MAX_LIMITERS as u64;
    eprintln!(
        "{VALUES} values: leased +{:.1} MiB ({limiters} limiters held, {past_cap} hits past \
         the cap, {:.1} MiB counted), plain +{:.1} MiB: {per} bytes a limiter, so {:.0} MiB \
         at the default cap of {default}",
        leased as f64 / 1048576.0,
        counted as f64 / 1048576.0,
        plain as f64 / 1048576.0,
        (per * default) as f64 / 1048576.0
    );
    assert_eq!(limiters, MEMORY_CAP, "the map fills to its cap");
    assert!(
        past_cap >= VALUES - MEMORY_CAP,
        "{past_cap} hits past the cap"
    );
    assert!(
        per <= BYTES_PER_LIMITER,
        "a held limiter takes {per} bytes: leased +{leased} bytes, plain +{plain}"
    );
    // What the layer counts of itself is most of what it takes (the rest
    // is the allocator's own), never more.
    assert!(
        counted <= extra && counted * 10 >= extra * 7,
        "counted {counted} bytes of {extra}"
    );
}

/// Limiters holding reservations ahead (a sliding counter hit a few
/// times a bucket) stay bounded too: each adds at most [`AHEAD_BYTES`] to
/// what [`BYTES_PER_LIMITER`] allows, and `tollgate_lease_bytes` counts
/// their runs. Resident memory of a child process per side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_ahead_keep_a_limiter_small() {
    let (leased, limiters, _, counted, reserving, store_leased) =
        tokio::task::spawn_blocking(move || memory_side("ahead-lease"))
            .await
            .unwrap();
    let (plain, .., store_plain) = tokio::task::spawn_blocking(move || memory_side("ahead-plain"))
        .await
        .unwrap();
    eprintln!("the store counts {store_leased} bytes leased, {store_plain} plain");
    let extra = leased.saturating_sub(plain);
    let per = extra / limiters.max(1);
    eprintln!(
        "{AHEAD_VALUES} values on a counter: leased +{:.1} MiB ({limiters} limiters held, \
         {reserving} reserving, {:.1} MiB counted), plain +{:.1} MiB: {per} bytes a limiter",
        leased as f64 / 1048576.0,
        counted as f64 / 1048576.0,
        plain as f64 / 1048576.0,
    );
    // The map's cap is per shard of it: a few values find theirs full.
    assert!(
        limiters * 100 >= AHEAD_VALUES * 98,
        "{limiters} values held"
    );
    assert!(
        reserving * 10 >= limiters * 8,
        "{reserving} of {limiters} limiters hold reservations: the case measures nothing else"
    );
    assert!(
        per <= BYTES_PER_LIMITER + AHEAD_BYTES,
        "a reserving limiter takes {per} bytes: leased +{leased} bytes, plain +{plain}"
    );
    assert!(counted <= extra, "counted {counted} bytes of {extra}");
}

/// Leases are on by default: a rule naming no algorithm and no `lease`
/// (the sliding window counter) and a sliding log are decided from
/// leases on Redis, most hits without a script call, and `/rlconfig`
/// says so; a rule that cannot lease (`concurrency`) is decided in Redis
/// on every hit, and `/rlconfig` says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_that_do_not_say_lease_by_default() {
    let redis = RedisServer::start();
    let domain = unique_domain("default");
    let rules = format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: 100000}}\n  - key: log\n    rate_limit: {{unit: minute, requests_per_unit: 1000, algorithm: sliding_window_log}}\n  - key: slots\n    rate_limit: {{unit: second, requests_per_unit: 1000, algorithm: concurrency, max_duration: 60s}}\n"
    );
    let t = Tollgate::start(&[("r.yaml", &rules)], &[("store", &redis.url())]).await;
    t.wait_serving(Duration::from_secs(30)).await;
    let (status, text) = support::http_get(t.debug, "/rlconfig").await;
    assert_eq!(status, 200);
    let line = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{domain}.{key}:")))
            .unwrap_or_else(|| panic!("no {key} in {text}"))
            .to_string()
    };
    assert!(
        line("user").contains("sliding_window_counter lease=true"),
        "{text}"
    );
    assert!(
        line("log").contains("sliding_window_log lease=true"),
        "{text}"
    );
    assert!(
        line("slots").contains("lease=false (decided in the store: lease: true applies to"),
        "{text}"
    );
    let (_, json) = support::http_get(t.debug, "/rlconfig?format=json").await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let entry = |key: &str| {
        json["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["rule"] == key)
            .cloned()
            .unwrap()
    };
    assert_eq!(entry("user")["leased"], true, "{json}");
    assert_eq!(entry("log")["leased"], true, "{json}");
    assert_eq!(entry("slots")["leased"], false, "{json}");
    assert!(entry("slots")["leaseOffBecause"].is_string(), "{json}");
    let mut c = t.client().await;
    for key in ["user", "log", "slots"] {
        let before = support::redis::command_calls(redis.port(), "evalsha");
        for _ in 0..200 {
            let req = RateLimitRequest {
                domain: domain.clone(),
                descriptors: vec![descriptor(&[(key, "one")])],
                hits_addend: 0,
            };
            let r = c.should_rate_limit(req).await.unwrap().into_inner();
            assert_eq!(r.overall_code, Code::Ok as i32);
        }
        let calls = support::redis::command_calls(redis.port(), "evalsha") - before;
        eprintln!("{key}: {calls} script calls for 200 decisions");
        if key != "slots" {
            assert!(calls <= 20, "{key}: {calls} script calls for 200 decisions");
        } else {
            // (The first key's idle lease may go back meanwhile.)
            assert!(
                calls >= 200,
                "{key}: {calls} script calls for 200 decisions"
            );
        }
    }
    t.stop().await;
}
