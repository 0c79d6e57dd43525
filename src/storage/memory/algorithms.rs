//! The four algorithms on one limiter's state, with the semantics of the
//! scripts in `lua/`: each decides a hit and records it in one step, and
//! returns when the state stops counting.

use std::collections::VecDeque;

use super::*;
use crate::limit::{Span, bucket_scale, effective_burst, lease_period};
use crate::quota::window::Held;
use crate::storage::Ahead;

/// Recorded usage saturates here, as in the scripts (Redis Lua numbers are
/// doubles, exact below 2^53): a usage report may carry any cost, and a
/// limiter that far over its limit is refused for its whole window anyway.
pub(super) const MAX_COUNT: u64 = 1 << 53;

/// Epoch-aligned fixed window, or a calendar one (its index the first
/// second of the local day, week, month or year). Every counted hit stays
/// counted, admitted or not (as the reference service does), except a
/// cost above the limit, which can never pass and is not recorded unless
/// the limiter takes usage reports. What quota streams' shares hold of a
/// window (`held`, [`crate::quota::window`]) is spent with its count: a
/// hit is admitted only while both stay within the limit.
pub(super) fn fixed_window(
    now: u64,
    hit: &Hit<'_>,
    window: &mut u64,
    count: &mut u64,
    ahead: &mut [u64; AHEAD],
    held: &mut Option<Box<Held>>,
) -> (Decision, u64) {
    let Span { index: idx, end } = hit.window.span(now);
    let fixed = hit.window.zone().is_none();
    if *window != idx {
        // The hits reserved for this window by leases taken in an earlier
        // one are its count (a calendar window reserves none).
        let shift = idx.wrapping_sub(*window);
        if fixed && idx > *window && shift <= AHEAD as u64 {
            let s = shift as usize;
            *count = ahead[s - 1];
            ahead.rotate_left(s);
            ahead[AHEAD - s..].fill(0);
        } else {
            *count = 0;
            *ahead = [0; AHEAD];
        }
        *window = idx;
        if let Some(h) = held {
            h.forget_before(idx);
            if h.is_empty() {
                *held = None;
            }
        }
    }
    let w = hit.window.micros();
    // Hits the shares hold of window `i`; nothing to work out (on every
    // decision) where no share holds any.
    let shared = |i: u64| {
        held.as_ref().map_or(0, |h| {
            h.hits(
                i,
                crate::quota::fill_secs(hit.window).saturating_mul(1_000_000),
            )
        })
    };
    let now_shared = shared(idx);
    let limit = hit.limit;
    let reset = end - now;
    let expires = |ahead: &[u64; AHEAD]| {
        let last = ahead
            .iter()
            .rposition(|&a| a > 0)
            .map_or(0, |j| j as u64 + 1);
        let shares = held
            .as_ref()
            .and_then(|h| h.last())
            .map_or(0, |i| (i + 1).saturating_mul(w));
        (end + last * w).max(shares)
    };
    let left = |count: u64| limit.saturating_sub(count.saturating_add(now_shared));
    if hit.negative {
        *count = count.saturating_sub(hit.hits);
        return (decision(true, left(*count), reset), expires(ahead));
    }
    if hit.hits > limit && !hit.usage_reports {
        return (decision(false, left(*count), reset), expires(ahead));
    }
    let before = *count;
    *count = count.saturating_add(hit.hits).min(MAX_COUNT);
    let admitted = count.saturating_add(now_shared) <= limit;
    // A refusal the shares take part in holds at most a second: a share
    // may shrink at its stream's next report.
    let reset = if !admitted && now_shared > 0 {
        reset.min(crate::quota::window::REFUSAL_MICROS)
    } else {
        reset
    };
    let d = decision(admitted, left(*count), reset);
    // An admitted lease's reservations in the next windows, window after
    // window while each has room (as lua/fixed_window.lua).
    let mut granted = 0;
    if admitted && fixed && hit.receipt && !hit.ahead.is_none() {
        let wanted = usize::from(hit.ahead.windows.min(Ahead::MAX_WINDOWS));
        for (j, a) in ahead.iter_mut().take(wanted).enumerate() {
            let room = limit.saturating_sub(shared(idx + 1 + j as u64));
            if a.saturating_add(hit.ahead.hits) > room {
                break;
            }
            *a += hit.ahead.hits;
            granted += 1;
        }
    }
    (
        with_receipt(d, hit, *count - before, idx, granted),
        expires(ahead),
    )
}

