//! `tollgate simulate-rlqs`: N Envoys sharing one limit through the quota
//! service, on a virtual clock.
//!
//! The server side is the code that runs: the embedded store's lease ledger
//! (`Store::lease` on a [`MemoryStore`] over a [`ManualClock`]) and the
//! grant-to-token-bucket mapping of [`tollgate::rlqs::bucket`]. The Envoys
//! are modelled as Envoy's `rate_limit_quota` filter behaves: the first
//! request is allowed and reported at once (no assignment yet), then a
//! report every 5 s with the requests allowed and denied since the last one
//! (`time_elapsed` in whole seconds); an assignment arrives one round trip
//! later and is enforced by a token bucket refilled continuously at
//! `tokens_per_fill / fill_interval`, a changed bucket starting with the old
//! one's remaining/max ratio; `DENY_ALL` denies everything.
//!
//! For each load the table gives what was offered and admitted per second
//! after convergence (the first 20 s left out, and for a shifting load the
//! 20 s after the shift, shown on their own), admitted as a share of
//! min(offered, limit), and the most admitted in any trailing window over
//! the whole run, against the bound (1 + burst) × limit.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write;
use std::sync::Arc;

use tollgate::clock::ManualClock;
use tollgate::limit::{Unit, Window};
use tollgate::quota::{self, Report, Terms};
use tollgate::rlqs::bucket::{self, Assignment};
use tollgate::rlqs::filter::Filter;
use tollgate::rlqs::{DEFAULT_REPORT_SECS, HOLD_MARGIN};
use tollgate::storage::{LeaseCall, MemoryStore, Store};

use super::timeline::{max_in_trailing_window, poisson_arrivals};

const SEC: u64 = 1_000_000;
/// Envoy's report interval (hard-coded in the filter).
const REPORT_EVERY: u64 = 5 * SEC;
/// A round trip between Envoy and the server.
const RTT: u64 = 2_000;
/// Left out of the admitted rate, at the start and after a shift: the
/// shares settle within a few reports.
const SETTLE: u64 = 20 * SEC;

#[derive(Debug, Clone, clap::Args)]
pub struct SimulateRlqsArgs {
    /// Requests per second of the shared limit.
    #[arg(long, default_value_t = 100)]
    pub limit: u64,
    /// Seconds of traffic per load.
    #[arg(long, default_value_t = 300)]
    pub seconds: u64,
    /// `rlqs.burst`.
    #[arg(long, default_value_t = 1.0)]
    pub burst: f64,
    /// `rlqs.assignment_ttl_ms`, in seconds.
    #[arg(long, default_value_t = 15)]
    pub ttl: u64,
    /// Seed of the Poisson arrivals.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl Default for SimulateRlqsArgs {
    fn default() -> Self {
        Self {
            limit: 100,
            seconds: 300,
            burst: 1.0,
            ttl: 15,
            seed: 1,
        }
    }
}

/// Who offers what: Poisson arrivals, each Envoy at its rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// `total` × limit spread equally.
    Even(f64),
    /// `total` × limit, 80% of it on the first Envoy.
    Skewed(f64),
    /// `total` × limit, 80% on the first Envoy for the first half, then
    /// 80% on the last.
    Shifting(f64),
}

impl Load {
    fn name(self) -> String {
        match self {
            Load::Even(x) => format!("even {x}x"),
            Load::Skewed(x) => format!("skewed {x}x"),
            Load::Shifting(x) => format!("shifting {x}x"),
        }
    }

    /// Rates per Envoy (requests per second) in each half of the run.
    fn rates(self, n: usize, limit: f64) -> [Vec<f64>; 2] {
        let skew = |total: f64, heavy: usize| -> Vec<f64> {
            if n == 1 {
                return vec![total];
            }
            (0..n)
                .map(|i| {
                    if i == heavy {
                        0.8 * total
                    } else {
                        0.2 * total / (n - 1) as f64
                    }
                })
                .collect()
        };
        match self {
            Load::Even(x) => {
                let v = vec![x * limit / n as f64; n];
                [v.clone(), v]
            }
            Load::Skewed(x) => {
                let v = skew(x * limit, 0);
                [v.clone(), v]
            }
            Load::Shifting(x) => [skew(x * limit, 0), skew(x * limit, n - 1)],
        }
    }
}

