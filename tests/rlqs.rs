//! The Rate Limit Quota Service over real gRPC, with an independent client
//! of the protocol (the `envoy-types` crate's generated types and client),
//! against the embedded store, a standalone Redis and a 3+3 Redis Cluster:
//! first assignments, shares of one limit among two and five busy streams
//! (never more than the limit in force, at every step), shares moving to a
//! stream whose demand rises, a closed stream's share freed after its time
//! to live, blanket rules, abandoned buckets and malformed reports.

#[path = "rlqs/meetings.rs"]
mod meetings;
mod support;

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use support::redis::{RedisCluster, RedisServer};
use support::tollgate::Tollgate;
use support::tollgate::descriptor;
use support::unique_domain;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tokio::sync::mpsc;
use tonic::Streaming;

/// 100 per second, shared in tokens per 60 s fill: 6,000.
const CAPACITY: u64 = 6_000;
/// A report of a stream that wants far more than the limit.
const BUSY: u64 = 1_000_000;
const WAIT: Duration = Duration::from_secs(20);

fn rules(domain: &str) -> String {
    format!(
        r#"
domain: {domain}
descriptors:
  - key: case
    descriptors:
      - key: name
        value: shared
        rate_limit: {{unit: second, requests_per_unit: 100}}
      - key: name
        value: strict
        rate_limit: {{unit: second, requests_per_unit: 100, on_store_error: deny}}
      - key: name
        value: daily
        rate_limit: {{unit: day, requests_per_unit: 1000000, algorithm: fixed_window}}
      - key: name
        value: bucketed
        rate_limit: {{unit: minute, requests_per_unit: 100, algorithm: token_bucket}}
      - key: name
        value: listed
        rate_limits:
          - {{unit: second, requests_per_unit: 100}}
          - {{unit: minute, requests_per_unit: 600}}
      - key: name
        value: pair
        rate_limits:
          - {{unit: minute, requests_per_unit: 6000, algorithm: fixed_window}}
          - {{unit: minute, requests_per_unit: 60, algorithm: token_bucket}}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {{unit: second, requests_per_unit: 10, algorithm: fixed_window}}
  - key: name
    value: free
  - key: name
    value: open
    rate_limit: {{unlimited: true}}
  - key: name
    value: banned
    rate_limit: {{unit: second, requests_per_unit: 0}}
  - key: name
    value: inflight
    rate_limit: {{algorithm: concurrency, unit: second, requests_per_unit: 5, max_duration: 30s}}
  - key: name
    value: shadow
    shadow_mode: true
    rate_limit: {{unit: second, requests_per_unit: 5}}
  - key: name
    value: seven
    rate_limit: {{unit: second, requests_per_unit: 10, unit_multiplier: 7}}
"#
    )
}

/// One client stream, as an Envoy keeps one per domain.
struct Quota {
    tx: Option<mpsc::Sender<RateLimitQuotaUsageReports>>,
    rx: Streaming<RateLimitQuotaResponse>,
    domain: String,
}

impl Quota {
    async fn open(t: &Tollgate, domain: &str) -> Quota {
        Self::try_open(t, domain).await.unwrap()
    }

    async fn try_open(t: &Tollgate, domain: &str) -> Result<Quota, tonic::Status> {
        let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", t.grpc))
            .await
            .unwrap();
        let (tx, rx) = mpsc::channel(16);
        let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
        let rx = client
            .stream_rate_limit_quotas(outbound)
            .await?
            .into_inner();
        Ok(Quota {
            tx: Some(tx),
            rx,
            domain: domain.to_owned(),
        })
    }

    async fn send(&mut self, usages: Vec<BucketQuotaUsage>) {
        let reports = RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: usages,
        };
        self.tx.as_ref().unwrap().send(reports).await.unwrap();
    }

    async fn next(&mut self) -> Result<RateLimitQuotaResponse, tonic::Status> {
        match tokio::time::timeout(WAIT, self.rx.message()).await {
            Ok(Ok(Some(r))) => Ok(r),
            Ok(Ok(None)) => panic!("stream ended without an answer"),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no answer within {WAIT:?}"),
        }
    }

    async fn report(&mut self, usages: Vec<BucketQuotaUsage>) -> RateLimitQuotaResponse {
        self.send(usages).await;
        self.next().await.unwrap()
    }

    /// Reports `requests` over 5 s on one bucket: the share it gets.
    async fn share(&mut self, bucket: &[(&str, &str)], requests: u64) -> u64 {
        let response = self.report(vec![usage(bucket, requests, 0, 5)]).await;
        assert_eq!(response.bucket_action.len(), 1, "{response:?}");
        match outcome(&response, bucket) {
            Outcome::Deny => 0,
            Outcome::Bucket {
                per_fill,
                fill_secs,
                ttl_secs,
                max_tokens,
            } => {
                assert_eq!(fill_secs, 60);
                assert!(ttl_secs >= 1);
                assert!(
                    max_tokens >= 1 && u64::from(max_tokens) <= 100,
                    "{max_tokens}"
                );
                u64::from(per_fill)
            }
            other => panic!("not a share: {other:?}"),
        }
    }

    fn close(&mut self) {
        self.tx = None;
    }
}

