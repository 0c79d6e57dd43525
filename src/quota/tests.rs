use proptest::prelude::*;

use super::*;
use crate::limit::Unit;

const SEC: u64 = 1_000_000;

fn terms(capacity: u64) -> Terms {
    Terms {
        capacity,
        fill_secs: 60,
        hold_micros: 17 * SEC,
    }
}

fn busy() -> Report {
    Report {
        requests: 1_000_000,
        elapsed_secs: 5,
    }
}

#[test]
fn per_second_limits_are_shared_in_sixtieths() {
    assert_eq!(fill_secs(Unit::Second.into()), 60);
    assert_eq!(fill_secs(Unit::Hour.into()), 3_600);
    assert_eq!(capacity(100, Unit::Second.into()), 6_000);
    assert_eq!(capacity(100, Unit::Minute.into()), 100);
    assert_eq!(capacity(100, Unit::Day.into()), 100);
    // Windows of several units (`unit_multiplier`): whole windows per
    // fill, at least a minute.
    let w = |unit, n| Window::new(unit, n).unwrap();
    assert_eq!(fill_secs(w(Unit::Second, 2)), 60);
    assert_eq!(capacity(10, w(Unit::Second, 2)), 300);
    assert_eq!(fill_secs(w(Unit::Second, 7)), 63);
    assert_eq!(capacity(10, w(Unit::Second, 7)), 90);
    assert_eq!(fill_secs(w(Unit::Second, 90)), 90);
    assert_eq!(capacity(10, w(Unit::Second, 90)), 10);
    assert_eq!(fill_secs(w(Unit::Minute, 5)), 300);
}

#[test]
fn demand_is_scaled_to_the_fill_and_capped() {
    let t = terms(6_000);
    let r = |requests, elapsed_secs| Report {
        requests,
        elapsed_secs,
    };
    assert_eq!(measured(r(50, 5), t), 600);
    assert_eq!(measured(r(1, 5), t), 12);
    assert_eq!(measured(r(1, 7), t), 9, "rounded up");
    assert_eq!(measured(r(1, 0), t), 60, "at least one second");
    assert_eq!(measured(r(u64::MAX, 1), t), 6_000);
    assert_eq!(next_demand(None, 10), 10);
    assert_eq!(next_demand(Some(10), 30), 20, "the mean");
    assert_eq!(next_demand(Some(30), 10), 20);
    assert_eq!(next_demand(Some(10), 11), 11, "rounded up");
    assert_eq!(next_demand(Some(1), 0), 1, "an idle stream keeps one token");
}

#[test]
fn water_filling_is_max_min_fair() {
    assert_eq!(fair_target(&[10, 1000, 1000], 0, 100), 10);
    assert_eq!(fair_target(&[10, 1000, 1000], 1, 100), 45);
    assert_eq!(
        fair_target(&[10, 20], 0, 100),
        10 + 35,
        "spare split equally"
    );
    assert_eq!(fair_target(&[0], 0, 100), 100);
    assert_eq!(fair_target(&[], 0, 100), 0);
}

#[test]
fn a_lone_holder_gets_the_whole_limit() {
    let mut ledger = Ledger::default();
    let g = ledger.report("a", busy(), terms(6_000), 0);
    assert_eq!(g.tokens, 6_000);
    assert_eq!(g.holders, 1);
}

#[test]
fn a_newcomer_gets_room_as_the_others_give_it_back() {
    let t = terms(6_000);
    let mut ledger = Ledger::default();
    assert_eq!(ledger.report("a", busy(), t, 0).tokens, 6_000);
    // Nothing is free until a reports again.
    assert_eq!(ledger.report("b", busy(), t, SEC).tokens, 0);
    assert_eq!(ledger.report("a", busy(), t, 5 * SEC).tokens, 3_000);
    assert_eq!(ledger.report("b", busy(), t, 6 * SEC).tokens, 3_000);
    assert_eq!(ledger.in_force(6 * SEC), 6_000);
}

#[test]
fn a_silent_holder_loses_its_share_when_it_expires() {
    let t = terms(6_000);
    let mut ledger = Ledger::default();
    ledger.report("a", busy(), t, 0);
    ledger.report("b", busy(), t, 0);
    ledger.report("a", busy(), t, 5 * SEC);
    ledger.report("b", busy(), t, 5 * SEC);
    // b goes quiet; a keeps reporting.
    let mut now = 5 * SEC;
    let mut last = 0;
    while now < 5 * SEC + t.hold_micros + 5 * SEC {
        now += 5 * SEC;
        last = ledger.report("a", busy(), t, now).tokens;
    }
    assert_eq!(last, 6_000);
    assert_eq!(ledger.len(), 1);
}

#[derive(Debug, Clone)]
struct Step {
    holder: usize,
    requests: u64,
    elapsed_secs: u64,
    advance_micros: u64,
}

fn step() -> impl Strategy<Value = Step> {
    (
        0usize..6,
        prop_oneof![Just(0u64), 0u64..100, 0u64..1_000_000, Just(u64::MAX)],
        0u64..70,
        0u64..20 * SEC,
    )
        .prop_map(|(holder, requests, elapsed_secs, advance_micros)| Step {
            holder,
            requests,
            elapsed_secs,
            advance_micros,
        })
}

proptest! {
    /// Whatever the holders report and whenever, the shares in force never
    /// add up to more than the capacity, and every grant is within it.
    #[test]
    fn shares_in_force_never_exceed_the_limit(
        capacity in 0u64..100_000,
        hold in 1u64..30 * SEC,
        steps in proptest::collection::vec(step(), 1..200),
    ) {
        let t = Terms { capacity, fill_secs: 60, hold_micros: hold };
        let mut ledger = Ledger::default();
        let mut now = 0;
        for s in steps {
            now += s.advance_micros;
            let report = Report { requests: s.requests, elapsed_secs: s.elapsed_secs };
            let g = ledger.report(&format!("h{}", s.holder), report, t, now);
            prop_assert!(g.tokens <= capacity);
            prop_assert!(g.granted_total <= capacity);
            prop_assert_eq!(ledger.in_force(now), g.granted_total);
            prop_assert!(ledger.in_force(now) <= capacity);
        }
    }

    /// Holders that all stay busy and report in turns end with the whole
    /// capacity shared within one token each of equal parts.
    #[test]
    fn busy_holders_converge_to_equal_shares(n in 1usize..8, capacity in 100u64..100_000) {
        let t = terms(capacity);
        let mut ledger = Ledger::default();
        let mut grants = vec![0; n];
        for round in 0..3u64 {
            for (h, grant) in grants.iter_mut().enumerate() {
                let now = round * 5 * SEC + h as u64;
                *grant = ledger.report(&format!("h{h}"), busy(), t, now).tokens;
            }
        }
        let total: u64 = grants.iter().sum();
        prop_assert!(total <= capacity);
        prop_assert!(total + n as u64 >= capacity);
        for g in grants {
            prop_assert!(g + 1 >= capacity / n as u64);
        }
    }
}
