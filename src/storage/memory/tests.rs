use super::bytes::{LOG_MEMBER_BYTES, heap};
use super::*;
use crate::clock::ManualClock;
use crate::limit::{DEFAULT_BUCKETS, Unit};
use crate::storage::Shard as SubLimiter;

const MINUTE: u64 = 60_000_000;
/// A whole number of minutes since the epoch.
const T0: u64 = 1_800_000_000_000_000;

fn store(max_bytes: usize) -> (ManualClock, MemoryStore) {
    let clock = ManualClock::at_micros(T0);
    let bounds = MemoryBounds {
        max_bytes,
        ..MemoryBounds::UNBOUNDED
    };
    (
        clock.clone(),
        MemoryStore::with_bounds(Arc::new(clock), bounds),
    )
}

fn hit<'a>(entries: &'a [(String, String)], algorithm: Algorithm, limit: u64) -> Hit<'a> {
    Hit {
        domain: "d",
        entries,
        algorithm,
        limit,
        window: Unit::Minute.into(),
        hits: 1,
        negative: false,
        usage_reports: false,
        buckets: DEFAULT_BUCKETS,
        burst: 0,
        shard: SubLimiter::NONE,
        receipt: false,
        also: &[],
        lease: false,
        ahead: crate::storage::Ahead::NONE,
    }
}

fn user(name: &str) -> Vec<(String, String)> {
    vec![("user".to_owned(), name.to_owned())]
}

/// Members of the one log the store holds.
fn members(store: &MemoryStore) -> usize {
    store
        .shards
        .iter()
        .flat_map(|s| {
            lock(s)
                .slots
                .values()
                .map(|slot| match &slot.state {
                    State::Log(m) => m.entries.len(),
                    _ => 0,
                })
                .collect::<Vec<_>>()
        })
        .sum()
}

#[test]
fn allocation_sizes_follow_glibc() {
    assert_eq!(heap(0), 0);
    assert_eq!(heap(1), 32);
    assert_eq!(heap(24), 32);
    assert_eq!(heap(25), 48);
    assert_eq!(heap(88), 96);
    assert_eq!(heap(16 * 1000), 16 * 1000 + 16);
    // hashbrown: 7 entries fit 8 buckets, 14 fit 16.
    assert_eq!(table_bytes(7), heap(8 * 9 + 16));
    assert_eq!(table_bytes(14), heap(16 * 9 + 16));
    assert_eq!(log_capacity(16 * 1000 + 16), 1000);
}

/// Bytes grow with limiters and log members, and come back to nothing
/// once every window has passed and the store is swept.
#[test]
fn bytes_follow_the_limiters_held() {
    let (clock, store) = store(usize::MAX);
    assert_eq!(store.bytes(), 0);
    for i in 0..100 {
        store.decide(&hit(&user(&format!("u{i}")), Algorithm::FixedWindow, 10));
    }
    let fixed = store.bytes();
    assert!(fixed >= 100 * NODE_BYTES, "{fixed}");
    let log = user("log");
    store.decide(&hit(&log, Algorithm::SlidingWindowLog, 5000));
    let one = store.bytes();
    assert!(one - fixed > NODE_BYTES, "{}", one - fixed);
    for _ in 1..1000 {
        clock.advance_micros(1);
        assert!(
            store
                .decide(&hit(&log, Algorithm::SlidingWindowLog, 5000))
                .admitted
        );
    }
    let grown = store.bytes() - one;
    assert!(
        (999 * LOG_MEMBER_BYTES..=1024 * LOG_MEMBER_BYTES).contains(&grown),
        "{grown}"
    );
    // The log's members leave with its window and its buffer follows.
    clock.advance_micros(MINUTE);
    store.decide(&hit(&log, Algorithm::SlidingWindowLog, 5000));
    assert_eq!(store.bytes(), one);
    clock.advance_micros(MINUTE);
    store.sweep();
    assert_eq!((store.len(), store.bytes()), (0, 0));
}

/// Past the byte budget the least recently used limiters go, and the
/// estimate never exceeds the budget between calls.
#[test]
fn the_byte_budget_forgets_the_least_recently_used() {
    let (_, store) = store(1 << 20);
    let hot = user("hot");
    assert!(store.decide(&hit(&hot, Algorithm::FixedWindow, 1)).admitted);
    for i in 0..20_000 {
        store.decide(&hit(&user(&format!("u{i}")), Algorithm::FixedWindow, 1));
        if i % 100 == 0 {
            // Kept recent, so never the one forgotten.
            assert!(!store.decide(&hit(&hot, Algorithm::FixedWindow, 1)).admitted);
        }
        assert!(store.bytes() <= store.max_bytes(), "after {i}");
    }
    assert!(store.evictions() > 10_000, "{}", store.evictions());
    assert!(store.len() < 10_000, "{}", store.len());
    assert!(
        store.bytes() > store.max_bytes() * 3 / 4,
        "{}",
        store.bytes()
    );
}

