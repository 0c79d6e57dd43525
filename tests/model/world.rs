//! The world a case runs in: replicas (each its own engine and its own
//! layers, as `serve` builds them: leases, hot keys, shards, the
//! over-limit cache, the in-flight gate) over one shared backend, each
//! with a wall clock that can step and a store that can fail; and the
//! traffic and faults a case is made of.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use tollgate::clock::Clock;
use tollgate::engine::{Descriptor, Engine, EngineOptions, LimitOverride, Request, RulesHandle};
use tollgate::limit::Unit;
use tollgate::quota;
use tollgate::rules::{LoadOptions, load_texts};
use tollgate::settings::{Settings, Sources};
use tollgate::storage::{
    BoxFuture, Coalescing, Cost, Decision, Hit, LeaseCall, Receipt, Store, StoreError,
};

use super::envoy::{EnvoyOp, EnvoySpec, QuotaServer};
use super::grammar::{KEYS, Rules, chance, pick};

/// A replica's wall clock: the world's time plus a step the case may
/// change. Its monotonic reading is the world's time: a step moves only
/// the wall.
pub struct StepClock {
    base: Arc<dyn Clock>,
    step: AtomicI64,
}

impl StepClock {
    fn new(base: Arc<dyn Clock>) -> Self {
        Self {
            base,
            step: AtomicI64::new(0),
        }
    }
}

impl Clock for StepClock {
    fn now_micros(&self) -> u64 {
        (self.base.now_micros() as i64 + self.step.load(Ordering::SeqCst)) as u64
    }

    fn monotonic_micros(&self) -> u64 {
        self.base.monotonic_micros()
    }
}

/// A replica's way to the shared store, failing a share of its calls:
/// half of them before the store saw the call, half after it was
/// recorded (a caller's deadline cutting a call already sent).
pub struct Faulty {
    inner: Arc<dyn Store>,
    percent: AtomicU8,
    /// Calls wait up to this long (Tokio's time) before they reach the
    /// store: callers interleave, and a call sent in the background (a
    /// lease given back) lands later on the virtual clock.
    slow_micros: AtomicU64,
    /// Calls wait exactly `slow_micros` (a scripted case's lag), not up
    /// to it.
    exact: AtomicBool,
    rng: Mutex<ChaCha8Rng>,
}

enum Fate {
    Pass,
    Before,
    After,
}

impl Faulty {
    fn fate(&self) -> Fate {
        let p = self.percent.load(Ordering::SeqCst) as u64;
        if p == 0 {
            return Fate::Pass;
        }
        let roll = self.rng.lock().unwrap().next_u64() % 200;
        if roll < p {
            Fate::Before
        } else if roll < 2 * p {
            Fate::After
        } else {
            Fate::Pass
        }
    }

    async fn delay(&self) {
        let most = self.slow_micros.load(Ordering::SeqCst);
        if most > 0 {
            let wait = if self.exact.load(Ordering::SeqCst) {
                most
            } else {
                self.rng.lock().unwrap().next_u64() % most
            };
            tokio::time::sleep(Duration::from_micros(wait)).await;
        }
    }

    /// The call is made only once its wait is over and its fate drawn
    /// (`call` builds it then): the embedded store does its work when a
    /// call is made, not when it is awaited, so a call made early would
    /// land before its wait and be recorded even when failed "before".
    async fn run<T, F>(&self, call: impl FnOnce() -> F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        self.delay().await;
        match self.fate() {
            Fate::Pass => call().await,
            Fate::Before => Err(StoreError::Unavailable("the model failed this call".into())),
            Fate::After => {
                let _ = call().await;
                Err(StoreError::Timeout(1))
            }
        }
    }
}

impl Store for Faulty {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(self.run(move || self.inner.hit(hit)))
    }

    fn hit_batch<'a>(
        &'a self,
        hit: Hit<'a>,
        more: &'a [Cost],
    ) -> BoxFuture<'a, Result<Vec<Decision>, StoreError>> {
        Box::pin(self.run(move || self.inner.hit_batch(hit, more)))
    }

    fn lease<'a>(&'a self, call: LeaseCall<'a>) -> BoxFuture<'a, Result<quota::Grant, StoreError>> {
        // A lease call cut after its write is a known gap (README's
        // Guarantees: RLQS is promised under store errors before the
        // write only): the ledger holds the new share while the stream
        // falls back to its last assignment, which Envoy keeps spending
        // unreserved. `TOLLGATE_MODEL_LEASE_CUTS=1` puts it back.
        if std::env::var("TOLLGATE_MODEL_LEASE_CUTS").is_err() {
            return Box::pin(async move {
                self.delay().await;
                match self.fate() {
                    Fate::Pass => self.inner.lease(call).await,
                    _ => Err(StoreError::Unavailable("the model failed this call".into())),
                }
            });
        }
        Box::pin(self.run(move || self.inner.lease(call)))
    }

    fn undo<'a>(&'a self, hit: Hit<'a>, receipt: Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.run(move || self.inner.undo(hit, receipt)))
    }

    fn reset<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        // Slow, never failing: a reset that fails is retried by its
        // caller.
        Box::pin(async move {
            self.delay().await;
            self.inner.reset(hit).await
        })
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}

