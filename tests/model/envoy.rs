//! Envoys with the quota filter (RLQS): each replica serves tollgate's
//! `rlqs::QuotaService` over real gRPC, in memory (a tonic server fed
//! `tokio::io::duplex` pipes, a client over `connect_with_connector`), so
//! the virtual clock stays the only clock; each Envoy keeps one stream to
//! a replica for the case's domain, offers its buckets' requests at their
//! rates, reports every second and enforces the answers with
//! `tollgate::rlqs::filter::Filter` (denying without an assignment, so
//! what passes is what tollgate assigned).

use std::collections::HashMap;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use futures_util::StreamExt;
use hyper_util::rt::TokioIo;
use rand_chacha::ChaCha8Rng;
use tokio::io::DuplexStream;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tollgate::engine::Engine;
use tollgate::rlqs::filter::Filter;
use tollgate::rlqs::{Assignment, QuotaService};
use tollgate::settings::Settings;
use tonic::Streaming;
use tonic::transport::{Channel, Endpoint};

use super::grammar::{Rules, Value, chance, pick};

const SEC: u64 = 1_000_000;
/// Envoy's report interval in the model (Envoy's own is 5 s).
pub const REPORT_MICROS: u64 = SEC;
/// How often an Envoy's offered requests arrive (they come in batches).
pub const TICK_MICROS: u64 = 100_000;
/// A bucket no rule names (no rule has this key): always answered
/// `ALLOW_ALL`, so every report gets an answer to wait for.
const PROBE: (&str, &str) = ("envoy_probe", "1");

/// One replica's quota service, served over gRPC on in-memory pipes.
pub struct QuotaServer {
    incoming: mpsc::UnboundedSender<DuplexStream>,
    draining: watch::Sender<bool>,
}

impl QuotaServer {
    /// Registered as `src/server/grpc.rs` does (the service under
    /// `RateLimitQuotaServiceServer`), on a tonic server whose
    /// connections are duplex pipes.
    pub fn start(engine: Engine, settings: &Settings) -> QuotaServer {
        let (draining, draining_rx) = watch::channel(false);
        let service = QuotaService::new(
            engine,
            tollgate::server::quota_options(settings),
            draining_rx,
        );
        let (incoming, rx) = mpsc::unbounded_channel::<DuplexStream>();
        let pipes = UnboundedReceiverStream::new(rx).map(Ok::<_, std::io::Error>);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(tollgate::proto::rlqs::RateLimitQuotaServiceServer::new(
                    service,
                ))
                .serve_with_incoming(pipes),
        );
        QuotaServer { incoming, draining }
    }

    async fn connect(&self) -> Option<RateLimitQuotaServiceClient<Channel>> {
        let incoming = self.incoming.clone();
        let channel = Endpoint::from_static("http://rlqs.model")
            .connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
                let incoming = incoming.clone();
                async move {
                    let (client, server) = tokio::io::duplex(1 << 16);
                    incoming
                        .send(server)
                        .map_err(|_| std::io::Error::other("the replica is gone"))?;
                    Ok::<_, std::io::Error>(TokioIo::new(client))
                }
            }))
            .await
            .ok()?;
        Some(RateLimitQuotaServiceClient::new(channel))
    }
}

impl Drop for QuotaServer {
    /// The replica is gone: its streams end (as a crashed process's do).
    fn drop(&mut self) {
        let _ = self.draining.send(true);
    }
}

/// One bucket an Envoy's matcher builds: a one-entry bucket id.
#[derive(Debug, Clone)]
pub struct BucketSpec {
    pub key: String,
    pub value: String,
    /// Requests offered per second.
    pub rate: f64,
}

#[derive(Debug, Clone)]
pub struct EnvoySpec {
    pub replica: usize,
    pub buckets: Vec<BucketSpec>,
}

