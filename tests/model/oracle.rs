//! The oracle: from the answers alone, what each limiter admitted and
//! when, checked against the bound `tollgate::guarantees` promises for its
//! rule. It knows the rule file (the model drew it) and the time of each
//! answer, nothing of tollgate's internals.
//!
//! Times are intervals: on the virtual clock an answer's moment is exact
//! (lo == hi); on the real clock it is somewhere between sending and
//! receiving, and a hit counts in a window only when its whole interval
//! does, so the check can never blame tollgate for the clock's
//! uncertainty (it can only miss an overshoot smaller than it).

use std::collections::BTreeMap;

use tollgate::guarantees::{Bound, Promise};
use tollgate::rlqs::filter::Filter;

use super::grammar::Limit;

#[derive(Debug, Clone, Copy)]
pub struct Moment {
    pub lo: u64,
    pub hi: u64,
    /// The op it came from: ops run one after another, so a reset cuts
    /// a limiter's history by op, however close their times.
    pub seq: usize,
}

#[derive(Debug, Clone)]
pub struct Limiter {
    pub limit: Limit,
    pub promise: Promise,
    /// Where a staggered counter's buckets start, in units of
    /// `1 / (buckets - 1)` µs ([`grammar::phase_on`]); 0 otherwise.
    pub phase: u64,
    pub admitted: Vec<(Moment, u64)>,
    pub given_back: Vec<(Moment, u64)>,
    pub resets: Vec<Moment>,
    /// Requests Envoys' quota filters admitted on it (RLQS).
    pub envoy_admitted: Vec<(Moment, u64)>,
    /// The Envoys' buckets counting on it: indices of [`Oracle::tracks`].
    pub tracks: Vec<usize>,
    /// Takes whose release comes later (Envoy-like pairs, `concurrency`):
    /// the pair's id, its moment, and whether its call surely reached the
    /// store (no store fault in force, an answer).
    pub takes: Vec<(u64, Moment, bool)>,
    /// The pairs' releases: id and moment (also in `given_back`).
    pub releases: Vec<(u64, Moment)>,
}

/// One Envoy bucket's filter over time: its state after each change (the
/// last at each time), and what it was given beyond its rate so far.
#[derive(Default)]
pub struct Track {
    events: Vec<(u64, Filter, f64)>,
    /// A reset of its limiter came after its last answer: until the next
    /// answer its share is forgotten by the store, and README lets its
    /// spending come on top of the limit.
    pub grace: bool,
    /// When the last such grace ended: requests its filter was offered
    /// before then came during it, whenever the filter decided them.
    pub grace_ended: u64,
}

impl Track {
    pub fn push(&mut self, at: u64, filter: &Filter, gained: f64) {
        match self.events.last_mut() {
            Some(last) if last.0 == at => *last = (at, filter.clone(), gained),
            _ => self.events.push((at, filter.clone(), gained)),
        }
    }

    /// The state before anything happened at `t`.
    fn before(&self, t: u64) -> Option<&(u64, Filter, f64)> {
        let i = self.events.partition_point(|e| e.0 < t);
        i.checked_sub(1).map(|i| &self.events[i])
    }

    /// Tokens it held as `t` began, and what it gained from `t` to `to`
    /// (inclusive): what it could spend there beyond its rate.
    fn beyond_rate(&self, t: u64, to: u64) -> f64 {
        let (held, gained_before) = self
            .before(t)
            .map_or((0.0, 0.0), |(_, f, g)| (f.tokens(t), *g));
        let i = self.events.partition_point(|e| e.0 <= to);
        let gained_by = i.checked_sub(1).map_or(0.0, |i| self.events[i].2);
        held + (gained_by - gained_before).max(0.0)
    }
}

/// (rule, limit of its list, identity).
pub type LimiterKey = (usize, usize, String);

#[derive(Default)]
pub struct Oracle {
    pub limiters: BTreeMap<LimiterKey, Limiter>,
    /// Replicas that may hold leases: each may spend what it held of a
    /// lease across a reset.
    pub replicas: u64,
    pub tracks: Vec<Track>,
    /// Hits given back on a descriptor's entries (`key=value `), for the
    /// overrides on them: the store keeps one count for the entries, an
    /// algorithm and a unit, whatever limit each request names.
    pub entries_back: BTreeMap<String, Vec<(Moment, u64)>>,
}

