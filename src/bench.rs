//! `tollgate bench`: a load generator for any RLS address (tollgate or any
//! other Envoy rate-limit service).
//!
//! Two ways to drive the target:
//! - **closed loop** (`--concurrency C`): C callers, each sending its next
//!   call as soon as the previous one is answered. Measures capacity; latency
//!   is per call, so a stalled target slows the generator down with it.
//! - **open loop** (`--rate R`): calls go out on a fixed timetable whatever
//!   the target does, and latency is counted from each call's *intended* send
//!   time, so a stall shows up in the percentiles instead of being hidden
//!   (coordinated omission). In-flight calls are capped (`--max-in-flight`)
//!   so an overloaded target cannot make the generator use unbounded memory;
//!   a call due while the cap is reached is not sent and counts as the error
//!   `DROPPED`.
//!
//! Latency covers every call that was sent, whatever its outcome (a timeout
//! counts as the time it took to give up); errors are also counted by gRPC
//! code. Calls that start during the warm-up are sent but not counted.
//!
//! Invariants: the generator never panics on a bad target (a closed port is
//! a run full of `UNAVAILABLE`, not a failure to start), and every call is
//! bounded by `--timeout-ms`, so a run always ends.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::proto::rate_limit_response::Code;
use crate::proto::{RateLimitRequest, RateLimitServiceClient};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub target: crate::check::Target,
    /// Number of distinct keys. Above 1, the value of the last entry of the
    /// last descriptor gets a suffix `-<i>`, cycling i over 0..N; 1 is one
    /// hot key.
    #[arg(long, default_value_t = 1)]
    pub keys: u64,
    /// Closed loop: this many callers, each sending as fast as it is answered.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Open loop: send this many calls per second on a fixed timetable
    /// (replaces --concurrency).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open loop: most calls in flight; a call due beyond it is DROPPED.
    #[arg(long, default_value_t = 1000)]
    pub max_in_flight: usize,
    /// Measure for this many seconds [default: 10 unless --requests is given].
    #[arg(long)]
    pub duration: Option<f64>,
    /// Measure this many calls (with --duration, whichever ends first).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Request hits_addend (0 counts as 1).
    #[arg(long, default_value_t = 0)]
    pub hits: u32,
    /// HTTP/2 connections to spread the calls over.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Give up on a call after this many milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub timeout_ms: u64,
    /// Seconds of load before measuring starts (not counted).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Print the report as one line of JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// How the load is offered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// `concurrency` callers, each waiting for its answer before the next call.
    Closed { concurrency: usize },
    /// `rate` calls per second on a timetable, at most `max_in_flight` at once.
    Open { rate: f64, max_in_flight: usize },
}

/// A bench run, validated by [`run`].
#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub addr: String,
    pub domain: String,
    /// Parsed descriptors (see [`crate::check::parse_descriptor`]).
    pub descriptors: Vec<Vec<(String, String)>>,
    pub keys: u64,
    pub load: Load,
    /// Stop measuring after this long; `None` needs `requests`.
    pub duration: Option<Duration>,
    /// Stop after this many measured calls.
    pub requests: Option<u64>,
    pub hits: u32,
    pub connections: usize,
    pub timeout: Duration,
    pub warmup: Duration,
    /// TLS settings; `None` for plaintext.
    pub tls: Option<crate::check::ClientTls>,
}

impl BenchConfig {
    /// A closed-loop run of 16 callers for 10 s after 1 s of warm-up.
    pub fn new(addr: &str, domain: &str, descriptors: Vec<Vec<(String, String)>>) -> BenchConfig {
        BenchConfig {
            addr: addr.to_string(),
            domain: domain.to_string(),
            descriptors,
            keys: 1,
            load: Load::Closed { concurrency: 16 },
            duration: Some(Duration::from_secs(10)),
            requests: None,
            hits: 0,
            connections: 4,
            timeout: Duration::from_secs(1),
            warmup: Duration::from_secs(1),
            tls: None,
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.descriptors.is_empty() || self.descriptors.iter().any(Vec::is_empty) {
            bail!("--descriptor: at least one descriptor with one entry is needed");
        }
        if self.keys == 0 {
            bail!("--keys must be at least 1");
        }
        if self.connections == 0 {
            bail!("--connections must be at least 1");
        }
        if self.timeout.is_zero() {
            bail!("--timeout-ms must be at least 1");
        }
        if self.duration.is_none() && self.requests.is_none() {
            bail!("give --duration or --requests");
        }
        match self.load {
            Load::Closed { concurrency: 0 } => bail!("--concurrency must be at least 1"),
            Load::Open { rate, .. } if !(rate.is_finite() && rate > 0.0) => {
                bail!("--rate must be a positive number of calls per second")
            }
            Load::Open {
                max_in_flight: 0, ..
            } => bail!("--max-in-flight must be at least 1"),
            _ => Ok(()),
        }
    }
}

impl TryFrom<&BenchArgs> for BenchConfig {
    type Error = anyhow::Error;

