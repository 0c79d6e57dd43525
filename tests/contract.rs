//! One behaviour suite for every store: the embedded store (real clock),
//! standalone Redis, a 3+3 Redis Cluster, and a smoke run through Sentinel.
//! Each backend is started once and runs the whole suite; every case uses
//! its own domain, so cases never share counters.

mod support;

#[path = "contract/ahead.rs"]
mod ahead;
#[path = "contract/shares.rs"]
mod shares;
#[path = "contract/timed.rs"]
mod timed;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, join_all};
use tollgate::clock::SystemClock;
use tollgate::limit::algorithms::sliding_counter;
use tollgate::limit::{Algorithm, Unit, Window as Span};
use tollgate::storage::keys::{KeyBuilder, Role};
use tollgate::storage::{
    Ahead, Coalescing, Cost, Decision, Hit, MemoryBounds, MemoryStore, Receipt, RedisConfig,
    RedisStore, Store, StoreError,
};

use support::redis::{RedisCluster, RedisSentinel, RedisServer};
use support::unique_domain;

type DynStore = Arc<dyn Store>;

/// One limiter under test.
#[derive(Clone)]
struct Limiter {
    domain: String,
    entries: Vec<(String, String)>,
    algorithm: Algorithm,
    limit: u64,
    window: Span,
    buckets: u8,
    /// A token bucket's burst; 0 means the limit.
    burst: u64,
    usage_reports: bool,
    /// Hits are answered with receipts ([`Hit::receipt`]).
    receipt: bool,
}

impl Limiter {
    fn new(case: &str, algorithm: Algorithm, limit: u64, window: impl Into<Span>) -> Limiter {
        let window = window.into();
        Limiter {
            domain: unique_domain(case),
            entries: vec![("user".into(), "alice".into())],
            algorithm,
            limit,
            window,
            buckets: 2,
            // A count in flight holds a slot for as long as the window
            // (its max_duration): what the cases wait for to pass.
            burst: if algorithm.releases() {
                window.micros()
            } else {
                0
            },
            usage_reports: false,
            receipt: false,
        }
    }

    /// One whose hits are answered with receipts.
    fn receipts(case: &str, algorithm: Algorithm, limit: u64, unit: Unit) -> Limiter {
        Limiter {
            receipt: true,
            ..Limiter::new(case, algorithm, limit, unit)
        }
    }

    /// A hit of `hits` on this limiter.
    fn as_hit(&self, hits: u64, negative: bool) -> Hit<'_> {
        Hit {
            domain: &self.domain,
            entries: &self.entries,
            algorithm: self.algorithm,
            limit: self.limit,
            window: self.window,
            hits,
            negative,
            usage_reports: self.usage_reports,
            buckets: self.buckets,
            burst: self.burst,
            shard: tollgate::storage::Shard::NONE,
            receipt: self.receipt,
            also: &[],
            lease: false,
            ahead: tollgate::storage::Ahead::NONE,
        }
    }

    /// Takes back what `receipt` says a hit recorded.
    async fn undo(&self, store: &dyn Store, receipt: Receipt) {
        store
            .undo(self.as_hit(receipt.hits, false), receipt)
            .await
            .unwrap_or_else(|e| panic!("{} {}: undo failed: {e}", store.kind(), self.algorithm))
    }

    /// One that records every positive cost (usage reports).
    fn reports(case: &str, algorithm: Algorithm, limit: u64, unit: Unit) -> Limiter {
        Limiter {
            usage_reports: true,
            ..Limiter::new(case, algorithm, limit, unit)
        }
    }

    /// A sliding window counter with `buckets` buckets.
    fn counter(case: &str, limit: u64, unit: Unit, buckets: u8) -> Limiter {
        Limiter {
            buckets,
            ..Limiter::new(case, Algorithm::SlidingWindowCounter, limit, unit)
        }
    }

    fn with_entries(&self, entries: &[(&str, &str)]) -> Limiter {
        Limiter {
            entries: entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..self.clone()
        }
    }

    async fn call(
        &self,
        store: &dyn Store,
        hits: u64,
        negative: bool,
    ) -> Result<Decision, StoreError> {
        store.hit(self.as_hit(hits, negative)).await
    }

    /// Decides the costs in one [`Store::hit_batch`] call.
    async fn batch(&self, store: &dyn Store, costs: &[Cost]) -> Vec<Decision> {
        let hit = self.as_hit(costs[0].hits, costs[0].negative);
        store
            .hit_batch(hit, &costs[1..])
            .await
            .unwrap_or_else(|e| panic!("{} {}: batch failed: {e}", store.kind(), self.algorithm))
    }

    async fn hit(&self, store: &dyn Store, hits: u64) -> Decision {
        self.call(store, hits, false).await.unwrap_or_else(|e| {
            panic!(
                "{} {}: hit of {hits} failed: {e}",
                store.kind(),
                self.algorithm
            )
        })
    }

    async fn give_back(&self, store: &dyn Store, hits: u64) -> Decision {
        self.call(store, hits, true).await.unwrap_or_else(|e| {
            panic!(
                "{} {}: giving back {hits} failed: {e}",
                store.kind(),
                self.algorithm
            )
        })
    }

    fn window(&self) -> u64 {
        self.window.micros()
    }

    /// The longest reset an answer may carry: the counter's current bucket
    /// (a window over buckets - 1 long) keeps counting through a window.
    fn max_reset(&self) -> u64 {
        match self.algorithm {
            Algorithm::SlidingWindowCounter => {
                let spans = u64::from(self.buckets) - 1;
                self.window() + self.window().div_ceil(spans)
            }
            // A bucket in debt (usage reports) owes more than a window:
            // the 50-of-10 report below owes four.
            Algorithm::TokenBucket => 5 * self.window(),
            _ => self.window(),
        }
    }

    fn assert_reset_in_range(&self, store: &dyn Store, d: &Decision, what: &str) {
        assert!(
            d.reset_micros > 0 && d.reset_micros <= self.max_reset(),
            "{} {}: {what}: reset {} not in (0, {}]",
            store.kind(),
            self.algorithm,
            d.reset_micros,
            self.max_reset()
        );
    }
}

fn ctx(store: &dyn Store, algorithm: Algorithm) -> String {
    format!("{} {algorithm}", store.kind())
}

// ---------------------------------------------------------------- the cases

async fn burst_up_to_the_limit_then_refused(store: &dyn Store, algorithm: Algorithm) {
    let l = Limiter::new("burst", algorithm, 5, Unit::Day);
    for expected in (0..5).rev() {
        let d = l.hit(store, 1).await;
        assert!(
            d.admitted,
            "{}: hit within the limit",
            ctx(store, algorithm)
        );
        assert_eq!(
            d.remaining,
            expected,
            "{}: remaining counts down",
            ctx(store, algorithm)
        );
        l.assert_reset_in_range(store, &d, "admitted");
    }
    let d = l.hit(store, 1).await;
    assert!(!d.admitted, "{}: hit over the limit", ctx(store, algorithm));
    assert_eq!(d.remaining, 0, "{}", ctx(store, algorithm));
    l.assert_reset_in_range(store, &d, "refused");
}