/// The embedded store shared by a case's replicas, standing in for a
/// Redis they share: a reset through any replica moves the generation
/// every replica reads ([`Store::reset_generation`]), as Redis's reset
/// counter does (there read every poll; here at once).
pub struct Shared {
    inner: Arc<dyn Store>,
    generation: AtomicU64,
}

impl Shared {
    pub fn new(inner: Arc<dyn Store>) -> Shared {
        Shared {
            inner,
            generation: AtomicU64::new(0),
        }
    }
}

impl Store for Shared {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        self.inner.hit(hit)
    }

    fn hit_batch<'a>(
        &'a self,
        hit: Hit<'a>,
        more: &'a [Cost],
    ) -> BoxFuture<'a, Result<Vec<Decision>, StoreError>> {
        self.inner.hit_batch(hit, more)
    }

    fn reset<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let done = self.inner.reset(hit).await;
            self.generation.fetch_add(1, Ordering::AcqRel);
            done
        })
    }

    fn reset_generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}

pub struct Replica {
    pub clock: Arc<StepClock>,
    pub faults: Arc<Faulty>,
    pub engine: Engine,
    /// Its quota service (RLQS), over in-memory gRPC.
    pub quota: QuotaServer,
}

/// What a case's replicas share.
pub struct World {
    pub clock: Arc<dyn Clock>,
    pub backend: Arc<dyn Store>,
    pub settings: Settings,
    pub rules: Rules,
    pub replicas: Vec<Replica>,
    seed: u64,
    /// Each replica queues hits of one limiter behind the call in flight
    /// for it ([`Coalescing`], as `serve` does on Redis).
    coalesce: bool,
}

pub fn settings() -> Settings {
    Settings::load(&Sources::default()).expect("the default settings load")
}

pub fn load(rules: &Rules) -> Result<tollgate::rules::RuleSet, String> {
    load_texts(
        vec![("model.yaml".into(), rules.yaml())],
        &LoadOptions::default(),
    )
    .map_err(|e| e.to_string())
}

impl World {
    pub fn new(
        clock: Arc<dyn Clock>,
        backend: Arc<dyn Store>,
        rules: Rules,
        replicas: usize,
        seed: u64,
        coalesce: bool,
    ) -> World {
        let mut w = World {
            clock,
            backend,
            settings: settings(),
            rules,
            replicas: Vec::new(),
            seed,
            coalesce,
        };
        for i in 0..replicas {
            let r = w.replica(i as u64);
            w.replicas.push(r);
        }
        w
    }