impl Oracle {
    /// Hits given back on `entries`: room on every override's limiter on
    /// them, those to come included.
    pub fn give_back_on(&mut self, entries: String, at: Moment, cost: u64) {
        for (k, l) in self.limiters.iter_mut() {
            if k.0 == usize::MAX && k.2.starts_with(&entries) {
                l.given_back.push((at, cost));
            }
        }
        self.entries_back
            .entry(entries)
            .or_default()
            .push((at, cost));
    }

    /// An override's limiter, created with what was given back on its
    /// entries so far.
    pub fn override_limiter(
        &mut self,
        key: LimiterKey,
        entries: &str,
        limit: &Limit,
        promise: Promise,
        phase: u64,
    ) -> &mut Limiter {
        let back = self.entries_back.get(entries).cloned().unwrap_or_default();
        self.limiters.entry(key).or_insert_with(|| Limiter {
            limit: limit.clone(),
            promise,
            phase,
            admitted: Vec::new(),
            given_back: back,
            resets: Vec::new(),
            envoy_admitted: Vec::new(),
            tracks: Vec::new(),
            takes: Vec::new(),
            releases: Vec::new(),
        })
    }

    pub fn limiter(
        &mut self,
        key: LimiterKey,
        limit: &Limit,
        promise: Promise,
        phase: u64,
    ) -> &mut Limiter {
        self.limiters.entry(key).or_insert_with(|| Limiter {
            limit: limit.clone(),
            promise,
            phase,
            admitted: Vec::new(),
            given_back: Vec::new(),
            resets: Vec::new(),
            envoy_admitted: Vec::new(),
            tracks: Vec::new(),
            takes: Vec::new(),
            releases: Vec::new(),
        })
    }

    /// Every limiter's history against its bound: the first violation.
    pub fn check(&self) -> Result<(), String> {
        for (key, l) in &self.limiters {
            l.check(self.replicas.max(1), &self.tracks).map_err(|e| {
                format!(
                    "limiter {key:?} ({:?} {}/{}s): {e}",
                    l.limit.algorithm,
                    l.limit.limit,
                    l.limit.window_secs()
                )
            })?;
        }
        Ok(())
    }
}

fn overlaps(m: Moment, from: u64, to: u64) -> bool {
    m.hi >= from && m.lo < to
}

impl Limiter {
    fn check(&self, replicas: u64, tracks: &[Track]) -> Result<(), String> {
        // What the Envoys' buckets could spend in [from, to] beyond their
        // rates: what they held as it began, and what they were given
        // beyond their rates within it (first fills, rebuilds).
        let beyond = |from: u64, to: u64| -> u64 {
            let sum: f64 = self
                .tracks
                .iter()
                .map(|&t| tracks[t].beyond_rate(from, to))
                .sum();
            (sum + 1e-6).ceil() as u64
        };
        let none = |_: u64, _: u64| 0;
        // A reset gives the whole limit back: each stretch between resets
        // is checked on its own.
        let mut cuts: Vec<usize> = vec![0];
        cuts.extend(self.resets.iter().map(|r| r.seq));
        cuts.sort();
        for (i, &from) in cuts.iter().enumerate() {
            let to = cuts.get(i + 1).copied().unwrap_or(usize::MAX);
            let within = |hits: &[(Moment, u64)]| -> Vec<(Moment, u64)> {
                hits.iter()
                    .copied()
                    .filter(|(m, _)| (i == 0 || m.seq > from) && m.seq < to)
                    .collect()
            };
            let rls = within(&self.admitted);
            let envoys = within(&self.envoy_admitted);
            if self.promise.bound == Bound::InFlight {
                self.check_held(&rls)
                    .map_err(|e| format!("held at once: {e}"))?;
            }
            if self.promise.one_count {
                // RLS and RLQS on one count: their hits together.
                let mut both = rls;
                both.extend(envoys);
                self.check_stretch(&both, i > 0, replicas, &beyond)
                    .map_err(|e| format!("RLS and Envoys together: {e}"))?;
            } else {
                self.check_stretch(&rls, i > 0, replicas, &none)?;
                if !envoys.is_empty() {
                    self.check_stretch(&envoys, false, replicas, &beyond)
                        .map_err(|e| format!("Envoys alone: {e}"))?;
                }
            }
        }
        Ok(())
    }

