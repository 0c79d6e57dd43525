//! One dead Redis Cluster primary, with no replica to take over, over real
//! gRPC: limiters on the live primaries keep counting exactly, limiters on
//! the dead one follow their `on_store_error` policy within the command
//! timeout, and once that server's circuit opens they are answered at once;
//! when the primary returns, its limiters answer again. Also: a call on a
//! slot that just moved follows `MOVED`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures_util::future::join_all;
use tollgate::limit::{Algorithm, Unit};
use tollgate::storage::Hit;
use tollgate::storage::keys::{KeyBuilder, Role};
use tonic::transport::Channel;

use support::redis::{ClusterOptions, RedisCluster};
use support::tollgate::{Tollgate, descriptor};
use support::unique_domain;

type Client = RateLimitServiceClient<Channel>;

const COMMAND_TIMEOUT_MS: u64 = 200;
/// Scheduling on a machine busy with other test binaries.
const SLACK: Duration = Duration::from_millis(1_500);
/// Long enough that few probes interrupt the "open" phase.
const COOLDOWN_MS: u64 = 3_000;
const POLICIES: [&str; 3] = ["error", "allow", "deny"];
/// Limit of the `steady` limiters, counted down call by call.
const STEADY_LIMIT: u32 = 1_000;

fn rules(domain: &str) -> String {
    // Sliding logs over an hour: no window boundary can reset a count
    // in the middle of the test.
    let limit = |n: u32, policy: &str| {
        format!(
            "{{unit: hour, requests_per_unit: {n}, algorithm: sliding_window_log, \
             on_store_error: {policy}}}"
        )
    };
    format!(
        "domain: {domain}\ndescriptors:\n\
         \x20 - key: error\n    rate_limit: {}\n\
         \x20 - key: allow\n    rate_limit: {}\n\
         \x20 - key: deny\n    rate_limit: {}\n\
         \x20 - key: steady\n    rate_limit: {}\n",
        limit(5, "error"),
        limit(5, "allow"),
        limit(5, "deny"),
        limit(STEADY_LIMIT, "error"),
    )
}

/// Finds, for `key`, a value whose limiter lives on a given primary: the
/// slot of the key tollgate builds, by Redis's own `CLUSTER KEYSLOT`. Every
/// value found has a slot of its own, so moving one slot moves one limiter.
struct Placement<'a> {
    cluster: &'a RedisCluster,
    domain: String,
    next: usize,
    slots: BTreeSet<u16>,
}

impl Placement<'_> {
    fn redis_key(&self, key: &str, value: &str) -> String {
        let entries = vec![(key.to_owned(), value.to_owned())];
        KeyBuilder::default()
            .limiter(&Hit {
                domain: &self.domain,
                entries: &entries,
                algorithm: Algorithm::SlidingWindowLog,
                limit: 5,
                window: Unit::Hour.into(),
                hits: 1,
                negative: false,
                usage_reports: false,
                buckets: 2,
                burst: 0,
                shard: tollgate::storage::Shard::NONE,
                receipt: false,
                also: &[],
                lease: false,
                ahead: tollgate::storage::Ahead::NONE,
            })
            .key(Role::LogSet)
    }

    fn value_on(&mut self, key: &str, port: u16) -> String {
        for _ in 0..1_000 {
            self.next += 1;
            let value = format!("v{}", self.next);
            let slot = self.cluster.keyslot(&self.redis_key(key, &value));
            if !self.slots.contains(&slot) && self.cluster.primary_for_slot(slot) == Some(port) {
                self.slots.insert(slot);
                return value;
            }
        }
        panic!("no value of {key} lands on the primary at {port} in 1000 tries");
    }
}

/// One call's outcome: the overall code, or the gRPC error code.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Ok { remaining: u32 },
    OverLimit,
    Error(tonic::Code),
}

/// Calls share one HTTP/2 connection, as Envoy's do.
async fn ask(client: &Client, domain: &str, key: &str, value: &str) -> (Outcome, Duration) {
    let mut client = client.clone();
    let request = RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![descriptor(&[(key, value)])],
        hits_addend: 1,
    };
    let started = Instant::now();
    let reply = client.should_rate_limit(request).await;
    let elapsed = started.elapsed();
    let outcome = match reply.map(tonic::Response::into_inner) {
        Err(status) => Outcome::Error(status.code()),
        Ok(RateLimitResponse {
            overall_code,
            statuses,
            ..
        }) => {
            if overall_code == Code::OverLimit as i32 {
                Outcome::OverLimit
            } else {
                assert_eq!(overall_code, Code::Ok as i32, "{key}={value}");
                Outcome::Ok {
                    remaining: statuses[0].limit_remaining,
                }
            }
        }
    };
    (outcome, elapsed)
}

