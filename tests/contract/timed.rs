//! The cases that wait for time to pass, on the real clock: each bounds
//! what it asserts by the clock read around its calls, not by how long it
//! assumes they take, and starts again on a fresh limiter when a busy
//! machine took its calls across a window boundary.

use super::*;

/// Waits until the wall clock is early in a second, so a burst of calls
/// does not straddle a 1-second window boundary (Redis runs on this
/// machine's clock).
async fn early_in_a_second() {
    early_in_a_second_by(600).await
}

/// Waits until the wall clock is at most `latest` ms into a second.
pub(super) async fn early_in_a_second_by(latest: u32) {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .subsec_millis();
    if millis > latest {
        tokio::time::sleep(Duration::from_millis(u64::from(1_010 - millis))).await;
    }
}

/// Whether calls made between the wall-clock readings `from` and `to`
/// (micros) fell in one window of `span` micros, quickly enough (300 ms)
/// that no 1-second limit refilled meanwhile. A case that needs its calls
/// in one window tries again, on a fresh limiter, when they were not: on a
/// busy machine they can take longer than the case assumed.
fn in_one_window(from: u64, to: u64, span: u64) -> bool {
    from / span == to / span && to - from < 300_000
}

/// How many tries a case makes for its calls to fall in one window.
const TRIES: u32 = 5;

/// Checks that `d`, decided `margin` before a reset the store answered,
/// was refused, when the clock says it was: the reset counts from when the
/// store refused, after `before_refused`, so a call back before
/// `before_refused + reset - 100 ms` was decided at least 100 ms early.
/// On a busy machine the call can come back later than that, and then it
/// proves nothing.
fn refused_before_reset(c: &str, d: &Decision, before_refused: Instant, reset: Duration) {
    if Instant::now() + Duration::from_millis(100) <= before_refused + reset {
        assert!(
            !d.admitted,
            "{c}: admitted 150 ms before the reset {reset:?}"
        );
    } else {
        eprintln!("{c}: the call 150 ms before the reset came back too late to tell");
    }
}

/// With a 1-second window: the refused answer's reset is when a retry
/// succeeds (not much earlier, not later).
pub(super) async fn retry_after_reset_succeeds(store: &dyn Store, algorithm: Algorithm) {
    retry_after_reset_succeeds_on(store, Limiter::new("retry", algorithm, 3, Unit::Second)).await;
}

pub(super) async fn retry_after_reset_succeeds_on(store: &dyn Store, l: Limiter) {
    let algorithm = l.algorithm;
    let c = format!("{} ({} buckets)", ctx(store, algorithm), l.buckets);
    let mut tries = 0;
    let (l, before_first, before_refused, refused, refused_at) = loop {
        let l = Limiter {
            domain: unique_domain("retry"),
            ..l.clone()
        };
        early_in_a_second().await;
        let from = wall_micros();
        let before_first = Instant::now();
        let mut admitted = true;
        for _ in 0..3 {
            admitted &= l.hit(store, 1).await.admitted;
        }
        let before_refused = Instant::now();
        let refused = l.hit(store, 1).await;
        let refused_at = Instant::now();
        tries += 1;
        if in_one_window(from, wall_micros(), 1_000_000) || tries == TRIES {
            assert!(admitted, "{c}");
            break (l, before_first, before_refused, refused, refused_at);
        }
    };
    assert!(!refused.admitted, "{c}");
    l.assert_reset_in_range(store, &refused, "refused");
    let reset = Duration::from_micros(refused.reset_micros);
    if algorithm == Algorithm::SlidingWindowLog {
        let since_first = refused_at - before_first;
        assert!(
            reset + since_first + Duration::from_millis(5) >= Duration::from_secs(1),
            "{c}: reset {reset:?} is too early ({since_first:?} since the first hit)"
        );
    }
    if reset > Duration::from_millis(300) {
        tokio::time::sleep_until(
            (refused_at + reset.saturating_sub(Duration::from_millis(150))).into(),
        )
        .await;
        let d = l.hit(store, 1).await;
        refused_before_reset(&c, &d, before_refused, reset);
    }
    tokio::time::sleep_until((refused_at + reset + Duration::from_millis(30)).into()).await;
    assert!(
        l.hit(store, 1).await.admitted,
        "{c}: refused 30 ms after the reset {reset:?}"
    );
}

/// After the window passes the limiter admits again. The counter's previous
/// bucket still weighs in during the next window, so it needs two.
pub(super) async fn admits_again_after_the_window(store: &dyn Store, algorithm: Algorithm) {
    let c = ctx(store, algorithm);
    let mut tries = 0;
    let l = loop {
        let l = Limiter::new("window", algorithm, 2, Unit::Second);
        early_in_a_second().await;
        let from = wall_micros();
        l.hit(store, 2).await;
        let refused = !l.hit(store, 1).await.admitted;
        tries += 1;
        if in_one_window(from, wall_micros(), 1_000_000) || tries == TRIES {
            assert!(refused, "{c}");
            break l;
        }
    };
    let wait = match algorithm {
        Algorithm::SlidingWindowCounter => Duration::from_millis(2_100),
        _ => Duration::from_millis(1_100),
    };
    tokio::time::sleep(wait).await;
    let d = l.hit(store, 1).await;
    assert!(d.admitted, "{c}: after {wait:?}");
    assert_eq!(d.remaining, 1, "{c}: after {wait:?}");
}