    /// What given-back hits add to a span [from, to).
    fn back_within(&self, from: u64, to: u64) -> u64 {
        if !self.promise.given_back {
            return 0;
        }
        self.given_back
            .iter()
            .filter(|(m, _)| overlaps(*m, from, to))
            .map(|(_, c)| c)
            .sum()
    }

    /// The paired check (`concurrency`, Envoy-like traffic): each take
    /// admitted is held from its answer until its own release is sent or
    /// `max_duration` after it was sent (a take with no release paired
    /// with it: until then); at any instant, at most the limit held,
    /// plus what the releases that may free a slot another take holds
    /// freed within the last `max_duration`. Those are (README's
    /// allowance): releases paired with no take (hits given back at
    /// random), a release whose take may not have reached the store (a
    /// store fault in force, an error), and one sent `max_duration` or
    /// more after its take (its slot, or what its refusal owed, lapsed).
    /// A refused take's release frees nothing another holds: it pays what
    /// the refusal owes.
    fn check_held(&self, admitted: &[(Moment, u64)]) -> Result<(), String> {
        let d = self.limit.max_duration_micros();
        // Each pair's release: the first one sent.
        let mut released: BTreeMap<u64, Moment> = BTreeMap::new();
        for (id, m) in &self.releases {
            released
                .entry(*id)
                .and_modify(|e| {
                    if m.lo < e.lo {
                        *e = *m
                    }
                })
                .or_insert(*m);
        }
        let take_of: BTreeMap<usize, (u64, Moment, bool)> =
            self.takes.iter().map(|t| (t.1.seq, *t)).collect();
        // The releases that free only what their own take holds or owes.
        let mut own: std::collections::BTreeSet<usize> = std::collections::BTreeSet::new();
        for (id, m) in &self.releases {
            if let Some((_, t, clean)) = self.takes.iter().find(|t| t.0 == *id)
                && *clean
                && m.hi < t.lo + d
            {
                own.insert(m.seq);
            }
        }
        let foreign: Vec<(Moment, u64)> = self
            .given_back
            .iter()
            .filter(|(m, _)| !own.contains(&m.seq))
            .copied()
            .collect();
        // Each admitted take: held from `hi` until `end`.
        let held: Vec<(u64, u64, u64)> = admitted
            .iter()
            .map(|(m, c)| {
                let mut end = m.lo + d;
                if let Some((id, _, _)) = take_of.get(&m.seq)
                    && let Some(r) = released.get(id)
                {
                    end = end.min(r.lo);
                }
                (m.hi, end, *c)
            })
            .collect();
        for &(t, _, _) in &held {
            let sum: u64 = held
                .iter()
                .filter(|(from, end, _)| *from <= t && t < *end)
                .map(|(_, _, c)| c)
                .sum();
            if sum <= self.limit.limit {
                continue;
            }
            let slack: u64 = foreign
                .iter()
                .filter(|(m, _)| m.hi + d > t && m.lo <= t)
                .map(|(_, c)| c)
                .sum();
            let allowed = self.limit.limit + slack;
            if sum > allowed {
                return Err(format!(
                    "{sum} takes held at {t} µs (admitted within the last max_duration, {d} µs, and not released), bound {} + releases that may free another's slot within it {slack} = {allowed}",
                    self.limit.limit
                ));
            }
        }
        Ok(())
    }

