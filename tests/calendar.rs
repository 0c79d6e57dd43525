//! Calendar windows (`timezone:` on a rate limit): a day, week, month or
//! year of a time zone, renewed at its local boundary.
//!
//! Over real gRPC on the embedded store, Redis and a 3+3 Redis Cluster,
//! every unit in zones east and west of UTC, one with a half-hour offset
//! and one in the southern hemisphere's summer time: the first answer's
//! `duration_until_reset` is the time to the next local boundary as
//! Python's `zoneinfo` computes it from the host's tz database (an oracle
//! independent of tollgate's bundled one and of its arithmetic), and
//! exactly the limit is admitted. On a `ManualClock`, the embedded store
//! across two daylight-saving changes and a month end: the window changes
//! at the local boundary, not a microsecond before or after, and counts
//! start over there.

mod support;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use support::redis::{RedisCluster, RedisServer};
use support::tollgate::{Tollgate, descriptor};
use support::unique_domain;
use tollgate::clock::ManualClock;
use tollgate::limit::{Algorithm, Unit, Window, Zone};
use tollgate::storage::{Decision, Hit, MemoryStore, Shard, Store};

/// East of UTC, west of it, a half-hour offset, and a zone in its summer
/// time in November (and in winter time in June).
const ZONES: [&str; 5] = [
    "Europe/Berlin",
    "America/New_York",
    "Asia/Kolkata",
    "Australia/Adelaide",
    "Pacific/Auckland",
];
const UNITS: [&str; 4] = ["day", "week", "month", "year"];
const LIMIT: u64 = 3;

fn rules(domain: &str) -> String {
    let mut text = format!("domain: {domain}\ndescriptors:\n");
    for zone in ZONES {
        text.push_str(&format!(
            "  - key: zone\n    value: {zone}\n    descriptors:\n"
        ));
        for unit in UNITS {
            text.push_str(&format!(
                "      - key: unit\n        value: {unit}\n        rate_limit: \
                 {{unit: {unit}, requests_per_unit: {LIMIT}, timezone: {zone}}}\n"
            ));
        }
    }
    // A monthly budget charged only by requests answered OK, next to a
    // per-user limit that refuses.
    text.push_str(
        "  - key: budget\n    rate_limit: {unit: month, requests_per_unit: 10, \
         timezone: Asia/Kolkata, count_refused: false}\n  - key: user\n    \
         rate_limit: {unit: hour, requests_per_unit: 1, algorithm: fixed_window}\n",
    );
    // A monthly budget split over three shards (three slots on a
    // cluster), and one taking costs reported after the response.
    text.push_str(
        "  - key: sharded\n    rate_limit: {unit: month, requests_per_unit: 6, \
         timezone: Pacific/Auckland, shards: 3}\n  - key: reported\n    \
         rate_limit: {unit: week, requests_per_unit: 10, timezone: America/New_York, \
         usage_reports: true}\n",
    );
    // A ban answers the time to the local boundary too; a limit many
    // callers hit at once (queued behind each other on Redis) admits
    // exactly its limit.
    text.push_str(
        "  - key: banned\n    rate_limit: {unit: year, requests_per_unit: 0, \
         timezone: Australia/Adelaide}\n  - key: busy\n    rate_limit: {unit: day, \
         requests_per_unit: 10, timezone: Asia/Kolkata}\n",
    );
    // An epoch-aligned day next to the calendar ones: its own counter.
    text.push_str(&format!(
        "  - key: plain\n    rate_limit: {{unit: day, requests_per_unit: {LIMIT}, \
         algorithm: fixed_window}}\n"
    ));
    text
}

