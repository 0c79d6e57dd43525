//! `token_bucket`: `burst` tokens refilled at `requests_per_unit` per
//! `unit` (the generic cell rate algorithm: one stored arrival time).
//! Exact, constant memory; the burst is its own number.

use super::*;
use crate::limit::{bucket_scale, effective_burst, lease_period};

pub const SPEC: Spec = Spec {
    name: "token_bucket",
    key_code: 't',
    keys_buckets: false,
    staggered: false,
    roles: &[Role::State],
    lua: include_str!("../../../lua/token_bucket.lua"),
    batch_id: 4,
    param: Param::Burst,
    leasing: Leasing::Tokens,
    refusals: Refusals::SameCost,
    rlqs: Rlqs::Bucket,
    reset: Reset::NewBucket,
    bound: Bound::Bucket,
    calendar: false,
    own_keys: &["burst"],
    entry_per_hit: None,
    takes_reports: true,
    memory: || State::Bucket(Memory::default()),
};

// The embedded store.

/// Its state in the embedded store.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// When `debt` was counted (microseconds).
    stamp: u64,
    /// Time until the bucket is full, in units of `1 / scale` µs.
    debt: u64,
    scale: u64,
    /// Tokens leased out.
    leased: Leased,
}

impl Embedded for Memory {
    fn decide(&mut self, now: u64, hit: &Hit<'_>, _: usize, expires_at: &mut u64) -> Decision {
        let Memory {
            stamp,
            debt,
            scale,
            leased,
        } = self;
        let (d, exp) = decide(now, hit.window.micros(), hit, stamp, debt, scale, leased);
        *expires_at = exp;
        d
    }

    fn undo(&mut self, now: u64, hit: &Hit<'_>, r: &Receipt, _: Option<u64>) {
        let w = hit.window.micros();
        let Memory {
            stamp,
            debt,
            scale,
            leased,
        } = self;
        undo(now, w, hit, r, stamp, debt, *scale, leased);
    }

    fn heap_bytes(&self) -> usize {
        0
    }

    /// A reset starts a new bucket after `now`: a lease or a charge
    /// taken before it gives nothing back into it.
    fn forget(&mut self, now: u64, _: &Hit<'_>) {
        self.leased.since = now + 1;
    }
}

/// Tokens leased out of a token bucket, as `lua/token_bucket.lua` keeps
/// them: `h` leased in `period`, `o` in the period before. A lease lives
/// until the end of the period after its own, and while it lives its
/// tokens count as still in the bucket for the bucket's size.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Leased {
    period: u64,
    h: u64,
    o: u64,
    /// When the bucket's state began (the script's `b`): a lease or a
    /// charge from before it (a reset ago) is not this bucket's.
    since: u64,
}

impl Leased {
    /// Tokens leased out during period `q`.
    fn held_in(&self, q: u64) -> u64 {
        let mut n = 0;
        if q == self.period || q == self.period + 1 {
            n += self.h;
        }
        if q == self.period || q + 1 == self.period {
            n += self.o;
        }
        n
    }

    /// Moves to period `current`: leases older than the one before end.
    fn roll(&mut self, current: u64) {
        if self.period != current {
            self.o = if self.period + 1 == current {
                self.h
            } else {
                0
            };
            self.h = 0;
            self.period = current;
        }
    }

    fn held(&self) -> u64 {
        self.h + self.o
    }

    /// Whether a lease taken at `at` lives at `now` in this bucket (the
    /// leases moved to `now`'s period): taken in this period or the one
    /// before, since the state began.
    fn lives(&self, at: u64, w: u64) -> bool {
        let q = at / lease_period(w);
        at >= self.since && (q == self.period || q + 1 == self.period)
    }

    /// A lease of `tokens` from period `q` ends.
    fn end(&mut self, q: u64, tokens: u64) {
        if q == self.period {
            self.h = self.h.saturating_sub(tokens);
        } else if q + 1 == self.period {
            self.o = self.o.saturating_sub(tokens);
        }
    }
}

/// Drains a bucket's debt from `stamp` to `now` at `k` units per
/// microsecond, never below the time of the tokens leased out (`step`
/// units each), period by period as leases end; then moves the leases to
/// `now`'s period.
fn drain(
    now: u64,
    w: u64,
    (step, k): (u64, u64),
    stamp: &mut u64,
    debt: &mut u64,
    leased: &mut Leased,
) {
    let period = lease_period(w);
    let mut from = *stamp;
    while from < now {
        let q = from / period;
        let floor = leased.held_in(q) * step;
        let to = if floor > 0 && (q + 1) * period < now {
            (q + 1) * period
        } else {
            now
        };
        let drained = u128::from(to - from) * u128::from(k);
        if *debt > floor {
            *debt = (u128::from(*debt).saturating_sub(drained) as u64).max(floor);
        }
        from = to;
    }
    *stamp = (*stamp).max(now);
    leased.roll(now / period);
}

