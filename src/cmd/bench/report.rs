//! What a run measured: the tally of measured calls, and the report for a
//! person or, as one line of JSON, for scripts.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use hdrhistogram::Histogram;

use super::{BenchConfig, Load};

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

/// How one call ended.
pub(super) enum Outcome {
    Ok,
    Over,
    Error(&'static str),
}

/// Counts and latencies of measured calls.
pub(super) struct Stats {
    ok: u64,
    over: u64,
    pub(super) errors: BTreeMap<&'static str, u64>,
    /// Microseconds, 1 µs to 1 h at 3 significant digits.
    hist: Histogram<u64>,
}

impl Stats {
    pub(super) fn new() -> Stats {
        Stats {
            ok: 0,
            over: 0,
            errors: BTreeMap::new(),
            hist: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds"),
        }
    }

    pub(super) fn record(&mut self, outcome: Outcome, latency: Duration) {
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

    pub(super) fn merge(&mut self, other: Stats) {
        self.ok += other.ok;
        self.over += other.over;
        for (code, n) in other.errors {
            *self.errors.entry(code).or_default() += n;
        }
        // Same bounds on both sides, so this cannot fail.
        let _ = self.hist.add(&other.hist);
    }

    pub(super) fn report(self, cfg: &BenchConfig, elapsed: Duration) -> Report {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