    /// A replica freshly started: new layers (no leases, no cache), the
    /// rules loaded anew.
    fn replica(&self, salt: u64) -> Replica {
        let clock = Arc::new(StepClock::new(self.clock.clone()));
        let faults = Arc::new(Faulty {
            inner: self.backend.clone(),
            percent: AtomicU8::new(0),
            slow_micros: AtomicU64::new(0),
            exact: AtomicBool::new(false),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(
                self.seed ^ salt.wrapping_mul(0x9e37_79b9),
            )),
        });
        // Coalescing above the way to the store, as `serve` wraps Redis.
        let below: Arc<dyn Store> = if self.coalesce {
            Arc::new(Coalescing::new(faults.clone()))
        } else {
            faults.clone()
        };
        let store = tollgate::server::layers(below, &self.settings, clock.clone());
        let rules = RulesHandle::new(load(&self.rules).expect("the case's rules load"));
        let engine = Engine::new(rules, store, clock.clone(), EngineOptions::default());
        let quota = QuotaServer::start(engine.clone(), &self.settings);
        Replica {
            clock,
            faults,
            engine,
            quota,
        }
    }

    pub fn crash(&mut self, i: usize, salt: u64) {
        let fresh = self.replica(salt);
        self.replicas[i] = fresh;
    }

    pub fn reload(&self, i: usize) {
        let set = load(&self.rules).expect("the case's rules load");
        self.replicas[i].engine.rules().replace(set);
    }

    pub fn step(&self, i: usize, micros: i64) {
        self.replicas[i]
            .clock
            .step
            .fetch_add(micros, Ordering::SeqCst);
    }

    pub fn faults(&self, i: usize, percent: u8) {
        self.replicas[i]
            .faults
            .percent
            .store(percent, Ordering::SeqCst);
    }

    /// Whether replica `i`'s store calls may fail or outlive their
    /// deadline now: an answer may then come from `on_store_error`.
    pub fn failing(&self, i: usize) -> bool {
        let f = &self.replicas[i].faults;
        f.percent.load(Ordering::SeqCst) > 0 || f.slow_micros.load(Ordering::SeqCst) > 0
    }

    pub fn slow(&self, i: usize, micros: u64) {
        self.replicas[i].faults.exact.store(false, Ordering::SeqCst);
        self.replicas[i]
            .faults
            .slow_micros
            .store(micros, Ordering::SeqCst);
    }

    /// The replica's store calls wait exactly this long from now on.
    pub fn lag(&self, i: usize, micros: u64) {
        self.slow(i, micros);
        self.replicas[i].faults.exact.store(true, Ordering::SeqCst);
    }
}

#[derive(Debug, Clone)]
pub struct Desc {
    pub key: String,
    pub value: String,
    pub hits: Option<u64>,
    pub negative: bool,
    /// The request's own limit for it (`RateLimitOverride`): requests per
    /// unit, and the unit.
    pub limit: Option<(u32, &'static str)>,
}

/// The unit of an override as the engine takes it.
pub fn unit_of(name: &str) -> Unit {
    match name {
        "second" => Unit::Second,
        "minute" => Unit::Minute,
        _ => Unit::Day,
    }
}

#[derive(Debug, Clone)]
pub struct Req {
    pub hits: u64,
    pub descriptors: Vec<Desc>,
}

impl Req {
    pub fn request(&self, domain: &str) -> Request {
        Request {
            domain: domain.to_string(),
            descriptors: self
                .descriptors
                .iter()
                .map(|d| Descriptor {
                    entries: vec![(d.key.clone(), d.value.clone())],
                    limit_override: d.limit.map(|(n, unit)| LimitOverride {
                        requests_per_unit: n,
                        unit: unit_of(unit),
                    }),
                    hits: d.hits,
                    negative: d.negative,
                })
                .collect(),
            hits: self.hits,
            deadline: None,
        }
    }

    /// The rule each descriptor matches (an override matches none), and
    /// the limit names those rules replace across the request.
    pub fn matched<'r>(&self, rules: &'r Rules) -> (Vec<Option<usize>>, Vec<&'r str>) {
        let matched: Vec<Option<usize>> = self
            .descriptors
            .iter()
            .map(|d| match d.limit {
                Some(_) => None,
                None => rules.find(&d.key, &d.value),
            })
            .collect();
        let replaced = matched
            .iter()
            .flatten()
            .flat_map(|&r| rules.rules[r].replaces.iter().map(String::as_str))
            .collect();
        (matched, replaced)
    }

    /// What a descriptor costs: its own `hits_addend`, else the request's
    /// (0 counts as 1).
    pub fn cost(&self, d: &Desc) -> u64 {
        d.hits.unwrap_or(if self.hits == 0 { 1 } else { self.hits })
    }
}

#[derive(Debug, Clone)]
pub enum Op {
    /// Time passes (the virtual clock; on the real one, a short sleep).
    Advance(u64),
    Ask(usize, Req),
    /// Callers on one replica at once.
    Together(usize, Vec<Call>),
    Reset(usize, String, String),
    Reload(usize),
    /// The replica stops (its leases and cache lost) and starts again.
    Crash(usize),
    /// The replica's wall clock steps by this many microseconds.
    Step(usize, i64),
    /// This share (in half-percents) of the replica's store calls fail
    /// from now on.
    Faults(usize, u8),
    /// The replica's store calls take up to this long from now on.
    Slow(usize, u64),
    /// One client's calls a millisecond apart: a client at its limit.
    Flood(usize, Req, usize),
    /// Something happens to an Envoy (RLQS).
    Envoy(usize, EnvoyOp),
    /// An ask whose release comes later (as Envoy's stream-done call
    /// comes for every request, refused ones too): the pair's id.
    Take(usize, Req, u64),
    /// The release of take `id`: its descriptors as negative hits of
    /// their costs.
    Done(usize, Req, u64),
}

