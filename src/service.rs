//! The gRPC face: Envoy's `ShouldRateLimit` mapped onto [`Engine`] and back.
//! The only module that converts between protocol messages and the engine's
//! types, and the one place where errors become gRPC statuses ([`to_status`]).

use tonic::{Request, Response, Status};

use crate::engine::{
    self, Code, Descriptor, Engine, EngineError, LimitOverride, Response as Decision,
};
use crate::limit::Unit;
use crate::proto::rate_limit_response::{DescriptorStatus, RateLimit, rate_limit};
use crate::proto::{
    HeaderValue, RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitUnit,
    rate_limit_response,
};
use crate::settings::HeaderNames;

/// The `RateLimitService` implementation.
#[derive(Clone)]
pub struct RateLimiter {
    engine: Engine,
    headers: Option<HeaderNames>,
}

impl RateLimiter {
    pub fn new(engine: Engine, headers: Option<HeaderNames>) -> Self {
        Self { engine, headers }
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let req = from_proto(request.into_inner())?;
        let decision = self
            .engine
            .should_rate_limit(&req)
            .await
            .map_err(|e| to_status(&req.domain, e))?;
        Ok(Response::new(to_proto(&decision, self.headers.as_ref())))
    }
}

/// The one mapping from errors to gRPC statuses. Store failures are
/// UNAVAILABLE: Envoy treats every error alike and its `failure_mode_deny`
/// decides.
pub fn to_status(domain: &str, e: EngineError) -> Status {
    match e {
        EngineError::EmptyDomain
        | EngineError::NoDescriptors
        | EngineError::BadDescriptor { .. } => Status::invalid_argument(e.to_string()),
        EngineError::Store { .. } => {
            tracing::warn!(domain, error = %e, "store failed; answering UNAVAILABLE");
            Status::unavailable(e.to_string())
        }
    }
}

fn from_proto(r: RateLimitRequest) -> Result<engine::Request, Status> {
    let descriptors = r
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(index, d)| {
            let limit_override = match d.limit {
                None => None,
                Some(o) => {
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
                    Some(LimitOverride {
                        requests_per_unit: o.requests_per_unit,
                        unit,
                    })
                }
            };
            Ok(Descriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit_override,
                hits: d.hits_addend,
                negative: d.is_negative_hits,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(engine::Request {
        domain: r.domain,
        descriptors,
        hits: u64::from(r.hits_addend),
    })
}

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
                unit: unit_to_proto(l.unit) as i32,
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
                limit.unit.seconds()
            ),
        ),
        header(&names.remaining, status.remaining.to_string()),
        header(&names.reset, reset_secs.to_string()),
    ]
}
