//! Random rule files from the whole rule grammar, and the model's own
//! reading of them: which rule and which limiter a descriptor meets. The
//! model matches as README describes (exact value, then wildcards in file
//! order, then the key-only rule), knowing nothing of `tollgate::rules`.

use std::fmt::Write;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::RngCore;
use rand_chacha::rand_core::SeedableRng;
use tollgate::guarantees::Features;
use tollgate::limit::Algorithm;

pub const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindowLog,
    Algorithm::SlidingWindowCounter,
    Algorithm::TokenBucket,
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
    pub lease: bool,
    pub count_refused: Option<bool>,
    pub usage_reports: bool,
    pub replaces: Vec<String>,
    /// `on_store_error`: `error` (the default), `allow` or `deny`.
    pub on_store_error: Option<&'static str>,
}

impl Rule {
    pub fn features(&self, limit: &Limit, rlqs: bool) -> Features {
        Features {
            algorithm: limit.algorithm,
            shadow: self.shadow,
            lease: self.lease,
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

fn draw_limit(rng: &mut ChaCha8Rng, index: usize, taken: &[Limit], leases: bool) -> Limit {
    loop {
        let algorithm = if leases && chance(rng, 80) {
            [Algorithm::FixedWindow, Algorithm::TokenBucket][pick(rng, 2)]
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
        let limit = if leases {
            [20, 50, 100, 200][pick(rng, 4)]
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

/// A rule set of one domain: a few top-level rules on a few keys.
pub fn draw(rng: &mut ChaCha8Rng, domain: &str) -> Rules {
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
        let leasable = limits
            .iter()
            .all(|l| matches!(l.algorithm, Algorithm::FixedWindow | Algorithm::TokenBucket));
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
    Rules {
        domain: domain.to_string(),
        rules,
    }
}

impl Rules {
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
                if r.shards > 1 {
                    let _ = writeln!(y, "{pad}shards: {}", r.shards);
                }
                if r.lease {
                    let _ = writeln!(y, "{pad}lease: true");
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