/// One line of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub load: Load,
    pub envoys: usize,
    /// Per second, after the warm-up.
    pub offered: f64,
    pub admitted: f64,
    /// Admitted after the warm-up over min(offered, limit).
    pub efficiency: f64,
    /// The same over the 20 s after the shift, for a shifting load.
    pub after_shift: Option<f64>,
    /// The most admitted in any trailing one-second window, whole run.
    pub worst_window: u64,
    /// The same after the first 20 s.
    pub worst_converged: u64,
}

/// One Envoy: its arrivals, and its quota filter's bucket.
struct Envoy {
    arrivals: Vec<u64>,
    next: usize,
    filter: Filter,
    subscribed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Envoy `i` sends a report (first: the subscribing one).
    Report(usize),
    /// Envoy `i` receives an assignment (an index into `pending`).
    Answer(usize, usize),
}

/// Runs one load with `n` Envoys: each arrival admitted or denied by its
/// Envoy's filter, each report leased on the store, until the last
/// arrival and event; then the row of what was offered and admitted.
pub async fn run(load: Load, n: usize, args: &SimulateRlqsArgs) -> Row {
    let mut sim = Sim::new(load, n, args);
    while let Some(next) = sim.next() {
        match next {
            Next::Arrival(t, i) => sim.arrive(t, i),
            Next::Event(t, Event::Report(i)) => sim.report(t, i).await,
            Next::Event(t, Event::Answer(i, k)) => {
                sim.envoys[i].filter.assign(t, sim.pending[k], args.ttl);
            }
        }
    }
    sim.row(load, n)
}

/// What happens next on the virtual clock.
enum Next {
    /// A request arrives at Envoy `i` at `t`.
    Arrival(u64, usize),
    /// An event is due at `t`.
    Event(u64, Event),
}

/// One run: the Envoys, the server's store over the virtual clock, the
/// events due, and what was offered and admitted.
struct Sim<'a> {
    args: &'a SimulateRlqsArgs,
    envoys: Vec<Envoy>,
    duration: u64,
    half: u64,
    /// The virtual clock's start, in microseconds.
    t0: u64,
    clock: ManualClock,
    store: MemoryStore,
    window: Window,
    terms: Terms,
    counted: Option<quota::Counted>,
    events: BinaryHeap<Reverse<(u64, Event)>>,
    /// The assignments sent, each delivered by an `Event::Answer`.
    pending: Vec<Assignment>,
    /// When each admitted request arrived.
    admitted: Vec<u64>,
    shifts: bool,
    /// Offered and admitted: converged, and in the 20 s after the shift.
    counts: [[u64; 2]; 2],
    last_report: Vec<Option<u64>>,
}

impl<'a> Sim<'a> {
    /// A run of `load` over `n` Envoys, none subscribed yet, the server
    /// leasing a one-second fixed window's limit.
    fn new(load: Load, n: usize, args: &'a SimulateRlqsArgs) -> Self {
        let duration = args.seconds * SEC;
        let half = duration / 2;
        let envoys = envoys(load, n, args, duration);
        let t0 = 1_800_000_000 * SEC;
        let clock = ManualClock::at_micros(t0);
        let store = MemoryStore::new(Arc::new(clock.clone()));
        let window = Window::of(Unit::Second);
        let terms = Terms {
            capacity: quota::capacity(args.limit, window),
            fill_secs: quota::fill_secs(window),
            hold_micros: args.ttl * SEC + HOLD_MARGIN.as_micros() as u64,
        };
        // As the server leases a fixed window's limit: shares and requests
        // decided one at a time keep one count (here only shares spend it).
        let counted = quota::window::Fixed::fits(window.micros(), terms.hold_micros).then_some(
            quota::Counted::Window(quota::window::Fixed {
                limit: args.limit,
                window_micros: window.micros(),
            }),
        );
        Sim {
            args,
            envoys,
            duration,
            half,
            t0,
            clock,
            store,
            window,
            terms,
            counted,
            events: BinaryHeap::new(),
            pending: Vec::new(),
            admitted: Vec::new(),
            shifts: matches!(load, Load::Shifting(_)),
            counts: [[0u64; 2]; 2],
            last_report: vec![None; n],
        }
    }

