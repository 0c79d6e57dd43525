//! Quota streams' shares and requests decided one at a time keep one
//! count on a fixed window's limit (`LeaseCall::counted`,
//! `tollgate::quota::window`), on every store.

use super::*;
use tollgate::quota::bucket::Bucket;
use tollgate::quota::window::Fixed;
use tollgate::quota::{self, Counted, Grant, Report, Terms};
use tollgate::storage::LeaseCall;

const SEC: u64 = 1_000_000;

/// A report of `requests` over 5 s from `holder`, on `l`'s limit, whose
/// share holds `hold` microseconds.
async fn report(store: &dyn Store, l: &Limiter, holder: &str, requests: u64, hold: u64) -> Grant {
    let call = LeaseCall {
        domain: &l.domain,
        entries: &l.entries,
        algorithm: l.algorithm,
        window: l.window,
        holder,
        report: Report {
            requests,
            elapsed_secs: 5,
        },
        terms: Terms {
            capacity: quota::capacity(l.limit, l.window),
            fill_secs: quota::fill_secs(l.window),
            hold_micros: hold,
        },
        counted: Some(match l.algorithm {
            Algorithm::TokenBucket => Counted::Bucket(Bucket {
                limit: l.limit,
                burst: l.burst,
            }),
            _ => Counted::Window(Fixed {
                limit: l.limit,
                window_micros: l.window.micros(),
            }),
        }),
    };
    store
        .lease(call)
        .await
        .unwrap_or_else(|e| panic!("{}: a report failed: {e}", store.kind()))
}

/// The hits a share of `tokens` granted at `at` (the wall clock's
/// microseconds: the store's, on this machine) holds of the rest of that
/// window. A grant made between two readings of the clock holds between
/// what the later one and the earlier one give.
fn held_from(l: &Limiter, tokens: u64, at: u64) -> f64 {
    let w = l.window.micros();
    let end = (at / w + 1) * w;
    tokens as f64 * (end - at) as f64 / (quota::fill_secs(l.window) * SEC) as f64
}

/// A day's limit of a million: a share's reservation runs to the day's
/// end, so what it holds is its rate times the rest of the day.
pub(super) async fn shares_and_requests_keep_one_count(store: &dyn Store) {
    let c = ctx(store, Algorithm::FixedWindow);
    let limit = 1_000_000u64;
    let hold = 60 * SEC;
    support::away_from_a_day_boundary().await;

    // Requests first: 600,000 counted, then a busy stream's report. Its
    // share holds at most what is left, and requests get the rest of it.
    let a = Limiter::new("onecount", Algorithm::FixedWindow, limit, Unit::Day);
    assert!(a.hit(store, 600_000).await.admitted, "{c}");
    let before = wall_micros();
    let g = report(store, &a, "envoy.1", 1_000_000, hold).await;
    assert!(g.tokens > 0, "{c}: {g:?}");
    let d = a.hit(store, 0).await;
    let after = wall_micros();
    let (least, most) = (
        held_from(&a, g.tokens, after),
        held_from(&a, g.tokens, before),
    );
    assert!(
        600_000.0 + least <= limit as f64 + 1.0,
        "{c}: the share fits: {g:?}, {least} held at least"
    );
    let left = 600_000.0 + d.remaining as f64;
    assert!(
        left + least <= limit as f64 + 1.0 && left + most >= limit as f64 - 2.0,
        "{c}: counted, left and held make the limit: {d:?}, {least} to {most} held"
    );
    if d.remaining > 0 {
        assert!(a.hit(store, d.remaining).await.admitted, "{c}: {d:?}");
    }
    let refused = a.hit(store, 1).await;
    assert!(!refused.admitted, "{c}: nothing beyond");
    assert!(
        refused.reset_micros <= 1_000_000,
        "{c}: a refusal the shares take part in holds a second: {refused:?}"
    );

    // A share first: the stream alone asks, so it gets the whole rate, held
    // to the day's end; requests get what the day has run.
    let b = a.with_entries(&[("user", "bob")]);
    let before = wall_micros();
    let g = report(store, &b, "envoy.1", 1_000_000, hold).await;
    assert_eq!(g.tokens, quota::capacity(limit, b.window), "{c}: {g:?}");
    let d = b.hit(store, 0).await;
    let after = wall_micros();
    let (least, most) = (
        held_from(&b, g.tokens, after),
        held_from(&b, g.tokens, before),
    );
    let left = d.remaining as f64;
    assert!(
        left + least <= limit as f64 + 1.0 && left + most >= limit as f64 - 2.0,
        "{c}: {d:?}, {least} to {most} held"
    );
    if d.remaining > 0 {
        assert!(b.hit(store, d.remaining).await.admitted, "{c}: {d:?}");
    }
    assert!(
        !b.hit(store, 1).await.admitted,
        "{c}: the share's part is kept"
    );
    // The stream's demand falls: its next report gives part of its share
    // back (at most the difference of the two over the rest of the day),
    // which requests then get, and no more.
    let before = wall_micros();
    let smaller = report(store, &b, "envoy.1", 0, hold).await;
    assert!(smaller.tokens < g.tokens, "{c}: {smaller:?}");
    let d = b.hit(store, 0).await;
    let given = held_from(&b, g.tokens - smaller.tokens, before);
    assert!(d.remaining > 0, "{c}: {d:?}");
    assert!(
        d.remaining as f64 <= given + 1.0,
        "{c}: {d:?}, {given} given back at most"
    );
    // A reset forgets what the shares hold with the count.
    store.reset(b.as_hit(0, false)).await.unwrap();
    assert_eq!(b.hit(store, 0).await.remaining, limit, "{c}");
}