fn id(bucket: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: bucket
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn usage(bucket: &[(&str, &str)], allowed: u64, denied: u64, secs: i64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(id(bucket)),
        time_elapsed: Some(PbDuration {
            seconds: secs,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: denied,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allow,
    Deny,
    Bucket {
        max_tokens: u32,
        per_fill: u32,
        fill_secs: i64,
        ttl_secs: i64,
    },
    Abandon,
}

/// The action for `bucket` in `response`; exactly one.
fn outcome(response: &RateLimitQuotaResponse, bucket: &[(&str, &str)]) -> Outcome {
    let want = id(bucket);
    let mut found = response
        .bucket_action
        .iter()
        .filter(|a| a.bucket_id.as_ref() == Some(&want));
    let action = found
        .next()
        .unwrap_or_else(|| panic!("no action for {bucket:?} in {response:?}"));
    assert!(found.next().is_none(), "two actions for {bucket:?}");
    match action.bucket_action.as_ref().unwrap() {
        Kind::AbandonAction(_) => Outcome::Abandon,
        Kind::QuotaAssignmentAction(a) => {
            let ttl = a.assignment_time_to_live.as_ref().expect("a time to live");
            assert_eq!(ttl.nanos, 0, "whole seconds");
            assert!(ttl.seconds >= 1, "Envoy expires a sub-second TTL at once");
            let strategy = a.rate_limit_strategy.as_ref().unwrap().strategy.as_ref();
            match strategy.expect("a strategy") {
                Strategy::BlanketRule(r) if *r == BlanketRule::AllowAll as i32 => Outcome::Allow,
                Strategy::BlanketRule(r) if *r == BlanketRule::DenyAll as i32 => Outcome::Deny,
                Strategy::TokenBucket(b) => {
                    let fill = b.fill_interval.as_ref().expect("a fill interval");
                    assert_eq!(fill.nanos, 0, "whole seconds");
                    Outcome::Bucket {
                        max_tokens: b.max_tokens,
                        per_fill: b.tokens_per_fill.as_ref().expect("explicit tokens").value,
                        fill_secs: fill.seconds,
                        ttl_secs: ttl.seconds,
                    }
                }
                other => panic!("a strategy Envoy does not apply: {other:?}"),
            }
        }
    }
}

/// Streams that report `demands[i]` each, in turns, for `rounds` rounds;
/// after every answer the latest shares of all streams (what each Envoy
/// enforces) add up to at most the limit. Returns the last shares.
async fn rounds(
    streams: &mut [Quota],
    shares: &mut [u64],
    bucket: &[(&str, &str)],
    demands: &[u64],
    rounds: usize,
) {
    for _ in 0..rounds {
        for (i, stream) in streams.iter_mut().enumerate() {
            shares[i] = stream.share(bucket, demands[i]).await;
            let total: u64 = shares.iter().sum();
            assert!(total <= CAPACITY, "shares {shares:?} add up to {total}");
        }
    }
}

async fn streams(t: &Tollgate, domain: &str, n: usize) -> Vec<Quota> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(Quota::open(t, domain).await);
    }
    all
}

/// Every scenario against one server (`t`, default time to live) and a
/// second one on the same store with a one-second time to live (`short`).
async fn suite(t: &Tollgate, short: &Tollgate, domain: &str) {
    first_report_gets_a_bucket_within_the_limit(t, domain).await;
    a_bucket_under_several_limits_stays_within_each(t, domain).await;
    busy_streams_share_the_limit(t, domain, 2).await;
    busy_streams_share_the_limit(t, domain, 5).await;
    shares_follow_a_rising_demand(t, domain).await;
    blanket_rules(t, domain).await;
    a_window_of_several_units_fills_over_whole_windows(t, domain).await;
    malformed_reports(t, domain).await;
    idle_buckets_are_abandoned(t, domain).await;
    a_closed_streams_share_goes_to_the_others(short, domain).await;
    shares_and_requests_keep_one_count(t, domain).await;
    meetings::a_list_keeps_its_token_bucket(t, domain).await;
    meetings::a_shared_wildcard_is_one_limit(t, domain).await;
}

/// The tokens per fill of a day's share, from a bucket's assignment.
fn daily_share(response: &RateLimitQuotaResponse, bucket: &[(&str, &str)]) -> u64 {
    match outcome(response, bucket) {
        Outcome::Deny => 0,
        Outcome::Bucket {
            per_fill,
            fill_secs,
            ..
        } => {
            assert_eq!(fill_secs, 86_400, "a day's share fills over the day");
            u64::from(per_fill)
        }
        other => panic!("not a share: {other:?}"),
    }
}

/// The wall clock in microseconds (the server's and its store's, on this
/// machine).
fn wall() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// What a share of `tokens` a day granted at `at` holds of the rest of the
/// day. A grant made between two readings of the clock holds between
/// what the later one and the earlier one give.
fn held_from(tokens: u64, at: u64) -> f64 {
    let day = 86_400_000_000u64;
    tokens as f64 * (day - at % day) as f64 / day as f64
}

/// One decision through RLS: whether `hits` pass, and what is left.
async fn ask(t: &Tollgate, domain: &str, bucket: &[(&str, &str)], hits: u64) -> (bool, u64) {
    let r = t
        .ask(RateLimitRequest {
            domain: domain.to_owned(),
            descriptors: vec![descriptor(bucket)],
            hits_addend: u32::try_from(hits).unwrap(),
        })
        .await;
    let s = &r.statuses[0];
    (s.code == Code::Ok as i32, s.limit_remaining.into())
}

/// RLQS and RLS on one limit counted in a fixed window (a day of a
/// million): an Envoy's share holds its rate to the day's end, requests
/// get the rest, and what one spends the other does not get.
async fn shares_and_requests_keep_one_count(t: &Tollgate, domain: &str) {
    support::away_from_a_day_boundary().await;
    let limit = 1_000_000.0;
    // Requests first: 600,000 of them, then an Envoy's busy report gets
    // at most what is left.
    let first = [("case", "requestsfirst"), ("name", "daily")];
    assert!(ask(t, domain, &first, 600_000).await.0);
    let mut q = Quota::open(t, domain).await;
    let before = wall();
    let share = daily_share(&q.report(vec![usage(&first, BUSY, 0, 5)]).await, &first);
    assert!(share > 0);
    // Whether one more request passes depends on the time of day: the
    // requests already counted more than their fair half, so early in the
    // day the share holds all that is left (its rate over most of a day),
    // late in the day its rate to the day's end is a small part of it.
    // Either way the two keep one count.
    let (ok, left) = ask(t, domain, &first, 1).await;
    let after = wall();
    let (least, most) = (held_from(share, after), held_from(share, before));
    assert!(600_000.0 + least <= limit + 1.0, "{share}");
    let counted = 600_000.0 + f64::from(u8::from(ok)) + left as f64;
    assert!(
        counted + least <= limit + 1.0 && counted + most >= limit - 2.0,
        "{left} left, {least} to {most} held"
    );

    // A share first: the Envoy alone asks, so it gets the whole rate,
    // held to the day's end; requests get what the day has run.
    let bucket = [("case", "sharefirst"), ("name", "daily")];
    let mut q = Quota::open(t, domain).await;
    let before = wall();
    let share = daily_share(&q.report(vec![usage(&bucket, BUSY, 0, 5)]).await, &bucket);
    assert_eq!(share, 1_000_000);
    let (ok, left) = ask(t, domain, &bucket, 1).await;
    let after = wall();
    assert!(ok);
    let (least, most) = (held_from(share, after), held_from(share, before));
    let counted = 1.0 + left as f64;
    assert!(
        counted + least <= limit + 1.0 && counted + most >= limit - 2.0,
        "{left} left, {least} to {most} held"
    );
    assert!(ask(t, domain, &bucket, left).await.0);
    assert!(
        !ask(t, domain, &bucket, 1).await.0,
        "the share's part is kept"
    );
    // The Envoy goes quiet: its next report gives part of its share back
    // (at most the difference over the rest of the day), which requests
    // then get.
    let before = wall();
    let smaller = daily_share(&q.report(vec![usage(&bucket, 0, 0, 5)]).await, &bucket);
    assert!(smaller < share, "{smaller}");
    let given = held_from(share - smaller, before);
    // The refusal above holds a second (a share may shrink at any report),
    // in this replica's over-limit cache too.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (ok, left) = ask(t, domain, &bucket, 1).await;
    assert!(
        ok && left as f64 + 1.0 <= given + 1.0,
        "{left}, {given} given back at most"
    );

    // A token bucket of 100 a minute: the Envoy's share, 100 a minute for
    // its 15 s time to live and the 1 s margin, is charged to the bucket
    // when granted (27 tokens); requests get the rest.
    let bucket = [("case", "bucketfirst"), ("name", "bucketed")];
    let share = q.share(&bucket, BUSY).await;
    assert_eq!(share, 100);
    let (ok, left) = ask(t, domain, &bucket, 1).await;
    assert!(ok && (71..=74).contains(&left), "{left}");
    assert!(ask(t, domain, &bucket, left).await.0);
    assert!(
        !ask(t, domain, &bucket, 1).await.0,
        "the share's tokens are kept"
    );
}

async fn first_report_gets_a_bucket_within_the_limit(t: &Tollgate, domain: &str) {
    let bucket = [("case", "first"), ("name", "shared")];
    let mut q = Quota::open(t, domain).await;
    // Envoy's first report: the one request that subscribed the bucket,
    // with time_elapsed 0 (it counts whole seconds).
    let response = q.report(vec![usage(&bucket, 1, 0, 0)]).await;
    let Outcome::Bucket {
        max_tokens,
        per_fill,
        fill_secs,
        ttl_secs,
    } = outcome(&response, &bucket)
    else {
        panic!("{response:?}");
    };
    assert_eq!(fill_secs, 60);
    assert_eq!(ttl_secs, 15, "the default time to live");
    assert_eq!(
        u64::from(per_fill),
        CAPACITY,
        "a lone stream gets all of it"
    );
    assert_eq!(max_tokens, 100, "a burst of one window's share");
}

/// A bucket under `rate_limits: [100/second, 600/minute]`: a share of
/// both ledgers, and a token bucket within each: the minute's rate (600
/// a minute is the slower), at most the second's 100 at once.
async fn a_bucket_under_several_limits_stays_within_each(t: &Tollgate, domain: &str) {
    let bucket = [("case", "listed"), ("name", "listed")];
    let mut q = Quota::open(t, domain).await;
    let response = q.report(vec![usage(&bucket, 1, 0, 0)]).await;
    let Outcome::Bucket {
        max_tokens,
        per_fill,
        fill_secs,
        ..
    } = outcome(&response, &bucket)
    else {
        panic!("{response:?}");
    };
    assert_eq!((per_fill, fill_secs), (600, 60), "the minute's rate");
    assert_eq!(max_tokens, 100, "never more than the second's 100 at once");
}

async fn busy_streams_share_the_limit(t: &Tollgate, domain: &str, n: usize) {
    let case = format!("busy{n}");
    let bucket = [("case", case.as_str()), ("name", "shared")];
    let mut all = streams(t, domain, n).await;
    let mut shares = vec![0; n];
    rounds(&mut all, &mut shares, &bucket, &vec![BUSY; n], 3).await;
    let total: u64 = shares.iter().sum();
    assert!(total >= CAPACITY / 2, "{shares:?}");
    for share in &shares {
        assert!(
            share + 1 >= CAPACITY / n as u64,
            "equal demand, equal shares: {shares:?}"
        );
    }
}

async fn shares_follow_a_rising_demand(t: &Tollgate, domain: &str) {
    let bucket = [("case", "rising"), ("name", "shared")];
    let mut all = streams(t, domain, 2).await;
    let mut shares = vec![0; 2];
    // 5 requests in 5 s: 60 tokens per minute.
    rounds(&mut all, &mut shares, &bucket, &[BUSY, 5], 3).await;
    assert!(
        shares[1] >= 60,
        "the light stream keeps its demand: {shares:?}"
    );
    assert!(
        shares[0] >= CAPACITY - 200,
        "the busy one the rest: {shares:?}"
    );
    rounds(&mut all, &mut shares, &bucket, &[BUSY, BUSY], 2).await;
    assert!(
        shares[1] + 1 >= CAPACITY / 2,
        "within two rounds the risen stream has its half: {shares:?}"
    );
    assert!(shares[0] + 1 >= CAPACITY / 2, "{shares:?}");
}

/// 10 per 7 seconds (`unit_multiplier: 7`): the bucket fills every 63 s
/// (nine whole windows, the first from a minute), 90 tokens to a lone
/// stream, 10 at once (one window's share).
async fn a_window_of_several_units_fills_over_whole_windows(t: &Tollgate, domain: &str) {
    let bucket = [("name", "seven")];
    let mut q = Quota::open(t, domain).await;
    let response = q.report(vec![usage(&bucket, 1, 0, 0)]).await;
    let Outcome::Bucket {
        max_tokens,
        per_fill,
        fill_secs,
        ..
    } = outcome(&response, &bucket)
    else {
        panic!("{response:?}");
    };
    assert_eq!((fill_secs, per_fill, max_tokens), (63, 90, 10));
}

async fn blanket_rules(t: &Tollgate, domain: &str) {
    let mut q = Quota::open(t, domain).await;
    let free = [("name", "free")];
    let open = [("name", "open")];
    let banned = [("name", "banned")];
    let shadow = [("name", "shadow")];
    let unknown = [("nothing", "matches")];
    let inflight = [("name", "inflight")];
    let response = q
        .report(vec![
            usage(&free, 3, 0, 5),
            usage(&open, 3, 0, 5),
            usage(&banned, 0, 3, 5),
            usage(&shadow, 30, 0, 5),
            usage(&unknown, 1, 0, 5),
            usage(&inflight, 3, 0, 5),
        ])
        .await;
    assert_eq!(response.bucket_action.len(), 6, "{response:?}");
    // A quota stream has no release: a count in flight is refused to it.
    assert_eq!(outcome(&response, &inflight), Outcome::Deny, "concurrency");
    assert_eq!(outcome(&response, &free), Outcome::Allow, "no limit");
    assert_eq!(outcome(&response, &open), Outcome::Allow, "unlimited");
    assert_eq!(outcome(&response, &banned), Outcome::Deny, "a 0 limit");
    assert_eq!(outcome(&response, &shadow), Outcome::Allow, "shadow mode");
    assert_eq!(outcome(&response, &unknown), Outcome::Allow, "no rule");
}

async fn malformed_reports(t: &Tollgate, domain: &str) {
    // A stream that names no domain is the operator's mistake: a clear
    // error, on that stream only.
    let mut q = Quota::open(t, "").await;
    q.send(vec![usage(&[("name", "free")], 1, 0, 5)]).await;
    let status = q.next().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("domain"), "{status:?}");

    // Buckets this server cannot read are skipped; the others answered,
    // and the stream goes on.
    let mut q = Quota::open(t, domain).await;
    let good = [("case", "malformed"), ("name", "shared")];
    let many: Vec<(String, String)> = (0..40).map(|i| (format!("k{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut no_id = usage(&good, 1, 0, 5);
    no_id.bucket_id = None;
    let response = q
        .report(vec![
            usage(&[], 1, 0, 5),
            usage(&[("name", "")], 1, 0, 5),
            usage(&many, 1, 0, 5),
            no_id,
            usage(&good, 1, 0, 5),
        ])
        .await;
    assert_eq!(response.bucket_action.len(), 1, "{response:?}");
    assert!(matches!(outcome(&response, &good), Outcome::Bucket { .. }));
    let again = q.report(vec![usage(&good, 1, 0, 5)]).await;
    assert!(matches!(outcome(&again, &good), Outcome::Bucket { .. }));

    // A value of any length is decided (matched whole, kept as a digest).
    let long = "v".repeat(100_000);
    let long_bucket = [("case", long.as_str()), ("name", "shared")];
    let answered = q.report(vec![usage(&long_bucket, 1, 0, 5)]).await;
    assert!(matches!(
        outcome(&answered, &long_bucket),
        Outcome::Bucket { .. }
    ));

    // Nothing answerable: no response, and the stream still works.
    q.send(vec![usage(&[], 1, 0, 5)]).await;
    let after = q.report(vec![usage(&[("name", "free")], 1, 0, 5)]).await;
    assert_eq!(after.bucket_action.len(), 1, "{after:?}");
    assert_eq!(outcome(&after, &[("name", "free")]), Outcome::Allow);
}

async fn idle_buckets_are_abandoned(t: &Tollgate, domain: &str) {
    let mut q = Quota::open(t, domain).await;
    let bucket = [("case", "idle"), ("name", "shared")];
    let first = q.report(vec![usage(&bucket, 1, 0, 0)]).await;
    assert!(matches!(outcome(&first, &bucket), Outcome::Bucket { .. }));
    let idle = q.report(vec![usage(&bucket, 0, 0, 1)]).await;
    assert!(
        matches!(outcome(&idle, &bucket), Outcome::Bucket { .. }),
        "idle for less than abandon_after: still assigned"
    );
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let later = q.report(vec![usage(&bucket, 0, 0, 2)]).await;
    assert_eq!(outcome(&later, &bucket), Outcome::Abandon);
}

async fn a_closed_streams_share_goes_to_the_others(t: &Tollgate, domain: &str) {
    let bucket = [("case", "closed"), ("name", "shared")];
    let mut all = streams(t, domain, 2).await;
    let mut shares = vec![0; 2];
    rounds(&mut all, &mut shares, &bucket, &[BUSY, BUSY], 3).await;
    assert!(shares[0] + 1 >= CAPACITY / 2 && shares[1] + 1 >= CAPACITY / 2);
    let mut gone = all.pop().unwrap();
    gone.close();
    let mut stays = all.pop().unwrap();
    // The closed stream's Envoy still enforces its share until it
    // expires: the other does not get it before (time to live 1 s, plus
    // the 1 s margin), and does after.
    let started = tokio::time::Instant::now();
    let right_after = stays.share(&bucket, BUSY).await;
    assert!(right_after + shares[1] <= CAPACITY, "{right_after}");
    let mut last = right_after;
    while started.elapsed() < Duration::from_millis(3_500) {
        tokio::time::sleep(Duration::from_millis(400)).await;
        last = stays.share(&bucket, BUSY).await;
        if started.elapsed() < Duration::from_millis(1_500) {
            assert!(last + shares[1] <= CAPACITY, "freed too early: {last}");
        }
    }
    assert_eq!(last, CAPACITY, "the whole limit once the share expired");
}

/// The debug view shows each open stream's buckets and shares (values as
/// digests); the metrics count streams, assignments, reported usage (also
/// on the rule's own counters) and skipped buckets.
async fn operations(t: &Tollgate, domain: &str) {
    let bucket = [("case", "debug"), ("name", "shared")];
    let mut q = Quota::open(t, domain).await;
    q.report(vec![usage(&bucket, 7, 3, 5)]).await;
    let (code, body) = support::http_get(t.debug, "/debug/rlqs").await;
    assert_eq!(code, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    let row = view["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bucket"]["case"] == tollgate::server::masked("debug"))
        .unwrap_or_else(|| panic!("no masked bucket in {body}"));
    assert_eq!(row["domain"], domain);
    assert_eq!(row["bucket"]["name"], tollgate::server::masked("shared"));
    assert_eq!(row["rule"], "case.name_shared");
    assert_eq!(row["assignment"]["token_bucket"]["fill_interval_s"], 60);
    assert!(row["ledger_tokens_in_force"].as_u64().unwrap() <= CAPACITY);
    assert!(view["streams"].as_u64().unwrap() >= 1, "{body}");

    let (code, metrics) = support::http_get(t.http, "/metrics").await;
    assert_eq!(code, 200);
    for line in [
        "tollgate_rlqs_streams ",
        "tollgate_rlqs_assignments_total{kind=\"token_bucket\"",
        "tollgate_rlqs_assignments_total{kind=\"abandon\"",
        "tollgate_rlqs_reported_total{result=\"denied\"",
        "tollgate_rlqs_skipped_total{reason=\"empty_id\"",
        "tollgate_rlqs_buckets ",
    ] {
        assert!(metrics.contains(line), "{line} missing from /metrics");
    }
    let denied_on_rule = metrics.lines().any(|l| {
        l.starts_with("tollgate_rule_over_limit_total")
            && l.contains(domain)
            && l.contains("case.name_shared")
            && !l.ends_with(" 0")
    });
    assert!(denied_on_rule, "reported denials on the rule's counters");
}

/// One server with the default time to live, one with a short one, on the
/// same store settings.
async fn servers(files: &[(&str, &str)], store: &[(&str, &str)]) -> (Tollgate, Tollgate) {
    let mut main = store.to_vec();
    main.push(("rlqs.abandon_after_ms", "2000"));
    let mut short = store.to_vec();
    short.push(("rlqs.assignment_ttl_ms", "1000"));
    let t = Tollgate::start(files, &main).await;
    t.wait_serving(WAIT).await;
    let s = Tollgate::start(files, &short).await;
    s.wait_serving(WAIT).await;
    (t, s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_store() {
    let domain = unique_domain("rlqs-memory");
    let text = rules(&domain);
    let (t, short) = servers(&[("rules.yaml", &text)], &[]).await;
    suite(&t, &short, &domain).await;
    operations(&t, &domain).await;
    t.stop().await;
    short.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let redis = RedisServer::start();
    let domain = unique_domain("rlqs-redis");
    let text = rules(&domain);
    let url = redis.url();
    let store = [
        ("store", url.as_str()),
        ("redis.command_timeout_ms", "2000"),
    ];
    let (t, short) = servers(&[("rules.yaml", &text)], &store).await;
    suite(&t, &short, &domain).await;
    // The ledger lives in Redis, under the limiter's tag, role q.
    let keys = redis.cli(&["--scan", "--pattern", "tg2:*:q:*"]);
    assert!(keys.contains(":q:"), "{keys}");
    t.stop().await;
    short.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let domain = unique_domain("rlqs-cluster");
    let text = rules(&domain);
    let url = cluster.url();
    let store = [
        ("store", url.as_str()),
        ("redis.command_timeout_ms", "2000"),
    ];
    let (t, short) = servers(&[("rules.yaml", &text)], &store).await;
    suite(&t, &short, &domain).await;
    t.stop().await;
    short.stop().await;
}

/// Redis away: a bucket keeps its last share for what is left of its time
/// to live, then follows the rule's `on_store_error`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_keeps_the_last_share_then_follows_the_policy() {
    let mut redis = RedisServer::start();
    let domain = unique_domain("rlqs-failure");
    let text = rules(&domain);
    let url = redis.url();
    let settings = [
        ("store", url.as_str()),
        ("redis.command_timeout_ms", "2000"),
        ("rlqs.assignment_ttl_ms", "3000"),
    ];
    let t = Tollgate::start(&[("rules.yaml", &text)], &settings).await;
    t.wait_serving(WAIT).await;
    let bucket = [("case", "failure"), ("name", "strict")];
    let mut q = Quota::open(&t, &domain).await;
    // The share is assigned after this: it cannot run out before 3 s
    // from here, however long the calls below take.
    let started = tokio::time::Instant::now();
    let before = outcome(&q.report(vec![usage(&bucket, 5, 0, 5)]).await, &bucket);
    let Outcome::Bucket { per_fill, .. } = before else {
        panic!("{before:?}");
    };
    redis.stop();
    let during = outcome(&q.report(vec![usage(&bucket, 5, 0, 5)]).await, &bucket);
    match during {
        Outcome::Bucket {
            per_fill: kept,
            ttl_secs,
            ..
        } => {
            assert_eq!(kept, per_fill, "the last share");
            assert!(
                (1..=3).contains(&ttl_secs),
                "what is left of it: {ttl_secs}"
            );
        }
        other => {
            // Only once the last share has run out: 3 s after it was
            // assigned, less a second for its whole-second time to live.
            assert!(started.elapsed() >= Duration::from_secs(2), "{other:?}");
        }
    }
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    let after = outcome(&q.report(vec![usage(&bucket, 5, 0, 5)]).await, &bucket);
    assert_eq!(after, Outcome::Deny, "on_store_error: deny");
    t.stop().await;
}

/// Two replicas on one Redis share one ledger: streams on both split the
/// limit, never more than it in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_ledger() {
    let redis = RedisServer::start();
    let domain = unique_domain("rlqs-replicas");
    let text = rules(&domain);
    let url = redis.url();
    let store = [
        ("store", url.as_str()),
        ("redis.command_timeout_ms", "2000"),
    ];
    let replicas = Tollgate::start_replicas(2, &[("rules.yaml", &text)], &store).await;
    let bucket = [("case", "replicas"), ("name", "shared")];
    let mut all = vec![
        Quota::open(&replicas[0], &domain).await,
        Quota::open(&replicas[1], &domain).await,
        Quota::open(&replicas[1], &domain).await,
    ];
    let mut shares = vec![0; 3];
    rounds(&mut all, &mut shares, &bucket, &[BUSY; 3], 3).await;
    for share in &shares {
        assert!(share + 1 >= CAPACITY / 3, "{shares:?}");
    }
    for t in replicas {
        t.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_name_the_quota_service() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    const NAME: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
    let t = Tollgate::start(&[], &[]).await;
    t.wait_serving(WAIT).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", t.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: NAME.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::Serving as i32);
    let outbound = tokio_stream::iter(vec![ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }]);
    let mut inbound = ServerReflectionClient::new(channel)
        .server_reflection_info(outbound)
        .await
        .unwrap()
        .into_inner();
    let msg = inbound.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
        panic!("unexpected reflection answer: {msg:?}");
    };
    let names: HashMap<&str, ()> = list.service.iter().map(|s| (s.name.as_str(), ())).collect();
    assert!(names.contains_key(NAME), "{names:?}");
    t.stop().await;
}

/// The buckets examples/envoy/rlqs/envoy.yaml builds get what its comments
/// say from the example's rules: a share of 100/s per tenant, DENY_ALL for
/// admin, ALLOW_ALL for the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_envoy_example_buckets_get_their_assignments() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/envoy/rlqs/rules");
    let text = std::fs::read_to_string(dir.join("quota.yaml")).unwrap();
    let t = Tollgate::start(&[("quota.yaml", &text)], &[]).await;
    t.wait_serving(WAIT).await;
    let mut q = Quota::open(&t, "edge_quota").await;
    let tenant = [("route", "api"), ("tenant", "acme")];
    let admin = [("route", "admin")];
    let other = [("route", "other")];
    let response = q
        .report(vec![
            usage(&tenant, 1, 0, 0),
            usage(&admin, 0, 1, 0),
            usage(&other, 1, 0, 0),
        ])
        .await;
    assert_eq!(
        outcome(&response, &tenant),
        Outcome::Bucket {
            max_tokens: 100,
            per_fill: 6_000,
            fill_secs: 60,
            ttl_secs: 15
        }
    );
    assert_eq!(outcome(&response, &admin), Outcome::Deny);
    assert_eq!(outcome(&response, &other), Outcome::Allow);
    t.stop().await;
}

/// Past `rlqs.max_buckets` on one stream, new buckets are skipped and
/// counted; those already answered still are, and an abandoned bucket
/// makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_answers_at_most_max_buckets() {
    let domain = unique_domain("rlqs-max");
    let text = rules(&domain);
    let settings = [("rlqs.max_buckets", "2"), ("rlqs.abandon_after_ms", "1000")];
    let t = Tollgate::start(&[("rules.yaml", &text)], &settings).await;
    t.wait_serving(WAIT).await;
    let mut q = Quota::open(&t, &domain).await;
    let [a, b, c] = [[("name", "free")], [("name", "open")], [("name", "banned")]];
    let first = q
        .report(vec![
            usage(&a, 1, 0, 0),
            usage(&b, 1, 0, 0),
            usage(&c, 1, 0, 0),
        ])
        .await;
    assert_eq!(first.bucket_action.len(), 2, "{first:?}");
    assert_eq!(outcome(&first, &a), Outcome::Allow);
    assert_eq!(outcome(&first, &b), Outcome::Allow);
    let (_, metrics) = support::http_get(t.http, "/metrics").await;
    let skipped = metrics
        .lines()
        .find(|l| l.starts_with("tollgate_rlqs_skipped_total{") && l.contains("too_many_buckets"))
        .unwrap_or_else(|| panic!("no skipped series in\n{metrics}"));
    assert!(skipped.ends_with(" 1"), "{skipped}");
    // b goes idle and is abandoned; then c fits.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let second = q.report(vec![usage(&a, 1, 0, 1), usage(&b, 0, 0, 1)]).await;
    assert_eq!(outcome(&second, &b), Outcome::Abandon);
    let third = q.report(vec![usage(&c, 0, 1, 1)]).await;
    assert_eq!(outcome(&third, &c), Outcome::Deny);
    t.stop().await;
}

