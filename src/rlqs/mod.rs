//! The Rate Limit Quota Service (`envoy.service.rate_limit_quota.v3`,
//! `StreamRateLimitQuotas`): the second gRPC face beside [`crate::service`]
//! (RLS). Each Envoy keeps one stream per domain, reports usage per bucket
//! every few seconds, and enforces the assignment it gets back locally. This
//! module is the only one that sees the RLQS protocol types: it maps a
//! bucket id to the rule RLS would apply ([`bucket`]) and to the limiter
//! RLS counts the same entries on (`engine::limiter_identity`: a
//! `share_threshold` wildcard's values count on one), asks the store's
//! lease ledger of each limit ([`crate::quota`], `Store::lease`) for the
//! stream's share, and answers with token buckets Envoy reads correctly.
//!
//! What a client controls is decided, never refused: a bucket this server
//! cannot read (empty id, past the input limits) is skipped, counted and
//! logged once per stream, and the other buckets of the report are
//! answered. Only a stream whose first report names no domain, or that
//! changes domain, ends with `INVALID_ARGUMENT`: the domain is the
//! operator's configuration.

pub mod bucket;
pub mod filter;
mod stats;
mod stream;

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::engine::Engine;
use crate::proto::rlqs::{
    RateLimitQuotaResponse, RateLimitQuotaService, RateLimitQuotaUsageReports,
};

pub use bucket::{Assignment, IdLimits, Skip};
pub use stats::{QuotaStats, QuotaStatsSnapshot, ShareView};

/// Seconds a report is taken to cover when it says less than one (Envoy
/// fills `time_elapsed` in whole seconds, so its first report says 0):
/// Envoy's report interval.
pub const DEFAULT_REPORT_SECS: u64 = 5;

/// A share stays in the ledger this long past its time to live, for the
/// answer's way to Envoy: Envoy's clock for the assignment starts when it
/// reads it.
pub const HOLD_MARGIN: Duration = Duration::from_secs(1);

/// Responses waiting to be written on one stream.
const OUTBOX: usize = 8;

/// The service's settings (`rlqs.*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaOptions {
    /// `assignment_time_to_live` of every assignment, whole seconds (Envoy
    /// reads only the seconds; an assignment without one expires at once).
    pub assignment_ttl_secs: u64,
    /// `max_tokens` as a multiple of the share of one window.
    pub burst: f64,
    /// A bucket reported idle (0 allowed, 0 denied) for this long gets
    /// `abandon_action`; `None`: never.
    pub abandon_after: Option<Duration>,
    /// Buckets one stream may have answered at once.
    pub max_buckets: usize,
    /// Buckets all of this replica's streams may have answered at once:
    /// with `max_streams`, what Envoys' bucket ids cost a replica.
    pub max_total_buckets: u64,
    /// Streams open at once; a new one past it is refused.
    pub max_streams: u64,
    pub ids: IdLimits,
}

/// The `RateLimitQuotaService` implementation. Cheap to clone.
#[derive(Clone)]
pub struct QuotaService {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    options: QuotaOptions,
    /// Tells this replica's streams from other replicas' in a shared ledger.
    replica: String,
    next_stream: AtomicU64,
    stats: Arc<QuotaStats>,
    /// The shares this replica's streams were last given, by stream, for
    /// the debug view. A std mutex: never held across an `.await`.
    shares: Mutex<HashMap<u64, Vec<ShareView>>>,
    /// True once the server drains: streams end (`UNAVAILABLE`), so Envoys
    /// reconnect, through the load balancer, to a replica that stays.
    draining: watch::Receiver<bool>,
}

impl QuotaService {
    /// `draining` turns true when the server starts to drain.
    pub fn new(engine: Engine, options: QuotaOptions, draining: watch::Receiver<bool>) -> Self {
        // A random replica id without a clock or a new dependency: the
        // standard library seeds every RandomState at random.
        let replica = std::collections::hash_map::RandomState::new().hash_one(0u8);
        Self {
            inner: Arc::new(Inner {
                engine,
                options,
                replica: format!("{replica:016x}"),
                next_stream: AtomicU64::new(1),
                stats: Arc::default(),
                shares: Mutex::default(),
                draining,
            }),
        }
    }

    pub fn stats(&self) -> &Arc<QuotaStats> {
        &self.inner.stats
    }

    /// Every bucket's last assignment on this replica's open streams.
    pub fn shares(&self) -> Vec<ShareView> {
        let shares = self.inner.shares.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<ShareView> = shares.values().flatten().cloned().collect();
        all.sort_by(|a, b| (&a.domain, &a.bucket, a.stream).cmp(&(&b.domain, &b.bucket, b.stream)));
        all
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for QuotaService {
    type StreamRateLimitQuotasStream = ResponseStream;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let inbound = request.into_inner();
        let most = self.inner.options.max_streams;
        if !self.inner.stats.stream_opened(most) {
            return Err(Status::resource_exhausted(format!(
                "this replica already has {most} quota streams open (rlqs.max_streams): open it again later, or through another replica"
            )));
        }
        let (tx, rx) = mpsc::channel(OUTBOX);
        let number = self.inner.next_stream.fetch_add(1, Ordering::Relaxed);
        let inner = self.inner.clone();
        tokio::spawn(async move {
            stream::run(&inner, number, inbound, tx).await;
            inner
                .shares
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&number);
            inner.stats.stream_closed();
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