/// The count of window `index` as a fixed window's state holds it, without
/// moving the state: the current window's count, the hits reserved ahead
/// in a later one, or nothing.
pub(super) fn counted_at(window: u64, count: u64, ahead: &[u64; AHEAD], index: u64) -> u64 {
    if index == window {
        count
    } else if index > window && index - window <= AHEAD as u64 {
        ahead[(index - window - 1) as usize]
    } else {
        0
    }
}

/// Windows after the current one whose reserved hits a fixed window's
/// state keeps ([`Ahead::MAX_WINDOWS`]).
pub(super) const AHEAD: usize = Ahead::MAX_WINDOWS as usize;

/// `n` epoch-aligned buckets of `w / (n - 1)` each: the current one, `n - 2`
/// full ones, and the oldest, which weighs what is left of it in the
/// trailing window. With `n = 2` that is the classic previous-and-current
/// pair. Only admitted hits are recorded, unless the limiter takes usage
/// reports: then every positive cost is, and the answer is refused while
/// the estimate is over the limit.
///
/// Time is counted in units of `1 / (n - 1)` microsecond ("scaled"), so a
/// bucket is exactly `w` scaled units long whatever `n` is and no bucket
/// boundary is rounded; real durations are the scaled ones divided by
/// `n - 1`, rounded up.
pub(super) fn sliding_counter(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    window: &mut u64,
    counts: &mut Vec<u64>,
) -> (Decision, u64) {
    let n = hit.buckets.clamp(DEFAULT_BUCKETS, MAX_BUCKETS) as usize;
    let spans = n as u64 - 1;
    let scaled = u128::from(now) * u128::from(spans);
    let idx = (scaled / u128::from(w)) as u64;
    let elapsed = (scaled - u128::from(idx) * u128::from(w)) as u64;
    let real = |scaled: u64| scaled.div_ceil(spans);
    if counts.len() != n {
        counts.clear();
        // Exactly n: the default growth would round 2 buckets up to 4.
        counts.reserve_exact(n);
        counts.resize(n, 0);
    } else if idx >= *window && idx - *window < n as u64 {
        let shift = (idx - *window) as usize;
        counts.rotate_right(shift);
        counts[..shift].fill(0);
    } else if idx != *window {
        counts.fill(0);
    }
    *window = idx;
    let expires = now + real(n as u64 * w - elapsed);
    let limit = hit.limit;
    // The same floating-point steps as lua/sliding_window_counter.lua.
    // Multiplying before dividing keeps the estimate exact while
    // oldest x window stays below 2^53.
    let wf = w as f64;
    let left = (w - elapsed) as f64;
    let estimate = |counts: &[u64]| {
        let full: u64 = counts[..n - 1].iter().sum();
        counts[n - 1] as f64 * left / wf + full as f64
    };
    let remaining = |est: f64| {
        let r = (limit as f64 - est).floor();
        if r > 0.0 { r as u64 } else { 0 }
    };
    // Until the oldest bucket holding hits has left the trailing window.
    let ok_reset = |counts: &[u64]| match counts.iter().rposition(|&c| c > 0) {
        Some(age) => real((n - age) as u64 * w - elapsed),
        None => 0,
    };
    if hit.negative {
        let mut back = hit.hits;
        for c in counts.iter_mut() {
            let take = back.min(*c);
            *c -= take;
            back -= take;
        }
        let est = estimate(counts);
        return (decision(true, remaining(est), ok_reset(counts)), expires);
    }
    // Refused: the first bucket (j buckets on) where the full ones fit a
    // hit of `cost`, then the moment in it when the oldest has lost enough
    // weight: oldest x (w - e) / w <= room  holds from
    // e = w - floor(w x room / oldest).
    let wait_for = |counts: &[u64], cost: u64| {
        let need = (limit - cost) as f64;
        for j in 0..n {
            let full: u64 = counts[..n - 1 - j].iter().sum();
            if full as f64 > need {
                continue;
            }
            let oldest = counts[n - 1 - j];
            let at = if oldest == 0 {
                0
            } else {
                w - ((wf * (need - full as f64) / oldest as f64).floor() as u64).min(w)
            };
            return if j == 0 {
                real(at.saturating_sub(elapsed)).max(1)
            } else {
                real(j as u64 * w + at - elapsed)
            };
        }
        w
    };
    let est = estimate(counts);
    if hit.hits > limit && !hit.usage_reports {
        return (decision(false, remaining(est), w), expires);
    }
    if est + hit.hits as f64 <= limit as f64 {
        counts[0] += hit.hits;
        let est = estimate(counts);
        let d = decision(true, remaining(est), ok_reset(counts));
        return (with_receipt(d, hit, hit.hits, idx, 0), expires);
    }
    if hit.usage_reports {
        // Recorded all the same; refused until a check would pass.
        counts[0] = counts[0].saturating_add(hit.hits).min(MAX_COUNT);
        let d = decision(false, remaining(estimate(counts)), wait_for(counts, 0));
        return (d, expires);
    }
    (
        decision(false, remaining(est), wait_for(counts, hit.hits)),
        expires,
    )
}