/// A case's traffic: most descriptors on a hot value of each key.
pub struct Traffic {
    hot: Vec<(String, String)>,
    /// Draws added to the grammar later (when concurrent callers come),
    /// from a generator of their own: the case's generator draws what it
    /// drew before, so seeds found earlier replay their cases.
    side: ChaCha8Rng,
    /// Envoy-like pairs of a take and its release (limits in flight,
    /// added later still): a generator of their own again.
    pairs: ChaCha8Rng,
}

impl Traffic {
    pub fn new(rng: &mut ChaCha8Rng, rules: &Rules) -> Traffic {
        let hot = KEYS
            .iter()
            .map(|k| (k.to_string(), rules.value(rng, k)))
            .filter(|(_, v)| v.len() < 100)
            .collect::<Vec<_>>();
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&hot, &mut h);
        let side = ChaCha8Rng::seed_from_u64(std::hash::Hasher::finish(&h));
        std::hash::Hash::hash("pairs", &mut h);
        let pairs = ChaCha8Rng::seed_from_u64(std::hash::Hasher::finish(&h));
        Traffic { hot, side, pairs }
    }

    fn req(&mut self, rng: &mut ChaCha8Rng, rules: &Rules) -> Req {
        let n = 1 + pick(rng, 3);
        let descriptors = (0..n)
            .map(|_| {
                let key = KEYS[pick(rng, KEYS.len())];
                let hot = self
                    .hot
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.as_str());
                let negative = chance(rng, 4);
                Desc {
                    key: key.to_string(),
                    value: rules.value_of(rng, key, hot),
                    hits: if negative || chance(rng, 10) {
                        Some(pick(rng, 4) as u64)
                    } else {
                        None
                    },
                    negative,
                    limit: draw_override(&mut self.side, 8),
                }
            })
            .collect();
        Req {
            hits: [0, 0, 0, 0, 1, 2, 5][pick(rng, 7)],
            descriptors,
        }
    }

    /// One descriptor on a hot value: what a flooding client sends.
    fn hot(&mut self, rng: &mut ChaCha8Rng, rules: &Rules) -> Req {
        let (key, value) = self.reset(rng, rules);
        Req {
            hits: [0, 1, 2][pick(rng, 3)],
            descriptors: vec![Desc {
                key,
                value,
                hits: None,
                negative: false,
                limit: draw_override(&mut self.side, 10),
            }],
        }
    }

    fn reset(&self, rng: &mut ChaCha8Rng, rules: &Rules) -> (String, String) {
        let key = KEYS[pick(rng, KEYS.len())];
        let hot = self
            .hot
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str());
        (key.to_string(), rules.value_of(rng, key, hot))
    }

    fn call(&mut self, rng: &mut ChaCha8Rng, rules: &Rules) -> Call {
        if chance(rng, 8) {
            let (key, value) = self.reset(rng, rules);
            Call::Reset(0, key, value)
        } else {
            let req = self.req(rng, rules);
            // Half the callers come while the first ones' calls are in
            // flight (behind a slow store: coalesced, or waiting for a
            // lease, across a reset among them).
            if chance(&mut self.side, 50) {
                let later = [1_000, 50_000, 150_000, 1_000_000][pick(&mut self.side, 4)];
                Call::Later(later, req)
            } else {
                Call::Ask(req)
            }
        }
    }
}

/// A request's own limit for a descriptor, `percent` of the time: small
/// ones that clients reach, or a large one.
fn draw_override(side: &mut ChaCha8Rng, percent: u64) -> Option<(u32, &'static str)> {
    chance(side, percent).then(|| {
        (
            [1, 2, 5, 50][pick(side, 4)],
            ["second", "minute"][pick(side, 2)],
        )
    })
}

/// One caller's call among callers at once.
#[derive(Debug, Clone)]
pub enum Call {
    Ask(Req),
    /// An ask this many microseconds after the others began.
    Later(u64, Req),
    /// A reset this many microseconds after the others began.
    Reset(u64, String, String),
    /// This many microseconds after the others began, the replica's
    /// store calls take exactly the second figure from then on (a call
    /// already waiting keeps its wait): a scripted case's timing.
    Lag(u64, u64),
}