async fn weighted_cost(store: &dyn Store, algorithm: Algorithm) {
    let l = Limiter::new("weighted", algorithm, 9_500, Unit::Day);
    let d = l.hit(store, 100).await;
    assert!(d.admitted, "{}", ctx(store, algorithm));
    assert_eq!(d.remaining, 9_400, "{}", ctx(store, algorithm));
    let d = l.hit(store, 9_400).await;
    assert!(d.admitted, "{}", ctx(store, algorithm));
    assert_eq!(d.remaining, 0, "{}", ctx(store, algorithm));
    let d = l.hit(store, 1).await;
    assert!(!d.admitted, "{}", ctx(store, algorithm));
}

async fn cost_above_the_limit_is_refused_and_not_recorded(store: &dyn Store, algorithm: Algorithm) {
    let l = Limiter::new("too-big", algorithm, 10, Unit::Day);
    assert_eq!(
        l.hit(store, 3).await.remaining,
        7,
        "{}",
        ctx(store, algorithm)
    );
    let d = l.hit(store, 11).await;
    assert!(!d.admitted, "{}: cost 11 > limit 10", ctx(store, algorithm));
    assert_eq!(
        d.remaining,
        7,
        "{}: nothing recorded",
        ctx(store, algorithm)
    );
    l.assert_reset_in_range(store, &d, "cost above the limit");
    let d = l.hit(store, 7).await;
    assert!(
        d.admitted,
        "{}: the rest is still there",
        ctx(store, algorithm)
    );
    assert_eq!(d.remaining, 0, "{}", ctx(store, algorithm));
}

/// A limiter that takes usage reports records every positive cost, also
/// past the limit and above it: the answer says over, checks are refused
/// until enough is given back (or ages out), and the total is exact.
async fn reports_are_recorded_past_the_limit(store: &dyn Store, algorithm: Algorithm) {
    let c = ctx(store, algorithm);
    let l = Limiter::reports("reports", algorithm, 10, Unit::Day);
    let d = l.hit(store, 7).await;
    assert!(d.admitted && d.remaining == 3, "{c}: {d:?}");
    let d = l.hit(store, 5).await;
    assert!(!d.admitted, "{c}: 12 of 10: {d:?}");
    assert_eq!(d.remaining, 0, "{c}");
    l.assert_reset_in_range(store, &d, "a report past the limit");
    let check = l.hit(store, 0).await;
    assert!(!check.admitted, "{c}: check at 12 of 10: {check:?}");
    l.assert_reset_in_range(store, &check, "a check past the limit");
    let d = l.hit(store, 1).await;
    assert!(!d.admitted, "{c}: 13 of 10");
    // 13 recorded: 3 back leaves 10 (a check passes at the limit, with
    // nothing left), 1 more leaves 9.
    l.give_back(store, 3).await;
    let check = l.hit(store, 0).await;
    assert!(
        check.admitted && check.remaining == 0,
        "{c}: 10 of 10: {check:?}"
    );
    l.give_back(store, 1).await;
    let check = l.hit(store, 0).await;
    assert!(
        check.admitted && check.remaining == 1,
        "{c}: 9 of 10: {check:?}"
    );

    let big = Limiter::reports("reports-big", algorithm, 10, Unit::Day);
    let d = big.hit(store, 50).await;
    assert!(!d.admitted && d.remaining == 0, "{c}: 50 of 10: {d:?}");
    big.assert_reset_in_range(store, &d, "a report above the limit");
    assert!(
        !big.hit(store, 0).await.admitted,
        "{c}: check after 50 of 10"
    );
    big.give_back(store, 45).await;
    let check = big.hit(store, 0).await;
    assert!(
        check.admitted && check.remaining == 5,
        "{c}: 5 of 10: {check:?}"
    );
}

async fn zero_hits_check_without_counting(store: &dyn Store, algorithm: Algorithm) {
    let l = Limiter::new("check", algorithm, 10, Unit::Day);
    let fresh = l.hit(store, 0).await;
    assert!(fresh.admitted, "{}", ctx(store, algorithm));
    assert_eq!(fresh.remaining, 10, "{}", ctx(store, algorithm));
    if algorithm != Algorithm::FixedWindow {
        assert_eq!(
            fresh.reset_micros,
            0,
            "{}: nothing counted yet",
            ctx(store, algorithm)
        );
    }
    l.hit(store, 3).await;
    for _ in 0..3 {
        let d = l.hit(store, 0).await;
        assert!(d.admitted, "{}", ctx(store, algorithm));
        assert_eq!(
            d.remaining,
            7,
            "{}: a check counts nothing",
            ctx(store, algorithm)
        );
        l.assert_reset_in_range(store, &d, "check");
    }
    l.hit(store, 7).await;
    let d = l.hit(store, 0).await;
    assert!(
        d.admitted,
        "{}: a check fits even when full",
        ctx(store, algorithm)
    );
    assert_eq!(d.remaining, 0, "{}", ctx(store, algorithm));
}

async fn negative_hits_give_back(store: &dyn Store, algorithm: Algorithm) {
    let l = Limiter::new("negative", algorithm, 10, Unit::Day);
    assert_eq!(
        l.hit(store, 5).await.remaining,
        5,
        "{}",
        ctx(store, algorithm)
    );
    assert_eq!(
        l.hit(store, 3).await.remaining,
        2,
        "{}",
        ctx(store, algorithm)
    );
    let d = l.give_back(store, 2).await;
    assert!(d.admitted, "{}", ctx(store, algorithm));
    assert_eq!(d.remaining, 4, "{}", ctx(store, algorithm));
    // More than held, never below zero (a count in flight frees nothing
    // for a release of more than its limit: its take owed nothing).
    let back = if algorithm.releases() { 10 } else { 100 };
    let d = l.give_back(store, back).await;
    assert_eq!(
        d.remaining,
        10,
        "{}: never below zero",
        ctx(store, algorithm)
    );
    let d = l.hit(store, 10).await;
    assert!(d.admitted, "{}: all of it is back", ctx(store, algorithm));
    assert!(!l.hit(store, 1).await.admitted, "{}", ctx(store, algorithm));
    // Giving back to a limiter that never counted anything.
    let fresh = Limiter::new("negative-fresh", algorithm, 10, Unit::Day);
    assert_eq!(
        fresh.give_back(store, 4).await.remaining,
        10,
        "{}",
        ctx(store, algorithm)
    );
    assert_eq!(
        fresh.hit(store, 1).await.remaining,
        9,
        "{}",
        ctx(store, algorithm)
    );
}

async fn log_reset_is_when_the_oldest_hit_leaves(store: &dyn Store) {
    let l = Limiter::new("log-reset", Algorithm::SlidingWindowLog, 3, Unit::Day);
    let before_first = Instant::now();
    l.hit(store, 1).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    l.hit(store, 2).await;
    let d = l.hit(store, 1).await;
    let elapsed = before_first.elapsed().as_micros() as u64;
    assert!(!d.admitted, "{}", store.kind());
    // The first hit leaves one window after it was counted, between our
    // first call and now.
    let w = l.window();
    assert!(
        d.reset_micros <= w - 50_000 && d.reset_micros + elapsed + 5_000 >= w,
        "{}: reset {} with {elapsed} us elapsed since the first hit",
        store.kind(),
        d.reset_micros
    );
}

