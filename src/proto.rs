//! Envoy's rate-limit protocol and the xDS client's messages, generated at
//! build time from `proto/`. In the library only [`crate::service`],
//! [`crate::json`] and [`crate::xds`] use these types (and, from the
//! binary, the `check` and `bench` clients); the engine never sees them.

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