/// Seconds since the epoch of the next local boundary of `unit` after
/// `at` in each `(zone, unit)`, by Python's `zoneinfo` on the host's
/// database.
fn oracle(at: f64, cases: &[(&str, &str)]) -> Vec<f64> {
    const SCRIPT: &str = r#"
import sys
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo
at = float(sys.argv[1])
for arg in sys.argv[2:]:
    name, unit = arg.split(",")
    zone = ZoneInfo(name)
    d = datetime.fromtimestamp(at, zone).date()
    if unit == "day":
        n = d + timedelta(days=1)
    elif unit == "week":
        n = d + timedelta(days=7 - d.weekday())
    elif unit == "month":
        n = date(d.year + 1, 1, 1) if d.month == 12 else date(d.year, d.month + 1, 1)
    else:
        n = date(d.year + 1, 1, 1)
    print(datetime(n.year, n.month, n.day, tzinfo=zone).timestamp())
"#;
    let mut args = vec!["-c".to_string(), SCRIPT.to_string(), at.to_string()];
    args.extend(cases.iter().map(|(z, u)| format!("{z},{u}")));
    let out = Command::new("python3")
        .args(&args)
        .output()
        .expect("python3 (with zoneinfo and /usr/share/zoneinfo) is the oracle");
    assert!(
        out.status.success(),
        "python3 oracle failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<f64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(lines.len(), cases.len());
    lines
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Every calendar rule on one store: the first answer's reset equals the
/// time to the next local boundary within a second, exactly the limit is
/// admitted, and the refusals carry the same reset.
async fn calendar_windows(settings: &[(&str, &str)]) {
    let domain = unique_domain("calendar");
    let t = Arc::new(Tollgate::start(&[("r.yaml", &rules(&domain))], settings).await);
    t.wait_serving(Duration::from_secs(30)).await;
    let cases: Vec<(&str, &str)> = ZONES
        .iter()
        .flat_map(|z| UNITS.iter().map(move |u| (*z, *u)))
        .collect();
    let at = now_secs();
    let boundaries = oracle(at, &cases);
    let mut failures = Vec::new();
    for ((zone, unit), boundary) in cases.iter().zip(boundaries) {
        let ask = || RateLimitRequest {
            domain: domain.clone(),
            descriptors: vec![descriptor(&[("zone", zone), ("unit", unit)])],
            hits_addend: 0,
        };
        let mut admitted = 0;
        for i in 0..LIMIT + 2 {
            let sent = now_secs();
            let r = t.ask(ask()).await;
            let s = &r.statuses[0];
            let reset = s.duration_until_reset.as_ref().expect("a reset");
            let reset = reset.seconds as f64 + f64::from(reset.nanos) / 1e9;
            let expected = boundary - sent;
            if i == 0 && (reset - expected).abs() > 1.0 {
                failures.push(format!(
                    "{zone} {unit}: reset {reset:.3} s, expected {expected:.3} s (boundary {boundary})"
                ));
            }
            if i > 0 && (reset - expected).abs() > 2.0 {
                failures.push(format!("{zone} {unit}: answer {i} reset {reset:.3} s"));
            }
            if r.overall_code == Code::Ok as i32 {
                admitted += 1;
            }
        }
        if admitted != LIMIT {
            failures.push(format!("{zone} {unit}: {admitted} admitted of {LIMIT}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // The plain day is the epoch-aligned one, with a counter of its own.
    let plain = RateLimitRequest {
        domain: domain.clone(),
        descriptors: vec![descriptor(&[("plain", "x")])],
        hits_addend: 0,
    };
    let r = t.ask(plain).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, LIMIT as u32 - 1);
    let reset = r.statuses[0].duration_until_reset.as_ref().unwrap().seconds as f64;
    let expected = 86_400.0 - now_secs() % 86_400.0;
    assert!((reset - expected).abs() <= 1.0, "{reset} vs {expected}");

    // count_refused: false takes back the budget's hit of a request the
    // user limit refused: 10 - 2 admitted, not 10 - 3 counted.
    let both = RateLimitRequest {
        domain: domain.clone(),
        descriptors: vec![descriptor(&[("budget", "b")]), descriptor(&[("user", "u")])],
        hits_addend: 0,
    };
    assert_eq!(t.ask(both.clone()).await.overall_code, Code::Ok as i32);
    assert_eq!(t.ask(both).await.overall_code, Code::OverLimit as i32);
    let budget = RateLimitRequest {
        domain: domain.clone(),
        descriptors: vec![descriptor(&[("budget", "b")])],
        hits_addend: 0,
    };
    let r = t.ask(budget).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(
        r.statuses[0].limit_remaining, 8,
        "the refused request's hit taken back"
    );

    // Sharded: exactly the limit over the shards, each answer's reset the
    // month's end.
    let month_end = oracle(
        now_secs(),
        &[("Pacific/Auckland", "month"), ("America/New_York", "week")],
    );
    let mut admitted = 0;
    for _ in 0..9 {
        let sent = now_secs();
        let r = t
            .ask(RateLimitRequest {
                domain: domain.clone(),
                descriptors: vec![descriptor(&[("sharded", "s")])],
                hits_addend: 0,
            })
            .await;
        let reset = r.statuses[0].duration_until_reset.as_ref().unwrap().seconds as f64;
        assert!(
            (reset - (month_end[0] - sent)).abs() <= 2.0,
            "sharded reset {reset}"
        );
        admitted += u64::from(r.overall_code == Code::Ok as i32);
    }
    assert_eq!(
        admitted, 6,
        "a sharded calendar limit admits exactly its limit"
    );
    // A report of 15 takes the week over; checks are refused until the
    // week ends in New York.
    let mut report = descriptor(&[("reported", "r")]);
    report.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 15 });
    let reported = |d| RateLimitRequest {
        domain: domain.clone(),
        descriptors: vec![d],
        hits_addend: 0,
    };
    assert_eq!(
        t.ask(reported(report)).await.overall_code,
        Code::OverLimit as i32
    );
    let sent = now_secs();
    let r = t.ask(reported(descriptor(&[("reported", "r")]))).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let reset = r.statuses[0].duration_until_reset.as_ref().unwrap().seconds as f64;
    assert!(
        (reset - (month_end[1] - sent)).abs() <= 2.0,
        "reported reset {reset}"
    );

    let ends = oracle(
        now_secs(),
        &[("Australia/Adelaide", "year"), ("Asia/Kolkata", "day")],
    );
    let sent = now_secs();
    let r = t
        .ask(RateLimitRequest {
            domain: domain.clone(),
            descriptors: vec![descriptor(&[("banned", "x")])],
            hits_addend: 0,
        })
        .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let reset = r.statuses[0].duration_until_reset.as_ref().unwrap().seconds as f64;
    assert!((reset - (ends[0] - sent)).abs() <= 2.0, "ban reset {reset}");
    let callers: Vec<_> = (0..24)
        .map(|_| {
            let t = t.clone();
            let req = RateLimitRequest {
                domain: domain.clone(),
                descriptors: vec![descriptor(&[("busy", "x")])],
                hits_addend: 0,
            };
            tokio::spawn(async move { t.ask(req).await })
        })
        .collect();
    let mut admitted = 0;
    for c in callers {
        let r = c.await.unwrap();
        let reset = r.statuses[0].duration_until_reset.as_ref().unwrap().seconds as f64;
        assert!(
            (reset - (ends[1] - now_secs())).abs() <= 5.0,
            "busy reset {reset}"
        );
        admitted += u64::from(r.overall_code == Code::Ok as i32);
    }
    assert_eq!(admitted, 10, "24 callers at once on a limit of 10");

    // `/rlconfig` shows the zone.
    let (status, page) = support::http_get(t.debug, "/rlconfig").await;
    assert_eq!(status, 200);
    assert!(
        page.contains(&format!("{LIMIT}/month in Pacific/Auckland fixed_window")),
        "{page}"
    );
    Arc::into_inner(t).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_windows_on_the_embedded_store() {
    calendar_windows(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_windows_on_redis() {
    let redis = RedisServer::start();
    calendar_windows(&[("store", &redis.url())]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_windows_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    calendar_windows(&[("store", &cluster.url())]).await;
}

/// The Redis script picks among the boundaries it is given by the
/// server's clock: a window ending 1.5 s after the server's `now` refuses
/// past its limit until then, and the next window counts afresh, with
/// its own reset; an undo takes back only from the window it recorded in.
#[test]
fn the_script_picks_the_window_by_the_servers_clock() {
    let redis = RedisServer::start();
    let script = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua/fixed_window.lua"),
    )
    .unwrap();
    let server_now = || {
        let t: Vec<u64> = redis
            .cli(&["TIME"])
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect();
        t[0] * SECOND + t[1]
    };
    let now = server_now();
    let bounds = [
        now - 20 * SECOND,
        now - 10 * SECOND,
        now + 1_500_000,
        now + 100 * SECOND,
    ];
    let b: Vec<String> = bounds.iter().map(u64::to_string).collect();
    // limit 2, calendar, 1 hit, mode, receipts.
    let call = |extra: &[&str], mode: &str| -> Vec<i64> {
        let mut args = vec!["EVAL", &script, "1", "cal", "2", "0", "1", mode, "2", "2"];
        args.extend(b.iter().map(String::as_str));
        args.extend(extra);
        redis
            .cli(&args)
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    };
    let first = call(&[], "0");
    // {admitted, remaining, reset, hits, window index, 0}
    assert_eq!(&first[..2], &[1, 1]);
    assert!(first[2] > 0 && first[2] <= 1_500_000, "{first:?}");
    assert_eq!(
        first[4] as u64,
        bounds[1] / SECOND,
        "the current window's index"
    );
    assert_eq!(call(&[], "0")[..2], [1, 0]);
    let refused = call(&[], "0");
    assert_eq!(refused[0], 0, "past the limit: {refused:?}");
    let wait = support::redis::wait_until;
    wait("the window's end", Duration::from_secs(10), || {
        server_now() >= bounds[2]
    });
    let next = call(&[], "0");
    assert_eq!(&next[..2], &[1, 1], "a new window counts afresh: {next:?}");
    let until_next = (bounds[3] - server_now()) as i64;
    assert!((next[2] - until_next).abs() < SECOND as i64, "{next:?}");
    assert_eq!(next[4] as u64, bounds[2] / SECOND);
    // An undo of the old window's receipt changes nothing; of this one's,
    // it takes the hit back.
    let undo = |at: &str| call(&[at, "0"], "2");
    let old = (bounds[1] / SECOND).to_string();
    assert_eq!(undo(&old), [1]);
    assert_eq!(call(&[], "0")[..2], [1, 0]);
    let current = (bounds[2] / SECOND).to_string();
    assert_eq!(undo(&current), [1]);
    assert_eq!(call(&[], "0")[..2], [1, 0], "one hit taken back");
}

// ---- On a clock the test holds. ----

const SECOND: u64 = 1_000_000;
const HOUR: u64 = 3_600 * SECOND;

/// Local midnights in Berlin, as instants (seconds since the epoch).
/// 2026-03-29: clocks go forward at 02:00 (a 23-hour day); 2026-10-25:
/// back at 03:00 (a 25-hour day).
const MAR_29: u64 = 1_774_738_800; // 2026-03-28T23:00:00Z
const MAR_30: u64 = MAR_29 + 23 * 3_600; // 2026-03-29T22:00:00Z
const APR_1: u64 = MAR_30 + 2 * 86_400; // 2026-03-31T22:00:00Z
const OCT_25: u64 = 1_792_879_200; // 2026-10-24T22:00:00Z
const OCT_26: u64 = OCT_25 + 25 * 3_600; // 2026-10-25T23:00:00Z

struct Fixture {
    clock: ManualClock,
    store: MemoryStore,
    entries: Vec<(String, String)>,
    window: Window,
}

impl Fixture {
    fn new(unit: Unit) -> Fixture {
        let clock = ManualClock::at_micros(0);
        let zone = Zone::named("Europe/Berlin").unwrap();
        Fixture {
            store: MemoryStore::new(Arc::new(clock.clone())),
            clock,
            entries: vec![("user".into(), "alice".into())],
            window: Window::calendar(unit, zone).unwrap(),
        }
    }

    async fn hit_at(&self, micros: u64, hits: u64) -> Decision {
        self.clock.set_micros(micros);
        self.store
            .hit(Hit {
                domain: "calendar",
                entries: &self.entries,
                algorithm: Algorithm::FixedWindow,
                limit: LIMIT,
                window: self.window,
                hits,
                negative: false,
                usage_reports: false,
                buckets: 2,
                burst: 0,
                shard: Shard::NONE,
                receipt: false,
                also: &[],
                lease: false,
                ahead: tollgate::storage::Ahead::NONE,
            })
            .await
            .expect("the embedded store always answers")
    }

    /// Fills the window holding `at` to its limit (one refusal past it)
    /// and checks every answer's reset is `until` the boundary.
    async fn fill(&self, at: u64, boundary: u64) {
        for i in 0..LIMIT {
            let d = self.hit_at(at, 1).await;
            assert!(d.admitted, "hit {i} at {at}");
            assert_eq!(d.remaining, LIMIT - 1 - i);
            assert_eq!(d.reset_micros, boundary - at, "at {at}");
        }
        let d = self.hit_at(at, 1).await;
        assert!(!d.admitted, "past the limit at {at}");
        assert_eq!(d.reset_micros, boundary - at);
    }
}

/// A day across both of Berlin's daylight-saving changes: 23 hours in
/// March, 25 in October; the window ends exactly at the next local
/// midnight and the count starts over there.
#[tokio::test]
async fn days_across_daylight_saving_changes_on_a_manual_clock() {
    let f = Fixture::new(Unit::Day);
    for (midnight, next, hours) in [(MAR_29, MAR_30, 23), (OCT_25, OCT_26, 25)] {
        let (start, end) = (midnight * SECOND, next * SECOND);
        assert_eq!(end - start, hours * HOUR);
        // The first hit of the day sees the whole day ahead.
        let d = f.hit_at(start, 1).await;
        assert!(d.admitted);
        assert_eq!(d.reset_micros, hours * HOUR, "{hours}-hour day");
        f.hit_at(start + 3 * HOUR, 1).await;
        f.hit_at(end - 1, 1).await;
        // Full through the last microsecond of the day.
        let d = f.hit_at(end - 1, 1).await;
        assert!(!d.admitted);
        assert_eq!(d.reset_micros, 1);
        // At the boundary, a fresh day.
        let d = f.hit_at(end, 1).await;
        assert!(d.admitted, "the count starts over at local midnight");
        assert_eq!(d.remaining, LIMIT - 1);
        assert_eq!(d.reset_micros, 24 * HOUR);
    }
}

/// A month ends at local midnight of the 1st (22:00 UTC in Berlin's
/// summer time), after a 23-hour day within it; a week on Monday.
#[tokio::test]
async fn a_month_end_and_a_week_on_a_manual_clock() {
    let f = Fixture::new(Unit::Month);
    // 2026-03-31 23:59:59 local, the month's last second.
    let last = APR_1 * SECOND - SECOND;
    f.fill(MAR_29 * SECOND, APR_1 * SECOND).await;
    let d = f.hit_at(last, 1).await;
    assert!(!d.admitted);
    assert_eq!(d.reset_micros, SECOND);
    let d = f.hit_at(APR_1 * SECOND, 1).await;
    assert!(d.admitted, "April counts afresh");
    assert_eq!(d.remaining, LIMIT - 1);
    // April has 30 days, all in summer time.
    assert_eq!(d.reset_micros, 30 * 24 * HOUR);

    // Sunday 29 March is in the week from Monday the 23rd to Monday the
    // 30th (local midnight, already in summer time).
    let w = Fixture::new(Unit::Week);
    w.fill(MAR_29 * SECOND, MAR_30 * SECOND).await;
    let d = w.hit_at(MAR_30 * SECOND, 1).await;
    assert!(d.admitted, "a new week on Monday");
    assert_eq!(d.reset_micros, 7 * 24 * HOUR);
}

/// A calendar window and an epoch-aligned one of the same length, or the
/// same unit in two zones, never share a counter.
#[tokio::test]
async fn calendar_limiters_are_their_own() {
    let clock = ManualClock::at_micros(MAR_29 * SECOND + 12 * HOUR);
    let store = MemoryStore::new(Arc::new(clock.clone()));
    let entries = vec![("user".to_string(), "bob".to_string())];
    let windows = [
        Window::of(Unit::Day),
        Window::calendar(Unit::Day, Zone::named("Europe/Berlin").unwrap()).unwrap(),
        Window::calendar(Unit::Day, Zone::named("Europe/Paris").unwrap()).unwrap(),
    ];
    for window in windows {
        let d = store
            .hit(Hit {
                domain: "calendar",
                entries: &entries,
                algorithm: Algorithm::FixedWindow,
                limit: 1,
                window,
                hits: 1,
                negative: false,
                usage_reports: false,
                buckets: 2,
                burst: 0,
                shard: Shard::NONE,
                receipt: false,
                also: &[],
                lease: false,
                ahead: tollgate::storage::Ahead::NONE,
            })
            .await
            .unwrap();
        assert!(d.admitted, "{window}: a counter of its own");
    }
}
