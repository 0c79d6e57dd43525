//! The lease ledger as the stores keep it (`Store::lease`): random report
//! sequences never put more than the limit in force, and the Redis script
//! (standalone and Cluster) grants exactly what the embedded store grants
//! for the same sequence, so both run one arithmetic.

mod support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use support::redis::{RedisCluster, RedisServer};
use support::unique_domain;
use tollgate::clock::ManualClock;
use tollgate::limit::{Algorithm, Unit};
use tollgate::quota::{Grant, Report, Terms};
use tollgate::storage::{LeaseCall, MemoryStore, RedisConfig, RedisStore, Store};

#[derive(Debug, Clone)]
struct Step {
    holder: usize,
    requests: u64,
    elapsed_secs: u64,
    /// Moves the embedded store's clock; Redis runs on its own clock, so
    /// equivalence is checked without expiry (see `hold`).
    advance_secs: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(
        (
            0usize..5,
            prop_oneof![Just(0u64), 0u64..50, 0u64..100_000, Just(1u64 << 53)],
            0u64..12,
            0u64..8,
        )
            .prop_map(|(holder, requests, elapsed_secs, advance_secs)| Step {
                holder,
                requests,
                elapsed_secs,
                advance_secs,
            }),
        1..60,
    )
}

async fn lease(store: &dyn Store, domain: &str, case: &str, step: &Step, terms: Terms) -> Grant {
    let entries = vec![("case".to_string(), case.to_string())];
    let holder = format!("replica.{}", step.holder);
    store
        .lease(LeaseCall {
            domain,
            entries: &entries,
            algorithm: Algorithm::SlidingWindowCounter,
            window: Unit::Second.into(),
            holder: &holder,
            report: Report {
                requests: step.requests,
                elapsed_secs: step.elapsed_secs,
            },
            terms,
            counted: None,
        })
        .await
        .expect("a lease")
}

/// Runs `cases` random sequences: on the embedded store with its clock
/// moving (shares expire), checking the bound; and, when `redis` is given,
/// on both stores without expiry, checking equal grants.
async fn check(redis: Option<Arc<RedisStore>>, cases: u32) {
    let domain = unique_domain("ledger");
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let handle = tokio::runtime::Handle::current();
    // Each case its own limiter (the Redis ledgers outlive a case).
    let case = std::sync::atomic::AtomicU64::new(0);
    runner
        .run(&(steps(), 1u64..20_000), |(steps, capacity)| {
            let n = case.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let name = format!("c{n}");
            tokio::task::block_in_place(|| {
                handle.block_on(async {
                    // Expiring shares on the embedded store: the bound.
                    let clock = ManualClock::at_secs(1_000);
                    let memory = MemoryStore::new(Arc::new(clock.clone()));
                    let terms = Terms {
                        capacity,
                        fill_secs: 60,
                        hold_micros: 10_000_000,
                    };
                    for step in &steps {
                        clock.advance_secs(step.advance_secs);
                        let g = lease(&memory, &domain, &name, step, terms).await;
                        prop_assert!(g.tokens <= capacity);
                        prop_assert!(g.granted_total <= capacity, "{g:?}");
                    }
                    let Some(redis) = &redis else {
                        return Ok(());
                    };
                    // The same sequence on both, no expiry: equal grants.
                    let memory = MemoryStore::new(Arc::new(ManualClock::at_secs(1_000)));
                    let terms = Terms {
                        hold_micros: 3_600_000_000,
                        ..terms
                    };
                    for step in &steps {
                        let m = lease(&memory, &domain, &name, step, terms).await;
                        let r = lease(redis.as_ref(), &domain, &name, step, terms).await;
                        prop_assert_eq!(m, r, "{:?}", step);
                        prop_assert!(r.granted_total <= capacity);
                    }
                    Ok(())
                })
            })
        })
        .unwrap();
}