/// The token bucket (generic cell rate algorithm), as
/// `lua/token_bucket.lua`: `burst` tokens refilled at `limit` per window
/// `w`. The state is the bucket's debt at `stamp`: the time until it is
/// full again, in units of `1 / k` microsecond (see
/// [`crate::limit::bucket_scale`]), so one token is exactly `step` units
/// and nothing is rounded. `scale` is the `k` the debt was counted in (0:
/// new); a changed limit converts it, rounded up. A refused call takes
/// nothing; a cost above the burst is refused and not recorded unless the
/// limiter takes usage reports, which put the bucket into debt.
/// A hit with `lease` set takes a lease of its cost (the answer's reset
/// is the lease's life, its receipt `{tokens, when it was taken,
/// tokens}`).
fn decide(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    stamp: &mut u64,
    debt: &mut u64,
    scale: &mut u64,
    leased: &mut Leased,
) -> (Decision, u64) {
    let (step, k) = bucket_scale(hit.limit, w);
    let burst = effective_burst(hit.burst, hit.limit, hit.window);
    let max = u128::from(MAX_COUNT);
    if *scale != 0 && *scale != k {
        let converted = (u128::from(*debt) * u128::from(k)).div_ceil(u128::from(*scale));
        *debt = converted.min(max) as u64;
    }
    if *scale == 0 {
        // A new state (one left by a reset may begin later).
        leased.since = leased.since.max(now);
    }
    *scale = k;
    drain(now, w, (step, k), stamp, debt, leased);
    let floor = leased.held() * step;
    let full = burst * step;
    let micros = |units: u64| units.div_ceil(k);
    let remaining = |debt: u64| full.saturating_sub(debt) / step;
    let cost = u128::from(hit.hits) * u128::from(step);
    let d = if hit.negative {
        *debt = (u128::from(*debt).saturating_sub(cost) as u64).max(floor);
        decision(true, remaining(*debt), micros(*debt))
    } else if hit.hits > burst && !hit.usage_reports {
        decision(false, remaining(*debt), micros(full))
    } else {
        let after = (u128::from(*debt) + cost).min(max) as u64;
        if after <= full && hit.lease && hit.hits > 0 {
            *debt = after;
            let period = lease_period(w);
            let current = now / period;
            leased.h += hit.hits;
            let life = (current + 2) * period - now;
            let d = decision(true, remaining(after), life);
            with_receipt(d, hit, hit.hits, now, hit.hits)
        } else if after <= full {
            *debt = after;
            let d = decision(true, remaining(after), micros(after));
            with_receipt(d, hit, hit.hits, *stamp, after)
        } else if hit.usage_reports && hit.hits > 0 {
            *debt = after;
            decision(false, 0, micros(after - full))
        } else {
            decision(false, remaining(*debt), micros(after - full))
        }
    };
    let mut expires = *stamp + micros(*debt);
    if leased.held() > 0 {
        let period = lease_period(w);
        expires = expires.max((leased.period + 2) * period);
    }
    (d, expires)
}

/// Token bucket: gives back the part of the receipt's tokens that lies
/// after `now` on the bucket's timeline. The charge took the interval
/// `[tat - cost, tat]` of the bucket's time (`tat`: when the bucket would
/// be full again right after it, `at + mark / k`); the part of it already
/// past cannot be told from time the bucket would have refilled anyway,
/// so it stays spent. The debt never goes below zero.
/// With `lease` set on the hit, the receipt is a lease's (`{unused
/// tokens, when it was taken, tokens leased}`): the lease ends and its
/// unused tokens go back, never below what other leases hold, but only
/// while it lives (see [`Leased::lives`]): once its life is over the
/// bucket has refilled over its tokens, and a reset since gave the whole
/// bucket back, so a give-back that lands then returns nothing. Neither
/// does a charge's undo from before the state began.
#[allow(clippy::too_many_arguments)]
fn undo(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    r: &Receipt,
    stamp: &mut u64,
    debt: &mut u64,
    scale: u64,
    leased: &mut Leased,
) {
    let (step, k) = bucket_scale(hit.limit, w);
    if hit.lease {
        drain(now, w, (step, k), stamp, debt, leased);
        if !leased.lives(r.at, w) {
            return;
        }
        leased.end(r.at / lease_period(w), r.mark);
        if scale == k {
            *debt = debt.saturating_sub(r.hits.saturating_mul(step));
        }
        *debt = (*debt).max(leased.held() * step);
        return;
    }
    if scale != k || *stamp < r.at || r.at < leased.since {
        // Another limit's units, or a state older than the charge (it was
        // forgotten and started again): nothing to tell apart.
        return;
    }
    drain(now, w, (step, k), stamp, debt, leased);
    let drained = u128::from(now.saturating_sub(r.at)) * u128::from(k);
    let ahead = u128::from(r.mark).saturating_sub(drained);
    let back = ahead.min(u128::from(r.hits) * u128::from(step));
    *debt = (u128::from(*debt).saturating_sub(back) as u64).max(leased.held() * step);
}
