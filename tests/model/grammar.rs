//! Random rule files from the whole rule grammar, and the model's own
//! reading of them: which rule and which limiter a descriptor meets. The
//! model matches as README describes (exact value, then wildcards in file
//! order, then the key-only rule), knowing nothing of `tollgate::rules`.

use std::fmt::Write;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::RngCore;
use rand_chacha::rand_core::SeedableRng;
use tollgate::guarantees::Features;
use tollgate::limit::algorithms::sliding_counter;
use tollgate::limit::{Algorithm, Window};
use tollgate::storage::keys;

/// The algorithms the case's generator draws from (`concurrency` is
/// drawn from a generator of its own, [`Concurrency`], so that the cases
/// drawn before it came replay).
pub const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
    Algorithm::TokenBucket,
];

/// Every algorithm a case may meet.
pub const DRAWN: [Algorithm; 5] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
    Algorithm::TokenBucket,
    Algorithm::Concurrency,
];

/// `max_duration`s drawn for a limit in flight: as written, and in
/// microseconds. The model's time moves by milliseconds to seconds
/// between calls: slots freed by their releases, by themselves, or held
/// across the whole case.
pub const MAX_DURATIONS: [(&str, u64); 4] = [
    ("200ms", 200_000),
    ("1s", 1_000_000),
    ("2s", 2_000_000),
    ("1m", 60_000_000),
];