/// A log whose limit needs more members than one limiter may hold keeps
/// its hits in rounded times: never more members than fit, never more
/// admitted than the limit in a window, again admitted once the window
/// (and at most one granule more) has passed.
#[test]
fn a_log_above_its_room_keeps_its_limit_in_bounded_members() {
    let (clock, store) = store(1 << 20);
    let log = user("big");
    let key_bytes = entry_bytes(
        store
            .keys
            .local(&hit(&log, Algorithm::SlidingWindowLog, 1))
            .capacity(),
    );
    let room = log_capacity(store.limiter_bytes() - key_bytes);
    let limit = 5000;
    assert!(room < limit as usize / 4, "room {room}");
    let granule = MINUTE.div_ceil(room as u64 - 1);
    let mut admitted = 0;
    let mut refused = None;
    for _ in 0..6000 {
        clock.advance_micros(7_000);
        let d = store.decide(&hit(&log, Algorithm::SlidingWindowLog, limit));
        if d.admitted {
            admitted += 1;
        } else if refused.is_none() {
            refused = Some(d);
        }
        assert!(members(&store) <= room);
        assert!(store.bytes() <= store.max_bytes());
    }
    assert_eq!(admitted, limit);
    // The first hit was at T0 + 7 ms; a refusal at T0 + 35 s waits for
    // it to leave, at most one granule late.
    let refused = refused.expect("hits past the limit are refused");
    let exact = T0 + 7_000 + MINUTE - (T0 + 7_000 * (limit + 1));
    assert!(
        (exact..=exact + granule).contains(&refused.reset_micros),
        "reset {} exact {exact} granule {granule}",
        refused.reset_micros
    );
    assert_eq!(store.evictions(), 0);
    clock.advance_micros(MINUTE + granule);
    let d = store.decide(&hit(&log, Algorithm::SlidingWindowLog, limit));
    assert!(d.admitted);
    assert_eq!(d.remaining, limit - 1);
}

/// A log within its room is exact: each hit keeps its own time.
#[test]
fn a_log_within_its_room_keeps_every_time() {
    let (clock, store) = store(1 << 20);
    let log = user("small");
    for _ in 0..100 {
        clock.advance_micros(3);
        store.decide(&hit(&log, Algorithm::SlidingWindowLog, 100));
    }
    assert_eq!(members(&store), 100);
    let d = store.decide(&hit(&log, Algorithm::SlidingWindowLog, 100));
    assert!(!d.admitted);
    assert_eq!(d.reset_micros, MINUTE - 99 * 3);
}

/// A budget too small for even one limiter holds none: each hit is
/// decided as new and counted as forgotten.
#[test]
fn a_budget_too_small_for_one_limiter_holds_none() {
    let (_, tiny) = store(512);
    let alice = user("alice");
    for _ in 0..3 {
        assert!(
            tiny.decide(&hit(&alice, Algorithm::FixedWindow, 1))
                .admitted
        );
    }
    assert_eq!((tiny.len(), tiny.bytes(), tiny.evictions()), (0, 0, 3));
    // Long identities are hashed: the smallest budget settings accept
    // holds them.
    let (_, store) = store(1 << 20);
    let long = user(&"v".repeat(20_000));
    for admitted in [true, false] {
        let d = store.decide(&hit(&long, Algorithm::FixedWindow, 1));
        assert_eq!(d.admitted, admitted);
    }
    assert_eq!((store.len(), store.evictions()), (1, 0));
}

/// Both bounds apply: a tight limiter cap wins over a loose byte budget.
#[test]
fn the_limiter_cap_still_applies() {
    let clock = ManualClock::at_micros(T0);
    let bounds = MemoryBounds {
        max_limiters: 64,
        max_bytes: 1 << 30,
    };
    let store = MemoryStore::with_bounds(Arc::new(clock), bounds);
    for i in 0..1000 {
        store.decide(&hit(&user(&format!("u{i}")), Algorithm::FixedWindow, 1));
    }
    assert_eq!(store.len(), 64);
    assert_eq!(store.evictions(), 1000 - 64);
}

/// A window of several units (`unit: second, unit_multiplier: 2`): fixed
/// windows align on even seconds since the epoch and reset at the next
/// one, a log's hit leaves two seconds after it came, a bucket refills 3
/// tokens in two seconds, and the limiter is not the 1-second one.
#[test]
fn multiplied_windows_count_their_whole_length() {
    let (clock, store) = store(usize::MAX);
    let two = crate::limit::Window::new(Unit::Second, 2).unwrap();
    let entries = user("w");
    let at = |algorithm| Hit {
        window: two,
        ..hit(&entries, algorithm, 3)
    };
    // An odd second plus half: 1.5 s into the window that began at T0.
    clock.set_micros(T0 + 1_500_000);
    // The rates: a count in flight has no window.
    for algorithm in Algorithm::ALL.into_iter().filter(|a| !a.releases()) {
        for _ in 0..3 {
            assert!(store.decide(&at(algorithm)).admitted, "{algorithm}");
        }
        let d = store.decide(&at(algorithm));
        assert!(!d.admitted, "{algorithm}");
        let expected = match algorithm {
            // The window ends at T0 + 2 s.
            Algorithm::FixedWindow => 500_000,
            // The oldest hit leaves two seconds after it came.
            Algorithm::SlidingWindowLog => 2_000_000,
            // Two buckets of a window each, the full one [T0, T0 + 2 s):
            // once it is the older one, it has to weigh a third less,
            // 2/3 s into the next.
            Algorithm::SlidingWindowCounter => 500_000 + 666_667,
            // One token at 3 per 2 s.
            Algorithm::TokenBucket => 666_667,
            Algorithm::Concurrency => unreachable!("left out above"),
        };
        assert!(
            d.reset_micros.abs_diff(expected) <= 1,
            "{algorithm}: reset {} is not {expected}",
            d.reset_micros
        );
        // The same descriptor per second is another limiter.
        let per_second = Hit {
            window: Unit::Second.into(),
            ..at(algorithm)
        };
        assert!(store.decide(&per_second).admitted, "{algorithm}");
    }
    // At T0 + 2 s the fixed window starts again; a 2-second log still
    // holds the hits of 0.5 s ago.
    clock.set_micros(T0 + 2_000_000);
    assert!(store.decide(&at(Algorithm::FixedWindow)).admitted);
    assert!(!store.decide(&at(Algorithm::SlidingWindowLog)).admitted);
    clock.set_micros(T0 + 3_500_000);
    assert!(store.decide(&at(Algorithm::SlidingWindowLog)).admitted);
}