    fn try_from(a: &BenchArgs) -> anyhow::Result<BenchConfig> {
        let descriptors = a
            .target
            .parsed_descriptors()
            .map_err(|e| anyhow::anyhow!(e))?;
        let secs = |name: &str, v: f64| {
            Duration::try_from_secs_f64(v)
                .map_err(|_| anyhow::anyhow!("--{name} {v} is not a number of seconds"))
        };
        let duration = match (a.duration, a.requests) {
            (Some(d), _) => Some(secs("duration", d)?),
            (None, Some(_)) => None,
            (None, None) => Some(Duration::from_secs(10)),
        };
        let load = match a.rate {
            Some(rate) => Load::Open {
                rate,
                max_in_flight: a.max_in_flight,
            },
            None => Load::Closed {
                concurrency: a.concurrency,
            },
        };
        Ok(BenchConfig {
            addr: a.target.addr.clone(),
            domain: a.target.domain.clone(),
            descriptors,
            keys: a.keys,
            load,
            duration,
            requests: a.requests,
            hits: a.hits,
            connections: a.connections,
            timeout: Duration::from_millis(a.timeout_ms),
            warmup: secs("warmup", a.warmup)?,
            tls: a.target.client_tls()?,
        })
    }
}

/// `tollgate bench`: 0 when the run happened (even full of errors), 1 when it
/// could not start.
pub fn main(args: BenchArgs) -> ExitCode {
    let result = BenchConfig::try_from(&args).and_then(|cfg| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("starting the runtime")?;
        rt.block_on(run(&cfg))
    });
    match result {
        Ok(report) => {
            if args.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.render());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tollgate bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latency {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Report {
    pub load: Load,
    pub connections: usize,
    pub keys: u64,
    /// From the end of the warm-up to the last measured answer.
    pub elapsed: Duration,
    pub ok: u64,
    pub over_limit: u64,
    /// By gRPC code name (`UNAVAILABLE`...), plus `DROPPED` (open loop, cap
    /// reached) and `UNKNOWN_DECISION` (an answer whose overall code is
    /// neither OK nor OVER_LIMIT).
    pub errors: BTreeMap<String, u64>,
    pub latency: Latency,
}

impl Report {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Every measured call: `ok + over_limit + error_count()`.
    pub fn total(&self) -> u64 {
        self.ok + self.over_limit + self.error_count()
    }

    /// Answered decisions (OK or OVER_LIMIT) per second.
    pub fn decisions_per_sec(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            (self.ok + self.over_limit) as f64 / secs
        } else {
            0.0
        }
    }

    fn mode(&self) -> String {
        match self.load {
            Load::Closed { concurrency } => format!("closed loop, {concurrency} callers"),
            Load::Open {
                rate,
                max_in_flight,
            } => {
                format!("open loop, {rate} calls/s, at most {max_in_flight} in flight")
            }
        }
    }

    /// The report for a person.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "mode         {}, {} connection(s), {} key(s)",
            self.mode(),
            self.connections,
            self.keys
        );
        let _ = writeln!(out, "duration     {:.3} s", self.elapsed.as_secs_f64());
        let _ = writeln!(out, "requests     {}", self.total());
        let _ = writeln!(out, "decisions/s  {:.1}", self.decisions_per_sec());
        let _ = writeln!(out, "OK           {}", self.ok);
        let _ = writeln!(out, "OVER_LIMIT   {}", self.over_limit);
        let _ = writeln!(out, "errors       {}", self.error_count());
        for (code, n) in &self.errors {
            let _ = writeln!(out, "  {code:<20} {n}");
        }
        let l = &self.latency;
        let _ = writeln!(
            out,
            "latency µs   p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
            l.p50, l.p90, l.p99, l.p999, l.max
        );
        out
    }

