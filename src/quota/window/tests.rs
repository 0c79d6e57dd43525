use proptest::prelude::*;

use super::*;

const SEC: u64 = 1_000_000;

#[test]
fn a_span_is_cut_at_window_boundaries() {
    let parts: Vec<_> = spread(2_500_000, 5_000_000, SEC).collect();
    assert_eq!(
        parts,
        vec![(2, 500_000), (3, SEC), (4, SEC)],
        "the end is excluded"
    );
    assert_eq!(spread(7, 7, SEC).count(), 0);
    assert_eq!(reserved_until(60 * SEC, 60 * SEC), 60 * SEC);
    assert_eq!(reserved_until(60 * SEC + 1, 60 * SEC), 120 * SEC);
    assert!(Fixed::fits(SEC, 16 * SEC));
    assert!(Fixed::fits(SEC, 62 * SEC));
    assert!(!Fixed::fits(SEC, 63 * SEC), "a share over 64 windows");
    assert!(Fixed::fits(60 * SEC, 3_600 * SEC));
}

#[test]
fn a_reservation_is_taken_back_exactly() {
    let mut held = Held::default();
    held.add(60, 0, 90 * SEC, 60 * SEC);
    // 60 tokens a minute for 60 s, then for 30 s.
    assert_eq!(held.hits(0, 60 * SEC), 60);
    assert_eq!(held.hits(1, 60 * SEC), 30);
    held.take_back(60, 30 * SEC, 90 * SEC, 60 * SEC);
    assert_eq!(held.hits(0, 60 * SEC), 30);
    assert_eq!(held.hits(1, 60 * SEC), 0);
    assert_eq!(held.last(), Some(0));
    held.forget_before(1);
    assert!(held.is_empty());
}

fn terms(limit: u64, w: u64) -> Terms {
    let window = crate::limit::Window::new(crate::limit::Unit::Second, (w / SEC) as u32).unwrap();
    Terms {
        capacity: super::super::capacity(limit, window),
        fill_secs: super::super::fill_secs(window),
        hold_micros: 16 * SEC,
    }
}

fn busy(requests: u64) -> Report {
    Report {
        requests,
        elapsed_secs: 5,
    }
}

#[test]
fn requests_counted_first_keep_their_hits_and_a_stream_gets_its_part_of_the_rest() {
    // 100 a minute; 70 counted one at a time in the window's first 30 s.
    let limit = Fixed {
        limit: 100,
        window_micros: 60 * SEC,
    };
    let t = terms(100, 60 * SEC);
    let mut ledger = Ledger::default();
    let mut held = Held::default();
    let now = 30 * SEC;
    let g = report(
        &mut ledger,
        &mut held,
        |i| if i == 0 { 70 } else { 0 },
        "a",
        busy(1_000),
        t,
        limit,
        now,
    );
    // The stream may spend at most 30 in the 30 s left: 60 a minute.
    // Both ask for more than the limit: they split it evenly, within the
    // 60 a minute the window leaves.
    assert_eq!(g.tokens, 50);
    assert_eq!(held.hits(0, 60 * SEC), 25);
    assert_eq!(held.hits(1, 60 * SEC), 0, "it expires in this window");
    assert!(70 + held.hits(0, 60 * SEC) <= 100);
}

#[test]
fn a_share_keeps_its_part_of_the_window_from_later_requests() {
    let limit = Fixed {
        limit: 100,
        window_micros: 60 * SEC,
    };
    let t = terms(100, 60 * SEC);
    let mut ledger = Ledger::default();
    let mut held = Held::default();
    // At the window's start nothing is counted: the stream, alone and
    // busy, gets its fair part beside requests decided one at a time,
    // which have asked nothing yet (so all but their equal part of the
    // spare), for the whole window.
    let g = report(&mut ledger, &mut held, |_| 0, "a", busy(1_000), t, limit, 0);
    assert_eq!(g.tokens, 100);
    assert_eq!(held.hits(0, 60 * SEC), 100);
    // Its next report, 5 s later, with 80 counted meanwhile (refused ones
    // too): what it had from 5.25 s on is taken back, and it is granted
    // what the window has left.
    let g = report(
        &mut ledger,
        &mut held,
        |i| if i == 0 { 80 } else { 0 },
        "a",
        busy(1_000),
        t,
        limit,
        5 * SEC,
    );
    assert!(80 + held.hits(0, 60 * SEC) <= 100 + 1, "{held:?}");
    assert!(g.tokens <= 100);
}

