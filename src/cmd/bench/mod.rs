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

mod load;
mod report;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};

pub use load::run;
pub use report::Report;

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub target: crate::cmd::check::Target,
    /// Number of distinct keys. Above 1, the value of the last entry of the
    /// last descriptor gets a suffix `-<i>`, cycling i over 0..N; 1 is one
    /// hot key.
    #[arg(long, default_value_t = 1)]
    pub keys: u64,
    /// Draw each call's key from a Zipf distribution of this exponent
    /// (e.g. 1.1: key i in proportion to 1/(i+1)^1.1) instead of cycling.
    #[arg(long)]
    pub zipf: Option<f64>,
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
    /// Parsed descriptors (see [`crate::cmd::check::parse_descriptor`]).
    pub descriptors: Vec<Vec<(String, String)>>,
    pub keys: u64,
    /// Keys drawn from a Zipf distribution of this exponent.
    pub zipf: Option<f64>,
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
    pub tls: Option<crate::cmd::check::ClientTls>,
}

impl BenchConfig {
    /// A closed-loop run of 16 callers for 10 s after 1 s of warm-up.
    #[cfg(test)]
    pub fn new(addr: &str, domain: &str, descriptors: Vec<Vec<(String, String)>>) -> BenchConfig {
        BenchConfig {
            addr: addr.to_string(),
            domain: domain.to_string(),
            descriptors,
            keys: 1,
            zipf: None,
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
        if let Some(s) = self.zipf
            && !(s.is_finite() && s > 0.0)
        {
            bail!("--zipf must be a positive exponent");
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
            zipf: a.zipf,
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

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The configuration's `Debug` names the client certificate's file,
    /// never the key it read.
    #[test]
    fn debug_names_the_files_never_the_key() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["client.test".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let ca = write("ca.pem", cert.pem());
        let cert = write("client.pem", cert.pem());
        let key = write("client.key", key.serialize_pem());
        let args = [
            "tollgate",
            "bench",
            "--domain",
            "tls",
            "--descriptor",
            "k=b",
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ];
        let cli = <crate::cmd::cli::Cli as clap::Parser>::try_parse_from(args).unwrap();
        let crate::cmd::cli::Command::Bench(args) = cli.command else {
            unreachable!()
        };
        let cfg = BenchConfig::try_from(&args).unwrap();
        assert!(cfg.tls.is_some());
        let debug = format!("{cfg:?}");
        assert!(debug.contains("client.pem"), "{debug}");
        assert!(!debug.contains("PRIVATE KEY"), "{debug}");
    }
}
