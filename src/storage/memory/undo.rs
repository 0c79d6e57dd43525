//! Taking back what a receipt says one call recorded, on one limiter's
//! state, with the semantics of the scripts' undo mode in `lua/`. Each
//! function removes at most what the receipt names, from where it was
//! recorded, and only while that still counts; what can no longer be
//! told apart stays counted (see [`crate::storage::Store::undo`]).

use std::collections::VecDeque;

use super::*;
use crate::limit::{bucket_scale, lease_period};

use super::algorithms::{AHEAD, Leased, drain};

/// Fixed window: the count of the receipt's window, only while that
/// window is the current one (a later window never counted the hit), or
/// the hits reserved in it, while it is still to come; and only where
/// what it recorded may not predate the limiter's last reset (`reset_at`):
/// a reset deleted that count, and the count after it holds other hits.
/// The receipt names its window, not when it was recorded, so a window
/// the reset fell in (or, for a reservation, one of the seven windows
/// before it, which may have reserved it) gives nothing back after a
/// reset: an error towards refusing.
pub(super) fn fixed_window(
    now: u64,
    hit: &Hit<'_>,
    r: &Receipt,
    (window, reset_at): (u64, Option<u64>),
    count: &mut u64,
    ahead: &mut [u64; AHEAD],
) {
    let idx = hit.window.span(now).index;
    if let Some(reset_at) = reset_at {
        // The first window whose calls may have recorded it: its own, or
        // for a reservation the earliest that could have reserved it.
        let first = if r.at > idx {
            r.at.saturating_sub(AHEAD as u64)
        } else {
            r.at
        };
        let start = match hit.window.zone() {
            None => first.saturating_mul(hit.window.micros()),
            // A calendar window's index is its first second.
            Some(_) => first.saturating_mul(1_000_000),
        };
        if reset_at >= start {
            return;
        }
    }
    if window == r.at && idx == r.at {
        *count = count.saturating_sub(r.hits);
    } else if hit.window.zone().is_none() && r.at > window && r.at >= idx {
        // The state is rolled at its next hit: reservations count from
        // its own window.
        if let Some(a) = ahead.get_mut((r.at - window - 1) as usize) {
            *a = a.saturating_sub(r.hits);
        }
    }
}

/// Counter: the receipt's bucket, while it is still one of the `n`
/// buckets in the trailing window. `window` is the index of the state's
/// newest bucket, `counts[age]` the bucket `age` buckets older.
pub(super) fn sliding_counter(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    r: &Receipt,
    window: u64,
    counts: &mut [u64],
) {
    let n = hit.buckets.clamp(DEFAULT_BUCKETS, MAX_BUCKETS) as usize;
    if counts.len() != n || r.at > window {
        return;
    }
    let spans = n as u64 - 1;
    let idx = (u128::from(now) * u128::from(spans) / u128::from(w)) as u64;
    // Buckets the state has not been moved past yet: the receipt's age
    // counts from the state's newest bucket, and one older than the
    // trailing window at `now` has stopped counting anyway.
    let age = window - r.at;
    if idx.saturating_sub(r.at) >= n as u64 {
        return;
    }
    if let Some(c) = counts.get_mut(age as usize) {
        *c = c.saturating_sub(r.hits);
    }
}

/// Log: the member at the receipt's time, less at most the receipt's
/// cost (hits of one instant share a member), removed when nothing is
/// left of it. A member whose time moved (a later hit joined a full log's
/// newest member) is not found, and stays.
pub(super) fn sliding_log(r: &Receipt, entries: &mut VecDeque<(u64, u64)>, sum: &mut u64) {
    // A member is named by its time here (`at` and `mark` alike).
    if r.at != r.mark {
        return;
    }
    let Ok(i) = entries.binary_search_by(|&(ts, _)| ts.cmp(&r.at)) else {
        return;
    };
    let take = r.hits.min(entries[i].1);
    entries[i].1 -= take;
    *sum -= take;
    if entries[i].1 == 0 {
        entries.remove(i);
    }
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
pub(super) fn token_bucket(
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

/// Takes back what `r` recorded on the limiter of `key` in `shard`
/// (locked by the caller).
pub(super) fn take_back_in(shard: &mut Shard, key: &str, hit: &Hit<'_>, r: &Receipt, now: u64) {
    let w = hit.window.micros();
    let reset_at = shard
        .resets
        .get(key)
        .filter(|&&(_, until)| now < until)
        .map(|&(at, _)| at);
    let Some(slot) = shard.slots.get_mut(key) else {
        return;
    };
    let before = state_bytes(slot);
    match &mut slot.state {
        State::Fixed {
            window,
            count,
            ahead,
            ..
        } => undo::fixed_window(now, hit, r, (*window, reset_at), count, ahead),
        State::Counter { window, counts } => undo::sliding_counter(now, w, hit, r, *window, counts),
        State::Log { entries, sum } => undo::sliding_log(r, entries, sum),
        State::Bucket {
            stamp,
            debt,
            scale,
            leased,
        } => undo::token_bucket(now, w, hit, r, stamp, debt, *scale, leased),
    }
    shard.held = shard.held.saturating_sub(before) + state_bytes(slot);
}