/// An Envoy as the quota filter behaves: a token bucket refilled
/// continuously, rebuilt keeping its remaining/max ratio when its share
/// changes, full when first assigned; no share, or an expired one,
/// admits nothing (the filter's fallbacks are outside the server's
/// reach, so the model leaves them out).
#[derive(Debug, Default)]
struct Envoy {
    max: f64,
    tokens: f64,
    per_micro: f64,
    expires: u64,
    assigned: bool,
    /// Requests offered per second.
    offered: f64,
    due: f64,
    allowed: u64,
    denied: u64,
    /// Tokens it was given beyond its rate in the current window: what
    /// its bucket held at the window's start, the first fill, and what
    /// ratio-keeping rebuilds added.
    free: f64,
    admitted: u64,
    next_report: u64,
    crashed_at: Option<u64>,
}

impl Envoy {
    fn assign(&mut self, tokens: u64, t: Terms, w: u64, now: u64) {
        let max = ((tokens as f64) * (w as f64) / (t.fill_secs as f64 * 1e6))
            .ceil()
            .max(1.0);
        let before = self.tokens;
        if !self.assigned {
            self.tokens = max;
        } else if (max - self.max).abs() > f64::EPSILON {
            self.tokens = self.tokens / self.max * max;
        }
        self.free += (self.tokens - before).max(0.0);
        self.max = max;
        self.per_micro = tokens as f64 / (t.fill_secs as f64 * 1e6);
        self.expires = now + t.hold_micros - SEC;
        self.assigned = true;
    }
}

struct Run {
    /// Hits admitted in each window (both sides), and the slack the
    /// Envoys' bursts allow in it.
    windows: Vec<(u64, f64)>,
    offered_per_window: f64,
}

/// `envoys` offering `offered` requests a second each (a crash stops one
/// from reporting at its time), and requests decided one at a time at
/// `counted_rate` a second, on `limit` per window `w`, for `secs`.
fn simulate(
    limit: u64,
    w: u64,
    envoys: &[(f64, Option<u64>)],
    counted_rate: f64,
    secs: u64,
    tick: u64,
) -> Run {
    let t = terms(limit, w);
    let counted = Fixed {
        limit,
        window_micros: w,
    };
    let mut ledger = Ledger::default();
    let mut held = Held::default();
    let mut window = 0u64;
    let mut count = 0u64;
    let mut envoys: Vec<Envoy> = envoys
        .iter()
        .enumerate()
        .map(|(i, (offered, crash))| Envoy {
            offered: *offered,
            next_report: i as u64 * 700_000,
            crashed_at: *crash,
            ..Envoy::default()
        })
        .collect();
    let mut due = 0.0;
    let mut admitted = 0u64;
    let mut windows = Vec::new();
    let mut now = 0;
    while now < secs * SEC {
        let idx = now / w;
        if idx != window {
            let free: f64 = envoys.iter().map(|e| e.free).sum();
            let envoyed: u64 = envoys.iter().map(|e| e.admitted).sum();
            windows.push((admitted + envoyed, free));
            for e in &mut envoys {
                e.admitted = 0;
                e.free = e.tokens;
            }
            admitted = 0;
            window = idx;
            count = 0;
        }
        for (i, e) in envoys.iter_mut().enumerate() {
            let alive = e.crashed_at.is_none_or(|c| now < c);
            if alive && now >= e.next_report {
                let usage = Report {
                    requests: e.allowed + e.denied,
                    elapsed_secs: 5,
                };
                e.allowed = 0;
                e.denied = 0;
                let c = |x: u64| if x == window { count } else { 0 };
                let g = report(
                    &mut ledger,
                    &mut held,
                    c,
                    &format!("e{i}"),
                    usage,
                    t,
                    counted,
                    now,
                );
                e.assign(g.tokens, t, w, now);
                e.next_report = now + 5 * SEC;
            }
            e.tokens = (e.tokens + e.per_micro * tick as f64).min(e.max);
            e.due += e.offered * tick as f64 / 1e6;
            while e.due >= 1.0 {
                e.due -= 1.0;
                if e.assigned && now < e.expires && e.tokens >= 1.0 {
                    e.tokens -= 1.0;
                    e.allowed += 1;
                    e.admitted += 1;
                } else {
                    e.denied += 1;
                }
            }
        }
        due += counted_rate * tick as f64 / 1e6;
        let fill = t.fill_secs * SEC;
        while due >= 1.0 {
            due -= 1.0;
            // Refused requests are not counted (`count_refused: false`,
            // the default).
            if count + 1 + held.hits(window, fill) <= limit {
                count += 1;
                admitted += 1;
            }
        }
        now += tick;
    }
    let offered: f64 = envoys.iter().map(|e| e.offered).sum::<f64>() + counted_rate;
    Run {
        windows,
        offered_per_window: offered * w as f64 / 1e6,
    }
}