/// What happens to an Envoy during a case.
#[derive(Debug, Clone)]
pub enum EnvoyOp {
    /// Its bucket's requests come at this rate from now on.
    Rate(usize, f64),
    /// Its stream closes; it opens a new one at its next report.
    Close,
    /// It reconnects to another replica (a load balancer's choice).
    Move(usize),
    /// The Envoy restarts: new buckets, no assignments, a new stream.
    Restart,
}

/// The rate a bucket of `rule`'s limits is offered: around the limit's
/// rate (windows over 10 s hit as if they were 10 s), from idle to 4x.
fn rate_for(rng: &mut ChaCha8Rng, rules: &Rules, key: &str, value: &str) -> f64 {
    let per_sec = rules.find(key, value).map_or(10.0, |r| {
        rules.rules[r]
            .limits
            .iter()
            .map(|l| l.limit as f64 / l.window_secs().min(10) as f64)
            .fold(f64::MAX, f64::min)
    });
    // Now and then a request every few seconds: a bucket whose share is
    // far below what the limit leaves.
    if chance(rng, 10) {
        return [0.2, 0.5][pick(rng, 2)];
    }
    per_sec * [0.0, 0.3, 0.7, 1.0, 1.5, 2.0, 4.0][pick(rng, 7)]
}

/// A case's Envoys: none in most, 1 or 2 in the rest, with buckets on the
/// case's rules (the RLS traffic's hot values among them; several values
/// of a `share_threshold` wildcard; the values of `rate_limits:` lists).
pub fn draw(
    rng: &mut ChaCha8Rng,
    rules: &Rules,
    hot: &[(String, String)],
    replicas: usize,
) -> Vec<EnvoySpec> {
    if !chance(rng, 55) {
        return Vec::new();
    }
    let mut candidates: Vec<(String, String)> = Vec::new();
    for rule in &rules.rules {
        let values: Vec<String> = match &rule.value {
            Value::KeyOnly => {
                let mut v: Vec<String> = hot
                    .iter()
                    .filter(|(k, _)| *k == rule.key)
                    .map(|(_, v)| v.clone())
                    .collect();
                v.push("u0".into());
                v
            }
            Value::Exact(v) => vec![v.clone()],
            Value::Wildcard { prefix, shared } => {
                let n = if *shared { 3 } else { 2 };
                ["a", "b", "c"][..n]
                    .iter()
                    .map(|s| format!("{prefix}/{s}"))
                    .collect()
            }
        };
        // Lists and shared wildcards are where the protocols meet most:
        // offered twice as often.
        let weight = if rule.list || matches!(rule.value, Value::Wildcard { shared: true, .. }) {
            2
        } else {
            1
        };
        for v in values {
            for _ in 0..weight {
                candidates.push((rule.key.clone(), v.clone()));
            }
        }
    }
    candidates.extend(hot.iter().cloned());
    if candidates.is_empty() {
        return Vec::new();
    }
    let n = 1 + pick(rng, 2);
    (0..n)
        .map(|_| {
            let mut buckets: Vec<BucketSpec> = Vec::new();
            for _ in 0..1 + pick(rng, 4) {
                let (key, value) = candidates[pick(rng, candidates.len())].clone();
                if buckets.iter().any(|b| b.key == key && b.value == value) {
                    continue;
                }
                let rate = rate_for(rng, rules, &key, &value);
                buckets.push(BucketSpec { key, value, rate });
            }
            EnvoySpec {
                replica: pick(rng, replicas),
                buckets,
            }
        })
        .collect()
}

/// An op on one of `envoys` Envoys.
pub fn draw_op(
    rng: &mut ChaCha8Rng,
    rules: &Rules,
    envoys: &[EnvoySpec],
    replicas: usize,
) -> (usize, EnvoyOp) {
    let e = pick(rng, envoys.len());
    let op = match pick(rng, 10) {
        0..=4 => {
            let b = pick(rng, envoys[e].buckets.len());
            let spec = &envoys[e].buckets[b];
            EnvoyOp::Rate(b, rate_for(rng, rules, &spec.key, &spec.value))
        }
        5..=6 => EnvoyOp::Close,
        7..=8 => EnvoyOp::Move(pick(rng, replicas)),
        _ => EnvoyOp::Restart,
    };
    (e, op)
}