/// Waits until the wall clock is early in an even second: the start of a
/// 2-second window, as fixed windows align them (on multiples of their
/// length since the epoch).
async fn early_in_an_even_second() {
    let into = wall_micros() % 2_000_000;
    if into > 300_000 {
        tokio::time::sleep(Duration::from_micros(2_010_000 - into)).await;
    }
}

/// A window of two seconds (`unit: second, unit_multiplier: 2`), 3 per
/// window, taken at the start of an even second: every algorithm refuses
/// the 4th hit and says when a retry succeeds, as a 2-second window
/// counts (a 1-second one would answer about half as long); the retry is
/// still refused 150 ms before that and admitted 30 ms after.
pub(super) async fn two_second_window(store: &dyn Store, algorithm: Algorithm) {
    let c = format!("{} (2 s)", ctx(store, algorithm));
    let mut tries = 0;
    let (l, from, to, before_refused, refused, refused_at) = loop {
        let l = Limiter::new(
            "two-seconds",
            algorithm,
            3,
            Span::new(Unit::Second, 2).unwrap(),
        );
        early_in_an_even_second().await;
        let from = wall_micros();
        let mut admitted = true;
        for _ in 0..3 {
            admitted &= l.hit(store, 1).await.admitted;
        }
        let before_refused = Instant::now();
        let refused = l.hit(store, 1).await;
        let refused_at = Instant::now();
        let to = wall_micros();
        tries += 1;
        if in_one_window(from, to, 2_000_000) || tries == TRIES {
            assert!(admitted, "{c}");
            break (l, from, to, before_refused, refused, refused_at);
        }
    };
    assert!(!refused.admitted, "{c}");
    // Fixed: the rest of the even-aligned window (at least 1.7 s, less the
    // calls). Log: two seconds after the first hit. Counter (two buckets
    // of a window): once the full bucket is the older one and weighs a
    // third less, 8/3 s after the even second. Bucket: one token at 1.5 a
    // second. A 1-second window would answer about half of each. Each is
    // shorter by the time the calls took, which the clock read around
    // them bounds: into the window for the fixed window and the counter,
    // since the first hit for the others.
    let (least, most, spent) = match algorithm {
        Algorithm::FixedWindow => (1_500_000, 2_000_000, to % 2_000_000),
        Algorithm::SlidingWindowLog | Algorithm::Concurrency => (1_500_000, 2_000_000, to - from),
        Algorithm::SlidingWindowCounter => (2_200_000, 2_666_667, to % 2_000_000),
        Algorithm::TokenBucket => (550_000, 666_667, to - from),
    };
    let least = least.min(most - spent.min(most));
    assert!(
        (least..=most).contains(&refused.reset_micros),
        "{c}: reset {} not in [{least}, {most}], {} us after the even second",
        refused.reset_micros,
        to % 2_000_000
    );
    let reset = Duration::from_micros(refused.reset_micros);
    tokio::time::sleep_until(
        (refused_at + reset.saturating_sub(Duration::from_millis(150))).into(),
    )
    .await;
    let d = l.hit(store, 1).await;
    refused_before_reset(&c, &d, before_refused, reset);
    tokio::time::sleep_until((refused_at + reset + Duration::from_millis(30)).into()).await;
    assert!(
        l.hit(store, 1).await.admitted,
        "{c}: refused 30 ms after the reset {reset:?}"
    );
}

