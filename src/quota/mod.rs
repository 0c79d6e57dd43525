//! How one limit is shared among the streams that report usage of it (the
//! Rate Limit Quota Service, `rlqs`): a lease ledger per limiter, and the
//! arithmetic that turns reported demand into a share. Pure: no I/O, no
//! clock, no protocol types. The embedded store keeps a [`Ledger`] per
//! limiter behind a mutex; Redis runs the same arithmetic in
//! `lua/rlqs_lease.lua`, one script call per report.
//!
//! Units. A limit of `L` requests per window `W` is handed out as a token
//! bucket that fills every `F` = [`fill_secs`] seconds. The ledger counts in
//! tokens per fill: its capacity is `C = L * F / W` ([`capacity`]), every
//! share is a whole number of tokens per fill, and so is every demand.
//! Integers make the bound exact in both implementations (Lua numbers are
//! doubles, exact below 2^53; capacities stay far below).
//!
//! Invariant: after any report, the shares in force (not expired) add up to
//! at most `C`. A report never grants more than `C` minus the shares the
//! other holders have in force; a holder whose fair share fell gives the
//! difference back at its own next report, and a holder that stops
//! reporting gives all of it back when its share expires.

use std::collections::HashMap;

use crate::limit::Window;

/// The fill interval for a window: at least a minute, so a per-second
/// limit is shared in sixtieths of a request per second, and always whole
/// seconds (Envoy divides by the interval's seconds and compares only its
/// nanoseconds when it decides whether an assignment changed). A whole
/// number of windows, so the capacity stays a whole number: the window
/// itself from a minute up, else the first multiple of it from a minute
/// (60 seconds for the windows that divide a minute, 63 for 7 seconds).
pub fn fill_secs(window: Window) -> u64 {
    let w = window.seconds().max(1);
    w * 60u64.div_ceil(w).max(1)
}

/// Tokens per fill of the whole limit: `limit` per `window`, over
/// [`fill_secs`].
pub fn capacity(limit: u64, window: Window) -> u64 {
    limit.saturating_mul(fill_secs(window) / window.seconds().max(1))
}

/// What one stream reports about one limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Requests it saw since its last report, allowed and denied: denied
    /// ones are demand too.
    pub requests: u64,
    /// Seconds they were seen over (whole seconds, at least 1).
    pub elapsed_secs: u64,
}

/// The numbers a ledger works with, fixed per limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// Tokens per fill of the whole limit ([`capacity`]).
    pub capacity: u64,
    /// The fill interval in seconds ([`fill_secs`]).
    pub fill_secs: u64,
    /// How long a share stays in force after the report that granted it,
    /// in microseconds: the assignment's time to live plus a margin for the
    /// answer's way to the stream.
    pub hold_micros: u64,
}

/// One holder's entry in a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// Tokens per fill granted.
    pub granted: u64,
    /// When the grant stops being in force (microseconds).
    pub expires_micros: u64,
    /// Estimated demand, tokens per fill.
    pub demand: u64,
}

/// What a report gets back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Tokens per fill for this holder: 0 means deny everything until the
    /// next report.
    pub tokens: u64,
    /// Holders with a share in force, this one included.
    pub holders: u64,
    /// The shares in force, this one included: never above the capacity.
    pub granted_total: u64,
}

/// Demand in tokens per fill measured by one report: requests over the
/// elapsed seconds, scaled to the fill interval, rounded up, capped at the
/// capacity (more than the whole limit counts as the whole limit).
pub fn measured(report: Report, terms: Terms) -> u64 {
    let elapsed = u128::from(report.elapsed_secs.max(1));
    let scaled = u128::from(report.requests) * u128::from(terms.fill_secs);
    let per_fill = scaled.div_ceil(elapsed);
    per_fill.min(u128::from(terms.capacity)) as u64
}

/// The demand estimate after a report: the mean of the previous estimate
/// and the new measure, rounded up (an exponential average with weight
/// 1/2). A stream whose demand rises has three quarters of it counted
/// after two reports; a stream whose demand is noisy (Poisson traffic) is
/// granted near its mean, not its peaks, which would sit unused while
/// busier streams are refused (the simulation measured 92.7% of the limit
/// used with 10 Envoys, one of them busy, when rises counted at once, and
/// 95.2% with the average).
pub fn next_demand(previous: Option<u64>, measured: u64) -> u64 {
    match previous {
        Some(old) => (old + measured).div_ceil(2),
        None => measured,
    }
}

/// The max-min fair share of `capacity` for the demand at `me` among
/// `demands`, plus an equal part of whatever nobody asked for (so a holder
/// can grow into spare capacity before its next report). The targets of
/// all holders add up to at most `capacity`.
///
/// Water-filling: holders in order of demand (ties by position) each take
/// their demand or an equal part of what is left, whichever is less.
pub fn fair_target(demands: &[u64], me: usize, capacity: u64) -> u64 {
    let n = demands.len() as u64;
    if n == 0 || me >= demands.len() {
        return 0;
    }
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|&i| (demands[i], i));
    let mut left = capacity;
    let mut mine = 0;
    for (k, &i) in order.iter().enumerate() {
        let equal = left / (n - k as u64);
        let take = demands[i].min(equal);
        left -= take;
        if i == me {
            mine = take;
        }
    }
    mine + left / n
}