pub fn pick(rng: &mut ChaCha8Rng, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

pub fn chance(rng: &mut ChaCha8Rng, percent: u64) -> bool {
    rng.next_u64() % 100 < percent
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    KeyOnly,
    Exact(String),
    /// `prefix/*`, its matches sharing one limiter when `shared`.
    Wildcard {
        prefix: String,
        shared: bool,
    },
}

#[derive(Debug, Clone)]
pub struct Limit {
    pub algorithm: Algorithm,
    pub limit: u64,
    /// The window in seconds: `unit` x `unit_multiplier`, or a day.
    pub unit: &'static str,
    pub multiplier: u64,
    pub buckets: Option<u64>,
    pub burst: Option<u64>,
    /// A calendar day in a zone a fixed offset from UTC (no daylight
    /// saving, so the model computes its boundaries itself).
    pub zone: Option<(&'static str, i64)>,
    pub name: String,
    /// `max_duration` (`concurrency`; on another algorithm, refused), as
    /// written and in microseconds.
    pub max_duration: Option<(&'static str, u64)>,
}

impl Limit {
    pub fn window_secs(&self) -> u64 {
        let unit = match self.unit {
            "second" => 1,
            "minute" => 60,
            _ => 86_400,
        };
        unit * self.multiplier
    }

    pub fn window_micros(&self) -> u64 {
        self.window_secs() * 1_000_000
    }

    /// Buckets of a counter (2 unless said).
    pub fn buckets(&self) -> u64 {
        self.buckets.unwrap_or(2)
    }

    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.limit)
    }

    /// How long a slot is held at most (`concurrency`).
    pub fn max_duration_micros(&self) -> u64 {
        self.max_duration.map_or(self.window_micros(), |(_, m)| m)
    }
}

#[derive(Debug, Clone)]
pub struct Rule {
    pub key: String,
    pub value: Value,
    /// One limit is `rate_limit`, more are a `rate_limits:` list.
    pub limits: Vec<Limit>,
    pub list: bool,
    pub shadow: bool,
    pub quota: bool,
    pub shards: u16,
    /// `lease: true` written.
    pub lease: bool,
    /// `lease: false` written; a rule that says neither leases where it
    /// may ([`Rule::leases`]), as the `lease` setting's default says.
    pub no_lease: bool,
    pub count_refused: Option<bool>,
    pub usage_reports: bool,
    pub replaces: Vec<String>,
    /// `on_store_error`: `error` (the default), `allow` or `deny`.
    pub on_store_error: Option<&'static str>,
}

impl Rule {
    /// Whether its limiters are decided from leases: it says `lease:
    /// true` (and loads), or it says nothing and may lease: every limit
    /// leasable, not a list, not sharded, no usage reports, no calendar
    /// window, counting refused requests.
    pub fn leases(&self) -> bool {
        self.lease
            || (!self.no_lease
                && !self.list
                && self.shards <= 1
                && !self.usage_reports
                && self.count_refused != Some(false)
                && self
                    .limits
                    .iter()
                    .all(|l| LEASABLE.contains(&l.algorithm) && l.zone.is_none()))
    }

    pub fn features(&self, limit: &Limit, rlqs: bool) -> Features {
        Features {
            algorithm: limit.algorithm,
            shadow: self.shadow,
            lease: self.leases(),
            rlqs,
            shards: self.shards,
            calendar: limit.zone.is_some(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Rules {
    pub domain: String,
    pub rules: Vec<Rule>,
}

pub const KEYS: [&str; 3] = ["api_key", "files", "tenant"];

/// The algorithms `lease: true` applies to (on the others, load refuses
/// it, and the grammar draws that now and then).
const LEASABLE: [Algorithm; 4] = [
    Algorithm::FixedWindow,
    Algorithm::TokenBucket,
    Algorithm::SlidingWindowCounter,
    Algorithm::SlidingWindowLog,
];

fn draw_limit(rng: &mut ChaCha8Rng, index: usize, taken: &[Limit], leases: bool) -> Limit {
    loop {
        let algorithm = if leases && chance(rng, 80) {
            LEASABLE[pick(rng, LEASABLE.len())]
        } else {
            ALGORITHMS[pick(rng, 4)]
        };
        let (unit, multiplier) = match pick(rng, 6) {
            0..=2 => ("second", 1 + pick(rng, 3) as u64),
            3 | 4 => ("minute", 1),
            _ => ("day", 1),
        };
        let zone =
            (unit == "day" && algorithm == Algorithm::FixedWindow && chance(rng, 70)).then(|| {
                [
                    ("Etc/GMT-2", 2 * 3600),
                    ("UTC", 0),
                    ("Etc/GMT+5", -5 * 3600),
                ][pick(rng, 3)]
            });
        // A lease reserves ahead only what is at most a hundredth of the
        // limit: the larger limits let it.
        let limit = if leases {
            [20, 50, 100, 200, 1000, 5000][pick(rng, 6)]
        } else {
            [1, 2, 3, 5, 10, 20, 50, 100, 200, 1000][pick(rng, 10)]
        };
        let l = Limit {
            algorithm,
            limit,
            unit,
            multiplier,
            buckets: (algorithm == Algorithm::SlidingWindowCounter && chance(rng, 50))
                .then(|| [2, 3, 4, 10][pick(rng, 4)]),
            burst: (algorithm == Algorithm::TokenBucket && chance(rng, 50))
                .then(|| limit * (1 + pick(rng, 3) as u64)),
            zone,
            name: format!("l{index}"),
            max_duration: None,
        };
        // A list refuses two limits of one algorithm and window.
        if !taken
            .iter()
            .any(|t| t.algorithm == l.algorithm && t.window_secs() == l.window_secs())
        {
            return l;
        }
    }
}

/// A rule set of one domain: a few top-level rules on a few keys; limits
/// in flight in `in_flight` percent of the cases (the real clock's few
/// cases draw them more often).
pub fn draw(rng: &mut ChaCha8Rng, domain: &str, in_flight_percent: u64) -> Rules {
    // Keys added to the grammar later draw from a generator of their own
    // (seeded by the case's domain, which holds its seed): the case's
    // generator draws what it drew before, so seeds found earlier replay.
    let mut side = {
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(domain, &mut h);
        ChaCha8Rng::seed_from_u64(std::hash::Hasher::finish(&h))
    };
    let n = 1 + pick(rng, 4);
    // Some cases are about leases: limits large enough to lease, hit hard.
    let leases = chance(rng, 40);
    let mut rules: Vec<Rule> = Vec::new();
    let mut names = 0;
    for _ in 0..n {
        let key = KEYS[pick(rng, KEYS.len())].to_string();
        let value = match pick(rng, 3) {
            0 => Value::KeyOnly,
            1 => Value::Exact(format!("v{}", pick(rng, 3))),
            _ => Value::Wildcard {
                prefix: format!("p{}", pick(rng, 2)),
                shared: chance(rng, 60),
            },
        };
        if rules.iter().any(|r| r.key == key && r.value == value) {
            continue;
        }
        let list = chance(rng, 30);
        let mut limits = Vec::new();
        for _ in 0..if list { 2 } else { 1 } {
            let mut l = draw_limit(rng, names, &limits, leases);
            // Half the lists: two algorithms on one window length (their
            // keys and ledgers must still differ), now and then one limit
            // far above the other.
            if let Some(first) = limits.first()
                && chance(rng, 50)
                && first.zone.is_none()
            {
                let other = ALGORITHMS
                    .iter()
                    .copied()
                    .filter(|a| *a != first.algorithm)
                    .collect::<Vec<_>>();
                l.algorithm =
                    if matches!(first.algorithm, Algorithm::FixedWindow) && chance(rng, 60) {
                        Algorithm::TokenBucket
                    } else if matches!(first.algorithm, Algorithm::TokenBucket) && chance(rng, 60) {
                        Algorithm::FixedWindow
                    } else {
                        other[pick(rng, other.len())]
                    };
                l.unit = first.unit;
                l.multiplier = first.multiplier;
                l.zone = None;
                l.buckets = (l.algorithm == Algorithm::SlidingWindowCounter && chance(rng, 50))
                    .then(|| [2, 3, 4, 10][pick(rng, 4)]);
                if chance(rng, 30) {
                    l.limit = first.limit * [10, 50, 100][pick(rng, 3)];
                }
                l.burst = (l.algorithm == Algorithm::TokenBucket && chance(rng, 50))
                    .then(|| l.limit * (1 + pick(rng, 3) as u64));
            }
            names += 1;
            limits.push(l);
        }
        let leasable = limits.iter().all(|l| LEASABLE.contains(&l.algorithm));
        let usage_reports = chance(rng, 15);
        let count_refused = if chance(rng, 30) {
            Some(usage_reports || chance(rng, 40))
        } else {
            None
        };
        let min_limit = limits.iter().map(|l| l.limit).min().unwrap_or(1);
        let calendar = limits.iter().any(|l| l.zone.is_some());
        let shards = if chance(rng, 15) && min_limit >= 4 {
            2 + pick(rng, 3) as u16
        } else {
            1
        };
        rules.push(Rule {
            key,
            value,
            limits,
            list,
            shadow: chance(rng, 10),
            quota: chance(rng, 10),
            shards,
            // Load refuses a lease beside usage reports or a calendar
            // window: drawn now and then, to see it refused.
            lease: leasable
                && !list
                && shards == 1
                && chance(rng, if leases { 90 } else { 40 })
                && ((!usage_reports && !calendar) || chance(rng, 10)),
            // Drawn from the side stream, so earlier seeds replay.
            no_lease: chance(&mut side, 30),
            count_refused,
            usage_reports,
            replaces: Vec::new(),
            on_store_error: [None, None, None, Some("allow"), Some("deny"), Some("error")]
                [pick(&mut side, 6)],
        });
    }
    // Now and then a rule replaces another's named limit.
    if rules.len() > 1 && chance(rng, 25) {
        let target = rules[0].limits[0].name.clone();
        let last = rules.len() - 1;
        rules[last].replaces.push(target);
    }
    let mut drawn = Rules {
        domain: domain.to_string(),
        rules,
    };
    in_flight(&mut drawn, in_flight_percent);
    drawn
}

/// Limits in flight (`concurrency`, added later): some of the cases
/// turn some of their limits into one (a list keeps its other limit, a
/// rate), from a generator of their own, so that every other case draws
/// what it drew before. Now and then a key load refuses beside it (or
/// `max_duration` on another algorithm), to see the refusal name its line.
/// (Seeded by the file drawn so far: a file drawn again after a refusal
/// draws anew.)
fn in_flight(drawn: &mut Rules, percent: u64) {
    let mut side = {
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&(drawn.yaml(), "concurrency"), &mut h);
        ChaCha8Rng::seed_from_u64(std::hash::Hasher::finish(&h))
    };
    let rules = &mut drawn.rules;
    if !chance(&mut side, percent) {
        if chance(&mut side, 3) {
            let r = pick(&mut side, rules.len());
            rules[r].limits[0].max_duration = Some(MAX_DURATIONS[pick(&mut side, 4)]);
        }
        return;
    }
    let mut any = false;
    for rule in rules.iter_mut() {
        if !chance(&mut side, 45) {
            continue;
        }
        let k = pick(&mut side, rule.limits.len());
        become_in_flight(&mut side, rule, k);
        any = true;
    }
    if !any {
        let r = pick(&mut side, rules.len());
        let k = pick(&mut side, rules[r].limits.len());
        become_in_flight(&mut side, &mut rules[r], k);
    }
}

fn become_in_flight(side: &mut ChaCha8Rng, rule: &mut Rule, k: usize) {
    let l = &mut rule.limits[k];
    l.algorithm = Algorithm::Concurrency;
    l.limit = [1, 2, 3, 5, 10, 20][pick(side, 6)];
    l.unit = "second";
    l.multiplier = 1;
    l.buckets = None;
    l.burst = None;
    l.zone = None;
    l.max_duration = Some(MAX_DURATIONS[pick(side, 4)]);
    // What load refuses on it, the rule's as its limit's.
    rule.lease = false;
    rule.no_lease = false;
    rule.shards = 1;
    rule.usage_reports = false;
    if chance(side, 8) {
        refuse_in_flight(rule, k, pick(side, REFUSED_IN_FLIGHT));
    }
}

/// The keys load refuses on a limit in flight, one by one.
pub const REFUSED_IN_FLIGHT: usize = 9;

/// Limit `k` of `rule` (a limit in flight) with refused key `which`.
pub fn refuse_in_flight(rule: &mut Rule, k: usize, which: usize) {
    let l = &mut rule.limits[k];
    match which {
        0 => l.unit = "minute",
        1 => l.multiplier = 2,
        2 => rule.shards = 2,
        3 => rule.usage_reports = true,
        4 => {
            rule.lease = true;
            rule.no_lease = false;
        }
        5 => l.zone = Some(("UTC", 0)),
        6 => l.burst = Some(l.limit * 2),
        7 => l.buckets = Some(3),
        _ => l.max_duration = None,
    }
}

impl Rules {
    /// Where the engine starts `limit`'s buckets for `value` under rule
    /// `rule` ([`sliding_counter::phase`], scaled by `buckets - 1`): of
    /// the identity the engine counts on, a shared wildcard's pattern or
    /// the value (a long one as its digest). 0 on a window that is not
    /// staggered.
    pub fn phase(&self, rule: usize, value: &str, limit: &Limit) -> u64 {
        let r = &self.rules[rule];
        let ident = match &r.value {
            Value::Wildcard {
                prefix,
                shared: true,
            } => keys::shared_value(&format!("{prefix}/*")),
            _ => keys::identity_value(value, keys::DEFAULT_MAX_VALUE_BYTES).into_owned(),
        };
        phase_on(&self.domain, &[(r.key.clone(), ident)], limit)
    }

    /// The rule file, as a user writes it.
    pub fn yaml(&self) -> String {
        let mut y = format!("domain: {}\ndescriptors:\n", self.domain);
        for r in &self.rules {
            let _ = writeln!(y, "  - key: {}", r.key);
            match &r.value {
                Value::KeyOnly => {}
                Value::Exact(v) => {
                    let _ = writeln!(y, "    value: {v}");
                }
                Value::Wildcard { prefix, shared } => {
                    let _ = writeln!(y, "    value: {prefix}/*");
                    if *shared {
                        let _ = writeln!(y, "    share_threshold: true");
                    }
                }
            }
            if r.shadow {
                y.push_str("    shadow_mode: true\n");
            }
            if r.quota {
                y.push_str("    quota_mode: true\n");
            }
            if r.list {
                y.push_str("    rate_limits:\n");
            } else {
                y.push_str("    rate_limit:\n");
            }
            for l in &r.limits {
                let pad = if r.list { "        " } else { "      " };
                let first = if r.list { "      - " } else { pad };
                let _ = writeln!(y, "{first}unit: {}", l.unit);
                let _ = writeln!(y, "{pad}requests_per_unit: {}", l.limit);
                let _ = writeln!(y, "{pad}algorithm: {}", l.algorithm.as_str());
                let _ = writeln!(y, "{pad}name: {}", l.name);
                if l.multiplier > 1 {
                    let _ = writeln!(y, "{pad}unit_multiplier: {}", l.multiplier);
                }
                if let Some(b) = l.buckets {
                    let _ = writeln!(y, "{pad}buckets: {b}");
                }
                if let Some(b) = l.burst {
                    let _ = writeln!(y, "{pad}burst: {b}");
                }
                if let Some((zone, _)) = l.zone {
                    let _ = writeln!(y, "{pad}timezone: {zone}");
                }
                if let Some((text, _)) = l.max_duration {
                    let _ = writeln!(y, "{pad}max_duration: {text}");
                }
                if r.shards > 1 {
                    let _ = writeln!(y, "{pad}shards: {}", r.shards);
                }
                if r.lease {
                    let _ = writeln!(y, "{pad}lease: true");
                } else if r.no_lease {
                    let _ = writeln!(y, "{pad}lease: false");
                }
                if let Some(c) = r.count_refused {
                    let _ = writeln!(y, "{pad}count_refused: {c}");
                }
                if r.usage_reports {
                    let _ = writeln!(y, "{pad}usage_reports: true");
                }
                if let Some(policy) = r.on_store_error {
                    let _ = writeln!(y, "{pad}on_store_error: {policy}");
                }
                if !r.replaces.is_empty() {
                    let names: Vec<String> = r
                        .replaces
                        .iter()
                        .map(|n| format!("{{name: {n}}}"))
                        .collect();
                    let _ = writeln!(y, "{pad}replaces: [{}]", names.join(", "));
                }
            }
        }
        y
    }

    /// The rule a one-entry descriptor meets, by README's matching.
    pub fn find(&self, key: &str, value: &str) -> Option<usize> {
        let of_key = || {
            self.rules
                .iter()
                .enumerate()
                .filter(move |(_, r)| r.key == key)
        };
        of_key()
            .find(|(_, r)| r.value == Value::Exact(value.to_string()))
            .or_else(|| {
                of_key().find(|(_, r)| match &r.value {
                    Value::Wildcard { prefix, .. } => value.starts_with(&format!("{prefix}/")),
                    _ => false,
                })
            })
            .or_else(|| of_key().find(|(_, r)| r.value == Value::KeyOnly))
            .map(|(i, _)| i)
    }

    /// The identity a rule counts a value on: a shared wildcard's pattern,
    /// else the value.
    pub fn identity(&self, rule: usize, value: &str) -> String {
        match &self.rules[rule].value {
            Value::Wildcard {
                prefix,
                shared: true,
            } => format!("{prefix}/*"),
            _ => value.to_string(),
        }
    }

    /// A value a client may send on `key`: one a rule names, one of its
    /// wildcards' matches, or another; now and then a long one.
    pub fn value(&self, rng: &mut ChaCha8Rng, key: &str) -> String {
        self.value_of(rng, key, None)
    }

    /// As [`Rules::value`], but the case's hot value of the key most of
    /// the time, so that its limiters meet their limits.
    pub fn value_of(&self, rng: &mut ChaCha8Rng, key: &str, hot: Option<&str>) -> String {
        if let Some(h) = hot
            && chance(rng, 85)
        {
            return h.to_string();
        }
        let mut choices: Vec<String> = vec!["u0".into(), "u1".into()];
        for r in self.rules.iter().filter(|r| r.key == key) {
            match &r.value {
                Value::KeyOnly => {}
                Value::Exact(v) => choices.push(v.clone()),
                Value::Wildcard { prefix, .. } => {
                    choices.push(format!("{prefix}/a"));
                    choices.push(format!("{prefix}/b"));
                    choices.push(format!("{prefix}/c"));
                }
            }
        }
        if chance(rng, 2) {
            return "x".repeat(200 + pick(rng, 5000));
        }
        choices[pick(rng, choices.len())].clone()
    }
}

/// [`sliding_counter::phase`] of `entries` under `limit` as the engine
/// places its window.
pub fn phase_on(domain: &str, entries: &[(String, String)], limit: &Limit) -> u64 {
    let unit = super::world::unit_of(limit.unit);
    let mut window =
        Window::new(unit, limit.multiplier as u32).expect("a window the grammar draws");
    if limit.algorithm.spec().staggered {
        window = window.staggered();
    }
    sliding_counter::phase(domain, entries, window)
}