async fn distinct_limiters_are_independent(store: &dyn Store, algorithm: Algorithm) {
    let a = Limiter::new("independent", algorithm, 2, Unit::Day);
    let b = a.with_entries(&[("user", "bob")]);
    let other_domain = Limiter::new("independent", algorithm, 2, Unit::Day);
    let other_unit = Limiter {
        window: Unit::Hour.into(),
        ..a.clone()
    };
    // Two days (`unit_multiplier: 2`) is another window, so another limiter.
    let other_multiplier = Limiter {
        window: Span::new(Unit::Day, 2).unwrap(),
        ..a.clone()
    };
    a.hit(store, 2).await;
    assert!(!a.hit(store, 1).await.admitted, "{}", ctx(store, algorithm));
    for l in [&b, &other_domain, &other_unit, &other_multiplier] {
        let d = l.hit(store, 1).await;
        assert!(d.admitted, "{}: {:?}", ctx(store, algorithm), l.entries);
        assert_eq!(d.remaining, 1, "{}: {:?}", ctx(store, algorithm), l.entries);
    }
}

/// Descriptors that collide under naive joining, or carry bytes that mean
/// something in a key, get separate counters; on a cluster no call fails
/// (no CROSSSLOT).
async fn awkward_descriptors_get_separate_counters(store: &dyn Store, algorithm: Algorithm) {
    let base = Limiter::new("keys", algorithm, 1, Unit::Day);
    let long_a = "a".repeat(10 * 1024);
    let long_b = format!("{}b", "a".repeat(10 * 1024 - 1));
    let sets: Vec<Vec<(&str, &str)>> = vec![
        vec![("k", "a_b"), ("k2", "c")],
        vec![("k", "a"), ("k2", "b_c")],
        vec![("k_a", "b")],
        vec![("k", "a_b")],
        vec![("k", "a:k2=c")],
        vec![("k", "a"), ("k2", "c")],
        vec![("k", "}")],
        vec![("k", "{")],
        vec![("k", "{x}")],
        vec![("k", "}{")],
        vec![("{k}", "v")],
        vec![("k", ":")],
        vec![("k", "=")],
        vec![("k:", "v")],
        vec![("k=", "v")],
        vec![("k", " ")],
        vec![("k", "a b")],
        vec![("k", "a%20b")],
        vec![("k", "%")],
        vec![("k", "\n")],
        vec![("k", "line\nbreak")],
        vec![("k", "\r\n\t\0")],
        vec![("k", "ключ")],
        vec![("k", "😀")],
        vec![("ключ", "😀")],
        vec![("k", "")],
        vec![("", "")],
        vec![],
        vec![("k", long_a.as_str())],
        vec![("k", long_b.as_str())],
        vec![(long_a.as_str(), "v")],
    ];
    let limiters: Vec<Limiter> = sets.iter().map(|s| base.with_entries(s)).collect();
    // The domain is part of the identity too: "d:k=v" alone vs "d" + k=v.
    let mut colon_domain = base.with_entries(&[]);
    colon_domain.domain = format!("{}:k=v", base.domain);
    let plain_domain = base.with_entries(&[("k", "v")]);
    let limiters: Vec<Limiter> = limiters
        .into_iter()
        .chain([colon_domain, plain_domain])
        .collect();

    for l in &limiters {
        let d = l.hit(store, 1).await;
        assert!(
            d.admitted,
            "{}: {:?} shares a counter with an earlier descriptor",
            ctx(store, algorithm),
            l.entries
        );
    }
    for l in &limiters {
        let d = l.hit(store, 1).await;
        assert!(
            !d.admitted,
            "{}: {:?} did not count its first hit",
            ctx(store, algorithm),
            l.entries
        );
    }
}

async fn concurrent_hits_never_over_admit(store: DynStore, algorithm: Algorithm) {
    let l = Arc::new(Limiter::new("concurrent", algorithm, 100, Unit::Day));
    let tasks = (0..300).map(|_| {
        let store = store.clone();
        let l = l.clone();
        tokio::spawn(async move { l.hit(&*store, 1).await })
    });
    let admitted = join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.expect("task panicked"))
        .filter(|d| d.admitted)
        .count();
    let c = ctx(&*store, algorithm);
    match algorithm {
        Algorithm::SlidingWindowCounter => {
            assert!((1..=100).contains(&admitted), "{c}: admitted {admitted}")
        }
        _ => assert_eq!(admitted, 100, "{c}"),
    }
    let d = l.hit(&*store, 0).await;
    assert_eq!(d.remaining, 0, "{c}");
}

/// A batch of costs is decided as the same costs one call at a time: the
/// same admissions and remaining, in order (resets within the time between
/// the calls), with give-backs, checks and a cost above the limit mixed in.
async fn a_batch_decides_like_one_call_at_a_time(
    store: &dyn Store,
    algorithm: Algorithm,
    usage_reports: bool,
) {
    let take = |hits| Cost {
        hits,
        negative: false,
    };
    let back = |hits| Cost {
        hits,
        negative: true,
    };
    let costs = [
        take(3),
        take(4),
        take(0),
        take(5),
        back(2),
        take(4),
        take(11),
        take(1),
        take(1),
        back(1),
        take(2),
    ];
    let limiter = |case| Limiter {
        usage_reports,
        ..Limiter::new(case, algorithm, 10, Unit::Day)
    };
    let (batched, single) = (limiter("batched"), limiter("single"));
    let c = format!("{}, usage_reports {usage_reports}", ctx(store, algorithm));
    let from_batch = batched.batch(store, &costs).await;
    assert_eq!(from_batch.len(), costs.len(), "{c}");
    for (i, (cost, b)) in costs.iter().zip(&from_batch).enumerate() {
        let one = single.call(store, cost.hits, cost.negative).await.unwrap();
        assert_eq!(
            (b.admitted, b.remaining),
            (one.admitted, one.remaining),
            "{c}: hit {i} ({cost:?}): batch {b:?}, alone {one:?}"
        );
        assert!(
            b.reset_micros.abs_diff(one.reset_micros) <= 1_000_000,
            "{c}: hit {i} ({cost:?}): batch {b:?}, alone {one:?}"
        );
    }
    // And the state left behind is the same.
    let after_batch = batched.hit(store, 0).await;
    let after_single = single.hit(store, 0).await;
    assert_eq!(after_batch.remaining, after_single.remaining, "{c}");
}

/// How a reset is expected to relate to the clock.
#[derive(Debug, Clone, Copy)]
enum Reset {
    /// Nothing counts: 0.
    Zero,
    /// Exactly one window (a cost that can never fit).
    Window,
    /// The end of the current epoch-aligned window, plus this much.
    WindowEndPlus(u64),
    /// One window after the oldest counted hit, made during this run.
    AfterOldest,
    /// The end of the current bucket of a counter with 4 buckets, plus this.
    BucketEndPlus(u64),
    /// The time this many tokens take to refill (a tenth of a day each),
    /// less at most the time since the run started.
    Owed(u64),
}

use Reset::{AfterOldest, BucketEndPlus, Owed, Window, WindowEndPlus, Zero};

/// (admitted, remaining, reset) expected of one algorithm.
type Expect = (bool, u64, Reset);

const DAY: u64 = 86_400_000_000;