/// What Envoys' bucket ids and streams cost a replica is bounded: past
/// `rlqs.max_streams` a new stream is refused with `RESOURCE_EXHAUSTED`
/// (and counted) until one closes, and past `rlqs.max_total_buckets` on
/// all streams together new buckets are skipped while the answered ones
/// still are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_holds_at_most_max_streams_and_max_total_buckets() {
    let domain = unique_domain("rlqs-caps");
    let text = rules(&domain);
    let settings = [("rlqs.max_streams", "2"), ("rlqs.max_total_buckets", "3")];
    let t = Tollgate::start(&[("rules.yaml", &text)], &settings).await;
    t.wait_serving(WAIT).await;
    let [a, b, c] = [[("name", "free")], [("name", "open")], [("name", "banned")]];
    let mut first = Quota::open(&t, &domain).await;
    let mut second = Quota::open(&t, &domain).await;
    let answered = first
        .report(vec![usage(&a, 1, 0, 0), usage(&b, 1, 0, 0)])
        .await;
    assert_eq!(answered.bucket_action.len(), 2, "{answered:?}");
    // One bucket left on the replica: the second stream gets one of two.
    let answered = second
        .report(vec![usage(&a, 1, 0, 0), usage(&c, 1, 0, 0)])
        .await;
    assert_eq!(answered.bucket_action.len(), 1, "{answered:?}");
    let refused = Quota::try_open(&t, &domain)
        .await
        .err()
        .expect("a third stream past rlqs.max_streams is refused");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("rlqs.max_streams"),
        "{refused:?}"
    );
    let (_, metrics) = support::http_get(t.http, "/metrics").await;
    let series = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
            .to_owned()
    };
    assert!(
        series("tollgate_rlqs_streams_refused_total").ends_with(" 1"),
        "{metrics}"
    );
    let skipped = metrics
        .lines()
        .find(|l| l.starts_with("tollgate_rlqs_skipped_total{") && l.contains("too_many_buckets"))
        .unwrap_or_else(|| panic!("no skipped series in\n{metrics}"));
    assert!(skipped.ends_with(" 1"), "{skipped}");
    // A stream that closes frees its place and its buckets. The server
    // sees the close when the stream's task ends: wait for that, bounded.
    first.close();
    drop(first);
    let deadline = std::time::Instant::now() + WAIT;
    let mut third = loop {
        match Quota::try_open(&t, &domain).await {
            Ok(q) => break q,
            Err(status) if std::time::Instant::now() < deadline => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("no stream within {WAIT:?} of one closing: {status:?}"),
        }
    };
    let answered = third
        .report(vec![usage(&b, 1, 0, 0), usage(&c, 1, 0, 0)])
        .await;
    assert_eq!(answered.bucket_action.len(), 2, "{answered:?}");
    t.stop().await;
}

