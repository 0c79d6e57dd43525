//! `limitador-rls ADDR REDIS_URL SECONDS [cached]`: one limitador limit per
//! `user` value of a request's first descriptor (`descriptors[0].user`),
//! 1e9 hits per SECONDS, counted in Redis by limitador's
//! `AsyncRedisStorage` (every decision a Redis call), or with `cached` by
//! its `CachedRedisStorage` (counted locally, flushed to Redis later: it can
//! pass a limit). Each `ShouldRateLimit` maps as limitador's own RLS front
//! does: the domain is the namespace, each descriptor a map of its entries
//! in the list `descriptors`, `hits_addend` (at least 1) the delta.

use std::collections::HashMap;
use std::sync::Arc;

use limitador::AsyncRateLimiter;
use limitador::limit::{Context, Expression, Limit, Predicate};
use limitador::storage::AsyncStorage;
use limitador::storage::redis::{AsyncRedisStorage, CachedRedisStorage};
use tollgate::proto::rate_limit_response::{Code, DescriptorStatus};
use tollgate::proto::{
    RateLimitRequest, RateLimitResponse, RateLimitService, RateLimitServiceServer,
};
use tonic::{Request, Response, Status};

/// The same allocator as the tollgate binary, so the two compare on what
/// they do, not on how they allocate.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

struct Limitador(Arc<AsyncRateLimiter>);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tonic::async_trait]
impl RateLimitService for Limitador {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let req = request.into_inner();
        let descriptors: Vec<HashMap<String, String>> = req
            .descriptors
            .iter()
            .map(|d| {
                d.entries
                    .iter()
                    .map(|e| (text(&e.key), text(&e.value)))
                    .collect()
            })
            .collect();
        let statuses = |code: Code| {
            (0..req.descriptors.len())
                .map(|_| DescriptorStatus {
                    code: code as i32,
                    ..Default::default()
                })
                .collect()
        };
        let mut ctx = Context::default();
        ctx.list_binding("descriptors".into(), descriptors);
        let delta = u64::from(req.hits_addend.max(1));
        let namespace = req.domain.as_str().into();
        let code = match self
            .0
            .check_rate_limited_and_update(&namespace, &ctx, delta)
            .await
        {
            Ok(r) if r.limited => Code::OverLimit,
            Ok(_) => Code::Ok,
            Err(e) => return Err(Status::unavailable(e.to_string())),
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: code as i32,
            statuses: statuses(code),
            ..Default::default()
        }))
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, addr, redis, seconds, mode @ ..] = args.as_slice() else {
        return Err("usage: limitador-rls ADDR REDIS_URL SECONDS [cached]".into());
    };
    let storage: AsyncStorage = match mode.first().map(String::as_str) {
        Some("cached") => {
            AsyncStorage::with_counter_storage(Box::new(CachedRedisStorage::new(redis).await?))
        }
        _ => AsyncStorage::with_counter_storage(Box::new(AsyncRedisStorage::new(redis).await?)),
    };
    let limiter = limitador::AsyncRateLimiterBuilder::new(storage).build();
    let user = Expression::parse("descriptors[0].user")?;
    limiter.add_limit(Limit::new(
        "bench",
        1_000_000_000,
        seconds.parse()?,
        Vec::<Predicate>::new(),
        [user],
    ));
    let addr = addr.parse()?;
    println!("limitador rate-limit service listening on {addr}");
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Limitador(Arc::new(limiter))))
        .serve(addr)
        .await?;
    Ok(())
}
