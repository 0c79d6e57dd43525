//! The gRPC face: Envoy's `ShouldRateLimit` mapped onto [`Engine`] and back.
//! The only module that converts between protocol messages and the engine's
//! types, and the one place where errors become gRPC statuses ([`to_status`]).

mod dynamic;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::{
    FutureExt as _, Span as _, SpanKind, TraceContextExt as _, Tracer as _,
};
use tokio::time::Instant;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::engine::{
    self, Code, Descriptor, Engine, EngineError, LimitOverride, Response as Decision,
};
use crate::limit::Unit;
use crate::observe::Instruments;
use crate::proto::rate_limit_response::{DescriptorStatus, RateLimit, rate_limit};
use crate::proto::{
    HeaderValue, RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitUnit,
    rate_limit_descriptor, rate_limit_response,
};
use crate::settings::{HeaderNames, RequestLimits};

/// How the service treats requests before the engine sees them.
#[derive(Debug, Clone, Default)]
pub struct ServiceOptions {
    /// `Some` adds `RateLimit-*` response headers.
    pub headers: Option<HeaderNames>,
    pub limits: RequestLimits,
    /// Kept back from the caller's `grpc-timeout` for the answer's way back.
    pub deadline_margin: Duration,
    /// Answers carry `dynamic_metadata` (`response_dynamic_metadata`).
    pub dynamic_metadata: bool,
}

pub use crate::observe::ServiceStats;

/// The `RateLimitService` implementation.
#[derive(Clone)]
pub struct RateLimiter {
    engine: Engine,
    options: Arc<ServiceOptions>,
    stats: Arc<ServiceStats>,
    instruments: Option<Arc<Instruments>>,
}

impl RateLimiter {
    pub fn new(engine: Engine, options: ServiceOptions) -> Self {
        Self {
            engine,
            options: Arc::new(options),
            stats: Arc::default(),
            instruments: None,
        }
    }

    pub fn stats(&self) -> &Arc<ServiceStats> {
        &self.stats
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// `message` as the engine reads it, under the same input limits as a
    /// `ShouldRateLimit` call (`POST /reset` reads its body so).
    pub fn request_of(&self, message: RateLimitRequest) -> Result<engine::Request, Status> {
        from_proto(message, &self.options.limits, None)
    }

    /// The same service (stats, in-flight count) deciding with `engine`.
    pub fn with_engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let (metadata, _, message) = request.into_parts();
        let unknown = !self.engine.rules().has_domain(&message.domain);
        let mut response = self.decide(&metadata, message).await.map(Response::new)?;
        if unknown {
            // Envoy ignores it; `tollgate check` tells a mistyped domain
            // from one whose rules let everything through.
            response.metadata_mut().insert(
                DOMAIN_HEADER,
                tonic::metadata::MetadataValue::from_static("unknown"),
            );
        }
        Ok(response)
    }
}

/// Response metadata set to `unknown` when no rule file names the
/// request's domain (every descriptor is then OK with no limit).
pub const DOMAIN_HEADER: &str = "tollgate-domain";

impl RateLimiter {
    /// Adds metrics (and traces, when the instruments carry a tracer).
    pub fn with_instruments(mut self, instruments: Arc<Instruments>) -> Self {
        self.instruments = Some(instruments);
        self
    }