/// A scripted run with limit 10 in a one-day window, and what each
/// algorithm must answer, worked out from its definition (see
/// ARCHITECTURE.md and the scripts' headers): the fixed window counts every
/// hit that is not above the limit, admitted or not; the counter and the log
/// count admitted hits only; give-backs never go below zero (the log gives
/// back from its newest hits). The counter's previous bucket is empty, so
/// its estimate is its current bucket, and a refusal waits into the next
/// bucket until `cur x (w - e) / w + hits <= limit`: the reset is the
/// bucket's end plus `w - floor(w x (limit - hits) / cur)`. The token
/// bucket (burst 10, a token back every tenth of a day) takes only what it
/// admits, refuses a cost above its burst at once with the time to fill
/// it (a day), and resets when what it owes has refilled.
const SCRIPT: &[(u64, bool, [Expect; 4])] = &[
    // (hits, give back, [fixed window, sliding counter, sliding log, token
    // bucket])
    (
        0,
        false,
        [
            (true, 10, WindowEndPlus(0)),
            (true, 10, Zero),
            (true, 10, Zero),
            (true, 10, Zero),
        ],
    ),
    (
        4,
        false,
        [
            (true, 6, WindowEndPlus(0)),
            (true, 6, WindowEndPlus(DAY)),
            (true, 6, AfterOldest),
            (true, 6, Owed(4)),
        ],
    ),
    (
        11,
        false,
        [
            (false, 6, WindowEndPlus(0)),
            (false, 6, Window),
            (false, 6, Window),
            (false, 6, Window),
        ],
    ),
    (
        5,
        false,
        [
            (true, 1, WindowEndPlus(0)),
            (true, 1, WindowEndPlus(DAY)),
            (true, 1, AfterOldest),
            (true, 1, Owed(9)),
        ],
    ),
    // Fixed: counted anyway (12). Counter: DAY - floor(DAY x 7 / 9).
    (
        3,
        false,
        [
            (false, 0, WindowEndPlus(0)),
            (false, 1, WindowEndPlus(19_200_000_000)),
            (false, 1, AfterOldest),
            (false, 1, Owed(2)),
        ],
    ),
    (
        2,
        true,
        [
            (true, 0, WindowEndPlus(0)),
            (true, 3, WindowEndPlus(DAY)),
            (true, 3, AfterOldest),
            (true, 3, Owed(7)),
        ],
    ),
    (
        1,
        false,
        [
            (false, 0, WindowEndPlus(0)),
            (true, 2, WindowEndPlus(DAY)),
            (true, 2, AfterOldest),
            (true, 2, Owed(8)),
        ],
    ),
    (
        100,
        true,
        [
            (true, 10, WindowEndPlus(0)),
            (true, 10, Zero),
            (true, 10, Zero),
            (true, 10, Zero),
        ],
    ),
    (
        10,
        false,
        [
            (true, 0, WindowEndPlus(0)),
            (true, 0, WindowEndPlus(DAY)),
            (true, 0, AfterOldest),
            (true, 0, Owed(10)),
        ],
    ),
    (
        0,
        false,
        [
            (true, 0, WindowEndPlus(0)),
            (true, 0, WindowEndPlus(DAY)),
            (true, 0, AfterOldest),
            (true, 0, Owed(10)),
        ],
    ),
    // Counter: DAY - floor(DAY x 9 / 10).
    (
        1,
        false,
        [
            (false, 0, WindowEndPlus(0)),
            (false, 0, WindowEndPlus(8_640_000_000)),
            (false, 0, AfterOldest),
            (false, 0, Owed(1)),
        ],
    ),
    (
        3,
        true,
        [
            (true, 2, WindowEndPlus(0)),
            (true, 3, WindowEndPlus(DAY)),
            (true, 3, AfterOldest),
            (true, 3, Owed(7)),
        ],
    ),
];

fn wall_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as u64
}

/// Every store answers the scripted run exactly as the table says. Redis
/// uses its own clock (this machine's), so resets are checked against the
/// wall clock read around each call, with a second of slack.
async fn answers_the_expected_table(store: &dyn Store, algorithm: Algorithm) {
    let c = ctx(store, algorithm);
    // The run takes milliseconds; keep it inside one day.
    let left = DAY - wall_micros() % DAY;
    if left < 60_000_000 {
        tokio::time::sleep(Duration::from_micros(left + 1_000_000)).await;
    }
    let l = Limiter::new("table", algorithm, 10, Unit::Day);
    let column = Algorithm::ALL.iter().position(|&a| a == algorithm).unwrap();
    let slack = 1_000_000;
    let started = wall_micros();
    for (step, &(hits, negative, expected)) in SCRIPT.iter().enumerate() {
        let (admitted, remaining, reset) = expected[column];
        let before = wall_micros();
        let got = l
            .call(store, hits, negative)
            .await
            .unwrap_or_else(|e| panic!("{c}: step {step} failed: {e}"));
        let after = wall_micros();
        let what = format!("{c}: step {step} (hits {hits}, give back {negative})");
        assert_eq!(
            (got.admitted, got.remaining),
            (admitted, remaining),
            "{what}"
        );
        let r = got.reset_micros;
        let ok = match reset {
            Zero => r == 0,
            Window => r == DAY,
            WindowEndPlus(extra) => {
                let lo = DAY - after % DAY + extra;
                let hi = DAY - before % DAY + extra;
                r + slack >= lo && r <= hi + slack
            }
            AfterOldest => r <= DAY && r + (after - started) + slack >= DAY,
            Owed(n) => r <= n * DAY / 10 && r + (after - started) + slack >= n * DAY / 10,
            BucketEndPlus(_) => panic!("{what}: bucket ends are for the 4-bucket table"),
        };
        assert!(ok, "{what}: reset {r} is not {reset:?}");
    }
}

/// Bucket length of the N = 4 counter below: a day over 3.
const BUCKET4: u64 = DAY / 3;

/// A scripted run of a counter with 4 buckets of 8 hours (limit 10 in a
/// one-day window), worked out from its definition: within one bucket the
/// estimate is the current bucket; an admitted answer resets when the
/// current bucket has left the window (its end plus a day); a refusal waits
/// until this bucket is the oldest (its end plus two buckets) and weighs
/// `cur x (b - e) / b + hits <= limit`, i.e. `e = b - floor(b x (limit -
/// hits) / cur)` into that bucket.
const SCRIPT4: &[(u64, bool, (bool, u64, Reset))] = &[
    (0, false, (true, 10, Zero)),
    (4, false, (true, 6, BucketEndPlus(DAY))),
    (5, false, (true, 1, BucketEndPlus(DAY))),
    // 2 buckets, then b - floor(b x 7 / 9) = 6,400,000,000.
    (
        3,
        false,
        (false, 1, BucketEndPlus(2 * BUCKET4 + 6_400_000_000)),
    ),
    (2, true, (true, 3, BucketEndPlus(DAY))),
    (1, false, (true, 2, BucketEndPlus(DAY))),
    (100, true, (true, 10, Zero)),
    (10, false, (true, 0, BucketEndPlus(DAY))),
    // 2 buckets, then b - floor(b x 9 / 10) = 2,880,000,000.
    (
        1,
        false,
        (false, 0, BucketEndPlus(2 * BUCKET4 + 2_880_000_000)),
    ),
    (11, false, (false, 0, Window)),
];

