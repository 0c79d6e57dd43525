//! `tollgate simulate --algorithms`: the four algorithms on the same
//! traffic, on a virtual clock, through the embedded store (the same
//! arithmetic as the Redis scripts).
//!
//! Two loads at `limit` per second, every call of cost 1:
//! * steady: Poisson arrivals at 0.9x the limit, under the rate;
//! * bursty: Poisson arrivals at 0.5x the limit, and every 5 s a burst of
//!   2x the limit sent in the same millisecond after 4 quiet-ish seconds.
//!
//! For each: the share of calls admitted, the largest count admitted in
//! any 1 s trailing window, and, on the bursty load, how much of each burst
//! got through on average. The token bucket is shown with the default
//! burst (the limit) and with a burst of 2x the limit.

use std::fmt::Write;
use std::sync::Arc;

use tollgate::clock::ManualClock;
use tollgate::limit::algorithms::{Bound, Param};
use tollgate::limit::{Algorithm, Unit};
use tollgate::storage::{Hit, MemoryStore, Shard, Store};

use super::SimulateArgs;
use super::timeline::{max_in_trailing_window, poisson_arrivals};

const T0: u64 = 1_800_000_000 * 1_000_000;
const SECOND: u64 = 1_000_000;
const BURST_EVERY: u64 = 5 * SECOND;

/// One algorithm (with a burst for the bucket: 0 is the limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contender {
    pub algorithm: Algorithm,
    pub burst: u64,
}

/// What one contender did with one load.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub offered: u64,
    pub admitted: u64,
    /// Largest count admitted in any 1 s trailing window.
    pub max_window: u64,
    /// Calls of the bursts admitted, on average per burst (bursty only).
    pub per_burst: f64,
}

/// The contenders in table order, for a limit of `limit`.
pub fn contenders(limit: u64) -> Vec<Contender> {
    // The rates: arrivals alone do not say how long a request is in
    // flight.
    let mut out: Vec<Contender> = Algorithm::ALL
        .into_iter()
        .filter(|a| a.spec().bound != Bound::InFlight)
        .map(|algorithm| Contender {
            algorithm,
            burst: 0,
        })
        .collect();
    // An algorithm with a burst of its own also runs with twice the limit.
    out.extend(
        Algorithm::ALL
            .into_iter()
            .filter(|a| a.spec().param == Param::Burst)
            .map(|algorithm| Contender {
                algorithm,
                burst: 2 * limit,
            }),
    );
    out
}

/// Arrival times of a load, and the times of its bursts' calls.
fn arrivals(bursty: bool, args: &SimulateArgs) -> (Vec<u64>, u64) {
    let limit = args.limit.max(1);
    let span = args.windows * SECOND;
    if !bursty {
        return (poisson_arrivals(args.seed, 0.9 * limit as f64, span), 0);
    }
    let mut times = poisson_arrivals(args.seed, 0.5 * limit as f64, span);
    let mut bursts = 0;
    let mut at = BURST_EVERY - SECOND / 2;
    while at < span {
        times.extend(std::iter::repeat_n(at, 2 * limit as usize));
        bursts += 1;
        at += BURST_EVERY;
    }
    times.sort_unstable();
    (times, bursts)
}

/// Runs one load against a fresh limiter of `who`.
pub async fn run(who: Contender, bursty: bool, args: &SimulateArgs) -> Outcome {
    let clock = ManualClock::at_micros(T0);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    let entries = vec![("sim".to_owned(), "compare".to_owned())];
    let limit = args.limit.max(1);
    let hit = Hit {
        domain: "simulate",
        entries: &entries,
        algorithm: who.algorithm,
        limit,
        window: Unit::Second.into(),
        hits: 1,
        negative: false,
        usage_reports: false,
        buckets: tollgate::limit::DEFAULT_BUCKETS,
        burst: who.burst,
        shard: Shard::NONE,
        receipt: false,
        also: &[],
        lease: false,
        ahead: tollgate::storage::Ahead::NONE,
    };
    let (times, bursts) = arrivals(bursty, args);
    let burst_times: std::collections::HashSet<u64> = if bursty {
        (0..bursts)
            .map(|k| BURST_EVERY - SECOND / 2 + k * BURST_EVERY)
            .collect()
    } else {
        Default::default()
    };
    let mut admitted = Vec::new();
    let mut in_bursts = 0u64;
    for &t in &times {
        clock.set_micros(T0 + t);
        let ok = matches!(store.hit(hit).await, Ok(d) if d.admitted);
        if ok {
            admitted.push(t);
            in_bursts += u64::from(burst_times.contains(&t));
        }
    }
    Outcome {
        offered: times.len() as u64,
        admitted: admitted.len() as u64,
        max_window: max_in_trailing_window(&admitted, SECOND),
        per_burst: if bursts == 0 {
            0.0
        } else {
            in_bursts as f64 / bursts as f64
        },
    }
}

