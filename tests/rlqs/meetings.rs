//! Where RLQS meets other features, through a stream and RLS calls on one
//! server: a `rate_limits:` list whose limits share a window length (each
//! limit keeps its own ledger, and the token bucket its bound).

use super::*;
use tollgate::rlqs::Assignment;
use tollgate::rlqs::filter::Filter;

const SEC: u64 = 1_000_000;

/// What an Envoy's filter is told to enforce.
fn assignment(o: Outcome) -> (Assignment, u64) {
    match o {
        Outcome::Allow => (Assignment::AllowAll, 15),
        Outcome::Deny => (Assignment::DenyAll, 15),
        Outcome::Bucket {
            max_tokens,
            per_fill,
            fill_secs,
            ttl_secs,
        } => (
            Assignment::TokenBucket {
                max_tokens,
                tokens_per_fill: per_fill,
                fill_secs: u64::try_from(fill_secs).unwrap(),
            },
            u64::try_from(ttl_secs).unwrap(),
        ),
        Outcome::Abandon => panic!("a busy bucket abandoned"),
    }
}

/// `rate_limits: [fixed_window 6000/minute, token_bucket 60/minute]`: an
/// Envoy (the filter model, offered 5 requests a second) reporting every
/// second while RLS callers hit the same descriptor. Together they admit
/// at most the token bucket's bound, its burst (60) plus its rate (1 a
/// second) times the time run, plus the Envoy's own bursts: the fixed
/// window's ledger is not the bucket's, so no report gives the bucket
/// back tokens it never charged.
pub(super) async fn a_list_keeps_its_token_bucket(t: &Tollgate, domain: &str) {
    let bucket = [("case", "pair"), ("name", "pair")];
    let mut q = Quota::open(t, domain).await;
    let mut envoy = Filter::new(false);
    let start = std::time::Instant::now();
    let now = || start.elapsed().as_micros() as u64;
    let (mut rls, mut envoy_allowed, mut offered, mut reports) = (0u64, 0u64, 0u64, 0u64);
    while now() < 8 * SEC {
        if now() >= reports * SEC {
            let (allowed, denied) = envoy.take_usage();
            envoy_allowed += allowed;
            // The first report carries the request that subscribed the
            // bucket, with no time elapsed (Envoy counts whole seconds).
            let (denied, secs) = if reports == 0 { (1, 0) } else { (denied, 1) };
            let response = q.report(vec![usage(&bucket, allowed, denied, secs)]).await;
            let (a, ttl) = assignment(outcome(&response, &bucket));
            envoy.assign(now(), a, ttl);
            reports += 1;
        }
        while offered * SEC < now() * 5 {
            envoy.admit(now());
            offered += 1;
        }
        if ask(t, domain, &bucket, 1).await.0 {
            rls += 1;
        }
    }
    envoy_allowed += envoy.take_usage().0;
    let secs = now() as f64 / SEC as f64;
    let bound = 60.0 + secs + envoy.gained();
    assert!(
        (rls + envoy_allowed) as f64 <= bound + 2.0,
        "{rls} RLS and {envoy_allowed} Envoy admitted in {secs:.1} s, over the bucket's \
         {bound:.1} ({reports} reports)"
    );
    assert!(envoy_allowed > 0, "the Envoy got a share");
}
