//! `tollgate simulate`: how far a `sliding_window_counter` with N buckets
//! admits over its limit, measured on a virtual clock; with `--algorithms`,
//! the four algorithms side by side ([`compare`]).
//!
//! The counter is the embedded store's own (the same arithmetic as the Redis
//! script), driven through [`MemoryStore`] on a [`ManualClock`], so the table
//! describes the code that runs, not a model of it. For every admitted hit
//! the simulation keeps its time and reports the largest number admitted in
//! any true trailing window: the figure a client sees when it counts for
//! itself.
//!
//! Loads: Poisson arrivals at 1x and 2x the limit (a fixed seed, so a run is
//! repeatable); a boundary burst, where on top of Poisson traffic at 1x a
//! client sends as much as is admitted in the last microsecond of every
//! other window (more buckets shorten the time in which the burst's bucket
//! is weighed down while still inside the trailing window); and bursts timed
//! to the buckets, as much as is admitted in the last microseconds of every
//! bucket. The last is the counter's worst case whatever its bucket count:
//! every hit of the oldest bucket sits at its end, still inside the trailing
//! window, while the counter weighs that bucket as if its hits were spread
//! over it, so close to twice the limit gets through.

pub mod compare;
pub mod rlqs;
mod timeline;

use std::fmt::Write;
use std::sync::Arc;

use tollgate::clock::ManualClock;
use tollgate::limit::{Algorithm, MAX_BUCKETS, Unit};
use tollgate::storage::{Hit, MemoryStore, Shard, Store};

use timeline::{max_in_trailing_window, poisson_arrivals};

/// The bucket counts the table shows.
pub const BUCKETS: [u8; 5] = [2, 4, 10, 30, 60];

/// A whole number of seconds since the epoch, so bucket boundaries fall where
/// they would on a real clock.
const T0: u64 = 1_800_000_000 * 1_000_000;

#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// Requests per window (the window is one second).
    #[arg(long, default_value_t = 100)]
    pub limit: u64,
    /// Windows of traffic per load.
    #[arg(long, default_value_t = 300)]
    pub windows: u64,
    /// Seed of the Poisson arrivals.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Compare the four algorithms on steady and bursty traffic instead
    /// (`--windows` is then the seconds of each load).
    #[arg(long)]
    pub algorithms: bool,
}

impl Default for SimulateArgs {
    fn default() -> Self {
        Self {
            limit: 100,
            windows: 300,
            seed: 1,
            algorithms: false,
        }
    }
}

/// What a load sends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Poisson arrivals at this multiple of the limit.
    Poisson(f64),
    /// Poisson arrivals at 1x the limit, and a burst of as much as is
    /// admitted in the last microsecond of every other window.
    BoundaryBurst,
    /// As much as is admitted in the last microseconds of every bucket: the
    /// counter's worst case, whatever its bucket count.
    TimedBursts,
}

/// One line of the table: the largest count admitted in any trailing window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub buckets: u8,
    pub poisson_1x: u64,
    pub poisson_2x: u64,
    pub burst: u64,
    pub timed: u64,
}

