//! Envoy's rate-limit protocols (RLS and RLQS) and the xDS client's
//! messages, generated at build time from `proto/`. In the library only
//! [`crate::service`], [`crate::rlqs`], [`crate::json`] and [`crate::xds`]
//! use these types (and, from the binary, the `check` and `bench`
//! clients); the engine and the quota ledger never see them.

#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/tollgate_proto.rs"));

/// The encoded descriptor set served by gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/tollgate_descriptor.bin"));

pub use envoy::config::core::v3::HeaderValue;
pub use envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
pub use envoy::extensions::common::ratelimit::v3::rate_limit_descriptor;
pub use envoy::service::ratelimit::v3::rate_limit_response;
pub use envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
pub use envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
pub use envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
pub use envoy::r#type::v3::RateLimitUnit;

/// The Rate Limit Quota Service's types, under the names [`crate::rlqs`]
/// uses.
pub mod rlqs {
    pub use super::envoy::r#type::v3::TokenBucket;
    pub use super::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
    pub use super::envoy::r#type::v3::{RateLimitStrategy, rate_limit_strategy};
    pub use super::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
    pub use super::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
        AbandonAction, BucketAction as BucketActionKind, QuotaAssignmentAction,
    };
    pub use super::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    pub use super::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
        RateLimitQuotaService, RateLimitQuotaServiceServer,
    };
    pub use super::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage as UsageReport;
    pub use super::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
    };
}
