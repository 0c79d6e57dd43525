//! Where RLQS meets other features, through a stream and RLS calls on one
//! server: a `rate_limits:` list whose limits share a window length (each
//! limit keeps its own ledger, and the token bucket its bound), and a
//! `share_threshold` wildcard (every value it matches is one limit, for
//! streams and requests alike).

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

/// RLS calls on `bucket`, one hit each, through the next whole second of
/// the wall clock (the store's, on this machine): how many passed. A call
/// that may have been decided in another second is not counted.
async fn admitted_in_a_second(t: &Tollgate, domain: &str, bucket: &[(&str, &str)]) -> u64 {
    let second = wall() / SEC + 1;
    tokio::time::sleep(Duration::from_micros(second * SEC + 20_000 - wall())).await;
    let mut admitted = 0;
    while wall() < second * SEC + 900_000 {
        let ok = ask(t, domain, bucket, 1).await.0;
        if ok && wall() / SEC == second {
            admitted += 1;
        }
    }
    admitted
}

/// `files/*` with `share_threshold`, 10 a second (600 per 60 s fill):
/// streams reporting on `files/a` and `files/b` are granted shares of one
/// limit, and RLS calls on `files/c` beside a share count on it too.
pub(super) async fn a_shared_wildcard_is_one_limit(t: &Tollgate, domain: &str) {
    let (a, b, c) = (
        [("files", "files/a")],
        [("files", "files/b")],
        [("files", "files/c")],
    );
    let capacity = 600;
    let mut qa = Quota::open(t, domain).await;
    let first = qa.share(&a, BUSY).await;
    assert!(first > 0, "a lone stream gets a share");
    // A whole second the share holds: what it reserves of it is not
    // given to requests.
    let admitted = admitted_in_a_second(t, domain, &c).await;
    assert!(
        admitted as f64 + first as f64 / 60.0 <= 10.0 + 1.0,
        "{admitted} RLS calls passed in a second beside a share of {first} a minute"
    );
    let mut qb = Quota::open(t, domain).await;
    let mut shares = [first, 0];
    for _ in 0..3 {
        shares[1] = qb.share(&b, BUSY).await;
        assert!(
            shares.iter().sum::<u64>() <= capacity,
            "files/a and files/b hold {shares:?} of one limit of {capacity}"
        );
        shares[0] = qa.share(&a, BUSY).await;
        assert!(
            shares.iter().sum::<u64>() <= capacity,
            "files/a and files/b hold {shares:?} of one limit of {capacity}"
        );
        // Past the margin over which a shrunk share stays reserved.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
    }
    assert!(shares[1] > 0, "the second stream got a share: {shares:?}");
    // One report on two values: two buckets of the stream, each its own
    // share of the one limit (neither taken for the other's).
    let d = [("files", "files/d")];
    let response = qa
        .report(vec![usage(&a, BUSY, 0, 5), usage(&d, BUSY, 0, 5)])
        .await;
    let tokens = |bucket: &[(&str, &str)]| match outcome(&response, bucket) {
        Outcome::Bucket { per_fill, .. } => u64::from(per_fill),
        _ => 0,
    };
    let held = [tokens(&a), tokens(&d), shares[1]];
    assert!(
        held.iter().sum::<u64>() <= capacity,
        "files/a and files/d of one stream, and files/b, hold {held:?} of one limit of \
         {capacity}"
    );
    // The limit is held: a third stream gets nothing, until a reset of
    // the limiter RLS names (any value under the wildcard) forgets every
    // share in its ledger.
    let e = [("files", "files/e")];
    let mut qe = Quota::open(t, domain).await;
    let before = qe.share(&e, BUSY).await;
    assert!(
        before + held.iter().sum::<u64>() <= capacity,
        "{before} beside {held:?}"
    );
    let (status, body) = reset(t, domain, &[("files", "files/z")]).await;
    assert_eq!(status, 200, "{body}");
    let after = qe.share(&e, BUSY).await;
    assert_eq!(after, capacity, "the reset forgot the streams' shares");
}

/// `POST /reset` of one descriptor in `domain`, on the debug listener.
async fn reset(t: &Tollgate, domain: &str, entries: &[(&str, &str)]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let entries: Vec<_> = entries
        .iter()
        .map(|(k, v)| serde_json::json!({"key": k, "value": v}))
        .collect();
    let body = serde_json::json!({"domain": domain, "descriptors": [{"entries": entries}]});
    let body = body.to_string();
    let mut s = tokio::net::TcpStream::connect(t.debug).await.unwrap();
    let request = format!(
        "POST /reset HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(WAIT, s.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_owned())
}