/// The N-bucket counter answers its table on every store, and its state is
/// its own: the same descriptor with the default 2 buckets starts afresh.
/// Staggered (as the engine places every counter), its buckets start its
/// descriptor's phase after the epoch-aligned ones: the same answers, and
/// resets that count to the shifted bucket ends.
async fn bucketed_counter_answers_the_expected_table(store: &dyn Store, staggered: bool) {
    let c = format!("{} counter/4 staggered {staggered}", store.kind());
    let mut l = Limiter::counter("table4", 10, Unit::Day, 4);
    if staggered {
        l.window = l.window.staggered();
    }
    // In scaled units (a third of a microsecond): buckets of DAY each.
    let phase = sliding_counter::phase(&l.domain, &l.entries, l.window);
    assert_eq!(phase == 0, !staggered, "{c}: phase {phase}");
    let bucket_left = |t: u64| (DAY - (3 * t + phase) % DAY).div_ceil(3);
    let left = bucket_left(wall_micros());
    if left < 60_000_000 {
        tokio::time::sleep(Duration::from_micros(left + 1_000_000)).await;
    }
    let slack = 1_000_000;
    for (step, &(hits, negative, (admitted, remaining, reset))) in SCRIPT4.iter().enumerate() {
        let before = wall_micros();
        let got = l
            .call(store, hits, negative)
            .await
            .unwrap_or_else(|e| panic!("{c}: step {step} failed: {e}"));
        let after = wall_micros();
        let what = format!("{c}: step {step} (hits {hits}, give back {negative})");
        assert_eq!(
            (got.admitted, got.remaining),
            (admitted, remaining),
            "{what}"
        );
        let r = got.reset_micros;
        let ok = match reset {
            Zero => r == 0,
            Window => r == DAY,
            BucketEndPlus(extra) => {
                let lo = bucket_left(after) + extra;
                let hi = bucket_left(before) + extra;
                r + slack >= lo && r <= hi + slack
            }
            other => panic!("{what}: {other:?} is not used here"),
        };
        assert!(ok, "{what}: reset {r} is not {reset:?}");
    }
    // The limiter is full (10 of 10); with 2 buckets it is another limiter.
    let two = Limiter {
        buckets: 2,
        ..l.clone()
    };
    assert_eq!(two.hit(store, 1).await.remaining, 9, "{c}: 2 buckets");
    let sixty = Limiter {
        buckets: 60,
        ..l.clone()
    };
    assert_eq!(sixty.hit(store, 3).await.remaining, 7, "{c}: 60 buckets");
    assert!(!l.hit(store, 1).await.admitted, "{c}: still full");
}

/// Losing the log's metadata hash (evicted, deleted) between hits changes
/// nothing: the script rebuilds the sum and the sequence from the log, so no
/// live hit is overwritten and exactly the limit is admitted.
async fn log_survives_losing_its_metadata(store: &dyn Store, delete: impl Fn(&str) -> String) {
    let l = Limiter::new("log-meta", Algorithm::SlidingWindowLog, 6, Unit::Day);
    let hit = Hit {
        domain: &l.domain,
        entries: &l.entries,
        algorithm: l.algorithm,
        limit: l.limit,
        window: l.window,
        hits: 1,
        negative: false,
        usage_reports: false,
        buckets: 2,
        burst: 0,
        shard: tollgate::storage::Shard::NONE,
        receipt: false,
        also: &[],
        lease: false,
        ahead: tollgate::storage::Ahead::NONE,
    };
    let limiter = KeyBuilder::default().limiter(&hit);
    let (meta, log) = (limiter.key(Role::LogMeta), limiter.key(Role::LogSet));
    let c = store.kind();
    assert_eq!(l.hit(store, 1).await.remaining, 5, "{c}");
    // A weighted hit is one member "<seq>:<cost>".
    assert_eq!(l.hit(store, 2).await.remaining, 3, "{c}");
    let mut admitted = 3;
    for round in 0..6 {
        let deleted = delete(&meta);
        // A refused hit writes nothing, so the metadata is back only after
        // an admitted one (rounds 0 to 2 admit, round 3 is the first refusal).
        if round <= 3 {
            assert_eq!(deleted, "1", "{c}: round {round}: the metadata existed");
        }
        let d = l.hit(store, 1).await;
        if d.admitted {
            admitted += 1;
        }
        assert_eq!(d.remaining, 6 - admitted, "{c}: round {round}");
    }
    assert_eq!(admitted, 6, "{c}: exactly the limit across the deletions");
    assert!(!l.hit(store, 1).await.admitted, "{c}");
    // Members 1, 2:2, 3, 4, 5: none was overwritten.
    assert_eq!(delete(&log), "1", "{c}: the log existed");
    // The log lost and its metadata kept (it still says 6): the log is the
    // truth, so nothing counts any more and a full limit is admitted again.
    let d = l.hit(store, 1).await;
    assert!(d.admitted, "{c}: the lost log's hits no longer count");
    assert_eq!(d.remaining, 5, "{c}: after losing the log");
    assert_eq!(l.hit(store, 5).await.remaining, 0, "{c}");
    assert!(!l.hit(store, 1).await.admitted, "{c}: full again");
}

/// Moves `l`'s stored window index `by` windows ahead, as a server clock
/// that far ahead left it: its state key and the index it held.
fn step_stored_window(l: &Limiter, cli: impl Fn(&[&str]) -> String, by: u64) -> (String, u64) {
    let key = KeyBuilder::default()
        .limiter(&l.as_hit(1, false))
        .key(Role::State);
    let w: u64 = cli(&["HGET", &key, "w"])
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("no window index in {key}: {e}"));
    cli(&["HSET", &key, "w", &(w + by).to_string()]);
    (key, w)
}

/// When the Redis server's clock steps back (a failover to a replica
/// whose clock is behind), a fixed window's or a counter's stored window
/// (bucket) is after the server's current one: it counts on in it, never
/// afresh, and a fixed window's reset is that window's end. The step is
/// made by writing the stored index three windows ahead, as a clock three
/// windows ahead left it. `cli` runs a command on the node holding a key.
async fn a_window_ahead_of_the_clock_counts_on(store: &dyn Store, cli: impl Fn(&[&str]) -> String) {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let l = Limiter::new("window-ahead", algorithm, 10, Unit::Hour);
        let c = format!("{} {algorithm}", store.kind());
        assert_eq!(l.hit(store, 10).await.remaining, 0, "{c}");
        let (key, w) = step_stored_window(&l, &cli, 3);
        let ahead = (w + 3).to_string();
        let d = l.hit(store, 1).await;
        assert!(
            !d.admitted,
            "{c}: the stored window's 10 hits still count: {d:?}"
        );
        assert_eq!(d.remaining, 0, "{c}");
        if algorithm == Algorithm::FixedWindow {
            assert!(d.reset_micros > 3 * 3_600_000_000, "{c}: {d:?}");
        }
        // The state stays in the window written, its count whole (the
        // fixed window counts a refused hit, as the reference does).
        assert_eq!(cli(&["HGET", &key, "w"]).trim(), ahead, "{c}");
        let count = if algorithm == Algorithm::FixedWindow {
            "11"
        } else {
            "10"
        };
        assert_eq!(cli(&["HGET", &key, "c"]).trim(), count, "{c}");
    }
    // A counter's lease reserving ahead in the bucket written: its key
    // lives until the last reserved bucket (ten hours on) has left the
    // trailing window, counted from the real now, not from the start of
    // the bucket written.
    let l = Limiter::receipts(
        "window-ahead-reserve",
        Algorithm::SlidingWindowCounter,
        1_000,
        Unit::Hour,
    );
    l.hit(store, 1).await;
    let (key, _) = step_stored_window(&l, &cli, 3);
    let d = ahead::lease(store, &l, 2, 7, 3).await;
    assert_eq!(
        d.receipt.map(|r| r.ahead),
        Some(7),
        "{}: {d:?}",
        store.kind()
    );
    let ttl: u64 = cli(&["PTTL", &key]).trim().parse().expect("a TTL");
    assert!(
        ttl > 10 * 3_600_000,
        "{}: the key expires in {ttl} ms, before its last reserved bucket ends",
        store.kind()
    );
}