/// Every contender on both loads: (contender, steady, bursty).
pub async fn table(args: &SimulateArgs) -> Vec<(Contender, Outcome, Outcome)> {
    let mut rows = Vec::new();
    for who in contenders(args.limit.max(1)) {
        rows.push((who, run(who, false, args).await, run(who, true, args).await));
    }
    rows
}

/// The comparison as Markdown.
pub fn render(rows: &[(Contender, Outcome, Outcome)], args: &SimulateArgs) -> String {
    let limit = args.limit.max(1);
    let mut out = format!(
        "The four algorithms on the same traffic, limit {limit}/s, {} s per load, seed {}. \
         Steady: Poisson at 0.9x. Bursty: Poisson at 0.5x plus {} calls at once every 5 s.\n\n",
        args.windows,
        args.seed,
        2 * limit
    );
    out.push_str(
        "| algorithm | steady: admitted | steady: max in 1 s | bursty: admitted | bursty: max in 1 s | bursty: per burst |\n",
    );
    out.push_str("|:--|--:|--:|--:|--:|--:|\n");
    let share = |o: &Outcome| 100.0 * o.admitted as f64 / o.offered.max(1) as f64;
    for (who, steady, bursty) in rows {
        let name = match (who.algorithm.spec().param, who.burst) {
            (Param::Burst, 0) => format!("{} (burst {limit})", who.algorithm),
            (Param::Burst, b) => format!("{} (burst {b})", who.algorithm),
            (Param::Buckets | Param::MaxDuration, _) => who.algorithm.to_string(),
        };
        let _ = writeln!(
            out,
            "| {name} | {:.1}% | {} | {:.1}% | {} | {:.0} of {} |",
            share(steady),
            steady.max_window,
            share(bursty),
            bursty.max_window,
            bursty.per_burst,
            2 * limit
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bucket's bound holds in the table's own figures, the burst gets
    /// through as configured, and the log never passes its limit.
    #[tokio::test]
    async fn the_bucket_takes_its_burst_and_no_more() {
        let args = SimulateArgs {
            limit: 100,
            windows: 60,
            seed: 5,
            algorithms: true,
        };
        let rows = table(&args).await;
        let find = |a: Algorithm, burst: u64| {
            rows.iter()
                .find(|(w, _, _)| w.algorithm == a && w.burst == burst)
                .map(|r| (r.1, r.2))
                .unwrap()
        };
        let (_, log) = find(Algorithm::SlidingWindowLog, 0);
        assert!(log.max_window <= 100, "{log:?}");
        let (steady, bursty) = find(Algorithm::TokenBucket, 200);
        // Quiet enough before each burst for the bucket to be nearly full.
        assert!(bursty.per_burst >= 150.0, "{bursty:?}");
        // burst + rate x 1 s.
        assert!(bursty.max_window <= 300, "{bursty:?}");
        assert!(steady.max_window <= 300, "{steady:?}");
        assert!(
            steady.admitted as f64 >= 0.99 * steady.offered as f64,
            "{steady:?}"
        );
        let (_, default) = find(Algorithm::TokenBucket, 0);
        assert!(default.max_window <= 200, "{default:?}");
        assert!(default.per_burst < bursty.per_burst, "{default:?}");
    }
}