/// A case's traffic and faults: mostly requests, with time moving in
/// steps of a millisecond to a few seconds.
pub fn draw_ops(
    rng: &mut ChaCha8Rng,
    rules: &Rules,
    replicas: usize,
    len: usize,
) -> (Vec<Op>, Vec<EnvoySpec>) {
    let mut traffic = Traffic::new(rng, rules);
    let envoys = super::envoy::draw(rng, rules, &traffic.hot, replicas);
    // How fast time moves between calls: a case near its limits in
    // milliseconds, or one that spans many windows.
    let pace = [2_000, 10_000, 50_000, 300_000][pick(rng, 4)];
    let focus = pick(rng, 10);
    let mut ops = Vec::with_capacity(len);
    for _ in 0..len {
        let r = pick(rng, replicas);
        // Each case leans on one fault: its ops are drawn three times as
        // often, so that meetings of two rare events happen.
        let mut kind = pick(rng, 100);
        if kind >= 90 && chance(rng, 30) {
            kind = 90 + focus;
        }
        if !envoys.is_empty() && chance(rng, 6) {
            let (e, op) = super::envoy::draw_op(rng, rules, &envoys, replicas);
            ops.push(Op::Envoy(e, op));
            continue;
        }
        let op = match kind {
            0..=54 => Op::Ask(r, traffic.req(rng, rules)),
            55..=59 => Op::Flood(r, traffic.hot(rng, rules), 10 + pick(rng, 150)),
            60..=71 => Op::Together(
                r,
                (0..2 + pick(rng, 8))
                    .map(|_| traffic.call(rng, rules))
                    .collect(),
            ),
            // Envoys report every second: their cases span seconds.
            72..=89 if !envoys.is_empty() && chance(rng, 20) => {
                Op::Advance([300_000, 1_000_000, 2_500_000][pick(rng, 3)])
            }
            72..=89 if chance(rng, 3) => {
                Op::Advance([1_000_000, 3_000_000, 20_000_000][pick(rng, 3)])
            }
            72..=89 => Op::Advance(pace / 2 + rng.next_u64() % pace),
            90..=91 => {
                let (key, value) = traffic.reset(rng, rules);
                Op::Reset(r, key, value)
            }
            92 => Op::Reload(r),
            93 => Op::Crash(r),
            94..=95 => Op::Step(
                r,
                [-30_000_000, -1_500_000, -300_000, 400_000, 2_000_000][pick(rng, 5)],
            ),
            96..=97 => Op::Slow(r, [0, 0, 5_000, 300_000, 2_000_000][pick(rng, 5)]),
            _ => Op::Faults(r, [0, 0, 10, 40][pick(rng, 4)]),
        };
        ops.push(op);
    }
    if rules
        .rules
        .iter()
        .any(|r| r.limits.iter().any(|l| l.algorithm.releases()))
    {
        ops = pair(&mut traffic.pairs, ops, replicas);
    }
    (ops, envoys)
}

/// Envoy-like pairs, in cases with a limit in flight (from a generator
/// of their own): most asks become takes whose release follows a few ops
/// later (after the time those ops pass), whatever the take's answer;
/// now and then on another replica, and now and then lost.
fn pair(side: &mut ChaCha8Rng, ops: Vec<Op>, replicas: usize) -> Vec<Op> {
    let mut out = Vec::with_capacity(ops.len() * 2);
    // (position in `ops` after which it is sent, the release)
    let mut pending: Vec<(usize, Op)> = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        let op = match op {
            Op::Ask(r, req) if chance(side, 70) => {
                let id = i as u64;
                let release = Req {
                    hits: req.hits,
                    descriptors: req
                        .descriptors
                        .iter()
                        .filter(|d| !d.negative)
                        .map(|d| Desc {
                            hits: Some(req.cost(d)),
                            negative: true,
                            ..d.clone()
                        })
                        .collect(),
                };
                if !release.descriptors.is_empty() && !chance(side, 8) {
                    let to = if chance(side, 20) {
                        pick(side, replicas)
                    } else {
                        r
                    };
                    let after = i + [0, 1, 2, 4, 8, 16, 40][pick(side, 7)];
                    pending.push((after, Op::Done(to, release, id)));
                }
                Op::Take(r, req, id)
            }
            other => other,
        };
        out.push(op);
        let (now, later): (Vec<_>, Vec<_>) = pending.drain(..).partition(|(at, _)| *at <= i);
        pending = later;
        out.extend(now.into_iter().map(|(_, op)| op));
    }
    out.extend(pending.into_iter().map(|(_, op)| op));
    out
}