    /// One `ShouldRateLimit` call, from gRPC or from `POST /json`:
    /// `metadata` gives the caller's deadline and trace context.
    pub async fn decide(
        &self,
        metadata: &MetadataMap,
        message: RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let Some(obs) = &self.instruments else {
            return self.decide_unobserved(metadata, message).await;
        };
        let started = std::time::Instant::now();
        let descriptors = message.descriptors.len() as u64;
        let span_cx = obs.tracer.as_ref().and_then(|tracer| {
            let parent = crate::observe::extract(metadata);
            // What the sampler would decide, without building a span.
            if !obs.sample_new && !parent.span().span_context().is_sampled() {
                return None;
            }
            let mut span = tracer
                .span_builder("ShouldRateLimit")
                .with_kind(SpanKind::Server)
                .start_with_context(tracer, &parent);
            if span.is_recording() {
                span.set_attribute(KeyValue::new("tollgate.domain", message.domain.clone()));
                span.set_attribute(KeyValue::new("tollgate.descriptors", descriptors as i64));
            }
            Some(parent.with_span(span))
        });
        let result = match &span_cx {
            Some(cx) if cx.span().span_context().is_sampled() => {
                // Lines logged while deciding carry the trace id.
                let trace_id = cx.span().span_context().trace_id();
                let log_span = tracing::info_span!("rls", trace_id = %trace_id);
                self.decide_unobserved(metadata, message)
                    .with_context(cx.clone())
                    .instrument(log_span)
                    .await
            }
            _ => self.decide_unobserved(metadata, message).await,
        };
        let elapsed = started.elapsed().as_secs_f64();
        let code = match &result {
            Ok(r) if r.overall_code == rate_limit_response::Code::OverLimit as i32 => {
                obs.request_over_limit.record(elapsed);
                "over_limit"
            }
            Ok(_) => {
                obs.request_ok.record(elapsed);
                "ok"
            }
            Err(s) => {
                let attrs = [
                    KeyValue::new("code", "error"),
                    KeyValue::new("grpc_status", code_name(s.code())),
                ];
                obs.request_duration.record(elapsed, &attrs);
                "error"
            }
        };
        obs.request_descriptors.record(descriptors);
        if let Some(cx) = span_cx {
            let span = cx.span();
            span.set_attribute(KeyValue::new("tollgate.overall_code", code));
            if let Err(s) = &result {
                span.set_status(opentelemetry::trace::Status::error(s.message().to_string()));
            }
            span.end();
        }
        result
    }

    async fn decide_unobserved(
        &self,
        metadata: &MetadataMap,
        message: RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        let deadline = deadline(metadata, self.options.deadline_margin);
        let req = from_proto(message, &self.options.limits, deadline).inspect_err(|_| {
            self.stats.invalid.fetch_add(1, Ordering::Relaxed);
        })?;
        let decision = self.engine.should_rate_limit(&req).await.map_err(|e| {
            if matches!(
                e,
                EngineError::EmptyDomain
                    | EngineError::NoDescriptors
                    | EngineError::BadDescriptor { .. }
            ) {
                self.stats.invalid.fetch_add(1, Ordering::Relaxed);
            }
            if matches!(e, EngineError::Overloaded { .. }) {
                self.stats.overloaded.fetch_add(1, Ordering::Relaxed);
            }
            to_status(e)
        })?;
        let mut response = to_proto(&decision, self.options.headers.as_ref());
        if self.options.dynamic_metadata {
            response.dynamic_metadata = Some(dynamic::dynamic_metadata(&req, &decision));
        }
        Ok(response)
    }
}

/// A gRPC status code's name, as a fixed label.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "CANCELLED",
        C::Unknown => "UNKNOWN",
        C::InvalidArgument => "INVALID_ARGUMENT",
        C::DeadlineExceeded => "DEADLINE_EXCEEDED",
        C::NotFound => "NOT_FOUND",
        C::AlreadyExists => "ALREADY_EXISTS",
        C::PermissionDenied => "PERMISSION_DENIED",
        C::ResourceExhausted => "RESOURCE_EXHAUSTED",
        C::FailedPrecondition => "FAILED_PRECONDITION",
        C::Aborted => "ABORTED",
        C::OutOfRange => "OUT_OF_RANGE",
        C::Unimplemented => "UNIMPLEMENTED",
        C::Internal => "INTERNAL",
        C::Unavailable => "UNAVAILABLE",
        C::DataLoss => "DATA_LOSS",
        C::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The one mapping from errors to gRPC statuses. Store failures are
/// UNAVAILABLE: Envoy treats every error alike and its `failure_mode_deny`
/// decides. Nothing is logged per request: the engine counts failures, and
/// the store logs its state changes once each.
pub fn to_status(e: EngineError) -> Status {
    match e {
        EngineError::EmptyDomain
        | EngineError::NoDescriptors
        | EngineError::BadDescriptor { .. } => Status::invalid_argument(e.to_string()),
        EngineError::Store { .. } => Status::unavailable(e.to_string()),
        EngineError::DeadlineExceeded { .. } => Status::deadline_exceeded(e.to_string()),
        EngineError::Overloaded { .. } => Status::resource_exhausted(e.to_string()),
    }
}