    /// The next arrival of any Envoy, or the next event, whichever comes
    /// first (the event is taken off the queue); `None` when neither is
    /// left.
    fn next(&mut self) -> Option<Next> {
        let arrival = self
            .envoys
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.arrivals.get(e.next).map(|&t| (t, i)))
            .min();
        let event = self.events.peek().map(|Reverse(e)| *e);
        let take_arrival = match (arrival, event) {
            (None, None) => return None,
            (Some((t, _)), Some((te, _))) => t < te,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        if let (true, Some((t, i))) = (take_arrival, arrival) {
            return Some(Next::Arrival(t, i));
        }
        let Reverse((t, ev)) = self.events.pop()?;
        Some(Next::Event(t, ev))
    }

    /// A request at Envoy `i` at `t`: admitted or denied by its filter and
    /// counted; an Envoy's first request subscribes it (its first report
    /// at once).
    fn arrive(&mut self, t: u64, i: usize) {
        let envoy = &mut self.envoys[i];
        envoy.next += 1;
        let ok = envoy.filter.admit(t);
        if ok {
            self.admitted.push(t);
        }
        let settling = self.shifts && (self.half..self.half + SETTLE).contains(&t);
        if t >= SETTLE {
            let c = &mut self.counts[usize::from(settling)];
            c[0] += 1;
            c[1] += u64::from(ok);
        }
        if !envoy.subscribed {
            envoy.subscribed = true;
            self.events.push(Reverse((t, Event::Report(i))));
        }
    }

    /// Envoy `i` reports at `t`: its usage leased on the store, the
    /// assignment answered a round trip later, the next report due.
    async fn report(&mut self, t: u64, i: usize) {
        let envoy = &mut self.envoys[i];
        let (allowed, denied) = envoy.filter.take_usage();
        let requests = allowed + denied;
        // Whole seconds, as Envoy fills time_elapsed (0 in the first
        // report).
        let elapsed = self.last_report[i].map_or(0, |last| (t - last) / SEC);
        self.last_report[i] = Some(t);
        self.clock.set_micros(self.t0 + t);
        let holder = format!("envoy{i}");
        let entries = vec![("name".to_string(), "shared".to_string())];
        let grant = self
            .store
            .lease(LeaseCall {
                domain: "sim",
                entries: &entries,
                algorithm: tollgate::limit::Algorithm::FixedWindow,
                window: self.window,
                holder: &holder,
                report: Report {
                    requests,
                    elapsed_secs: if elapsed == 0 {
                        DEFAULT_REPORT_SECS
                    } else {
                        elapsed
                    },
                },
                terms: self.terms,
                counted: self.counted,
            })
            .await;
        if let Ok(grant) = grant {
            let assignment = bucket::token_bucket(grant.tokens, self.window, self.args.burst);
            self.pending.push(assignment);
            let answer = Event::Answer(i, self.pending.len() - 1);
            self.events.push(Reverse((t + RTT, answer)));
        }
        if t + REPORT_EVERY < self.duration {
            self.events
                .push(Reverse((t + REPORT_EVERY, Event::Report(i))));
        }
    }

    /// The table's row: rates after convergence (and after the shift),
    /// and the most admitted in any trailing second.
    fn row(mut self, load: Load, n: usize) -> Row {
        let limit = self.args.limit as f64;
        let counts = self.counts;
        self.admitted.sort_unstable();
        let settle = if self.shifts { SETTLE } else { 0 };
        let converged = (self.duration - SETTLE - settle) as f64 / SEC as f64;
        let offered = counts[0][0] as f64 / converged;
        let admitted_rate = counts[0][1] as f64 / converged;
        let after_shift = self.shifts.then(|| {
            let secs = SETTLE as f64 / SEC as f64;
            (counts[1][1] as f64 / secs) / (counts[1][0] as f64 / secs).min(limit)
        });
        let admitted = &self.admitted;
        Row {
            load,
            envoys: n,
            offered,
            admitted: admitted_rate,
            efficiency: admitted_rate / offered.min(limit),
            after_shift,
            worst_window: max_in_trailing_window(admitted, SEC),
            worst_converged: max_in_trailing_window(
                &admitted[admitted.partition_point(|&t| t < SETTLE)..],
                SEC,
            ),
        }
    }
}