/// The exact trailing window: every admitted hit with its time and cost,
/// in at most `max_members` members. A limit above that keeps its hits at
/// a coarser time (see the module docs). A limiter that takes usage
/// reports also records the costs that take it over (or are over the limit
/// themselves); while the log is already at or past its limit such a cost
/// is added to the newest entry, which takes the report's time, so a log
/// never holds more entries than its limit.
pub(super) fn sliding_log(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    entries: &mut VecDeque<(u64, u64)>,
    sum: &mut u64,
    max_members: usize,
) -> (Decision, u64) {
    // A hit at time t counts while t > now - w.
    while let Some(&(ts, cost)) = entries.front() {
        if ts + w <= now {
            entries.pop_front();
            *sum -= cost;
        } else {
            break;
        }
    }
    // Memory follows the log down as well as up; a quarter full, so that a
    // log hovering around one length does not reallocate back and forth.
    if entries.capacity() > 8 && entries.len() <= entries.capacity() / 4 {
        entries.shrink_to(entries.len() * 2);
    }
    let limit = hit.limit;
    let oldest_reset =
        |entries: &VecDeque<(u64, u64)>| entries.front().map(|&(ts, _)| ts + w - now).unwrap_or(0);
    let expires =
        |entries: &VecDeque<(u64, u64)>| entries.back().map(|&(ts, _)| ts + w).unwrap_or(now);
    if hit.negative {
        let mut back = hit.hits;
        while back > 0 {
            let Some(last) = entries.back_mut() else {
                break;
            };
            let take = back.min(last.1);
            last.1 -= take;
            *sum -= take;
            back -= take;
            if last.1 == 0 {
                entries.pop_back();
            }
        }
        let d = decision(true, limit.saturating_sub(*sum), oldest_reset(entries));
        return (d, expires(entries));
    }
    if hit.hits > limit && !hit.usage_reports {
        let d = decision(false, limit.saturating_sub(*sum), w);
        return (d, expires(entries));
    }
    if *sum + hit.hits <= limit {
        let mut at = 0;
        if hit.hits > 0 {
            at = record(entries, now, w, hit.hits, limit, max_members);
            *sum += hit.hits;
        }
        let d = decision(true, limit - *sum, oldest_reset(entries));
        return (with_receipt(d, hit, hit.hits, at, at), expires(entries));
    }
    // Refused: the first moment enough of the oldest hits have left for a
    // hit of `cost`.
    let wait_for = |entries: &VecDeque<(u64, u64)>, sum: u64, cost: u64| {
        let mut freed = 0;
        for &(ts, c) in entries.iter() {
            freed += c;
            if sum - freed + cost <= limit {
                return ts + w - now;
            }
        }
        w
    };
    if hit.usage_reports && hit.hits > 0 {
        let add = hit.hits.min(MAX_COUNT - *sum);
        match entries.back_mut() {
            Some(last) if *sum >= limit => *last = (last.0.max(now), last.1 + add),
            _ if add == 0 => {}
            _ => {
                record(entries, now, w, add, limit, max_members);
            }
        }
        *sum += add;
        let d = decision(false, 0, wait_for(entries, *sum, 0));
        return (d, expires(entries));
    }
    let d = decision(
        false,
        limit.saturating_sub(*sum),
        wait_for(entries, *sum, hit.hits),
    );
    (d, expires(entries))
}

