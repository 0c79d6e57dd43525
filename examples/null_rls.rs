//! A null rate-limit service for benchmarks: a bare gRPC server on the
//! address given (default 127.0.0.1:18089) that answers every
//! `ShouldRateLimit` with OK and does nothing else. Envoy with its
//! `ratelimit` filter pointed here pays for the filter and the gRPC call
//! and nothing more: the ceiling a real service is measured against
//! (`scripts/envoy-bench.sh`).
//!
//!     cargo run --release --example null_rls -- 127.0.0.1:18089

use tollgate::proto::{
    RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitServiceServer,
    rate_limit_response::Code,
};
use tonic::{Request, Response, Status};

/// The same allocator as the tollgate binary, so the two compare on what
/// they do, not on how they allocate.
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

struct Null;

#[tonic::async_trait]
impl RateLimitService for Null {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // One OK status per descriptor, as Envoy matches them by position.
        let statuses = request
            .into_inner()
            .descriptors
            .iter()
            .map(|_| tollgate::proto::rate_limit_response::DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..Default::default()
        }))
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18089".into())
        .parse()?;
    println!("null rate-limit service listening on {addr}");
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Null))
        .serve(addr)
        .await?;
    Ok(())
}
