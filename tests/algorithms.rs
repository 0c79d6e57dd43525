//! The algorithms on the embedded store, on a clock the test holds (the
//! token bucket has its own file, `tests/token_bucket.rs`).

use std::sync::Arc;

use tollgate::clock::ManualClock;
use tollgate::limit::{Algorithm, Unit};
use tollgate::storage::{Decision, Hit, MemoryStore, Store};

const MINUTE: u64 = 60_000_000;
const SECOND: u64 = 1_000_000;
/// A whole number of minutes since the epoch: window boundaries fall on
/// multiples of 60 s from here.
const T0: u64 = 1_800_000_000 * SECOND;

struct Fixture {
    clock: ManualClock,
    store: MemoryStore,
    entries: Vec<(String, String)>,
}

impl Fixture {
    fn new() -> Self {
        let clock = ManualClock::at_micros(T0);
        let store = MemoryStore::new(Arc::new(clock.clone()));
        Self {
            clock,
            store,
            entries: vec![("user".into(), "alice".into())],
        }
    }

    async fn hit(&self, algorithm: Algorithm, limit: u64, hits: u64) -> Decision {
        self.call(algorithm, limit, hits, false).await
    }

    /// A hit of `hits` on the test's limiter, a minute's window.
    fn spec(
        &self,
        algorithm: Algorithm,
        limit: u64,
        hits: u64,
        negative: bool,
        receipt: bool,
    ) -> Hit<'_> {
        Hit {
            domain: "test",
            entries: &self.entries,
            algorithm,
            limit,
            window: Unit::Minute.into(),
            hits,
            negative,
            usage_reports: false,
            buckets: 2,
            burst: 0,
            shard: tollgate::storage::Shard::NONE,
            receipt,
            also: &[],
            lease: false,
            ahead: tollgate::storage::Ahead::NONE,
        }
    }

    async fn call(&self, algorithm: Algorithm, limit: u64, hits: u64, negative: bool) -> Decision {
        self.store
            .hit(self.spec(algorithm, limit, hits, negative, false))
            .await
            .expect("the embedded store always answers")
    }

    async fn burst(&self, algorithm: Algorithm, limit: u64, n: u64) -> u64 {
        let mut admitted = 0;
        for _ in 0..n {
            if self.hit(algorithm, limit, 1).await.admitted {
                admitted += 1;
            }
        }
        admitted
    }
}

#[tokio::test]
async fn fixed_window_admits_twice_the_limit_across_a_boundary() {
    let f = Fixture::new();
    f.clock.set_micros(T0 + MINUTE - SECOND / 2);
    assert_eq!(f.burst(Algorithm::FixedWindow, 100, 100).await, 100);
    f.clock.advance_micros(SECOND);
    assert_eq!(f.burst(Algorithm::FixedWindow, 100, 100).await, 100);
}

#[tokio::test]
async fn sliding_log_admits_exactly_the_limit_across_a_boundary() {
    let f = Fixture::new();
    f.clock.set_micros(T0 + MINUTE - SECOND / 2);
    assert_eq!(f.burst(Algorithm::SlidingWindowLog, 100, 100).await, 100);
    f.clock.advance_micros(SECOND);
    assert_eq!(f.burst(Algorithm::SlidingWindowLog, 100, 100).await, 0);
    // A full window after the burst, it is all available again.
    f.clock.set_micros(T0 + 2 * MINUTE - SECOND / 2);
    assert_eq!(f.burst(Algorithm::SlidingWindowLog, 100, 100).await, 100);
}

#[tokio::test]
async fn sliding_counter_stays_near_the_limit_across_a_boundary() {
    let f = Fixture::new();
    f.clock.set_micros(T0 + MINUTE - SECOND / 2);
    assert_eq!(
        f.burst(Algorithm::SlidingWindowCounter, 100, 100).await,
        100
    );
    f.clock.advance_micros(SECOND);
    // The previous bucket still weighs 59.5/60 of 100: one more hit at most.
    assert!(f.burst(Algorithm::SlidingWindowCounter, 100, 100).await <= 1);
}