async fn connect(url: String) -> Arc<RedisStore> {
    let store = RedisStore::connect(RedisConfig {
        url,
        command_timeout: Duration::from_millis(2_000),
        ..RedisConfig::default()
    })
    .await
    .expect("valid settings");
    assert!(store.wait_ready(Duration::from_secs(20)).await);
    Arc::new(store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_ledgers_never_exceed_the_limit() {
    check(None, 256).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_script_grants_as_the_embedded_ledger() {
    let redis = RedisServer::start();
    check(Some(connect(redis.url()).await), 48).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_grants_as_the_embedded_ledger() {
    let cluster = RedisCluster::start();
    check(Some(connect(cluster.url()).await), 24).await;
}

/// The ledger key is the limiter's own, role `q`: same hash tag (so the
/// same Redis Cluster slot as the limiter's RLS state), its own key.
#[test]
fn the_ledger_key_shares_the_limiters_slot() {
    use tollgate::storage::keys::{KeyBuilder, Role};
    let entries = vec![("tenant".to_string(), "acme".to_string())];
    let call = LeaseCall {
        domain: "edge",
        entries: &entries,
        algorithm: Algorithm::FixedWindow,
        window: Unit::Second.into(),
        holder: "r.1",
        report: Report {
            requests: 1,
            elapsed_secs: 5,
        },
        terms: Terms {
            capacity: 60,
            fill_secs: 60,
            hold_micros: 16_000_000,
        },
        counted: None,
    };
    let keys = KeyBuilder::default().limiter(&call.limiter());
    let lease = keys.key(Role::Lease);
    let state = keys.key(Role::State);
    assert_ne!(lease, state);
    assert!(lease.contains(":q:edge:tenant=acme"), "{lease}");
    let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_string();
    assert_eq!(tag(&lease), tag(&state));
    assert_eq!(
        tollgate::storage::keys::slot_of(&lease),
        tollgate::storage::keys::slot_of(&state)
    );
}

/// Each limit of a `rate_limits:` list keeps its own ledger, told apart
/// as their counts are (algorithm and window), and the limit's own hits
/// (`Hit::ledger`, through which a reset forgets it), sharded or not, find
/// the ledger its lease calls keep.
#[test]
fn each_limit_has_its_ledger_and_its_hits_find_it() {
    use tollgate::storage::keys::{KeyBuilder, Role};
    use tollgate::storage::{Ahead, Hit, Shard};
    let entries = vec![("tenant".to_string(), "acme".to_string())];
    let keys = KeyBuilder::default();
    let window = Unit::Minute.into();
    let call = |algorithm| LeaseCall {
        domain: "edge",
        entries: &entries,
        algorithm,
        window,
        holder: "r.1",
        report: Report {
            requests: 1,
            elapsed_secs: 5,
        },
        terms: Terms {
            capacity: 60,
            fill_secs: 60,
            hold_micros: 16_000_000,
        },
        counted: None,
    };
    let hit = |algorithm, shard| Hit {
        domain: "edge",
        entries: &entries,
        algorithm,
        limit: 60,
        window,
        hits: 1,
        negative: false,
        usage_reports: true,
        buckets: 10,
        burst: 5,
        shard,
        receipt: true,
        also: &[],
        lease: true,
        ahead: Ahead::NONE,
    };
    let all = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
    ];
    let mut seen = Vec::new();
    for algorithm in all {
        let lease = keys.limiter(&call(algorithm).limiter()).key(Role::Lease);
        let local = keys.local(&call(algorithm).limiter());
        for shard in [Shard::NONE, Shard { index: 1, count: 4 }] {
            let own = hit(algorithm, shard).ledger();
            assert_eq!(keys.limiter(&own).key(Role::Lease), lease, "{algorithm:?}");
            assert_eq!(keys.local(&own), local, "{algorithm:?}");
        }
        assert!(!seen.contains(&lease), "{lease} is another limit's ledger");
        seen.push(lease);
    }
}