/// The caller's deadline from its `grpc-timeout` header, less `margin`.
/// A missing or malformed header means no deadline (the store's own
/// timeout still bounds every call).
pub fn deadline(metadata: &MetadataMap, margin: Duration) -> Option<Instant> {
    let timeout = parse_grpc_timeout(metadata.get("grpc-timeout")?.to_str().ok()?)?;
    let now = Instant::now();
    Some(now + timeout.saturating_sub(margin))
}

/// `grpc-timeout` is at most 8 ASCII digits and a unit: H, M, S, m
/// (milliseconds), u (microseconds) or n (nanoseconds).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

fn from_proto(
    r: RateLimitRequest,
    limits: &RequestLimits,
    deadline: Option<Instant>,
) -> Result<engine::Request, Status> {
    check_sizes(&r, limits)?;
    let descriptors = r
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(index, d)| {
            let limit_override = match d.limit {
                None => None,
                Some(o) => Some(limit_override(index, o)?),
            };
            Ok(Descriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| (value_text(e.key), value_text(e.value)))
                    .collect(),
                limit_override,
                hits: d.hits_addend,
                negative: d.is_negative_hits,
            })
        })
        .collect::<Result<_, Status>>()?;
    Ok(engine::Request {
        domain: r.domain,
        descriptors,
        hits: u64::from(r.hits_addend),
        deadline,
    })
}

/// Refuses a request over `limits`: too many descriptors, too many
/// entries in one, or a key too long or not UTF-8.
fn check_sizes(r: &RateLimitRequest, limits: &RequestLimits) -> Result<(), Status> {
    if r.descriptors.len() > limits.max_descriptors {
        return Err(Status::invalid_argument(format!(
            "{} descriptors, over max_descriptors={}",
            r.descriptors.len(),
            limits.max_descriptors
        )));
    }
    for (index, d) in r.descriptors.iter().enumerate() {
        if d.entries.len() > limits.max_entries {
            return Err(Status::invalid_argument(format!(
                "descriptor {index}: {} entries, over max_entries={}",
                d.entries.len(),
                limits.max_entries
            )));
        }
        for (i, e) in d.entries.iter().enumerate() {
            if e.key.len() > limits.max_key_bytes {
                return Err(Status::invalid_argument(format!(
                    "descriptor {index} entry {i}: key of {} bytes, over max_key_bytes={}",
                    e.key.len(),
                    limits.max_key_bytes
                )));
            }
            // Keys come from the operator's route configuration, never from
            // a client; values are read below whatever their bytes.
            if std::str::from_utf8(&e.key).is_err() {
                return Err(Status::invalid_argument(format!(
                    "descriptor {index} entry {i}: key is not UTF-8"
                )));
            }
        }
    }
    Ok(())
}

/// Descriptor `index`'s limit override `o` in the engine's terms; an
/// unknown unit is refused.
fn limit_override(
    index: usize,
    o: rate_limit_descriptor::RateLimitOverride,
) -> Result<LimitOverride, Status> {
    let unit = match RateLimitUnit::try_from(o.unit) {
        Ok(RateLimitUnit::Second) => Unit::Second,
        Ok(RateLimitUnit::Minute) => Unit::Minute,
        Ok(RateLimitUnit::Hour) => Unit::Hour,
        Ok(RateLimitUnit::Day) => Unit::Day,
        Ok(RateLimitUnit::Month) => Unit::Month,
        Ok(RateLimitUnit::Year) => Unit::Year,
        Ok(RateLimitUnit::Unknown) | Err(_) => {
            return Err(Status::invalid_argument(format!(
                "descriptor {index}: limit override has unit {} (expected SECOND to YEAR)",
                o.unit
            )));
        }
    };
    Ok(LimitOverride {
        requests_per_unit: o.requests_per_unit,
        unit,
    })
}