/// A draining server ends its quota streams with UNAVAILABLE (Envoy opens a
/// new one at its next report, through the load balancer), so an open
/// stream does not hold the shutdown for its whole grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_ends_the_streams() {
    let domain = unique_domain("rlqs-drain");
    let text = rules(&domain);
    const GRACE: Duration = Duration::from_secs(20);
    let grace = GRACE.as_millis().to_string();
    let t = Tollgate::start(&[("rules.yaml", &text)], &[("shutdown_grace_ms", &grace)]).await;
    t.wait_serving(WAIT).await;
    let mut q = Quota::open(&t, &domain).await;
    q.report(vec![usage(&[("name", "free")], 1, 0, 0)]).await;
    let started = tokio::time::Instant::now();
    t.stop().await;
    // A held stream keeps the server for the whole grace; half of it
    // leaves a busy machine seconds to stop a debug build.
    let stopped = started.elapsed();
    eprintln!("stopped after {stopped:?}");
    assert!(
        stopped < GRACE / 2,
        "stopped after {stopped:?}: the open stream held it"
    );
    let status = q.next().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
}

/// Arbitrary reports from a client (any bucket maps, counts, elapsed times,
/// missing ids) on one stream: never a panic or a broken stream; every
/// answer is about buckets of its report, each at most once, within the
/// limit, with whole-second times; a valid report afterwards is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_reports_are_decided_or_skipped() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let domain = unique_domain("rlqs-fuzz");
    let text = rules(&domain);
    let t = Tollgate::start(&[("rules.yaml", &text)], &[]).await;
    t.wait_serving(WAIT).await;
    let word = prop_oneof![
        Just(String::new()),
        Just("case".to_string()),
        Just("name".to_string()),
        Just("shared".to_string()),
        Just("free".to_string()),
        Just("banned".to_string()),
        "[a-z]{1,4}",
        ".{0,40}",
        "x{300,600}",
    ];
    let bucket = proptest::collection::btree_map(word.clone(), word, 0..5);
    let one = (
        proptest::option::weighted(0.9, bucket),
        any::<u64>(),
        prop_oneof![Just(0u64), 0u64..1_000, any::<u64>()],
        prop_oneof![Just(0i64), 0i64..100, any::<i64>()],
    );
    let reports = proptest::collection::vec(proptest::collection::vec(one, 0..6), 1..5);
    let mut runner = TestRunner::new(Config {
        cases: 32,
        failure_persistence: None,
        ..Config::default()
    });
    let handle = tokio::runtime::Handle::current();
    runner
        .run(&reports, |reports| {
            tokio::task::block_in_place(|| {
                handle.block_on(async {
                    let mut q = Quota::open(&t, &domain).await;
                    for report in reports {
                        // A valid report follows each (below): the
                        // arbitrary one leaves its bucket out, so each
                        // answer's actions tell which report they are for.
                        let probe = [("name", "free")];
                        let usages: Vec<BucketQuotaUsage> = report
                            .iter()
                            .map(|(id, allowed, denied, secs)| BucketQuotaUsage {
                                bucket_id: id.as_ref().map(|m| BucketId {
                                    bucket: m.clone().into_iter().collect(),
                                }),
                                time_elapsed: Some(PbDuration {
                                    seconds: *secs,
                                    nanos: 0,
                                }),
                                num_requests_allowed: *allowed,
                                num_requests_denied: *denied,
                            })
                            .filter(|u| u.bucket_id != Some(id(&probe)))
                            .collect();
                        let sent: Vec<BucketId> =
                            usages.iter().filter_map(|u| u.bucket_id.clone()).collect();
                        q.send(usages).await;
                        // A report with nothing answerable gets no answer:
                        // follow each with a valid one to keep in step.
                        q.send(vec![usage(&probe, 1, 0, 5)]).await;
                        let mut answer = q
                            .next()
                            .await
                            .map_err(|s| TestCaseError::fail(format!("stream broken: {s:?}")))?;
                        if answer.bucket_action.len() == 1
                            && answer.bucket_action[0].bucket_id == Some(id(&probe))
                            && !sent.contains(&id(&probe))
                        {
                            continue;
                        }
                        let mut seen = Vec::new();
                        for action in &answer.bucket_action {
                            let bucket = action.bucket_id.clone().unwrap();
                            prop_assert!(sent.contains(&bucket), "{bucket:?} not reported");
                            prop_assert!(!seen.contains(&bucket), "{bucket:?} twice");
                            seen.push(bucket.clone());
                            let pairs: Vec<(&str, &str)> = bucket
                                .bucket
                                .iter()
                                .map(|(k, v)| (k.as_str(), v.as_str()))
                                .collect();
                            if let Outcome::Bucket { per_fill, .. } = outcome(&answer, &pairs) {
                                prop_assert!(u64::from(per_fill) <= CAPACITY);
                            }
                        }
                        // Then the probe's own answer.
                        answer = q
                            .next()
                            .await
                            .map_err(|s| TestCaseError::fail(format!("stream broken: {s:?}")))?;
                        prop_assert_eq!(outcome(&answer, &probe), Outcome::Allow);
                    }
                    Ok(())
                })
            })
        })
        .unwrap();
    t.stop().await;
}