#[tokio::test]
async fn sliding_counter_weights_the_previous_bucket() {
    let f = Fixture::new();
    let counter = Algorithm::SlidingWindowCounter;
    // 40 in the previous window.
    assert!(f.hit(counter, 50, 40).await.admitted);
    // 25% into the next window, 10 in the current one: 40 x 0.75 + 10 = 40.
    f.clock.set_micros(T0 + MINUTE + MINUTE / 4);
    assert!(f.hit(counter, 50, 10).await.admitted);
    // The next hit is allowed, estimate 40 + 1 = 41: 9 left.
    let d = f.hit(counter, 50, 1).await;
    assert!(d.admitted);
    assert_eq!(d.remaining, 9);
    // Nine more fit, the tenth does not.
    assert!(f.hit(counter, 50, 9).await.admitted);
    let refused = f.hit(counter, 50, 1).await;
    assert!(!refused.admitted);
    assert_eq!(refused.remaining, 0);
    // Refused at estimate 50 with cur = 20: prev x w(t) + 20 + 1 <= 50 needs
    // the weight to fall to 29/40, at 60 x (1 - 29/40) = 16.5 s into the
    // window, 1.5 s from now.
    assert_eq!(refused.reset_micros, 1_500_000);
    f.clock.advance_micros(1_500_000 - 1);
    assert!(!f.hit(counter, 50, 1).await.admitted);
    f.clock.advance_micros(1);
    assert!(f.hit(counter, 50, 1).await.admitted);
}

#[tokio::test]
async fn weighted_cost_consumes_its_weight_on_every_algorithm() {
    for algorithm in Algorithm::ALL {
        let f = Fixture::new();
        let d = f.hit(algorithm, 9500, 100).await;
        assert!(d.admitted, "{algorithm}");
        assert_eq!(d.remaining, 9400, "{algorithm}");
        let d = f.hit(algorithm, 9500, 9400).await;
        assert!(d.admitted, "{algorithm}");
        assert_eq!(d.remaining, 0, "{algorithm}");
        assert!(!f.hit(algorithm, 9500, 1).await.admitted, "{algorithm}");
    }
}

#[tokio::test]
async fn a_cost_above_the_limit_never_passes_and_is_not_recorded() {
    for algorithm in Algorithm::ALL {
        let f = Fixture::new();
        let d = f.hit(algorithm, 10, 11).await;
        assert!(!d.admitted, "{algorithm}");
        assert_eq!(d.remaining, 10, "{algorithm}");
        let d = f.hit(algorithm, 10, 10).await;
        assert!(d.admitted, "{algorithm}");
    }
}

#[tokio::test]
async fn zero_hits_check_without_counting() {
    for algorithm in Algorithm::ALL {
        let f = Fixture::new();
        f.hit(algorithm, 5, 3).await;
        for _ in 0..3 {
            let d = f.hit(algorithm, 5, 0).await;
            assert!(d.admitted, "{algorithm}");
            assert_eq!(d.remaining, 2, "{algorithm}");
        }
    }
}

#[tokio::test]
async fn negative_hits_give_back_but_never_below_zero() {
    for algorithm in Algorithm::ALL {
        let f = Fixture::new();
        assert_eq!(f.hit(algorithm, 10, 6).await.remaining, 4, "{algorithm}");
        let d = f.call(algorithm, 10, 4, true).await;
        assert!(d.admitted, "{algorithm}");
        assert_eq!(d.remaining, 8, "{algorithm}");
        // More than is held (a count in flight frees nothing for a
        // release of more than its limit: such a take owed nothing).
        let back = if algorithm.releases() { 10 } else { 50 };
        let d = f.call(algorithm, 10, back, true).await;
        assert_eq!(d.remaining, 10, "{algorithm}");
        assert_eq!(f.hit(algorithm, 10, 10).await.remaining, 0, "{algorithm}");
    }
}

#[tokio::test]
async fn fixed_window_resets_at_the_epoch_aligned_end() {
    let f = Fixture::new();
    f.clock.set_micros(T0 + 20 * SECOND);
    let d = f.hit(Algorithm::FixedWindow, 2, 1).await;
    assert_eq!(d.reset_micros, 40 * SECOND);
    f.hit(Algorithm::FixedWindow, 2, 1).await;
    f.clock.advance_micros(15 * SECOND);
    let d = f.hit(Algorithm::FixedWindow, 2, 1).await;
    assert!(!d.admitted);
    assert_eq!(d.reset_micros, 25 * SECOND);
    // Every hit counts in a fixed window, refused ones included.
    f.clock.set_micros(T0 + MINUTE);
    assert_eq!(f.hit(Algorithm::FixedWindow, 2, 1).await.remaining, 1);
}