struct Stream {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
    _client: RateLimitQuotaServiceClient<Channel>,
}

/// One bucket of one Envoy as it runs.
struct Bucket {
    key: String,
    value: String,
    rate: f64,
    owed: f64,
    filter: Filter,
    /// Reported before (Envoy's cache of buckets): reported every time.
    cached: bool,
    /// The oracle's record of this bucket's filter.
    pub track: usize,
    /// What earlier filters of this track gained (an abandon starts a
    /// new one).
    gained_before: f64,
}

impl Bucket {
    fn id(&self) -> BucketId {
        id(&self.key, &self.value)
    }
}

fn id(key: &str, value: &str) -> BucketId {
    BucketId {
        bucket: HashMap::from([(key.to_string(), value.to_string())]),
    }
}

/// What an Envoy's filters did that the oracle needs: requests admitted
/// on a bucket, and its filter's state after each change.
pub trait Observer {
    /// A new record of a bucket's filter, counting on `key`=`value`'s
    /// limiters.
    fn track(&mut self, key: &str, value: &str) -> usize;
    /// `answered`: the ledger saw the report this state answers.
    /// A bucket's filter after a change; `answered`: by an answer the
    /// ledger made (not a store failure's re-sent assignment).
    fn filter(&mut self, track: usize, now: u64, filter: &Filter, gained: f64, answered: bool);
    /// `n` requests offered from `since` to `now`, admitted at `now`;
    /// `allow_all`: under an `ALLOW_ALL` assignment.
    #[allow(clippy::too_many_arguments)]
    fn admitted(
        &mut self,
        track: usize,
        key: &str,
        value: &str,
        offered: (u64, u64),
        seq: usize,
        n: u64,
        allow_all: bool,
    );
}

pub struct Envoy {
    pub replica: usize,
    domain: String,
    buckets: Vec<Bucket>,
    stream: Option<Stream>,
    last_report: u64,
    next_report: u64,
    last_tick: u64,
    /// Answers that never came (the stream broke): for the report.
    pub broken: u64,
    pub reports: u64,
    /// Answers during which Tokio's (paused) time moved.
    pub moved: u64,
    /// The time to live of an assignment the ledger has just made.
    full_ttl: u64,
}

impl Envoy {
    pub fn new(spec: &EnvoySpec, domain: &str, now: u64, obs: &mut dyn Observer) -> Envoy {
        let mut e = Envoy {
            replica: spec.replica,
            domain: domain.to_string(),
            buckets: Vec::new(),
            stream: None,
            last_report: now,
            next_report: now + REPORT_MICROS,
            last_tick: now,
            broken: 0,
            reports: 0,
            moved: 0,
            full_ttl: tollgate::server::quota_options(&super::world::settings())
                .assignment_ttl_secs,
        };
        for b in &spec.buckets {
            e.buckets.push(Bucket {
                key: b.key.clone(),
                value: b.value.clone(),
                rate: b.rate,
                owed: 0.0,
                filter: Filter::new(false),
                cached: false,
                track: obs.track(&b.key, &b.value),
                gained_before: 0.0,
            });
        }
        e
    }

    /// When this Envoy next has something to do.
    pub fn next_event(&self) -> u64 {
        self.next_report.min(self.last_tick + TICK_MICROS)
    }