/// What requests decided one at a time ask of a limit a ledger shares
/// ([`Ledger::report_beside`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beside {
    /// Their demand, in tokens per fill ([`window::counted_demand`]).
    pub demand: u64,
    /// The most tokens per fill the windows leave a new share
    /// ([`window::room`]).
    pub room: u64,
}

/// The shares of one limit, by holder (a stream of one replica, or one
/// bucket of it where several count on one limiter).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    shares: HashMap<String, Share>,
}

impl Ledger {
    /// Drops shares no longer in force.
    pub fn expire(&mut self, now_micros: u64) {
        self.shares.retain(|_, s| s.expires_micros > now_micros);
    }

    pub fn is_empty(&self) -> bool {
        self.shares.is_empty()
    }

    pub fn len(&self) -> usize {
        self.shares.len()
    }

    /// The shares, for the debug view.
    pub fn shares(&self) -> impl Iterator<Item = (&str, &Share)> {
        self.shares.iter().map(|(h, s)| (h.as_str(), s))
    }

    /// The shares in force at `now`, summed.
    pub fn in_force(&self, now_micros: u64) -> u64 {
        self.shares
            .values()
            .filter(|s| s.expires_micros > now_micros)
            .map(|s| s.granted)
            .sum()
    }

    /// One holder's report: updates its demand, grants it its fair share
    /// as far as the others' shares in force leave room, and holds the
    /// grant until `now + terms.hold_micros`.
    pub fn report(&mut self, holder: &str, report: Report, terms: Terms, now_micros: u64) -> Grant {
        self.report_beside(holder, report, terms, now_micros, None, true)
    }

    /// The share `holder` has in force at `now`, if any.
    pub fn share(&self, holder: &str, now_micros: u64) -> Option<Share> {
        self.shares
            .get(holder)
            .filter(|s| s.expires_micros > now_micros)
            .copied()
    }

    /// [`Ledger::report`] on a limit that requests decided one at a time
    /// count too ([`Counted`]): `beside` is their demand, which takes part
    /// in the water-filling as one more holder that is never granted a
    /// share (it spends the count directly), and the room the limit's
    /// windows leave, which caps the grant ([`window`]). Without `spare`,
    /// the holder gets no part of what nobody asked for: it is left to
    /// requests decided one at a time (a token bucket's share is charged
    /// whether it is spent or not: [`bucket`]).
    pub fn report_beside(
        &mut self,
        holder: &str,
        report: Report,
        terms: Terms,
        now_micros: u64,
        beside: Option<Beside>,
        spare: bool,
    ) -> Grant {
        self.expire(now_micros);
        let demand = next_demand(
            self.shares.get(holder).map(|s| s.demand),
            measured(report, terms),
        );
        // Holders in name order, so that ties in demand break the same way
        // on every replica (Lua sorts the hash's fields the same way, up to
        // the server's collation: a tie can move one token, never the sum).
        let mut names: Vec<&str> = self
            .shares
            .keys()
            .map(String::as_str)
            .filter(|h| *h != holder)
            .collect();
        names.push(holder);
        names.sort_unstable();
        let mut demands = Vec::with_capacity(names.len());
        let mut others = 0u64;
        let mut me = 0;
        for (i, h) in names.iter().enumerate() {
            if *h == holder {
                me = i;
                demands.push(demand);
            } else if let Some(share) = self.shares.get(*h) {
                others = others.saturating_add(share.granted);
                demands.push(share.demand);
            }
        }
        if let Some(b) = beside {
            // Last, as lua/rlqs_lease.lua places it: ties in demand go to
            // the streams first.
            demands.push(b.demand);
        }
        let mut target = fair_target(&demands, me, terms.capacity);
        if !spare {
            // Its max-min fair share of the demands, without a part of
            // what nobody asked for.
            target = target.min(demands[me]);
        }
        let room = terms.capacity.saturating_sub(others);
        let tokens = target.min(room).min(beside.map_or(u64::MAX, |b| b.room));
        self.shares.insert(
            holder.to_owned(),
            Share {
                granted: tokens,
                expires_micros: now_micros.saturating_add(terms.hold_micros),
                demand,
            },
        );
        Grant {
            tokens,
            holders: self.shares.len() as u64,
            granted_total: others + tokens,
        }
    }
}

pub mod bucket;
pub mod window;

/// How requests decided one at a time count a limit whose ledger shares
/// it with Envoys, so that both keep one count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// In fixed windows of the limiter's state: each share reserves its
    /// part of every window it covers ([`window`]).
    Window(window::Fixed),
    /// In a token bucket: each share is charged to the bucket when
    /// granted ([`bucket`]).
    Bucket(bucket::Bucket),
}

#[cfg(test)]
mod tests;
