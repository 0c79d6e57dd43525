//! What the answers tell the oracle: each descriptor's hits admitted or
//! given back on the limiters the model's own matching gives (a rule's,
//! or a request's override), resets, and the Envoys' filters over time.

use tollgate::engine::{Code, EngineOptions, Response};
use tollgate::guarantees;
use tollgate::storage::keys;

use super::Coverage;
use super::envoy::Observer;
use super::grammar::{self, Rules};
use super::oracle::{self, Moment, Oracle, Track};
use super::refusals;
use super::world::{self, Req};

/// What one answer tells the oracle. `pair`: the request is one of an
/// Envoy-like pair (its id; `true` for the take, `false` for its
/// release).
#[allow(clippy::too_many_arguments)]
pub fn record(
    oracle: &mut Oracle,
    rules: &Rules,
    req: &Req,
    answer: &Result<Response, String>,
    at: Moment,
    failing: bool,
    pair: Option<(u64, bool)>,
    coverage: &mut Coverage,
) {
    // Hits given back make room whatever the answer: record them as sent.
    // A descriptor with its own limit (an override) matches no rule.
    let (matched, replaced) = req.matched(rules);
    for (i, d) in req.descriptors.iter().enumerate() {
        if let Some(own) = d.limit {
            let passed = matches!(answer, Ok(resp) if resp.overall == Code::Ok && resp.statuses[i].code == Code::Ok);
            record_override(oracle, rules, req, d, own, passed, at, coverage);
            continue;
        }
        let Some(r) = matched[i] else { continue };
        let rule = &rules.rules[r];
        let identity = rules.identity(r, &d.value);
        let cost = req.cost(d);
        let mut given_back = false;
        let passed = matches!(answer, Ok(resp) if resp.overall == Code::Ok && resp.statuses[i].code == Code::Ok);
        // In a list with a limit in flight, a negative hit is a release:
        // it goes to the limits in flight alone, the rates keep their
        // count (README's `concurrency` page).
        let release = d.negative && rule.limits.iter().any(|l| l.algorithm.releases());
        for (k, limit) in rule.limits.iter().enumerate() {
            if replaced.contains(&limit.name.as_str()) || (release && !limit.algorithm.releases()) {
                continue;
            }
            let promise = guarantees::promise(&rule.features(limit, false));
            let phase = rules.phase(r, &d.value, limit);
            let l = oracle.limiter((r, k, identity.clone()), limit, promise, phase);
            if let Some((id, take)) = pair
                && limit.algorithm.releases()
            {
                if take && !d.negative {
                    l.takes.push((id, at, !failing && answer.is_ok()));
                } else if !take && d.negative {
                    l.releases.push((id, at));
                }
            }
            if d.negative {
                l.given_back.push((at, cost));
                given_back = true;
            } else if passed
                && cost > 0
                && !(rule.usage_reports && d.hits.is_some())
                // Answered OK by `on_store_error: allow` when its call
                // failed, perhaps: not decided by the store.
                && !(failing && rule.on_store_error == Some("allow"))
            {
                l.admitted.push((at, cost));
                coverage.admitted += cost;
                if limit.algorithm.releases() {
                    coverage.in_flight_admitted += cost;
                }
                if rule.leases() {
                    coverage.admitted_on_leased += cost;
                }
            }
        }
        if given_back && !release {
            // Room too for overrides counting on these entries (a
            // release frees a slot: no override counts on it).
            oracle.give_back_on(format!("{}={} ", d.key, d.value), at, cost);
        }
    }
}

