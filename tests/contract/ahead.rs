//! A sliding counter's lease reserving hits in the buckets after its own
//! (`Hit::ahead`), on the real clock: each reservation counts from the
//! start of its bucket, so every trailing window holds at most the limit
//! however the reserved hits are spent, and hits now are refused where
//! they would take a window to come over it.

use super::*;

/// A lease of `hits` on `l` reserving `each` in the next `windows`.
pub(super) async fn lease(
    store: &dyn Store,
    l: &Limiter,
    hits: u64,
    windows: u8,
    each: u64,
) -> Decision {
    let hit = Hit {
        ahead: Ahead {
            windows,
            hits: each,
        },
        ..l.as_hit(hits, false)
    };
    store.hit(hit).await.unwrap()
}

/// 10 per second in two 1-second buckets. A lease of 2 reserves 4 in
/// each of the next seven buckets (every pair of neighbours holds 8); a
/// second lease's 7 more would make the next pair 14, so it reserves
/// none. In the lease's own bucket only 3 more hits are admitted: its 6
/// and the next bucket's 4 are the window that starts then. That next
/// bucket starts full, and the one after it with its own 4 and the 4
/// before it.
pub(super) async fn a_counter_reserves_hits_ahead(store: &dyn Store) {
    let c = ctx(store, Algorithm::SlidingWindowCounter);
    let mut tries = 0;
    let (l, a, b, now_admitted, refused, to, bucket) = loop {
        let l = Limiter::receipts(
            "counterahead",
            Algorithm::SlidingWindowCounter,
            10,
            Unit::Second,
        );
        super::timed::early_in_a_second_by(300).await;
        let from = wall_micros();
        let a = lease(store, &l, 2, 9, 4).await;
        let b = lease(store, &l, 1, 3, 7).await;
        let mut admitted = 0;
        let mut refused = None;
        for _ in 0..11 {
            let d = l.hit(store, 1).await;
            admitted += u64::from(d.admitted);
            if !d.admitted {
                refused = Some(d);
            }
        }
        let to = wall_micros();
        tries += 1;
        if from / 1_000_000 == to / 1_000_000 {
            break (l, a, b, admitted, refused, to, from / 1_000_000);
        }
        if tries == 5 {
            // The calls straddled a bucket's end every time: what they
            // admitted tells nothing.
            eprintln!("{c}: no try kept its calls within one bucket");
            return;
        }
    };
    let r = a.receipt.expect("a lease has a receipt");
    assert!(a.admitted, "{c}: {a:?}");
    assert_eq!((r.hits, r.at, r.ahead), (2, bucket, 7), "{c}: {r:?}");
    // What is left is the lease's own answer, before it reserved (as a
    // fixed window's).
    assert_eq!(a.remaining, 8, "{c}: {a:?}");
    assert!(b.admitted, "{c}: {b:?}");
    assert_eq!(b.receipt.map(|r| r.ahead), Some(0), "{c}: {b:?}");
    assert_eq!(now_admitted, 3, "{c}: admitted beside the reservations");
    // A refused hit is told to wait at least until the next bucket: no
    // moment in this one admits it, the window that starts then holding
    // its 6 and the next bucket's 4 already.
    let refused = refused.expect("hits refused");
    assert!(
        to + refused.reset_micros >= (bucket + 1) * 1_000_000,
        "{c}: told to come back {} µs after a call before {to}, in bucket {bucket}: {refused:?}",
        refused.reset_micros
    );

    // 20 ms into bucket `bucket + j`: 11 hits, how many admitted, and
    // how far into the bucket the last call came back.
    let (l, c) = (&l, &c);
    let hits_in = |j: u64| async move {
        let start = (bucket + j) * 1_000_000 + 20_000;
        let now = wall_micros();
        if now < start {
            tokio::time::sleep(Duration::from_micros(start - now)).await;
        }
        let mut admitted = 0;
        for _ in 0..11 {
            admitted += u64::from(l.hit(store, 1).await.admitted);
        }
        (admitted, wall_micros().saturating_sub(start - 20_000))
    };
    // The next bucket starts with 6 weighing nearly whole and its own 4:
    // nothing fits until a sixth of it has gone by.
    let (admitted, into) = hits_in(1).await;
    if into < 160_000 {
        assert_eq!(admitted, 0, "{c}: admitted {into} µs into the next bucket");
    } else {
        eprintln!("{c}: the next bucket's calls came back {into} µs in: too late to tell");
    }
    // Two buckets on: its 4 and the 4 before it, weighing 4 x (1 - e): 2
    // more fit until a quarter of it has gone by.
    let (admitted, into) = hits_in(2).await;
    if into < 240_000 {
        assert_eq!(
            admitted, 2,
            "{c}: admitted {into} µs into the second bucket"
        );
    } else {
        eprintln!("{c}: the second bucket's calls came back {into} µs in: too late to tell");
    }
}
