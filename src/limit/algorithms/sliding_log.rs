//! `sliding_window_log`: every admitted hit with its time. Exact in every
//! trailing window; memory per hit, so its limit is capped
//! (`max_log_limit`).

use std::collections::VecDeque;

use super::*;
use crate::storage::memory::heap::{LOG_MEMBER_BYTES, heap};

pub const SPEC: Spec = Spec {
    name: "sliding_window_log",
    key_code: 'l',
    keys_buckets: false,
    roles: &[Role::LogSet, Role::LogMeta],
    lua: include_str!("../../../lua/sliding_window_log.lua"),
    batch_id: 3,
    param: Param::Buckets,
    leasing: Leasing::Never("a sliding window is decided in the store on every hit"),
    refusals: Refusals::Single,
    rlqs: Rlqs::Ledger,
    reset: Reset::Delete,
    bound: Bound::Trailing,
    calendar: false,
    own_keys: &[],
    entry_per_hit: Some((
        "a log keeps every admitted hit",
        "use algorithm: sliding_window_counter, or raise max_log_limit",
    )),
    takes_reports: true,
    memory: || State::Log(Memory::default()),
};

// The embedded store.

/// Its state in the embedded store.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// (timestamp in microseconds, cost), oldest first.
    pub(crate) entries: VecDeque<(u64, u64)>,
    sum: u64,
}

impl Embedded for Memory {
    fn decide(
        &mut self,
        now: u64,
        hit: &Hit<'_>,
        max_members: usize,
        expires_at: &mut u64,
    ) -> Decision {
        let w = hit.window.micros();
        let (d, exp) = decide(now, w, hit, &mut self.entries, &mut self.sum, max_members);
        *expires_at = exp;
        d
    }

    fn undo(&mut self, _: u64, _: &Hit<'_>, r: &Receipt, _: Option<u64>) {
        undo(r, &mut self.entries, &mut self.sum);
    }

    fn heap_bytes(&self) -> usize {
        heap(self.entries.capacity() * LOG_MEMBER_BYTES)
    }
}

/// The exact trailing window: every admitted hit with its time and cost,
/// in at most `max_members` members. A limit above that keeps its hits at
/// a coarser time (see the module docs). A limiter that takes usage
/// reports also records the costs that take it over (or are over the limit
/// themselves); while the log is already at or past its limit such a cost
/// is added to the newest entry, which takes the report's time, so a log
/// never holds more entries than its limit.
fn decide(
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
fn record(
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

/// Log: the member at the receipt's time, less at most the receipt's
/// cost (hits of one instant share a member), removed when nothing is
/// left of it. A member whose time moved (a later hit joined a full log's
/// newest member) is not found, and stays.
fn undo(r: &Receipt, entries: &mut VecDeque<(u64, u64)>, sum: &mut u64) {
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