/// Runs one load against a fresh counter with `buckets` buckets and returns
/// the largest count admitted in any trailing window.
pub async fn run_load(buckets: u8, load: Load, args: &SimulateArgs) -> u64 {
    let clock = ManualClock::at_micros(T0);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    let entries = vec![("sim".to_owned(), buckets.to_string())];
    let w = Unit::Second.micros();
    let hit = Hit {
        domain: "simulate",
        entries: &entries,
        algorithm: Algorithm::SlidingWindowCounter,
        limit: args.limit.max(1),
        window: Unit::Second.into(),
        hits: 1,
        negative: false,
        usage_reports: false,
        buckets,
        burst: 0,
        shard: Shard::NONE,
        receipt: false,
        also: &[],
        lease: false,
        ahead: tollgate::storage::Ahead::NONE,
    };
    let mut admitted = Vec::new();
    match load {
        Load::Poisson(multiple) => {
            let rate = multiple * args.limit.max(1) as f64;
            for t in poisson_arrivals(args.seed, rate, args.windows * w) {
                clock.set_micros(T0 + t);
                if decide(&store, hit).await {
                    admitted.push(t);
                }
            }
        }
        Load::BoundaryBurst => {
            let arrivals = poisson_arrivals(args.seed, args.limit.max(1) as f64, args.windows * w);
            let mut next = arrivals.iter().peekable();
            for k in (2..=args.windows).step_by(2) {
                // The last microsecond of every other window.
                let burst = k * w - 1;
                while let Some(&t) = next.next_if(|&&t| t < burst) {
                    clock.set_micros(T0 + t);
                    if decide(&store, hit).await {
                        admitted.push(t);
                    }
                }
                clock.set_micros(T0 + burst);
                for _ in 0..=args.limit {
                    if !decide(&store, hit).await {
                        break;
                    }
                    admitted.push(burst);
                }
            }
        }
        Load::TimedBursts => {
            let spans = u64::from(buckets.clamp(2, MAX_BUCKETS)) - 1;
            let drift = 2 * (spans + 1);
            for k in 1..=args.windows * spans {
                // Just before bucket k - 1 ends, a microsecond earlier than
                // the bucket before (cycling over a few microseconds), so
                // bursts one window apart fall in one trailing window.
                let t = (k * w).div_ceil(spans) - 1 - k % drift;
                clock.set_micros(T0 + t);
                for _ in 0..=args.limit {
                    if !decide(&store, hit).await {
                        break;
                    }
                    admitted.push(t);
                }
            }
        }
    }
    max_in_trailing_window(&admitted, w)
}

async fn decide(store: &MemoryStore, hit: Hit<'_>) -> bool {
    match store.hit(hit).await {
        Ok(d) => d.admitted,
        // The embedded store always answers; a failure would only make the
        // figures lower, never hide an overshoot.
        Err(_) => false,
    }
}

/// Every load for every bucket count in [`BUCKETS`].
pub async fn table(args: &SimulateArgs) -> Vec<Row> {
    let mut rows = Vec::new();
    for buckets in BUCKETS {
        rows.push(Row {
            buckets,
            poisson_1x: run_load(buckets, Load::Poisson(1.0), args).await,
            poisson_2x: run_load(buckets, Load::Poisson(2.0), args).await,
            burst: run_load(buckets, Load::BoundaryBurst, args).await,
            timed: run_load(buckets, Load::TimedBursts, args).await,
        });
    }
    rows
}

/// The table as Markdown, each figure as a count and a multiple of the limit.
pub fn render(rows: &[Row], args: &SimulateArgs) -> String {
    let limit = args.limit.max(1);
    let cell = |n: u64| format!("{n} ({:.2}x)", n as f64 / limit as f64);
    let mut out = format!(
        "Largest count admitted in any 1 s trailing window, limit {limit}/s, \
         {} windows per load, seed {}:\n\n",
        args.windows, args.seed
    );
    out.push_str(
        "| buckets | Poisson at 1x | Poisson at 2x | boundary burst over 1x | bursts timed to buckets |\n",
    );
    out.push_str("|--------:|--------------:|--------------:|--------------:|--------------:|\n");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            r.buckets,
            cell(r.poisson_1x),
            cell(r.poisson_2x),
            cell(r.burst),
            cell(r.timed)
        );
    }
    out
}

/// Entry point of `tollgate simulate`.
pub fn main(args: SimulateArgs) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if args.algorithms {
        let rows = runtime.block_on(compare::table(&args));
        print!("{}", compare::render(&rows, &args));
        return std::process::ExitCode::SUCCESS;
    }
    let rows = runtime.block_on(table(&args));
    print!("{}", render(&rows, &args));
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_window_counts_half_open_intervals() {
        assert_eq!(max_in_trailing_window(&[], 10), 0);
        // 0 and 10 are not in one window of 10 (it is (end - 10, end]).
        assert_eq!(max_in_trailing_window(&[0, 10, 20], 10), 1);
        assert_eq!(max_in_trailing_window(&[0, 9, 10, 11, 30], 10), 3);
    }

    #[test]
    fn poisson_arrivals_are_repeatable_and_near_the_rate() {
        let a = poisson_arrivals(7, 100.0, 100_000_000);
        assert_eq!(a, poisson_arrivals(7, 100.0, 100_000_000));
        assert_ne!(a, poisson_arrivals(8, 100.0, 100_000_000));
        // 10,000 expected; a standard deviation is 100.
        assert!((9_500..=10_500).contains(&a.len()), "{}", a.len());
        assert!(a.windows(2).all(|p| p[0] <= p[1]));
    }
}