/// A reset while the server's clock is stepped back, then a give-back of
/// a hit recorded before it in the window written: the reset is marked no
/// earlier than that window's start, so once the clock reaches it the
/// give-back takes nothing off the fresh count. One-second windows; the
/// step is one window (the stored index written one ahead). The final
/// check must fall in that window: a round the machine slowed past it
/// (read from the server's clock) is run again.
async fn a_reset_in_a_step_back_keeps_old_give_backs_out(
    store: &dyn Store,
    cli: impl Fn(&[&str]) -> String,
) {
    let server_micros = || {
        let time = cli(&["TIME"]);
        let mut parts = time.lines().map(|l| l.trim().parse::<u64>().unwrap());
        parts.next().unwrap() * 1_000_000 + parts.next().unwrap()
    };
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let mut decided = false;
        for round in 0..5 {
            let l = Limiter::receipts("reset-step", algorithm, 10, Unit::Second);
            let c = format!("{} {algorithm} round {round}", store.kind());
            // Start early in a second: the steps before the window written
            // begins take well under the rest of it.
            let now = server_micros();
            if now % 1_000_000 > 500_000 {
                tokio::time::sleep(Duration::from_micros(1_010_000 - now % 1_000_000)).await;
            }
            assert!(l.hit(store, 5).await.admitted, "{c}");
            let (_, w) = step_stored_window(&l, &cli, 1);
            let d = l.hit(store, 5).await;
            assert!(d.admitted, "{c}: {d:?}");
            let receipt = d.receipt.expect("a receipt");
            let before_reset = server_micros();
            store.reset(l.as_hit(1, false)).await.expect("a reset");
            // Into the window written, then filled afresh.
            let next = (before_reset / 1_000_000 + 1) * 1_000_000;
            if before_reset / 1_000_000 != w {
                continue;
            }
            let wait = next + 20_000 - server_micros();
            tokio::time::sleep(Duration::from_micros(wait)).await;
            let mut admitted = 0;
            for _ in 0..10 {
                admitted += u64::from(l.hit(store, 1).await.admitted);
            }
            l.undo(store, receipt).await;
            let d = l.hit(store, 1).await;
            if server_micros() >= next + 1_000_000 {
                continue;
            }
            assert_eq!(admitted, 10, "{c}: a fresh count after the reset");
            assert!(
                !d.admitted,
                "{c}: the give-back took off the fresh count: {d:?}"
            );
            decided = true;
            break;
        }
        assert!(
            decided,
            "{} {algorithm}: no round fell in one window",
            store.kind()
        );
    }
}

/// The token bucket's burst is its own number: a bucket of 30 refilled at
/// 10 a day admits 30 at once, then one per tenth of a day; tokens given
/// back never fill it past 30; a cost above 30 is refused and takes nothing.
async fn bucket_burst_is_not_the_rate(store: &dyn Store) {
    let c = ctx(store, Algorithm::TokenBucket);
    let l = Limiter {
        burst: 30,
        ..Limiter::new("bucket-burst", Algorithm::TokenBucket, 10, Unit::Day)
    };
    for expected in (0..30).rev() {
        let d = l.hit(store, 1).await;
        assert!(d.admitted && d.remaining == expected, "{c}: {d:?}");
    }
    let started = wall_micros();
    let d = l.hit(store, 1).await;
    assert!(!d.admitted && d.remaining == 0, "{c}: 31st: {d:?}");
    // One token, less the little time since the 30th.
    let token = DAY / 10;
    assert!(
        d.reset_micros <= token && d.reset_micros + 1_000_000 >= token,
        "{c}: reset {} is not a tenth of a day",
        d.reset_micros
    );
    let d = l.hit(store, 31).await;
    assert!(
        !d.admitted && d.remaining == 0,
        "{c}: above the burst: {d:?}"
    );
    assert!(d.reset_micros <= 3 * DAY, "{c}: {d:?}");
    let d = l.give_back(store, 100).await;
    assert!(
        d.admitted && d.remaining == 30,
        "{c}: never past the burst: {d:?}"
    );
    let d = l.hit(store, 30).await;
    assert!(d.admitted && d.remaining == 0, "{c}: {d:?}");
    // Three days to fill again, less the time the run took.
    assert!(
        d.reset_micros <= 3 * DAY
            && d.reset_micros + 1_000_000 + (wall_micros() - started) >= 3 * DAY,
        "{c}: {d:?}"
    );

    // A smaller burst than the rate: 5 at once, then 10 a second.
    let fast = Limiter {
        burst: 5,
        ..Limiter::new("bucket-rate", Algorithm::TokenBucket, 10, Unit::Second)
    };
    let emptied = Instant::now();
    let d = fast.hit(store, 5).await;
    assert!(d.admitted && d.remaining == 0, "{c}: {d:?}");
    let d = fast.hit(store, 6).await;
    assert!(!d.admitted, "{c}: above the burst of 5");
    let d = fast.hit(store, 1).await;
    assert!(!d.admitted, "{c}: empty");
    assert!(d.reset_micros <= 100_000, "{c}: a token per 100 ms: {d:?}");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let d = fast.hit(store, 2).await;
    assert!(d.admitted, "{c}: two tokens back after 250 ms: {d:?}");
    let d = fast.hit(store, 2).await;
    // Both twos need 4 tokens, 400 ms of refill since the bucket emptied
    // (after `emptied`): on a busy machine the calls may have taken that.
    if emptied.elapsed() < Duration::from_millis(400) {
        assert!(
            !d.admitted,
            "{c}: half a token left, 1.5 more need 150 ms: {d:?}"
        );
    }
}

// ------------------------------------------------ taking hits back (undo)