    /// The report as one line of JSON, for scripts.
    pub fn to_json(&self) -> String {
        let null = || "null".to_string();
        let (mode, concurrency, rate, max_in_flight) = match self.load {
            Load::Closed { concurrency } => ("closed", concurrency.to_string(), null(), null()),
            Load::Open {
                rate,
                max_in_flight,
            } => ("open", null(), rate.to_string(), max_in_flight.to_string()),
        };
        let errors = self
            .errors
            .iter()
            .map(|(k, v)| format!("{}:{v}", json_string(k)))
            .collect::<Vec<_>>()
            .join(",");
        let l = &self.latency;
        format!(
            concat!(
                "{{\"mode\":\"{}\",\"concurrency\":{},\"rate\":{},\"max_in_flight\":{},",
                "\"connections\":{},\"keys\":{},",
                "\"duration_s\":{:.3},\"requests\":{},\"decisions_per_s\":{:.1},",
                "\"ok\":{},\"over_limit\":{},\"errors\":{},\"errors_by_code\":{{{}}},",
                "\"latency_us\":{{\"p50\":{},\"p90\":{},\"p99\":{},\"p999\":{},\"max\":{}}}}}"
            ),
            mode,
            concurrency,
            rate,
            max_in_flight,
            self.connections,
            self.keys,
            self.elapsed.as_secs_f64(),
            self.total(),
            self.decisions_per_sec(),
            self.ok,
            self.over_limit,
            self.error_count(),
            errors,
            l.p50,
            l.p90,
            l.p99,
            l.p999,
            l.max,
        )
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Runs the bench. Fails only when it cannot start (bad configuration or
/// address); a target that refuses or times out makes a report full of
/// errors.
pub async fn run(cfg: &BenchConfig) -> anyhow::Result<Report> {
    cfg.validate()?;
    let endpoint = crate::check::endpoint(&cfg.addr, cfg.timeout, cfg.tls.as_ref())?;
    // Lazy: a target that is down is a run full of UNAVAILABLE, not a
    // failure to start, and each channel reconnects on its own.
    let clients: Vec<_> = (0..cfg.connections)
        .map(|_| RateLimitServiceClient::new(endpoint.connect_lazy()))
        .collect();

    let template = Arc::new(Template {
        base: crate::check::request(&cfg.domain, &cfg.descriptors, cfg.hits),
        keys: cfg.keys,
        next: AtomicU64::new(0),
    });
    let t0 = Instant::now();
    let plan = Plan {
        measure_start: t0 + cfg.warmup,
        end: cfg.duration.map(|d| t0 + cfg.warmup + d),
        requests: cfg.requests,
        issued: Arc::new(AtomicU64::new(0)),
        timeout: cfg.timeout,
    };
    let stats = match cfg.load {
        Load::Closed { concurrency } => closed_loop(concurrency, &clients, &template, &plan).await,
        Load::Open {
            rate,
            max_in_flight,
        } => open_loop(rate, max_in_flight, t0, &clients, &template, &plan).await,
    };
    let elapsed = Instant::now().saturating_duration_since(plan.measure_start);
    Ok(stats.report(cfg, elapsed))
}

/// Builds each call from the template, cycling over the key mix.
struct Template {
    base: RateLimitRequest,
    keys: u64,
    next: AtomicU64,
}

impl Template {
    fn next(&self) -> RateLimitRequest {
        let mut req = self.base.clone();
        if self.keys > 1 {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % self.keys;
            if let Some(e) = req
                .descriptors
                .last_mut()
                .and_then(|d| d.entries.last_mut())
            {
                e.value.extend_from_slice(format!("-{i}").as_bytes());
            }
        }
        req
    }
}

/// When to measure and when to stop, shared by all callers.
#[derive(Clone)]
struct Plan {
    measure_start: Instant,
    end: Option<Instant>,
    requests: Option<u64>,
    issued: Arc<AtomicU64>,
    timeout: Duration,
}

impl Plan {
    /// Whether a call due at `at` may go out, and whether it is measured.
    /// `None` means the run is over.
    fn admit(&self, at: Instant) -> Option<bool> {
        if self.end.is_some_and(|end| at >= end) {
            return None;
        }
        let measured = at >= self.measure_start;
        if measured
            && let Some(limit) = self.requests
            && self.issued.fetch_add(1, Ordering::Relaxed) >= limit
        {
            return None;
        }
        Some(measured)
    }
}

enum Outcome {
    Ok,
    Over,
    Error(&'static str),
}

async fn send(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
    timeout: Duration,
) -> Outcome {
    let mut req = tonic::Request::new(req);
    req.set_timeout(timeout);
    match tokio::time::timeout(timeout, client.should_rate_limit(req)).await {
        Err(_) => Outcome::Error("DEADLINE_EXCEEDED"),
        Ok(Err(status)) => Outcome::Error(crate::service::code_name(status.code())),
        Ok(Ok(resp)) => match Code::try_from(resp.get_ref().overall_code) {
            Ok(Code::Ok) => Outcome::Ok,
            Ok(Code::OverLimit) => Outcome::Over,
            _ => Outcome::Error("UNKNOWN_DECISION"),
        },
    }
}

/// Counts and latencies of measured calls.
struct Stats {
    ok: u64,
    over: u64,
    errors: BTreeMap<&'static str, u64>,
    /// Microseconds, 1 µs to 1 h at 3 significant digits.
    hist: Histogram<u64>,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            ok: 0,
            over: 0,
            errors: BTreeMap::new(),
            hist: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds"),
        }
    }

    fn record(&mut self, outcome: Outcome, latency: Duration) {
        match outcome {
            Outcome::Ok => self.ok += 1,
            Outcome::Over => self.over += 1,
            Outcome::Error(code) => *self.errors.entry(code).or_default() += 1,
        }
        let micros = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        self.hist.saturating_record(micros);
    }

    fn merge(&mut self, other: Stats) {
        self.ok += other.ok;
        self.over += other.over;
        for (code, n) in other.errors {
            *self.errors.entry(code).or_default() += n;
        }
        // Same bounds on both sides, so this cannot fail.
        let _ = self.hist.add(&other.hist);
    }

    fn report(self, cfg: &BenchConfig, elapsed: Duration) -> Report {
        let h = &self.hist;
        let latency = if h.is_empty() {
            Latency::default()
        } else {
            Latency {
                p50: h.value_at_quantile(0.5),
                p90: h.value_at_quantile(0.9),
                p99: h.value_at_quantile(0.99),
                p999: h.value_at_quantile(0.999),
                max: h.max(),
            }
        };
        Report {
            load: cfg.load,
            connections: cfg.connections,
            keys: cfg.keys,
            elapsed,
            ok: self.ok,
            over_limit: self.over,
            errors: self
                .errors
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            latency,
        }
    }
}

async fn closed_loop(
    concurrency: usize,
    clients: &[RateLimitServiceClient<Channel>],
    template: &Arc<Template>,
    plan: &Plan,
) -> Stats {
    let callers: Vec<_> = (0..concurrency)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let template = template.clone();
            let plan = plan.clone();
            // Each caller keeps its own stats: no lock on the hot path.
            tokio::spawn(async move {
                let mut stats = Stats::new();
                loop {
                    let start = Instant::now();
                    let Some(measured) = plan.admit(start) else {
                        break;
                    };
                    let outcome = send(&mut client, template.next(), plan.timeout).await;
                    if measured {
                        stats.record(outcome, start.elapsed());
                    }
                }
                stats
            })
        })
        .collect();
    let mut total = Stats::new();
    for caller in callers {
        // A caller cannot panic short of a bug; its stats are lost if it does.
        if let Ok(stats) = caller.await {
            total.merge(stats);
        }
    }
    total
}