#[test]
fn both_sides_busy_share_a_minute_limit_and_never_pass_it() {
    // Two Envoys and requests one at a time, each offering twice the limit.
    let run = simulate(
        600,
        60 * SEC,
        &[(20.0, None), (20.0, None)],
        20.0,
        300,
        10_000,
    );
    let limit = 600.0;
    for (i, &(admitted, free)) in run.windows.iter().enumerate() {
        assert!(
            admitted as f64 <= limit + free + 2.0,
            "window {i}: {admitted} admitted, {free} of bursts"
        );
    }
    // Once settled (after the first window), nearly the whole limit.
    let settled = &run.windows[1..];
    let least = settled.iter().map(|w| w.0).min().unwrap();
    eprintln!("{:?}", run.windows);
    assert!(least as f64 >= 0.9 * limit, "{:?}", run.windows);
    assert!(run.offered_per_window > limit);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the Envoys and the requests decided one at a time offer,
    /// with Envoys crashing, no window admits more than the limit plus
    /// the tokens the Envoys' buckets gave beyond their rates.
    #[test]
    fn no_window_passes_the_limit_plus_the_bursts(
        limit in 1u64..400,
        w in prop_oneof![Just(SEC), Just(2 * SEC), Just(10 * SEC), Just(60 * SEC)],
        envoys in proptest::collection::vec((0.0f64..300.0, proptest::option::of(0u64..60 * SEC)), 1..5),
        counted_rate in prop_oneof![Just(0.0f64), 0.0f64..300.0],
    ) {
        let run = simulate(limit, w, &envoys, counted_rate, 90, 20_000);
        for (i, &(admitted, free)) in run.windows.iter().enumerate() {
            prop_assert!(
                admitted as f64 <= limit as f64 + free + envoys.len() as f64,
                "window {}: {} admitted, limit {}, {} of bursts", i, admitted, limit, free
            );
        }
    }
}

#[test]
fn both_sides_busy_share_a_per_second_limit_and_never_pass_it() {
    let run = simulate(100, SEC, &[(100.0, None), (100.0, None)], 100.0, 60, 5_000);
    for (i, &(admitted, free)) in run.windows.iter().enumerate() {
        assert!(
            admitted as f64 <= 100.0 + free + 2.0,
            "window {i}: {admitted} admitted, {free} of bursts"
        );
    }
    let settled = &run.windows[10..];
    let mean = settled.iter().map(|w| w.0).sum::<u64>() as f64 / settled.len() as f64;
    eprintln!("{:?}", run.windows);
    assert!(mean >= 90.0, "{mean}");
}