/// Receipts name exactly what was recorded, and an undo takes exactly that
/// back: the limiter then admits what it would have without the hit.
async fn undo_takes_back_what_was_recorded(store: &dyn Store, algorithm: Algorithm) {
    let c = ctx(store, algorithm);
    let l = Limiter::receipts("undo", algorithm, 3, Unit::Day);
    let first = l.hit(store, 1).await;
    assert!(first.admitted, "{c}");
    let r1 = first.receipt.unwrap_or_else(|| panic!("{c}: no receipt"));
    assert_eq!((r1.hits, r1.shard), (1, 0), "{c}: {r1:?}");
    let second = l.hit(store, 2).await;
    assert!(second.admitted && second.remaining == 0, "{c}: {second:?}");
    let r2 = second.receipt.unwrap_or_else(|| panic!("{c}: no receipt"));
    assert_eq!(r2.hits, 2, "{c}");
    let refused = l.hit(store, 1).await;
    assert!(!refused.admitted, "{c}");
    // Only the fixed window records a refused hit (as the reference does);
    // its receipt takes that back too.
    match (algorithm, refused.receipt) {
        (Algorithm::FixedWindow, Some(r)) => {
            assert_eq!(r.hits, 1, "{c}");
            l.undo(store, r).await;
        }
        (Algorithm::FixedWindow, None) => panic!("{c}: a recorded refusal has a receipt"),
        (_, r) => assert_eq!(r, None, "{c}: nothing recorded, no receipt"),
    }
    // A check records nothing and has no receipt.
    assert_eq!(l.hit(store, 0).await.receipt, None, "{c}");

    l.undo(store, r1).await;
    assert_eq!(l.hit(store, 0).await.remaining, 1, "{c}: one taken back");
    let again = l.hit(store, 1).await;
    assert!(again.admitted && again.remaining == 0, "{c}: {again:?}");
    let refused = l.hit(store, 1).await;
    assert!(!refused.admitted, "{c}: full again");
    if let Some(r) = refused.receipt {
        l.undo(store, r).await;
    }
    l.undo(store, r2).await;
    assert_eq!(l.hit(store, 0).await.remaining, 2, "{c}: two taken back");
}

/// An undo takes nothing it cannot tell is its own: a receipt for another
/// window, bucket, member or time leaves the limiter as it is.
async fn undo_takes_nothing_it_did_not_record(store: &dyn Store, algorithm: Algorithm) {
    let c = ctx(store, algorithm);
    let l = Limiter::receipts("undo-stale", algorithm, 3, Unit::Day);
    let r = l.hit(store, 1).await.receipt.expect("a receipt");
    l.hit(store, 2).await;
    let day = Unit::Day.micros();
    let forged = match algorithm {
        // The previous and the next window.
        Algorithm::FixedWindow => {
            vec![Receipt { at: r.at - 1, ..r }, Receipt { at: r.at + 1, ..r }]
        }
        // A bucket that has not begun, and one that left the window.
        Algorithm::SlidingWindowCounter => {
            vec![Receipt { at: r.at + 1, ..r }, Receipt { at: r.at - 2, ..r }]
        }
        // Another member, and the same name at another score.
        Algorithm::SlidingWindowLog | Algorithm::Concurrency => vec![
            Receipt {
                at: r.at + 10_000_000,
                ..r
            },
            Receipt {
                mark: r.mark + 1,
                ..r
            },
        ],
        // Tokens taken two days ago: long since refilled.
        Algorithm::TokenBucket => vec![Receipt {
            at: r.at - 2 * day,
            ..r
        }],
    };
    for f in forged {
        l.undo(store, f).await;
        assert_eq!(
            l.hit(store, 0).await.remaining,
            0,
            "{c}: {f:?} took something"
        );
    }
    l.undo(store, r).await;
    assert_eq!(l.hit(store, 0).await.remaining, 1, "{c}: the real one");
}

/// A batch answers each hit with its own receipt.
async fn a_batch_gives_a_receipt_per_hit(store: &dyn Store, algorithm: Algorithm) {
    let c = ctx(store, algorithm);
    let l = Limiter::receipts("undo-batch", algorithm, 10, Unit::Day);
    let take = |hits| Cost {
        hits,
        negative: false,
    };
    let decisions = l.batch(store, &[take(1), take(2), take(0), take(3)]).await;
    let hits: Vec<Option<u64>> = decisions
        .iter()
        .map(|d| d.receipt.map(|r| r.hits))
        .collect();
    assert_eq!(hits, [Some(1), Some(2), None, Some(3)], "{c}");
    l.undo(store, decisions[1].receipt.unwrap()).await;
    assert_eq!(l.hit(store, 0).await.remaining, 6, "{c}");
}

/// Many callers take and take back at once: what stays admitted never
/// passes the limit, and (but for the token bucket, which refills) the
/// limiter then admits exactly the rest.
async fn concurrent_undos_never_over_admit(store: DynStore, algorithm: Algorithm) {
    let l = Arc::new(Limiter::receipts(
        "undo-concurrent",
        algorithm,
        20,
        Unit::Day,
    ));
    let tasks = (0..200).map(|i| {
        let (store, l) = (store.clone(), l.clone());
        tokio::spawn(async move {
            let d = l.hit(&*store, 1).await;
            // Every other caller's request is refused elsewhere; a refused
            // one is refused overall: both are taken back.
            let kept = d.admitted && i % 2 == 1;
            if let Some(r) = d.receipt.filter(|_| !kept) {
                l.undo(&*store, r).await;
            }
            u64::from(kept)
        })
    });
    let kept: u64 = join_all(tasks).await.into_iter().map(|r| r.unwrap()).sum();
    let c = ctx(&*store, algorithm);
    assert!(kept <= 20, "{c}: {kept} kept of 20");
    let left = l.hit(&*store, 0).await.remaining;
    assert!(left <= 20 - kept, "{c}: {left} left after {kept} kept");
    if algorithm != Algorithm::TokenBucket {
        assert_eq!(left, 20 - kept, "{c}: every undo took its hit back");
    }
}

/// A reset gives the limiter its whole limit back, no more, and forgets
/// its lease ledger; another limiter keeps its state.
async fn a_reset_gives_the_whole_limit_back(store: &dyn Store, algorithm: Algorithm) {
    let c = ctx(store, algorithm);
    let a = Limiter::new("reset", algorithm, 3, Unit::Day);
    let b = a.with_entries(&[("user", "bob")]);
    for _ in 0..3 {
        assert!(a.hit(store, 1).await.admitted, "{c}");
    }
    assert!(
        !a.hit(store, 1).await.admitted,
        "{c}: over before the reset"
    );
    assert!(b.hit(store, 1).await.admitted, "{c}");
    let lease = |holder: &'static str| tollgate::storage::LeaseCall {
        domain: &a.domain,
        entries: &a.entries,
        algorithm: a.algorithm,
        window: a.window,
        holder,
        report: tollgate::quota::Report {
            requests: 10,
            elapsed_secs: 1,
        },
        terms: tollgate::quota::Terms {
            capacity: 100,
            fill_secs: 60,
            hold_micros: 60_000_000,
        },
        counted: None,
    };
    store.lease(lease("one")).await.unwrap();
    let grant = store.lease(lease("two")).await.unwrap();
    assert_eq!(grant.holders, 2, "{c}: two holders before the reset");
    store.reset(a.as_hit(0, false)).await.unwrap();
    for i in 0..3 {
        let d = a.hit(store, 1).await;
        assert!(d.admitted, "{c}: hit {i} after the reset");
        assert_eq!(d.remaining, 2 - i, "{c}: hit {i} after the reset");
    }
    assert!(!a.hit(store, 1).await.admitted, "{c}: over after the reset");
    let d = b.hit(store, 1).await;
    assert!(
        d.admitted && d.remaining == 1,
        "{c}: bob kept his count: {d:?}"
    );
    assert!(b.hit(store, 1).await.admitted, "{c}");
    assert!(!b.hit(store, 1).await.admitted, "{c}: bob over");
    let grant = store.lease(lease("two")).await.unwrap();
    assert_eq!(grant.holders, 1, "{c}: the ledger was forgotten");
}

// ------------------------------------------------------------ the runners

