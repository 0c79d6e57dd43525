//! A cost above the limit can never pass: tollgate refuses it (never
//! failing open) with no `duration_until_reset`, so a client that honours
//! the reset does not retry forever; `current_limit` stays, for Envoy's
//! headers. Over real gRPC on the embedded store, through `tollgate check`
//! and on `/metrics`.

mod support;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, rate_limit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use support::away_from_an_hour_boundary;
use support::tollgate::{Tollgate, descriptor};

/// "Limit" is what one call can ever be admitted: the limit, a token
/// bucket's burst, each limit of a list on its own.
const RULES: &str = r#"
domain: never
descriptors:
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket, burst: 20}
  - key: list
    rate_limits:
      - {unit: second, requests_per_unit: 10, name: per_second}
      - {unit: day, requests_per_unit: 1000, name: per_day}
  - key: reports
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window, usage_reports: true}
  - key: sharded
    rate_limit: {unit: hour, requests_per_unit: 8, algorithm: fixed_window, shards: 4}
"#;

async fn ask(t: &Tollgate, key: &str, hits: u32) -> RateLimitResponse {
    t.ask(RateLimitRequest {
        domain: "never".into(),
        descriptors: vec![descriptor(&[(key, "x")])],
        hits_addend: hits,
    })
    .await
}

/// One descriptor's status, with its limit as `(requests, unit, name)`.
fn only(r: &RateLimitResponse) -> (&DescriptorStatus, (u32, i32, &str)) {
    assert_eq!(r.statuses.len(), 1, "{r:?}");
    let s = &r.statuses[0];
    let l = s.current_limit.as_ref().expect("current_limit is filled");
    (s, (l.requests_per_unit, l.unit, l.name.as_str()))
}

#[tokio::test]
async fn a_cost_above_the_limit_is_refused_with_no_reset() {
    away_from_an_hour_boundary().await;
    let t = Tollgate::start(&[("never.yaml", RULES)], &[]).await;
    let hour = rate_limit::Unit::Hour as i32;

    // 50 on 10 an hour: refused, nothing taken, and no time to wait for.
    let r = ask(&t, "fixed", 50).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    let (s, limit) = only(&r);
    assert_eq!(limit, (10, hour, ""), "{r:?}");
    assert_eq!(s.limit_remaining, 10, "{r:?}");
    assert_eq!(s.duration_until_reset, None, "no reset: {r:?}");
    // The whole limit passes, and then an ordinary refusal keeps its
    // reset: the time until a call of its cost passes.
    let r = ask(&t, "fixed", 10).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    let r = ask(&t, "fixed", 1).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    assert!(only(&r).0.duration_until_reset.is_some(), "{r:?}");

    // A token bucket's limit is its burst: 50 is within 100 a minute but
    // above the 20 the bucket ever holds.
    let r = ask(&t, "bucket", 50).await;
    let (s, limit) = only(&r);
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    assert_eq!(limit, (100, rate_limit::Unit::Minute as i32, ""), "{r:?}");
    assert_eq!(s.duration_until_reset, None, "{r:?}");
    let r = ask(&t, "bucket", 20).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "the burst passes: {r:?}");

    // A list: each limit on its own. 20 is within the day's 1,000 but
    // above the second's 10, so it never passes; the status names that
    // limit, with what it has left.
    let r = ask(&t, "list", 20).await;
    let (s, limit) = only(&r);
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    let second = rate_limit::Unit::Second as i32;
    assert_eq!(limit, (10, second, "per_second"), "{r:?}");
    assert_eq!(s.limit_remaining, 10, "{r:?}");
    assert_eq!(s.duration_until_reset, None, "{r:?}");
    let r = ask(&t, "list", 5).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");

    // A sharded limit: one shard decides a hit, so a cost above a share
    // (8 over 4 shards: 2) never passes.
    let r = ask(&t, "sharded", 3).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    let (s, limit) = only(&r);
    assert_eq!(limit, (8, hour, ""), "{r:?}");
    assert_eq!(s.duration_until_reset, None, "{r:?}");
    let r = ask(&t, "sharded", 2).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "a share passes: {r:?}");

    // A usage report is spent already: it is recorded, and its reset says
    // when the debt it left is paid.
    let mut report = descriptor(&[("reports", "x")]);
    report.hits_addend = Some(UInt64Value { value: 50 });
    let r = t
        .ask(RateLimitRequest {
            domain: "never".into(),
            descriptors: vec![report],
            hits_addend: 0,
        })
        .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    assert!(only(&r).0.duration_until_reset.is_some(), "{r:?}");

    // A request's own limit (an override) is a limit as well.
    let mut o = descriptor(&[("fixed", "overridden")]);
    o.limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: rate_limit::Unit::Hour as i32,
    });
    let r = t
        .ask(RateLimitRequest {
            domain: "never".into(),
            descriptors: vec![o],
            hits_addend: 6,
        })
        .await;
    let (s, limit) = only(&r);
    assert_eq!(limit.0, 5, "{r:?}");
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    assert_eq!(s.duration_until_reset, None, "{r:?}");

    // Each is counted on its rule (an override belongs to none).
    let page = support::http_get(t.http, "/metrics").await.1;
    for (rule, n) in [
        ("fixed", 1),
        ("bucket", 1),
        ("list[0]", 1),
        ("list[1]", 0),
        ("reports", 0),
        ("sharded", 1),
    ] {
        assert_eq!(
            counted(&page, "never", rule),
            Some(n),
            "tollgate_cost_above_limit_total for {rule}:\n{page}"
        );
    }
    t.stop().await;
}