/// Adds an admitted hit of `cost` at `now` to a log of at most
/// `max_members` members.
///
/// Each member costs at least 1 and the members add up to at most `limit`,
/// so a limit within `max_members` never needs more and every hit keeps
/// its own time. Above it, times are rounded up to a granule of
/// `w / (max_members - 1)`: the members within a window then sit on
/// distinct multiples of the granule in `(now - w, now + granule)`, at most
/// `max_members` of them. Should a log still be full (its limit was raised
/// by a reload), the hit joins the newest member, whose time moves up to
/// the hit's. Either way a hit only ever counts longer, never shorter.
/// Returns the time of the member that holds the hit.
pub(super) fn record(
    entries: &mut VecDeque<(u64, u64)>,
    now: u64,
    w: u64,
    cost: u64,
    limit: u64,
    max_members: usize,
) -> u64 {
    let mut at = now;
    if limit > max_members as u64 {
        let granule = w.div_ceil((max_members as u64).saturating_sub(1).max(1));
        at = now.div_ceil(granule).saturating_mul(granule);
    }
    let full = entries.len() >= max_members;
    if let Some(last) = entries.back_mut() {
        // A rounded time may be ahead of now: members stay in time order.
        at = at.max(last.0);
        if last.0 == at || full {
            last.0 = at;
            last.1 += cost;
            return at;
        }
    }
    if entries.len() == entries.capacity() {
        // Grown by hand, doubling up to the room and no further: the
        // default growth could allocate past it.
        let len = entries.len();
        let target = (len * 2).clamp(4, max_members.max(1));
        entries.reserve_exact(target.saturating_sub(len).max(1));
    }
    entries.push_back((at, cost));
    at
}

/// Tokens leased out of a token bucket, as `lua/token_bucket.lua` keeps
/// them: `h` leased in `period`, `o` in the period before. A lease lives
/// until the end of the period after its own, and while it lives its
/// tokens count as still in the bucket for the bucket's size.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Leased {
    period: u64,
    h: u64,
    o: u64,
    /// When the bucket's state began (the script's `b`): a lease or a
    /// charge from before it (a reset ago) is not this bucket's.
    pub(super) since: u64,
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

    pub(super) fn held(&self) -> u64 {
        self.h + self.o
    }

    /// Whether a lease taken at `at` lives at `now` in this bucket (the
    /// leases moved to `now`'s period): taken in this period or the one
    /// before, since the state began.
    pub(super) fn lives(&self, at: u64, w: u64) -> bool {
        let q = at / lease_period(w);
        at >= self.since && (q == self.period || q + 1 == self.period)
    }

    /// A lease of `tokens` from period `q` ends.
    pub(super) fn end(&mut self, q: u64, tokens: u64) {
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
pub(super) fn drain(
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
pub(super) fn token_bucket(
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

/// `d` with a receipt of `recorded` hits at `at` (and `mark`), when the
/// hit asked for one and something was recorded.
fn with_receipt(mut d: Decision, hit: &Hit<'_>, recorded: u64, at: u64, mark: u64) -> Decision {
    if hit.receipt && recorded > 0 {
        d.receipt = Some(Receipt {
            hits: recorded,
            at,
            mark,
            shard: hit.shard.index,
        });
    }
    d
}

pub(super) fn decision(admitted: bool, remaining: u64, reset_micros: u64) -> Decision {
    Decision::new(admitted, remaining, reset_micros)
}