    pub fn apply(&mut self, op: &EnvoyOp, obs: &mut dyn Observer) {
        match op {
            EnvoyOp::Rate(b, rate) => {
                if let Some(b) = self.buckets.get_mut(*b) {
                    b.rate = *rate;
                }
            }
            EnvoyOp::Close => self.stream = None,
            EnvoyOp::Move(r) => {
                self.stream = None;
                self.replica = *r;
            }
            EnvoyOp::Restart => {
                self.stream = None;
                for b in &mut self.buckets {
                    b.filter = Filter::new(false);
                    b.cached = false;
                    b.owed = 0.0;
                    b.gained_before = 0.0;
                    b.track = obs.track(&b.key, &b.value);
                }
            }
        }
    }

    /// The replica it talks to crashed: the stream ends.
    pub fn lost(&mut self, replica: usize) {
        if self.replica == replica {
            self.stream = None;
        }
    }

    /// Time has come to `now`: requests offered since the last tick, then
    /// a report when one is due.
    pub async fn tick(
        &mut self,
        mut now: u64,
        seq: usize,
        server: &QuotaServer,
        obs: &mut dyn Observer,
    ) {
        let dt = now.saturating_sub(self.last_tick);
        if dt >= TICK_MICROS || now >= self.next_report {
            let since = self.last_tick;
            self.last_tick = now;
            for i in 0..self.buckets.len() {
                let b = &mut self.buckets[i];
                b.owed += b.rate * dt as f64 / SEC as f64;
                let n = b.owed.floor() as u64;
                if n == 0 {
                    continue;
                }
                b.owed -= n as f64;
                let mut left = n;
                if !b.cached {
                    // Envoy's first request on a bucket: decided by the
                    // no-assignment behaviour (deny), and reported at once.
                    b.cached = true;
                    b.filter.admit(now);
                    left -= 1;
                    // The rest of this tick's requests come once its
                    // answer is in.
                    now = self.report(now, Some(i), server, obs).await;
                }
                let b = &mut self.buckets[i];
                let mut admitted = 0;
                for _ in 0..left {
                    if b.filter.admit(now) {
                        admitted += 1;
                    }
                }
                if admitted > 0 {
                    let allow_all = b.filter.allows_all(now);
                    obs.admitted(
                        b.track,
                        &b.key,
                        &b.value,
                        (since, now),
                        seq,
                        admitted,
                        allow_all,
                    );
                }
                obs.filter(
                    b.track,
                    now,
                    &b.filter,
                    b.gained_before + b.filter.gained(),
                    false,
                );
            }
        }
        if now >= self.next_report {
            now = self.report(now, None, server, obs).await;
            self.last_report = now;
            self.next_report = now + REPORT_MICROS;
        }
    }