fn bound() -> Duration {
    Duration::from_millis(COMMAND_TIMEOUT_MS) + SLACK
}

/// What a limiter on the dead primary must answer under `policy`.
fn dead_outcome_matches(policy: &str, outcome: &Outcome) -> bool {
    match policy {
        "error" => *outcome == Outcome::Error(tonic::Code::Unavailable),
        "allow" => matches!(outcome, Outcome::Ok { .. }),
        _ => *outcome == Outcome::OverLimit,
    }
}

/// Rounds of concurrent calls, the dead primary's limiters next to live
/// ones, each answer checked.
struct Outage<'a> {
    client: &'a Client,
    domain: &'a str,
    dead: &'a BTreeMap<&'static str, String>,
    steady: &'a [String],
    /// Calls each steady limiter has counted.
    steady_count: u32,
    slowest_live: Duration,
}

impl Outage<'_> {
    /// Runs rounds for `period`; returns the slowest dead answer of each.
    async fn rounds(&mut self, period: Duration) -> Vec<Duration> {
        let (t, domain) = (self.client, self.domain);
        let started = Instant::now();
        let mut slowest_dead = Vec::new();
        while started.elapsed() < period {
            let dead_calls = join_all(
                self.dead
                    .iter()
                    .map(|(policy, value)| ask(t, domain, policy, value)),
            );
            let live_calls = join_all(self.steady.iter().map(|v| ask(t, domain, "steady", v)));
            let (dead_answers, live_answers) = tokio::join!(dead_calls, live_calls);
            self.steady_count += 1;
            for ((policy, value), (outcome, took)) in self.dead.iter().zip(&dead_answers) {
                assert!(
                    dead_outcome_matches(policy, outcome),
                    "{policy}={value} on the dead primary answered {outcome:?}"
                );
                assert!(
                    *took < bound(),
                    "{policy} on the dead primary took {took:?}"
                );
            }
            for (value, (outcome, took)) in self.steady.iter().zip(&live_answers) {
                assert_eq!(
                    *outcome,
                    Outcome::Ok {
                        remaining: STEADY_LIMIT - self.steady_count
                    },
                    "steady={value} on a live primary, call {}",
                    self.steady_count
                );
                assert!(*took < bound(), "steady on a live primary took {took:?}");
                self.slowest_live = self.slowest_live.max(*took);
            }
            slowest_dead.push(dead_answers.iter().map(|(_, d)| *d).max().unwrap());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        slowest_dead
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_primary_fails_alone() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("TOLLGATE_TEST_LOG"))
        .try_init();
    let mut cluster = RedisCluster::start_with(ClusterOptions {
        replicas: 0,
        require_full_coverage: false,
    });
    let domain = unique_domain("isolation");
    let url = cluster.url();
    let t = Tollgate::start(
        &[("rules.yaml", &rules(&domain))],
        &[
            ("store", url.as_str()),
            ("redis.command_timeout_ms", &COMMAND_TIMEOUT_MS.to_string()),
            ("redis.breaker_failures", "3"),
            ("redis.breaker_cooldown_ms", &COOLDOWN_MS.to_string()),
            ("shutdown_drain_ms", "0"),
        ],
    )
    .await;
    t.wait_serving(Duration::from_secs(20)).await;
    let client = t.client().await;

    let ports = cluster.ports();
    let (victim, live) = (ports[0], [ports[1], ports[2]]);
    let mut place = Placement {
        cluster: &cluster,
        domain: domain.clone(),
        next: 0,
        slots: BTreeSet::new(),
    };
    let dead: BTreeMap<&'static str, String> = POLICIES
        .iter()
        .map(|&p| (p, place.value_on(p, victim)))
        .collect();
    let steady: Vec<String> = live.iter().map(|&p| place.value_on("steady", p)).collect();
    // Fresh limiters for counting once the node is known dead.
    let fresh: Vec<(&str, String)> = POLICIES
        .iter()
        .flat_map(|&policy| live.map(|p| (policy, p)))
        .map(|(policy, port)| (policy, place.value_on(policy, port)))
        .collect();

    // Every limiter answers before the kill: the placement is real.
    for (policy, value) in &dead {
        let (outcome, _) = ask(&client, &domain, policy, value).await;
        assert_eq!(outcome, Outcome::Ok { remaining: 4 }, "{policy}={value}");
    }
    for value in &steady {
        let (outcome, _) = ask(&client, &domain, "steady", value).await;
        assert_eq!(
            outcome,
            Outcome::Ok {
                remaining: STEADY_LIMIT - 1
            }
        );
    }

    // A slot handed to another primary behind tollgate's back (an empty
    // slot: Redis refuses to reassign one that holds keys). The call meets
    // MOVED before the routing is refreshed, and follows it.
    let moved = place.value_on("error", live[0]);
    let moved_key = place.redis_key("error", &moved);
    let slot = cluster.keyslot(&moved_key).to_string();
    let new_owner = cluster.cli(live[1], &["CLUSTER", "MYID"]);
    for port in [live[1], live[0], victim] {
        let reply = cluster.cli(port, &["CLUSTER", "SETSLOT", &slot, "NODE", &new_owner]);
        assert_eq!(reply, "OK", "CLUSTER SETSLOT on {port}");
    }
    let (outcome, took) = ask(&client, &domain, "error", &moved).await;
    assert_eq!(
        outcome,
        Outcome::Ok { remaining: 4 },
        "a call on a moved slot"
    );
    assert!(took < bound(), "a call on a moved slot took {took:?}");
    assert_eq!(
        cluster.cli(live[1], &["EXISTS", &moved_key]),
        "1",
        "counted on the slot's new owner"
    );

    // A hung primary first: connections stay open and nothing answers, so
    // calls wait for the command timeout until the circuit opens.
    cluster.pause_node(victim);
    let mut outage = Outage {
        client: &client,
        domain: &domain,
        dead: &dead,
        steady: &steady,
        steady_count: 1,
        slowest_live: Duration::ZERO,
    };
    let hung = outage.rounds(Duration::from_secs(3)).await;
    assert!(
        hung[0] >= Duration::from_millis(COMMAND_TIMEOUT_MS),
        "the first calls to the hung primary wait for the timeout: {hung:?}"
    );
    // Then most calls are answered by the open circuit without waiting;
    // only a probe per cooldown waits. The median, not every call, so a
    // busy machine cannot fail this.
    let mut after_open: Vec<Duration> = hung[1..].to_vec();
    after_open.sort();
    let median = after_open[after_open.len() / 2];
    assert!(
        median < Duration::from_millis(COMMAND_TIMEOUT_MS),
        "answers for the hung primary stay slow after the circuit should \
         have opened: median {median:?} of {hung:?}"
    );
    // Then dead: connections refused.
    cluster.kill_node(victim);
    let dead_rounds = outage.rounds(Duration::from_secs(2)).await;
    let slowest_live = outage.slowest_live;

    // Live primaries count exactly: 5 OK, then OVER_LIMIT.
    for (policy, value) in &fresh {
        for n in 1..=5u32 {
            let (outcome, took) = ask(&client, &domain, policy, value).await;
            assert_eq!(
                outcome,
                Outcome::Ok { remaining: 5 - n },
                "{policy}={value}"
            );
            assert!(took < bound(), "{policy} on a live primary took {took:?}");
        }
        let (outcome, _) = ask(&client, &domain, policy, value).await;
        assert_eq!(outcome, Outcome::OverLimit, "{policy}={value}, 6th call");
    }

    // The primary comes back (empty: no persistence): its circuit closes
    // after a probe and its limiters count again.
    cluster.restart_node(victim);
    let back = Instant::now();
    let deadline = back + Duration::from_secs(20);
    loop {
        let (outcome, took) = ask(&client, &domain, "error", &dead["error"]).await;
        assert!(
            took < bound(),
            "error on the returning primary took {took:?}"
        );
        match outcome {
            Outcome::Ok { .. } => break,
            Outcome::Error(tonic::Code::Unavailable) => {}
            other => panic!("error on the returning primary answered {other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "the restarted primary's limiters do not answer after 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovered = back.elapsed();

    eprintln!(
        "slowest live call {slowest_live:?}; slowest call of each round on the \
         hung primary: {hung:?}; then dead: {dead_rounds:?}; back after {recovered:?}"
    );
    t.stop().await;
}