/// The value of `tollgate_cost_above_limit_total{domain,rule}`.
fn counted(page: &str, domain: &str, rule: &str) -> Option<u64> {
    let labels = [format!("domain=\"{domain}\""), format!("rule=\"{rule}\"")];
    page.lines()
        .filter(|l| l.starts_with("tollgate_cost_above_limit_total{"))
        .find(|l| {
            let (series, _) = l.rsplit_once(' ').unwrap();
            let inside = series.split_once('{').unwrap().1.trim_end_matches('}');
            let pairs: Vec<&str> = inside.split(',').collect();
            labels.iter().all(|want| pairs.contains(&want.as_str()))
        })
        .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
}

/// `tollgate check` says so, and exits as for any OVER_LIMIT (2).
#[tokio::test]
async fn check_says_a_cost_can_never_pass() {
    away_from_an_hour_boundary().await;
    let t = Tollgate::start(&[("never.yaml", RULES)], &[]).await;
    let addr = t.grpc.to_string();
    let check = |descriptor: &str, hits: &str| {
        let bin = support::process::tollgate_bin();
        let args = [
            "check",
            "--addr",
            &addr,
            "--domain",
            "never",
            "--descriptor",
            descriptor,
            "--hits",
            hits,
        ];
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        async move {
            tokio::task::spawn_blocking(move || {
                std::process::Command::new(bin)
                    .args(&args)
                    .env_clear()
                    .output()
                    .unwrap()
            })
            .await
            .unwrap()
        }
    };
    let o = check("fixed=x", "50").await;
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains(
            "descriptor 0 [fixed=x]: OVER_LIMIT limit=10/hour remaining=10 can never pass: cost 50 > limit 10\n"
        ),
        "{out}"
    );
    assert!(!out.contains("reset="), "{out}");
    // Above a bucket's burst, within its rate: the answer carries no
    // reset, and `check` says what that means.
    let o = check("bucket=x", "50").await;
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(
        out.contains("remaining=20 no reset: cost 50 can never pass"),
        "{out}"
    );
    // An ordinary refusal still shows its reset.
    let o = check("fixed=x", "10").await;
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let o = check("fixed=x", "1").await;
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{out}");
    assert!(out.contains(" reset="), "{out}");
    assert!(!out.contains("never"), "{out}");
    t.stop().await;
}

/// The shipped client example (examples/client/quota_job.py) stops with a
/// message, exit code 1, on tollgate's answer, also where its own numbers
/// could not tell: 30 a call is within the budget's rate (100 a second)
/// but above the bucket's burst of 20.
#[tokio::test]
async fn the_client_example_stops_instead_of_waiting() {
    let python = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .output();
    assert!(
        python.is_ok_and(|o| o.status.success()),
        "Python 3 with grpcio and grpcio-tools is needed (scripts/test installs them)"
    );
    let rules = "domain: upstream_quota\ndescriptors:\n  - key: upstream_api\n    value: partner-search\n    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, burst: 20}\n";
    let t = Tollgate::start(&[("budget.yaml", rules)], &[]).await;
    let addr = t.grpc.to_string();
    let job = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["examples/client/quota_job.py", "--addr", &addr])
            .args(["--calls", "3", "--cost", "30", "--max-wait", "5"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&job.stdout),
        String::from_utf8_lossy(&job.stderr),
    );
    assert_eq!(job.status.code(), Some(1), "{out}{err}");
    assert!(
        err.contains(
            "a call costs 30 and tollgate gives no time to retry (budget 100 per second): it can never pass as it is"
        ),
        "{out}{err}"
    );
    assert!(!out.contains("waiting"), "{out}{err}");
    t.stop().await;
}