    fn check_stretch(
        &self,
        hits: &[(Moment, u64)],
        after_reset: bool,
        replicas: u64,
        beyond: &dyn Fn(u64, u64) -> u64,
    ) -> Result<(), String> {
        let l = &self.limit;
        let size = match self.promise.bound {
            Bound::Bucket => l.burst(),
            _ => l.limit,
        };
        let lease_slack = if after_reset && self.promise.reset_lease_divisor > 0 {
            (replicas - 1) * size.div_ceil(self.promise.reset_lease_divisor)
        } else {
            0
        };
        let w = l.window_micros();
        match self.promise.bound {
            Bound::None => Ok(()),
            Bound::InFlight => {
                // Every take admitted within a trailing `max_duration` is
                // still held at its end, unless a release within it freed
                // it: at most the limit plus the releases within it.
                let d = l.max_duration_micros();
                for (start, _) in hits {
                    let from = start.lo;
                    let sum: u64 = hits
                        .iter()
                        .filter(|(m, _)| m.lo >= from && m.hi < from + d)
                        .map(|(_, c)| c)
                        .sum();
                    let allowed =
                        l.limit + self.back_within(from, from + d) + beyond(from, from + d - 1);
                    if sum > allowed {
                        return Err(format!(
                            "{sum} admitted in the trailing max_duration ({d} µs) from {from} µs, bound {allowed} (the limit and the releases within it)"
                        ));
                    }
                }
                Ok(())
            }
            Bound::Window => {
                let offset = l.zone.map_or(0i64, |(_, o)| o * 1_000_000);
                let window_of = |t: u64| ((t as i64 + offset) as u64) / w;
                let mut sums: BTreeMap<u64, u64> = BTreeMap::new();
                for (m, c) in hits {
                    if window_of(m.lo) == window_of(m.hi) {
                        *sums.entry(window_of(m.lo)).or_default() += c;
                    }
                }
                for (k, sum) in sums {
                    let from = ((k * w) as i64 - offset) as u64;
                    let allowed = l.limit
                        + self.back_within(from, from + w)
                        + lease_slack
                        + beyond(from, from + w - 1);
                    if sum > allowed {
                        return Err(format!(
                            "{sum} admitted in the window from {from} µs, bound {allowed}"
                        ));
                    }
                }
                Ok(())
            }
            Bound::Trailing => {
                for (start, _) in hits {
                    let from = start.lo;
                    let sum: u64 = hits
                        .iter()
                        .filter(|(m, _)| m.lo >= from && m.hi < from + w)
                        .map(|(_, c)| c)
                        .sum();
                    let allowed = l.limit
                        + self.back_within(from.saturating_sub(w), from + w)
                        + lease_slack
                        + beyond(from, from + w - 1);
                    if sum > allowed {
                        return Err(format!(
                            "{sum} admitted in the trailing window from {from} µs, bound {allowed}"
                        ));
                    }
                }
                Ok(())
            }
            Bound::Buckets => {
                // Buckets of w / n: time scaled by n keeps them exact. A
                // staggered counter's start `phase` scaled units late.
                let n = l.buckets() - 1;
                let phase = self.phase;
                let bucket = |t: u64| (t * n + phase) / w;
                for (start, _) in hits {
                    let first = bucket(start.lo);
                    let sum: u64 = hits
                        .iter()
                        .filter(|(m, _)| bucket(m.lo) >= first && bucket(m.hi) < first + n)
                        .map(|(_, c)| c)
                        .sum();
                    let from = (first * w).saturating_sub(phase) / n;
                    let to = ((first + n) * w).saturating_sub(phase).div_ceil(n) + 1;
                    let allowed = l.limit
                        + self.back_within(from.saturating_sub(w), to)
                        + lease_slack
                        + beyond(from, to);
                    if sum > allowed {
                        return Err(format!(
                            "{sum} admitted in {n} buckets of {w}/{n} µs from {from} µs, bound {allowed}"
                        ));
                    }
                }
                Ok(())
            }
            Bound::Bucket => {
                let mut sorted = hits.to_vec();
                sorted.sort_by_key(|(m, _)| m.lo);
                for i in 0..sorted.len() {
                    let mut sum = 0u64;
                    for j in i..sorted.len() {
                        sum += sorted[j].1;
                        let (from, to) = (sorted[i].0.lo, sorted[j].0.hi.max(sorted[i].0.lo));
                        let refill = (l.limit as u128 * (to - from) as u128 / w as u128) as u64;
                        let base = l.burst() + refill + lease_slack;
                        if sum <= base {
                            continue;
                        }
                        let envoys = beyond(from, to);
                        let allowed = base + self.back_within(from, to + 1) + envoys;
                        if sum > allowed {
                            return Err(format!(
                                "{sum} admitted from {from} to {to} µs, bound burst {} + refill {refill} + Envoys' beyond their rates {envoys} (+ given back, leases) = {allowed}",
                                l.burst()
                            ));
                        }
                    }
                }
                Ok(())
            }
        }
    }
}