    /// One report (every cached bucket, or only `first`, a bucket's
    /// first), and its answer applied: returns when the answer arrived.
    async fn report(
        &mut self,
        now: u64,
        first: Option<usize>,
        server: &QuotaServer,
        obs: &mut dyn Observer,
    ) -> u64 {
        let sent_at = tokio::time::Instant::now();
        let arrived = |at: u64| at + sent_at.elapsed().as_micros() as u64;
        if self.stream.is_none() {
            self.stream = open(server).await;
        }
        let Some(stream) = &mut self.stream else {
            return arrived(now);
        };
        let elapsed = match first {
            Some(_) => 0,
            None => (now.saturating_sub(self.last_report) / SEC) as i64,
        };
        let mut usages = vec![BucketQuotaUsage {
            bucket_id: Some(id(PROBE.0, PROBE.1)),
            time_elapsed: Some(PbDuration {
                seconds: elapsed,
                nanos: 0,
            }),
            num_requests_allowed: 1,
            num_requests_denied: 0,
        }];
        for (i, b) in self.buckets.iter_mut().enumerate() {
            if !b.cached || first.is_some_and(|f| f != i) {
                continue;
            }
            let (allowed, denied) = b.filter.take_usage();
            usages.push(BucketQuotaUsage {
                bucket_id: Some(b.id()),
                time_elapsed: Some(PbDuration {
                    seconds: elapsed,
                    nanos: 0,
                }),
                num_requests_allowed: allowed,
                num_requests_denied: denied,
            });
        }
        let before = tokio::time::Instant::now();
        let sent = stream
            .reports
            .send(RateLimitQuotaUsageReports {
                domain: self.domain.clone(),
                bucket_quota_usages: usages,
            })
            .await;
        let answer = match sent {
            Ok(()) => stream.answers.message().await,
            Err(_) => Ok(None),
        };
        let Ok(Some(answer)) = answer else {
            // The stream ended (a replica crashed or drained): Envoy opens
            // a new one at its next report.
            self.stream = None;
            self.broken += 1;
            return arrived(now);
        };
        self.reports += 1;
        // Paused, Tokio's time moves only when every task waits on a
        // timer: the exchange itself never does (only a slow store's
        // sleeps do), so the virtual clock stays the one clock.
        let took = tokio::time::Instant::now() - before;
        if !took.is_zero() {
            self.moved += 1;
        }
        // Envoy applies an answer when it arrives: a slow store's answer
        // takes effect that much later than the report was sent.
        let sent = now;
        let now = now + took.as_micros() as u64;
        for action in &answer.bucket_action {
            let Some(b) = self
                .buckets
                .iter_mut()
                .find(|b| action.bucket_id.as_ref() == Some(&b.id()))
            else {
                continue;
            };
            let mut fresh = false;
            match action.bucket_action.as_ref() {
                Some(Kind::AbandonAction(_)) => {
                    fresh = true;
                    // Envoy forgets the bucket; its next request subscribes
                    // it again, without an assignment.
                    b.gained_before += b.filter.gained();
                    b.filter = Filter::new(false);
                    b.cached = false;
                }
                Some(Kind::QuotaAssignmentAction(a)) => {
                    let ttl = a
                        .assignment_time_to_live
                        .as_ref()
                        .map_or(0, |d| d.seconds.max(0) as u64);
                    // A whole time to live: the ledger saw this report
                    // (a store failure re-sends the last assignment for
                    // what is left of it).
                    fresh = ttl >= self.full_ttl;
                    if let Some(assignment) = assignment(
                        a.rate_limit_strategy
                            .as_ref()
                            .and_then(|s| s.strategy.as_ref()),
                    ) {
                        let old = b.filter.per_micro(sent);
                        b.filter.assign(now, assignment, ttl);
                        // While the answer was on its way (behind a slow
                        // store) the filter spent its old share, which the
                        // ledger had lowered: README's allowance.
                        let fell = (old - b.filter.per_micro(now)).max(0.0);
                        b.gained_before += fell * (now - sent) as f64;
                    }
                }
                None => {}
            }
            obs.filter(
                b.track,
                now,
                &b.filter,
                b.gained_before + b.filter.gained(),
                fresh,
            );
        }
        now
    }
}

/// What the filter enforces of a strategy (what it skips: `None`).
fn assignment(strategy: Option<&Strategy>) -> Option<Assignment> {
    match strategy? {
        Strategy::BlanketRule(r) if *r == BlanketRule::AllowAll as i32 => {
            Some(Assignment::AllowAll)
        }
        Strategy::BlanketRule(_) => Some(Assignment::DenyAll),
        Strategy::TokenBucket(b) => Some(Assignment::TokenBucket {
            max_tokens: b.max_tokens,
            tokens_per_fill: b.tokens_per_fill.as_ref().map_or(0, |v| v.value),
            fill_secs: b
                .fill_interval
                .as_ref()
                .map_or(0, |d| d.seconds.max(0) as u64),
        }),
        Strategy::RequestsPerTimeUnit(_) => None,
    }
}

async fn open(server: &QuotaServer) -> Option<Stream> {
    let mut client = server.connect().await?;
    let (reports, rx) = mpsc::channel(4);
    let answers = client
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await
        .ok()?
        .into_inner();
    Some(Stream {
        reports,
        answers,
        _client: client,
    })
}