async fn open_loop(
    rate: f64,
    max_in_flight: usize,
    t0: Instant,
    clients: &[RateLimitServiceClient<Channel>],
    template: &Arc<Template>,
    plan: &Plan,
) -> Stats {
    // Shared by the call tasks; a std Mutex is fine because it is only held
    // to add one sample, never across an await.
    let stats = Arc::new(Mutex::new(Stats::new()));
    let cap = u32::try_from(max_in_flight).unwrap_or(u32::MAX);
    let in_flight = Arc::new(Semaphore::new(cap as usize));
    let due = |i: u64| t0 + Duration::from_secs_f64(i as f64 / rate);
    let mut i: u64 = 0;
    'timetable: loop {
        // Send everything due by now, each stamped with its intended time,
        // so a generator (or target) that falls behind shows up as latency.
        let now = Instant::now();
        while due(i) <= now {
            let intended = due(i);
            let Some(measured) = plan.admit(intended) else {
                break 'timetable;
            };
            match in_flight.clone().try_acquire_owned() {
                Ok(permit) => {
                    let mut client = clients[(i as usize) % clients.len()].clone();
                    let req = template.next();
                    let stats = stats.clone();
                    let timeout = plan.timeout;
                    tokio::spawn(async move {
                        let outcome = send(&mut client, req, timeout).await;
                        let latency = intended.elapsed();
                        if measured {
                            stats
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .record(outcome, latency);
                        }
                        drop(permit);
                    });
                }
                Err(_) if measured => {
                    let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
                    *s.errors.entry("DROPPED").or_default() += 1;
                }
                Err(_) => {}
            }
            i += 1;
        }
        tokio::time::sleep_until(due(i)).await;
    }
    // Every call holds a permit until it is answered or times out.
    let _ = in_flight.acquire_many(cap).await;
    let mut total = Stats::new();
    total.merge(std::mem::replace(
        &mut *stats.lock().unwrap_or_else(|e| e.into_inner()),
        Stats::new(),
    ));
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(descriptors: &[&str], keys: u64) -> Template {
        let d: Vec<_> = descriptors
            .iter()
            .map(|d| crate::check::parse_descriptor(d).unwrap())
            .collect();
        Template {
            base: crate::check::request("dom", &d, 0),
            keys,
            next: AtomicU64::new(0),
        }
    }

    fn values(req: &RateLimitRequest) -> Vec<Vec<String>> {
        req.descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| String::from_utf8_lossy(&e.value).into_owned())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn one_key_is_the_template() {
        let t = template(&["a=1,b=x"], 1);
        assert_eq!(values(&t.next()), vec![vec!["1", "x"]]);
        assert_eq!(values(&t.next()), vec![vec!["1", "x"]]);
    }

    #[test]
    fn key_mix_suffixes_the_last_entry_of_the_last_descriptor() {
        let t = template(&["p=/api", "p=/api,user=bob"], 3);
        let got: Vec<_> = (0..4).map(|_| values(&t.next())).collect();
        let want = |s: &str| {
            vec![
                vec!["/api".to_string()],
                vec!["/api".to_string(), s.to_string()],
            ]
        };
        assert_eq!(
            got,
            vec![want("bob-0"), want("bob-1"), want("bob-2"), want("bob-0")]
        );
    }

    fn report() -> Report {
        Report {
            load: Load::Closed { concurrency: 2 },
            connections: 1,
            keys: 1,
            elapsed: Duration::from_secs(2),
            ok: 10,
            over_limit: 5,
            errors: BTreeMap::from([("UNAVAILABLE".to_string(), 1)]),
            latency: Latency {
                p50: 1,
                p90: 2,
                p99: 3,
                p999: 4,
                max: 5,
            },
        }
    }

    #[test]
    fn json_is_one_line_with_totals() {
        let json = report().to_json();
        assert_eq!(
            json,
            concat!(
                r#"{"mode":"closed","concurrency":2,"rate":null,"max_in_flight":null,"#,
                r#""connections":1,"keys":1,"#,
                r#""duration_s":2.000,"requests":16,"decisions_per_s":7.5,"ok":10,"over_limit":5,"#,
                r#""errors":1,"errors_by_code":{"UNAVAILABLE":1},"#,
                r#""latency_us":{"p50":1,"p90":2,"p99":3,"p999":4,"max":5}}"#
            )
        );
    }

    #[test]
    fn render_lists_errors_by_code() {
        let text = report().render();
        assert!(text.contains("requests     16\n"), "{text}");
        assert!(text.contains("  UNAVAILABLE          1\n"), "{text}");
        assert!(text.contains("p99.9 4  max 5"), "{text}");
    }

    #[test]
    fn bad_configs_do_not_start() {
        let d = vec![vec![("k".to_string(), "v".to_string())]];
        let mut cfg = BenchConfig::new("127.0.0.1:1", "dom", d);
        cfg.load = Load::Open {
            rate: 0.0,
            max_in_flight: 1,
        };
        assert!(cfg.validate().is_err());
        cfg.load = Load::Closed { concurrency: 0 };
        assert!(cfg.validate().is_err());
        cfg.load = Load::Closed { concurrency: 1 };
        cfg.keys = 0;
        assert!(cfg.validate().is_err());
        cfg.keys = 1;
        assert!(cfg.validate().is_ok());
    }
}