#[tokio::test]
async fn sliding_log_reset_is_exact() {
    let f = Fixture::new();
    let log = Algorithm::SlidingWindowLog;
    let d = f.hit(log, 3, 1).await;
    assert_eq!(d.reset_micros, MINUTE);
    f.clock.advance_micros(10 * SECOND);
    f.hit(log, 3, 2).await;
    f.clock.advance_micros(10 * SECOND);
    // Full: 1 at T0, 2 at T0+10s. One hit fits when the first leaves (40 s
    // from now); a hit of cost 3 only when both have left (50 s from now).
    let one = f.hit(log, 3, 1).await;
    assert!(!one.admitted);
    assert_eq!(one.reset_micros, 40 * SECOND);
    let three = f.hit(log, 3, 3).await;
    assert!(!three.admitted);
    assert_eq!(three.reset_micros, 50 * SECOND);
    f.clock.advance_micros(40 * SECOND - 1);
    assert!(!f.hit(log, 3, 1).await.admitted);
    f.clock.advance_micros(1);
    let d = f.hit(log, 3, 1).await;
    assert!(d.admitted);
    // The oldest counted hit (T0+10s) leaves 10 s from now.
    assert_eq!(d.reset_micros, 10 * SECOND);
}

/// Callers on several OS threads, released together by a barrier, hit one
/// limiter at the same time: the shard's mutex keeps the count exact.
#[test]
fn concurrent_callers_never_over_admit() {
    const THREADS: usize = 8;
    const CALLS: usize = 500;
    const LIMIT: u64 = 1_000;
    for algorithm in Algorithm::ALL {
        let f = Fixture::new();
        let start = std::sync::Barrier::new(THREADS);
        let admitted: usize = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..THREADS)
                .map(|_| {
                    let (f, start) = (&f, &start);
                    scope.spawn(move || {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .build()
                            .expect("a runtime");
                        start.wait();
                        (0..CALLS)
                            .filter(|_| rt.block_on(f.hit(algorithm, LIMIT, 1)).admitted)
                            .count()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        assert_eq!(admitted as u64, LIMIT, "{algorithm}");
        let after = futures_util::FutureExt::now_or_never(f.hit(algorithm, LIMIT, 0))
            .expect("the embedded store answers at once");
        assert_eq!(after.remaining, 0, "{algorithm}");
    }
}

fn user(i: usize) -> Vec<(String, String)> {
    vec![("user".to_string(), format!("u{i}"))]
}

async fn hit_user(store: &MemoryStore, i: usize, hits: u64) -> Decision {
    store
        .hit(Hit {
            domain: "capped",
            entries: &user(i),
            algorithm: Algorithm::FixedWindow,
            limit: 10,
            window: Unit::Hour.into(),
            hits,
            negative: false,
            usage_reports: false,
            buckets: 2,
            burst: 0,
            shard: tollgate::storage::Shard::NONE,
            receipt: false,
            also: &[],
            lease: false,
            ahead: tollgate::storage::Ahead::NONE,
        })
        .await
        .expect("the embedded store always answers")
}

/// A store capped at N, given 3N distinct limiters, holds N and counts 2N
/// evictions; the limiters used recently stay, with their counts.
#[tokio::test]
async fn a_capped_store_forgets_the_least_recently_used() {
    // 100 per shard: every shard receives far more than that (about 300,
    // give or take 17), so every shard ends full.
    const N: usize = 3_200;
    const HOT: usize = 16;
    let clock = ManualClock::at_micros(T0);
    let store = MemoryStore::with_max_limiters(Arc::new(clock.clone()), N);
    assert_eq!(store.capacity(), N);
    for i in 0..HOT {
        assert_eq!(hit_user(&store, i, 3).await.remaining, 7);
    }
    for i in HOT..3 * N {
        assert!(hit_user(&store, i, 1).await.admitted);
        // A check (0 hits) is a use: the hot limiters stay recent. Between
        // two checks a shard receives about 2 new limiters, far from 100.
        if i % 64 == 0 {
            for h in 0..HOT {
                assert_eq!(hit_user(&store, h, 0).await.remaining, 7, "hot u{h}");
            }
        }
        assert!(store.len() <= N, "{} limiters held", store.len());
    }
    assert_eq!(store.len(), N);
    assert_eq!(store.evictions(), 2 * N as u64);
    for h in 0..HOT {
        let d = hit_user(&store, h, 1).await;
        assert_eq!(d.remaining, 6, "hot u{h} kept its count");
    }
    // The oldest cold limiters were forgotten: they count from zero again.
    for i in HOT..HOT + 100 {
        assert_eq!(hit_user(&store, i, 1).await.remaining, 9, "cold u{i}");
    }
    assert_eq!(store.len(), N);
}

/// A cap smaller than the shard count still holds exactly that many.
#[tokio::test]
async fn a_tiny_cap_is_exact() {
    let clock = ManualClock::at_micros(T0);
    let store = MemoryStore::with_max_limiters(Arc::new(clock.clone()), 1);
    assert_eq!(store.capacity(), 1);
    assert_eq!(hit_user(&store, 0, 2).await.remaining, 8);
    assert_eq!(hit_user(&store, 0, 1).await.remaining, 7);
    assert_eq!(store.evictions(), 0);
    assert_eq!(hit_user(&store, 1, 1).await.remaining, 9);
    assert_eq!((store.len(), store.evictions()), (1, 1));
    assert_eq!(
        hit_user(&store, 0, 1).await.remaining,
        9,
        "u0 was forgotten"
    );
    assert_eq!((store.len(), store.evictions()), (1, 2));
    let five = MemoryStore::with_max_limiters(Arc::new(clock), 5);
    for i in 0..50 {
        hit_user(&five, i, 1).await;
        assert!(five.len() <= 5);
    }
    assert_eq!(five.capacity(), 5);
    assert_eq!(five.len() as u64 + five.evictions(), 50);
}

#[tokio::test]
async fn expired_limiters_are_reclaimed() {
    let f = Fixture::new();
    for i in 0..1000 {
        let entries = vec![("user".to_string(), format!("u{i}"))];
        for algorithm in Algorithm::ALL {
            f.store
                .hit(Hit {
                    domain: "test",
                    entries: &entries,
                    algorithm,
                    limit: 10,
                    window: Unit::Second.into(),
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
                })
                .await
                .unwrap();
        }
    }
    assert_eq!(f.store.len(), 1000 * Algorithm::ALL.len());
    // Two seconds on, every window (counter: both buckets) has passed, and
    // every bucket is full again.
    f.clock.advance_micros(2 * SECOND + 1);
    f.store.sweep();
    assert!(f.store.is_empty(), "{} left", f.store.len());
}

/// A counter with 4 buckets of 20 s in a one-minute window: three full
/// buckets and the oldest, weighted by the part of it still in the window.
#[tokio::test]
async fn four_buckets_weigh_only_the_oldest() {
    let f = Fixture::new();
    let call = |hits: u64| {
        let entries = &f.entries;
        let store = &f.store;
        async move {
            store
                .hit(Hit {
                    domain: "test",
                    entries,
                    algorithm: Algorithm::SlidingWindowCounter,
                    limit: 100,
                    window: Unit::Minute.into(),
                    hits,
                    negative: false,
                    usage_reports: false,
                    buckets: 4,
                    burst: 0,
                    shard: tollgate::storage::Shard::NONE,
                    receipt: false,
                    also: &[],
                    lease: false,
                    ahead: tollgate::storage::Ahead::NONE,
                })
                .await
                .expect("the embedded store always answers")
        }
    };
    f.clock.set_micros(T0 + 5 * SECOND);
    let d = call(30).await;
    // Counted until its bucket (ends at 20 s) has left the window: 80 s.
    assert_eq!(
        (d.admitted, d.remaining, d.reset_micros),
        (true, 70, 75 * SECOND)
    );
    f.clock.set_micros(T0 + 25 * SECOND);
    let d = call(20).await;
    // The oldest counted hits (bucket 0) leave at 80 s.
    assert_eq!(
        (d.admitted, d.remaining, d.reset_micros),
        (true, 50, 55 * SECOND)
    );
    f.clock.set_micros(T0 + 45 * SECOND);
    assert_eq!(call(10).await.remaining, 40);
    // Bucket 0 is now the oldest, 5 s into bucket 3: 30 x 15/20 + 20 + 10.
    f.clock.set_micros(T0 + 65 * SECOND);
    assert_eq!(call(0).await.remaining, 47);
    // 30 x 5/20 + 30 = 37.5.
    f.clock.set_micros(T0 + 75 * SECOND);
    assert_eq!(call(0).await.remaining, 62);
    // Bucket 0 is gone; bucket 1 is the oldest: 20 x 15/20 + 10 = 25.
    f.clock.set_micros(T0 + 85 * SECOND);
    assert_eq!(call(0).await.remaining, 75);
    // 80 more fit once 20 x (20 - e)/20 + 10 <= 20, at e = 10 s: 5 s on.
    let d = call(80).await;
    assert_eq!(
        (d.admitted, d.remaining, d.reset_micros),
        (false, 75, 5 * SECOND)
    );
    f.clock.set_micros(T0 + 90 * SECOND - 1);
    assert!(!call(80).await.admitted);
    f.clock.set_micros(T0 + 90 * SECOND);
    let d = call(80).await;
    assert_eq!((d.admitted, d.remaining), (true, 0));
}

/// The same hits with 2 buckets answer as the classic counter: the whole
/// previous window weighs in.
#[tokio::test]
async fn two_buckets_are_the_classic_counter() {
    let f = Fixture::new();
    let counter = Algorithm::SlidingWindowCounter;
    f.clock.set_micros(T0 + 5 * SECOND);
    assert!(f.hit(counter, 100, 30).await.admitted);
    // 45 s into the next minute: 30 x 15/60 = 7.5.
    f.clock.set_micros(T0 + 105 * SECOND);
    assert_eq!(f.hit(counter, 100, 0).await.remaining, 92);
}

/// A wall clock that steps back below the window (a counter's bucket)
/// last written counts on in it: what it holds still counts, on every
/// algorithm, and a fixed window's reset is its end on the stepped clock.
#[tokio::test]
async fn a_clock_step_back_never_counts_afresh() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
    ] {
        let f = Fixture::new();
        f.clock.advance_micros(30 * SECOND);
        assert_eq!(f.burst(algorithm, 10, 10).await, 10, "{algorithm}");
        f.clock.step_wall_micros(-3 * MINUTE as i64);
        let d = f.hit(algorithm, 10, 1).await;
        assert!(
            !d.admitted,
            "{algorithm}: counted afresh after the step: {d:?}"
        );
        if algorithm == Algorithm::FixedWindow {
            // 30 s left of the window written, three minutes later.
            assert_eq!(d.reset_micros, 3 * MINUTE + 30 * SECOND, "{algorithm}");
        }
    }
}

/// A reset while the clock is stepped back, then a give-back of a hit
/// recorded before it: the reset is marked no earlier than the window
/// (bucket) written, so once the clock is back in that window the
/// give-back takes nothing off the fresh count.
#[tokio::test]
async fn a_give_back_from_before_a_reset_in_a_step_back_takes_nothing() {
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindowCounter] {
        let f = Fixture::new();
        f.clock.advance_micros(30 * SECOND);
        let hit = |hits: u64, receipt: bool| f.spec(algorithm, 10, hits, false, receipt);
        assert!(f.store.hit(hit(5, false)).await.unwrap().admitted);
        // A minute back: the window written is after now.
        f.clock.step_wall_micros(-(MINUTE as i64));
        let d = f.store.hit(hit(5, true)).await.unwrap();
        assert!(d.admitted, "{algorithm}: {d:?}");
        let receipt = d.receipt.expect("a receipt");
        f.store.reset(hit(1, false)).await.unwrap();
        // Back in the window written, filled afresh after the reset.
        f.clock.advance_micros(MINUTE);
        assert_eq!(f.burst(algorithm, 10, 10).await, 10, "{algorithm}");
        f.store.undo(hit(5, true), receipt).await.unwrap();
        let d = f.hit(algorithm, 10, 1).await;
        assert!(
            !d.admitted,
            "{algorithm}: the give-back took off the fresh count: {d:?}"
        );
    }
}