/// A replica's lease reserves hits in the windows ahead only where the
/// shares leave room (`Hit::ahead`).
pub(super) async fn a_lease_reserves_ahead_only_what_shares_leave(store: &dyn Store) {
    let c = ctx(store, Algorithm::FixedWindow);
    // A share held 30 s from its report covers the two windows after the
    // one it was reported in: the report and the leases must fall in one
    // 10 s window. A busy machine can take them across its end; then the
    // case starts again on a fresh limiter.
    for tries in 1.. {
        // In the first half of a 10 s window, so they mostly do.
        let into = wall_micros() % (10 * SEC);
        if into > 5 * SEC {
            tokio::time::sleep(Duration::from_micros(10 * SEC - into + 50_000)).await;
        }
        let mut l = Limiter::receipts("shareahead", Algorithm::FixedWindow, 100, Unit::Second);
        l.window = Span::new(Unit::Second, 10).unwrap();
        let sent = wall_micros();
        let g = report(store, &l, "envoy.1", 25, 30 * SEC).await;
        // Tokens per minute: a 10 s window holds a sixth, rounded up.
        let per_window = g.tokens.div_ceil(6);
        assert!(per_window > 0 && per_window < 100, "{c}: {g:?}");
        let fits = 100 - per_window;
        let lease = |each: u64| Hit {
            ahead: Ahead {
                windows: 2,
                hits: each,
            },
            ..l.as_hit(1, false)
        };
        let a = store.hit(lease(fits + 1)).await.unwrap();
        let b = store.hit(lease(fits)).await.unwrap();
        let answered = wall_micros();
        if sent / (10 * SEC) != answered / (10 * SEC) && tries < 3 {
            eprintln!("{c}: the calls spanned two 10 s windows ({sent} to {answered}); again");
            continue;
        }
        assert!(a.admitted, "{c}: {a:?}");
        assert_eq!(
            a.receipt.map(|r| r.mark),
            Some(0),
            "{c}: no room ahead: {a:?}"
        );
        assert!(b.admitted, "{c}: {b:?}");
        assert_eq!(
            b.receipt.map(|r| r.mark),
            Some(2),
            "{c}: room for {fits}: {b:?}"
        );
        break;
    }
}

/// A token bucket of 100 a minute: a share is charged to the bucket to its
/// end when granted (100 a minute for 16 s: 27 tokens, rounded up), and a
/// smaller share later gives back what the old one will not take.
pub(super) async fn a_bucket_is_charged_for_its_shares(store: &dyn Store) {
    let c = ctx(store, Algorithm::TokenBucket);
    let l = Limiter::new("bucketshare", Algorithm::TokenBucket, 100, Unit::Minute);
    let hold = 16 * SEC;
    let a = report(store, &l, "envoy.a", 1_000_000, hold).await;
    assert_eq!(a.tokens, 100, "{c}: alone, the whole rate");
    let d = l.hit(store, 0).await;
    // A token refills every 600 ms: a second of slack.
    assert!((73..=75).contains(&d.remaining), "{c}: {d:?}");
    assert!(l.hit(store, d.remaining).await.admitted, "{c}");
    assert!(
        !l.hit(store, 1).await.admitted,
        "{c}: the share's tokens are kept"
    );
    // A second Envoy: nothing is free until the first reports again.
    let b = report(store, &l, "envoy.b", 1_000_000, hold).await;
    assert_eq!(b.tokens, 0, "{c}: {b:?}");
    assert!(!l.hit(store, 1).await.admitted, "{c}");
    // The first's share halves: about 26 tokens back, 14 charged.
    let a = report(store, &l, "envoy.a", 1_000_000, hold).await;
    assert_eq!(a.tokens, 50, "{c}: {a:?}");
    let d = l.hit(store, 1).await;
    assert!(d.admitted, "{c}: {d:?}");
    assert!((9..=14).contains(&d.remaining), "{c}: {d:?}");
}
