//! Load generation: the calls, built from a template over the key mix, sent
//! by closed-loop callers or on an open-loop timetable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tollgate::proto::rate_limit_response::Code;
use tollgate::proto::{RateLimitRequest, RateLimitServiceClient};
use tonic::transport::Channel;

use super::report::{Outcome, Stats};
use super::{BenchConfig, Load, Report};

/// Runs the bench. Fails only when it cannot start (bad configuration or
/// address); a target that refuses or times out makes a report full of
/// errors.
pub async fn run(cfg: &BenchConfig) -> anyhow::Result<Report> {
    cfg.validate()?;
    let endpoint = crate::cmd::check::endpoint(&cfg.addr, cfg.timeout, cfg.tls.as_ref())?;
    // Lazy: a target that is down is a run full of UNAVAILABLE, not a
    // failure to start, and each channel reconnects on its own.
    let clients: Vec<_> = (0..cfg.connections)
        .map(|_| RateLimitServiceClient::new(endpoint.connect_lazy()))
        .collect();

    let template = Arc::new(Template {
        base: crate::cmd::check::request(&cfg.domain, &cfg.descriptors, cfg.hits),
        keys: cfg.keys,
        zipf: cfg.zipf.map(|s| zipf_cdf(cfg.keys, s)),
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

/// Builds each call from the template, cycling over the key mix or
/// drawing from it.
struct Template {
    base: RateLimitRequest,
    keys: u64,
    /// Drawing keys from a Zipf distribution: the share of calls on keys
    /// 0..=i, for each i.
    zipf: Option<Vec<f64>>,
    next: AtomicU64,
}

/// The cumulative shares of a Zipf distribution of exponent `s` over
/// `keys` keys: key i (from 0) is drawn in proportion to 1 / (i + 1)^s.
fn zipf_cdf(keys: u64, s: f64) -> Vec<f64> {
    let mut sum = 0.0;
    let mut cdf: Vec<f64> = (1..=keys)
        .map(|rank| {
            sum += (rank as f64).powf(-s);
            sum
        })
        .collect();
    for c in &mut cdf {
        *c /= sum;
    }
    cdf
}

/// A uniform draw in [0, 1) from the `n`-th call (splitmix64): the same
/// sequence every run, with no shared generator to lock.
fn uniform(n: u64) -> f64 {
    let mut z = n.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

impl Template {
    fn key(&self) -> u64 {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        match &self.zipf {
            Some(cdf) => {
                let u = uniform(n);
                (cdf.partition_point(|&c| c <= u) as u64).min(self.keys - 1)
            }
            None => n % self.keys,
        }
    }

    fn next(&self) -> RateLimitRequest {
        let mut req = self.base.clone();
        if self.keys > 1 {
            let i = self.key();
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

async fn send(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
    timeout: Duration,
) -> Outcome {
    let mut req = tonic::Request::new(req);
    req.set_timeout(timeout);
    match tokio::time::timeout(timeout, client.should_rate_limit(req)).await {
        Err(_) => Outcome::Error("DEADLINE_EXCEEDED"),
        Ok(Err(status)) => Outcome::Error(tollgate::service::code_name(status.code())),
        Ok(Ok(resp)) => match Code::try_from(resp.get_ref().overall_code) {
            Ok(Code::Ok) => Outcome::Ok,
            Ok(Code::OverLimit) => Outcome::Over,
            _ => Outcome::Error("UNKNOWN_DECISION"),
        },
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
            .map(|d| crate::cmd::check::parse_descriptor(d).unwrap())
            .collect();
        Template {
            base: crate::cmd::check::request("dom", &d, 0),
            keys,
            zipf: None,
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

    #[test]
    fn zipf_draws_keys_in_proportion_to_their_rank() {
        let t = Template {
            zipf: Some(zipf_cdf(100, 1.1)),
            ..template(&["user=u"], 100)
        };
        let mut counts = [0u64; 100];
        const DRAWS: u64 = 200_000;
        for _ in 0..DRAWS {
            counts[t.key() as usize] += 1;
        }
        let total: f64 = (1..=100).map(|r| (r as f64).powf(-1.1)).sum();
        for (i, &n) in counts.iter().enumerate().take(10) {
            let want = ((i + 1) as f64).powf(-1.1) / total;
            let got = n as f64 / DRAWS as f64;
            assert!(
                (got - want).abs() < 0.1 * want,
                "key {i}: {got} of the calls, not {want}"
            );
        }
        assert!(counts[99] > 0 && counts[99] < counts[9]);
    }
}