/// Redis stops answering (paused, so every call would wait its timeout):
/// leases go through the store's circuit breaker, so once it opens a
/// report of many buckets is answered at once, each with its last share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_store_opens_the_circuit_for_leases_too() {
    let redis = RedisServer::start();
    let info = redis.cli(&["INFO", "server"]);
    let pid: u32 = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let domain = unique_domain("rlqs-hung");
    let text = rules(&domain);
    let url = redis.url();
    let settings = [("store", url.as_str()), ("redis.command_timeout_ms", "300")];
    let t = Tollgate::start(&[("rules.yaml", &text)], &settings).await;
    t.wait_serving(WAIT).await;
    let names: Vec<String> = (0..400).map(|i| format!("hung{i}")).collect();
    let buckets: Vec<[(&str, &str); 2]> = names
        .iter()
        .map(|n| [("case", n.as_str()), ("name", "strict")])
        .collect();
    let usages = || {
        buckets
            .iter()
            .map(|b| usage(b, 5, 0, 5))
            .collect::<Vec<_>>()
    };
    let mut q = Quota::open(&t, &domain).await;
    let before = q.report(usages()).await;
    assert_eq!(before.bucket_action.len(), 400);
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    };
    signal("-STOP");
    // The first report meets the timeouts and opens the circuit.
    let _ = q.report(usages()).await;
    let started = tokio::time::Instant::now();
    let during = q.report(usages()).await;
    let took = started.elapsed();
    signal("-CONT");
    assert_eq!(during.bucket_action.len(), 400, "each with its last share");
    for b in &buckets {
        assert!(matches!(outcome(&during, b), Outcome::Bucket { .. }));
    }
    assert!(
        took < Duration::from_secs(2),
        "400 buckets on an open circuit answered in {took:?} (without the circuit: about 4 s)"
    );
    t.stop().await;
}