/// A token bucket's lease (`Hit::lease`): its tokens keep their room in
/// the bucket while it lives, so the bucket refills only up to its burst
/// less the tokens leased out (whenever the lease spends them, what the
/// bucket gives meanwhile never passes one bucket); ending the lease gives
/// its unused tokens back.
pub(super) async fn a_bucket_keeps_room_for_its_leases(store: &dyn Store) {
    let c = ctx(store, Algorithm::TokenBucket);
    // 100 per 10 s: a token every 100 ms, leases live 10 to 20 s.
    let mut l = Limiter::receipts("bucketlease", Algorithm::TokenBucket, 100, Unit::Second);
    l.window = Span::new(Unit::Second, 10).unwrap();
    let lease = Hit {
        lease: true,
        ..l.as_hit(50, false)
    };
    let d = store.hit(lease).await.unwrap();
    assert!(d.admitted, "{c}: {d:?}");
    assert_eq!(d.remaining, 50, "{c}: {d:?}");
    assert!(
        (10_000_000..=20_000_000).contains(&d.reset_micros),
        "{c}: the lease lives 10 to 20 s: {d:?}"
    );
    let r = d.receipt.expect("a lease has a receipt");
    assert_eq!((r.hits, r.mark), (50, 50), "{c}: {r:?}");
    // 0.6 s later the bucket has refilled 6 tokens, which find no room:
    // the 50 leased are still out.
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The calls refill the bucket as they go: a token for every 100 ms
    // they take (more than 100 ms in a debug build on a busy machine), so
    // the bound is what the clock read around them allows.
    let refill = |since: Instant| since.elapsed().as_micros().div_ceil(100_000) as u64;
    let started = Instant::now();
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += u64::from(l.hit(store, 1).await.admitted);
    }
    let most = 50 + refill(started);
    assert!(
        (50..=most).contains(&admitted),
        "{c}: the bucket refilled over its leases: {admitted} admitted, at most {most}"
    );
    // The lease ends with 20 unused: they are back at once.
    let end = Hit {
        lease: true,
        ..l.as_hit(20, false)
    };
    store.undo(end, Receipt { hits: 20, ..r }).await.unwrap();
    let before = admitted;
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += u64::from(l.hit(store, 1).await.admitted);
    }
    // Both runs together: the 50 left, the 20 back, and what the time
    // since the first call refilled.
    let most = 70 + refill(started) - before;
    assert!(
        (20..=most).contains(&admitted),
        "{c}: {admitted} admitted after 20 came back, at most {most}"
    );
}

/// A fixed window's lease may reserve hits in the next windows
/// (`Hit::ahead`): each reservation is in its window's count at once, so
/// that window starts with it; the store reserves window after window
/// while each has room and says how many it reserved (the receipt's
/// mark), and a receipt naming a window to come takes its reservation
/// back.
pub(super) async fn a_lease_reserves_hits_ahead(store: &dyn Store) {
    let c = ctx(store, Algorithm::FixedWindow);
    use super::ahead::lease;
    // The four leases count from one window: on a busy machine they may
    // straddle two, and then the case starts again on a fresh limiter.
    let mut tries = 0;
    let (l, [a, b, d, e]) = loop {
        let l = Limiter::receipts("ahead", Algorithm::FixedWindow, 10, Unit::Second);
        early_in_a_second().await;
        let a = lease(store, &l, 2, 9, 4).await;
        let b = lease(store, &l, 1, 3, 7).await;
        let d = lease(store, &l, 1, 2, 5).await;
        let e = lease(store, &l, 1, 4, 6).await;
        let at = |x: &Decision| x.receipt.map(|r| r.at);
        tries += 1;
        if [&b, &d, &e].iter().all(|x| at(x) == at(&a)) || tries == TRIES {
            break (l, [a, b, d, e]);
        }
    };
    // The next seven windows (the most reserved) hold 4 each.
    let r = a.receipt.expect("a lease has a receipt");
    assert!(a.admitted, "{c}: {a:?}");
    assert_eq!((r.hits, r.mark), (2, 7), "{c}: {r:?}");
    let idx = r.at;
    // 7 more would pass the limit in the next window: none is reserved.
    assert!(b.admitted, "{c}: {b:?}");
    assert_eq!(b.receipt.map(|r| r.mark), Some(0), "{c}: {b:?}");
    // 5 more in two windows: 9 in each.
    assert_eq!(d.receipt.map(|r| r.mark), Some(2), "{c}: {d:?}");
    // 6 more fit in none of those two, so none is reserved (reservations
    // stop at the first window without room).
    assert_eq!(e.receipt.map(|r| r.mark), Some(0), "{c}: {e:?}");
    // The second window to come gives its 5 back: 4 again; the sixth
    // gives 3 of its 4 back.
    for (hits, at) in [(5, idx + 2), (3, idx + 6)] {
        l.undo(
            store,
            Receipt {
                hits,
                at,
                mark: 0,
                shard: 0,
                ahead: 0,
                reserved: 0,
            },
        )
        .await;
    }
    let (l, c) = (&l, &c);
    let admitted = |expected: u64, window: u64| async move {
        // Into window `window`, early enough for 11 calls.
        let start = (idx + window) * 1_000_000 + 30_000;
        let now = wall_micros();
        if now < start {
            tokio::time::sleep(Duration::from_micros(start - now)).await;
        }
        let mut n = 0;
        for _ in 0..11 {
            n += u64::from(l.hit(store, 1).await.admitted);
        }
        assert_eq!(n, expected, "{c}: admitted in window {idx} + {window}");
    };
    // This window counted the four leases' own hits (5 in all).
    admitted(5, 0).await;
    admitted(1, 1).await;
    admitted(6, 2).await;
    // Window 4 is first touched a window after window 3 (what the store
    // kept for it still counts).
    admitted(6, 3).await;
    admitted(6, 5).await;
    admitted(9, 6).await;
    admitted(6, 7).await;
    // Nothing reaches the eighth window after the lease's.
    admitted(10, 8).await;
}