/// The limit a request's override gives (`RateLimitOverride`): the
/// default algorithm (`default_algorithm`: the sliding window counter)
/// and nothing else of a rule's.
pub fn override_limit((n, unit): (u32, &'static str)) -> grammar::Limit {
    grammar::Limit {
        algorithm: EngineOptions::default().default_algorithm,
        limit: u64::from(n),
        unit,
        multiplier: 1,
        buckets: None,
        burst: None,
        zone: None,
        name: "override".into(),
        max_duration: None,
    }
}

/// The oracle's limiter of an override: its entries, unit and limit.
/// (The store keys it without the limit, by entries, algorithm and unit
/// as a rule's limit: overrides of other limits and a rule's limit of
/// the same algorithm and unit on those entries count on it too, which
/// only takes room; their hits given back make room on each.)
pub fn override_key(d: &world::Desc, (n, unit): (u32, &'static str)) -> oracle::LimiterKey {
    (usize::MAX, 0, format!("{}={} {n}/{unit}", d.key, d.value))
}

#[allow(clippy::too_many_arguments)]
fn record_override(
    oracle: &mut Oracle,
    rules: &Rules,
    req: &Req,
    d: &world::Desc,
    own: (u32, &'static str),
    passed: bool,
    at: Moment,
    coverage: &mut Coverage,
) {
    let limit = override_limit(own);
    let features = guarantees::Features {
        algorithm: limit.algorithm,
        shadow: false,
        lease: false,
        rlqs: false,
        shards: 1,
        calendar: false,
    };
    let promise = guarantees::promise(&features);
    let cost = req.cost(d);
    let entries = format!("{}={} ", d.key, d.value);
    let phase = grammar::phase_on(
        &rules.domain,
        &[(
            d.key.clone(),
            keys::identity_value(&d.value, keys::DEFAULT_MAX_VALUE_BYTES).into_owned(),
        )],
        &limit,
    );
    oracle.override_limiter(override_key(d, own), &entries, &limit, promise, phase);
    if d.negative {
        // Given back on the one count the store keeps for these entries:
        // room for every override on them, and for a rule's limit
        // sharing it.
        oracle.give_back_on(entries, at, cost);
        if let Some(r) = rules.find(&d.key, &d.value) {
            let identity = rules.identity(r, &d.value);
            for (k, l) in rules.rules[r].limits.iter().enumerate() {
                let promise = guarantees::promise(&rules.rules[r].features(l, false));
                let phase = rules.phase(r, &d.value, l);
                oracle
                    .limiter((r, k, identity.clone()), l, promise, phase)
                    .given_back
                    .push((at, cost));
            }
        }
        return;
    }
    // A descriptor carrying its own cost under an override is a usage
    // report (the `usage_reports` setting's default): it admits nothing.
    if passed && cost > 0 && d.hits.is_none() {
        oracle
            .override_limiter(override_key(d, own), &entries, &limit, promise, phase)
            .admitted
            .push((at, cost));
        coverage.admitted += cost;
    }
}

pub fn reset_request(key: &str, value: &str) -> Req {
    Req {
        hits: 0,
        descriptors: vec![world::Desc {
            key: key.to_string(),
            value: value.to_string(),
            hits: None,
            negative: false,
            limit: None,
        }],
    }
}

/// A reset: what the refusal check knows of the rule's limiters starts
/// again (`clean`: decided alone, with no fault in force).
pub fn forget(
    refusals: &mut refusals::Refusals,
    replica: usize,
    rules: &Rules,
    key: &str,
    value: &str,
    clean: bool,
) {
    if let Some(rule) = rules.find(key, value) {
        let identity = rules.identity(rule, value);
        for k in 0..rules.rules[rule].limits.len() {
            refusals.reset((rule, k, identity.clone()), replica, clean);
        }
    }
}

/// A reset gives the limiters of the rule it names their whole limit
/// back (recorded whatever it answered: a reset the model does not know
/// of could only make it expect less).
pub fn reset(oracle: &mut Oracle, rules: &Rules, key: &str, value: &str, at: Moment) {
    // A rule's limit may share its count with overrides on the same
    // entries (same algorithm and unit): theirs starts again too.
    let entries = format!("{key}={value} ");
    for (k, l) in oracle.limiters.iter_mut() {
        if k.0 == usize::MAX && k.2.starts_with(&entries) {
            l.resets.push(at);
        }
    }
    if let Some(rule) = rules.find(key, value) {
        let identity = rules.identity(rule, value);
        for (k, limit) in rules.rules[rule].limits.iter().enumerate() {
            let promise = guarantees::promise(&rules.rules[rule].features(limit, false));
            let phase = rules.phase(rule, value, limit);
            let l = oracle.limiter((rule, k, identity.clone()), limit, promise, phase);
            l.resets.push(at);
            // The Envoys' shares are forgotten too: until each one's next
            // answer, what it spends comes on top of the limit.
            let tracks = l.tracks.clone();
            for t in tracks {
                oracle.tracks[t].grace = true;
            }
        }
    }
}

pub fn check_answer(req: &Req, answer: &Result<Response, String>) -> Result<(), String> {
    match answer {
        Ok(resp) if resp.statuses.len() != req.descriptors.len() => Err(format!(
            "{} statuses for {} descriptors",
            resp.statuses.len(),
            req.descriptors.len()
        )),
        _ => Ok(()),
    }
}

/// The oracle as the Envoys' filters report to it.
pub struct Observe<'a> {
    pub oracle: &'a mut Oracle,
    pub rules: &'a Rules,
    pub admitted: u64,
}

impl Observer for Observe<'_> {
    fn track(&mut self, key: &str, value: &str) -> usize {
        let id = self.oracle.tracks.len();
        self.oracle.tracks.push(Track::default());
        if let Some(r) = self.rules.find(key, value) {
            let identity = self.rules.identity(r, value);
            for (k, limit) in self.rules.rules[r].limits.iter().enumerate() {
                let promise = guarantees::promise(&self.rules.rules[r].features(limit, true));
                self.oracle
                    .limiter(
                        (r, k, identity.clone()),
                        limit,
                        promise,
                        self.rules.phase(r, value, limit),
                    )
                    .tracks
                    .push(id);
            }
        }
        id
    }

    fn filter(
        &mut self,
        track: usize,
        now: u64,
        filter: &tollgate::rlqs::filter::Filter,
        gained: f64,
        answered: bool,
    ) {
        let t = &mut self.oracle.tracks[track];
        t.push(now, filter, gained);
        if answered && t.grace {
            t.grace = false;
            t.grace_ended = now;
        }
    }

    fn admitted(
        &mut self,
        track: usize,
        key: &str,
        value: &str,
        (since, now): (u64, u64),
        seq: usize,
        n: u64,
        allow_all: bool,
    ) {
        // Offered while the share was forgotten (the filter decides them
        // when it next ticks, which may be after the answer that ends
        // it): README's allowance.
        let t = &self.oracle.tracks[track];
        if t.grace || since < t.grace_ended {
            return;
        }
        self.admitted += n;
        let Some(r) = self.rules.find(key, value) else {
            return;
        };
        if allow_all && self.rules.rules[r].on_store_error == Some("allow") {
            // The stream's answer while the store failed: the rule's
            // `on_store_error: allow`.
            return;
        }
        let identity = self.rules.identity(r, value);
        for (k, limit) in self.rules.rules[r].limits.iter().enumerate() {
            let promise = guarantees::promise(&self.rules.rules[r].features(limit, true));
            self.oracle
                .limiter(
                    (r, k, identity.clone()),
                    limit,
                    promise,
                    self.rules.phase(r, value, limit),
                )
                .envoy_admitted
                .push((
                    Moment {
                        lo: now,
                        hi: now,
                        seq,
                    },
                    n,
                ));
        }
    }
}