async fn run_suite(store: DynStore) {
    let started = Instant::now();
    for algorithm in Algorithm::ALL {
        let s = &*store;
        burst_up_to_the_limit_then_refused(s, algorithm).await;
        weighted_cost(s, algorithm).await;
        cost_above_the_limit_is_refused_and_not_recorded(s, algorithm).await;
        zero_hits_check_without_counting(s, algorithm).await;
        negative_hits_give_back(s, algorithm).await;
        distinct_limiters_are_independent(s, algorithm).await;
        awkward_descriptors_get_separate_counters(s, algorithm).await;
        concurrent_hits_never_over_admit(store.clone(), algorithm).await;
        if !algorithm.releases() {
            // The rates' table; a count in flight has its own cases.
            answers_the_expected_table(s, algorithm).await;
        }
        a_batch_decides_like_one_call_at_a_time(s, algorithm, false).await;
        a_batch_decides_like_one_call_at_a_time(s, algorithm, true).await;
        if algorithm.spec().takes_reports {
            reports_are_recorded_past_the_limit(s, algorithm).await;
        }
        undo_takes_back_what_was_recorded(s, algorithm).await;
        undo_takes_nothing_it_did_not_record(s, algorithm).await;
        a_batch_gives_a_receipt_per_hit(s, algorithm).await;
        concurrent_undos_never_over_admit(store.clone(), algorithm).await;
        a_reset_gives_the_whole_limit_back(s, algorithm).await;
    }
    bucketed_counter_answers_the_expected_table(&*store, false).await;
    bucketed_counter_answers_the_expected_table(&*store, true).await;
    bucket_burst_is_not_the_rate(&*store).await;
    log_reset_is_when_the_oldest_hit_leaves(&*store).await;
    // The cases that wait for time to pass run side by side.
    let mut timed: Vec<BoxFuture<'_, ()>> = Vec::new();
    for algorithm in Algorithm::ALL {
        timed.push(Box::pin(timed::retry_after_reset_succeeds(
            &*store, algorithm,
        )));
        timed.push(Box::pin(timed::admits_again_after_the_window(
            &*store, algorithm,
        )));
        timed.push(Box::pin(timed::two_second_window(&*store, algorithm)));
    }
    // A counter with 10 buckets of 111 ms: the wait for a refused hit runs
    // through the bucket shifts until the full bucket is the oldest.
    timed.push(Box::pin(timed::a_bucket_keeps_room_for_its_leases(&*store)));
    timed.push(Box::pin(timed::a_lease_reserves_hits_ahead(&*store)));
    timed.push(Box::pin(ahead::a_counter_reserves_hits_ahead(&*store)));
    timed.push(Box::pin(shares::shares_and_requests_keep_one_count(
        &*store,
    )));
    timed.push(Box::pin(
        shares::a_lease_reserves_ahead_only_what_shares_leave(&*store),
    ));
    timed.push(Box::pin(shares::a_bucket_is_charged_for_its_shares(
        &*store,
    )));
    timed.push(Box::pin(timed::retry_after_reset_succeeds_on(
        &*store,
        Limiter::counter("retry10", 3, Unit::Second, 10),
    )));
    join_all(timed).await;
    eprintln!("{} suite passed in {:?}", store.kind(), started.elapsed());
}

async fn connect(url: String) -> Arc<RedisStore> {
    let store = RedisStore::connect(RedisConfig {
        url,
        // Generous: these tests check behaviour, not latency, on a shared
        // machine running debug builds.
        command_timeout: Duration::from_millis(500),
        ..RedisConfig::default()
    })
    .await
    .expect("valid settings");
    assert!(
        store.wait_ready(Duration::from_secs(20)).await,
        "{} store not ready after 20 s",
        store.kind()
    );
    Arc::new(store)
}

/// The store behind the coalescing layer, as `serve` runs Redis: every case
/// holds with hits queued behind calls in flight (the concurrent case
/// queues hundreds).
fn coalesced(store: DynStore) -> DynStore {
    Arc::new(Coalescing::new(store))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_contract() {
    run_suite(Arc::new(MemoryStore::default())).await;
    run_suite(coalesced(Arc::new(MemoryStore::default()))).await;
    // The smallest byte budget settings accept: bounded the same behaviour.
    let bounds = MemoryBounds {
        max_limiters: 1_000_000,
        max_bytes: 1 << 20,
    };
    run_suite(Arc::new(MemoryStore::with_bounds(
        Arc::new(SystemClock),
        bounds,
    )))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_standalone_contract() {
    let server = RedisServer::start();
    let store = connect(server.url()).await;
    assert_eq!(store.kind(), "redis");
    run_suite(store.clone()).await;
    run_suite(coalesced(store.clone())).await;
    log_survives_losing_its_metadata(&*store, |key| server.cli(&["DEL", key])).await;
    a_window_ahead_of_the_clock_counts_on(&*store, |args| server.cli(args)).await;
    a_reset_in_a_step_back_keeps_old_give_backs_out(&*store, |args| server.cli(args)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_contract() {
    let cluster = RedisCluster::start();
    let store = connect(cluster.url()).await;
    assert_eq!(store.kind(), "redis-cluster");
    run_suite(coalesced(store.clone())).await;
    log_survives_losing_its_metadata(&*store, |key| {
        let port = cluster
            .primary_for_key(key)
            .unwrap_or_else(|| panic!("no primary serves {key}"));
        cluster.cli(port, &["DEL", key])
    })
    .await;
    a_window_ahead_of_the_clock_counts_on(&*store, |args| {
        let port = cluster
            .primary_for_key(args[1])
            .unwrap_or_else(|| panic!("no primary serves {}", args[1]));
        cluster.cli(port, args)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_smoke() {
    let sentinel = RedisSentinel::start();
    let store = connect(sentinel.url()).await;
    assert_eq!(store.kind(), "redis-sentinel");
    for algorithm in Algorithm::ALL {
        burst_up_to_the_limit_then_refused(&*store, algorithm).await;
        weighted_cost(&*store, algorithm).await;
        negative_hits_give_back(&*store, algorithm).await;
    }
    // The counters live on the primary the sentinel named.
    let keys = support::redis::cli(sentinel.primary_port(), &["DBSIZE"]);
    assert_ne!(keys, "0", "nothing was written to the primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_tls_smoke() {
    let server = RedisServer::start_tls();
    let tls = server.tls_files().expect("a TLS server").clone();
    let config = RedisConfig {
        url: server.url(),
        tls_ca_file: Some(tls.ca_cert),
        tls_cert_file: Some(tls.client_cert),
        tls_key_file: Some(tls.client_key),
        command_timeout: Duration::from_millis(500),
        ..RedisConfig::default()
    };
    // Without the client certificate the server refuses the handshake.
    let anonymous = RedisStore::connect(RedisConfig {
        tls_cert_file: None,
        tls_key_file: None,
        ..config.clone()
    })
    .await
    .expect("valid settings");
    let store = RedisStore::connect(config).await.expect("valid settings");
    assert!(
        store.wait_ready(Duration::from_secs(20)).await,
        "TLS store not ready"
    );
    for algorithm in Algorithm::ALL {
        burst_up_to_the_limit_then_refused(&store, algorithm).await;
    }
    assert!(
        !anonymous.is_ready(),
        "connected without a client certificate"
    );
}