/// The Envoys of a run of `duration`: each its Poisson arrivals at its
/// rates in each half, its filter allowing until its first assignment.
fn envoys(load: Load, n: usize, args: &SimulateRlqsArgs, duration: u64) -> Vec<Envoy> {
    let half = duration / 2;
    let [first, second] = load.rates(n, args.limit as f64);
    (0..n)
        .map(|i| {
            let seed = args.seed.wrapping_mul(1_000).wrapping_add(i as u64);
            let mut arrivals = poisson_arrivals(seed, first[i].max(1e-9), half);
            let later = poisson_arrivals(seed ^ 0x5eed, second[i].max(1e-9), duration - half);
            arrivals.extend(later.into_iter().map(|t| t + half));
            Envoy {
                arrivals,
                next: 0,
                // Before its first assignment, the filter's default:
                // allow.
                filter: Filter::new(true),
                subscribed: false,
            }
        })
        .collect()
}

/// The loads and Envoy counts the table shows.
pub fn cases() -> Vec<(Load, usize)> {
    let mut out = Vec::new();
    for load in [
        Load::Even(0.5),
        Load::Even(2.0),
        Load::Skewed(2.0),
        Load::Shifting(2.0),
    ] {
        for n in [2, 5, 10] {
            out.push((load, n));
        }
    }
    out
}

pub async fn table(args: &SimulateRlqsArgs) -> Vec<Row> {
    let mut rows = Vec::new();
    for (load, n) in cases() {
        rows.push(run(load, n, args).await);
    }
    rows
}

pub fn render(rows: &[Row], args: &SimulateRlqsArgs) -> String {
    let mut out = String::new();
    let bound = ((1.0 + args.burst) * args.limit as f64).floor();
    let _ = writeln!(
        out,
        "limit {}/s shared by quota, burst {}, ttl {} s, {} s per load, reports every 5 s",
        args.limit, args.burst, args.ttl, args.seconds
    );
    let _ = writeln!(
        out,
        "| load | Envoys | offered/s | admitted/s | admitted / min(offered, limit) | the same, 20 s after the shift | most in any 1 s window (bound {bound}) | the same after 20 s |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {:.1}% | {} | {} | {} |",
            r.load.name(),
            r.envoys,
            r.offered,
            r.admitted,
            100.0 * r.efficiency,
            r.after_shift
                .map_or("".to_string(), |e| format!("{:.1}%", 100.0 * e)),
            r.worst_window,
            r.worst_converged
        );
    }
    out
}

/// Entry point of `tollgate simulate-rlqs`.
pub fn main(args: SimulateRlqsArgs) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot start a runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let rows = runtime.block_on(table(&args));
    print!("{}", render(&rows, &args));
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every load: never more than (1 + burst) × limit in a window, and at
    /// least 90% of min(offered, limit) admitted once converged.
    #[tokio::test]
    async fn envoys_stay_within_the_bound_and_use_the_limit() {
        let args = SimulateRlqsArgs {
            seconds: 120,
            ..SimulateRlqsArgs::default()
        };
        let bound = ((1.0 + args.burst) * args.limit as f64) as u64;
        for (load, n) in cases() {
            let row = run(load, n, &args).await;
            assert!(row.worst_window <= bound, "{row:?}");
            assert!(row.worst_converged <= row.worst_window, "{row:?}");
            assert!(row.efficiency >= 0.9, "{row:?}");
            assert!(row.admitted <= args.limit as f64 * 1.02, "{row:?}");
        }
    }

    /// A tighter burst tightens the worst window.
    #[tokio::test]
    async fn the_burst_bounds_the_worst_window() {
        let args = SimulateRlqsArgs {
            seconds: 60,
            burst: 0.2,
            ..SimulateRlqsArgs::default()
        };
        let row = run(Load::Even(2.0), 5, &args).await;
        assert!(row.worst_window <= 120, "{row:?}");
    }
}