/// A calendar limit (`timezone`) is not leased: a budget renewed at a
/// local boundary is no rate for Envoy's token buckets. Its bucket is
/// skipped and counted under its own reason; the report's other buckets
/// are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_limit_is_skipped_with_its_reason() {
    let domain = unique_domain("rlqs-calendar");
    let text = format!(
        "domain: {domain}\ndescriptors:\n  - key: plan\n    value: monthly\n    rate_limit: \
         {{unit: month, requests_per_unit: 1000, timezone: Europe/Berlin}}\n  - key: plan\n    \
         value: open\n    rate_limit: {{unit: minute, requests_per_unit: 100}}\n"
    );
    let t = Tollgate::start(&[("rules.yaml", &text)], &[]).await;
    t.wait_serving(WAIT).await;
    let mut q = Quota::open(&t, &domain).await;
    let (monthly, open) = ([("plan", "monthly")], [("plan", "open")]);
    let response = q
        .report(vec![usage(&monthly, 5, 0, 5), usage(&open, 5, 0, 5)])
        .await;
    assert_eq!(response.bucket_action.len(), 1, "{response:?}");
    assert!(matches!(outcome(&response, &open), Outcome::Bucket { .. }));
    let (_, metrics) = support::http_get(t.http, "/metrics").await;
    let skipped = metrics
        .lines()
        .find(|l| l.starts_with("tollgate_rlqs_skipped_total{") && l.contains("calendar_window"))
        .unwrap_or_else(|| panic!("no calendar_window series in\n{metrics}"));
    assert!(skipped.ends_with(" 1"), "{skipped}");
    t.stop().await;
}

/// A report that names one bucket twice is answered once for it: the
/// first usage counts, the repeat is left out (Envoy never repeats one;
/// a client may).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_named_twice_in_a_report_is_answered_once() {
    let domain = unique_domain("rlqs-twice");
    let text = rules(&domain);
    let t = Tollgate::start(&[("rules.yaml", &text)], &[]).await;
    t.wait_serving(WAIT).await;
    let mut q = Quota::open(&t, &domain).await;
    for bucket in [
        [("case", "banned")],
        [("name", "banned")],
        [("name", "free")],
        [("name", "shared")],
    ] {
        let response = q
            .report(vec![usage(&bucket, 1, 0, 5), usage(&bucket, 2, 0, 5)])
            .await;
        let n = response
            .bucket_action
            .iter()
            .filter(|a| a.bucket_id.as_ref() == Some(&id(&bucket)))
            .count();
        assert_eq!(n, 1, "{bucket:?}: {response:?}");
    }
    t.stop().await;
}