/// A value's bytes as text. UTF-8 is taken as it is (no copy). Bytes that
/// are not UTF-8 (Envoy may forward such header bytes) are a value like
/// any other: each invalid byte becomes U+FFFD followed by its two hex
/// digits, so different byte strings stay different limiters, the valid
/// text around them still matches rule patterns (`caf*` matches
/// `caf\xe9`), and nothing is refused.
pub fn value_text(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let bytes = e.into_bytes();
            let mut out = String::with_capacity(bytes.len() + 8);
            for chunk in bytes.utf8_chunks() {
                out.push_str(chunk.valid());
                for b in chunk.invalid() {
                    out.push(char::REPLACEMENT_CHARACTER);
                    out.push(char::from(HEX[usize::from(b >> 4)]));
                    out.push(char::from(HEX[usize::from(b & 0xf)]));
                }
            }
            out
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn unit_to_proto(u: Unit) -> rate_limit::Unit {
    match u {
        Unit::Second => rate_limit::Unit::Second,
        Unit::Minute => rate_limit::Unit::Minute,
        Unit::Hour => rate_limit::Unit::Hour,
        Unit::Day => rate_limit::Unit::Day,
        Unit::Week => rate_limit::Unit::Week,
        Unit::Month => rate_limit::Unit::Month,
        Unit::Year => rate_limit::Unit::Year,
    }
}

fn code_to_proto(c: Code) -> rate_limit_response::Code {
    match c {
        Code::Ok => rate_limit_response::Code::Ok,
        Code::OverLimit => rate_limit_response::Code::OverLimit,
    }
}

fn to_proto(d: &Decision, headers: Option<&HeaderNames>) -> RateLimitResponse {
    let statuses = d
        .statuses
        .iter()
        .map(|s| DescriptorStatus {
            code: code_to_proto(s.code) as i32,
            current_limit: s.limit.as_ref().map(|l| RateLimit {
                name: l.name.clone().unwrap_or_default(),
                requests_per_unit: l.requests_per_unit,
                unit: unit_to_proto(l.window.unit()) as i32,
            }),
            limit_remaining: s.remaining,
            duration_until_reset: s.reset.map(|r| prost_types::Duration {
                seconds: r.as_secs() as i64,
                nanos: r.subsec_nanos() as i32,
            }),
            quota: None,
        })
        .collect();
    RateLimitResponse {
        overall_code: code_to_proto(d.overall) as i32,
        statuses,
        response_headers_to_add: headers
            .map(|h| rate_limit_headers(d, h))
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// `RateLimit-Limit`, `-Remaining` and `-Reset` for the most restrictive
/// limited descriptor (the fewest remaining; ties go to the earliest).
fn rate_limit_headers(d: &Decision, names: &HeaderNames) -> Vec<HeaderValue> {
    let Some((status, limit)) = d
        .statuses
        .iter()
        .filter_map(|s| s.limit.as_ref().map(|l| (s, l)))
        .min_by_key(|(s, _)| s.remaining)
    else {
        return Vec::new();
    };
    let reset_secs = status
        .reset
        .map(|r| r.as_secs() + u64::from(r.subsec_nanos() > 0))
        .unwrap_or(0);
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_string(),
        value,
        raw_value: Vec::new(),
    };
    vec![
        header(
            &names.limit,
            format!(
                "{}, {};w={}",
                limit.requests_per_unit,
                limit.requests_per_unit,
                limit.window.seconds()
            ),
        ),
        header(&names.remaining, status.remaining.to_string()),
        header(&names.reset, reset_secs.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_of_any_bytes_are_text() {
        let cases: [(&[u8], &str); 5] = [
            (b"plain", "plain"),
            (b"", ""),
            (b"caf\xe9", "caf\u{fffd}e9"),
            (b"\xff", "\u{fffd}ff"),
            (b"a\xf0\x9f\x98b", "a\u{fffd}f0\u{fffd}9f\u{fffd}98b"),
        ];
        for (bytes, want) in cases {
            assert_eq!(value_text(bytes.to_vec()), want, "{bytes:?}");
        }
        // Valid UTF-8 passes through untouched, multi-byte included.
        assert_eq!(value_text("é😀".as_bytes().to_vec()), "é😀");
        // Different bytes, different text.
        assert_ne!(value_text(b"\xfe".to_vec()), value_text(b"\xff".to_vec()));
    }

    #[test]
    fn grpc_timeout_units() {
        let cases = [
            ("20m", Some(Duration::from_millis(20))),
            ("1S", Some(Duration::from_secs(1))),
            ("2M", Some(Duration::from_secs(120))),
            ("1H", Some(Duration::from_secs(3600))),
            ("500u", Some(Duration::from_micros(500))),
            ("99999999n", Some(Duration::from_nanos(99_999_999))),
            ("123456789m", None),
            ("m", None),
            ("", None),
            ("20", None),
            ("-1m", None),
            ("2x", None),
            ("1.5S", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_grpc_timeout(text), want, "{text:?}");
        }
    }
}
