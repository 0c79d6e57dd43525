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
    staggered: false,
    roles: &[Role::LogSet, Role::LogMeta],
    lua: include_str!("../../../lua/sliding_window_log.lua"),
    batch_id: 3,
    param: Param::Buckets,
    leasing: Leasing::Log,
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

/// How long a lease of a log of window `w` (microseconds) may be spent:
/// a tenth of the window, within a millisecond and ten seconds. Its hits
/// are recorded at its end, so each counts at most this much longer than
/// if it had been recorded when admitted. The store stamps a lease with
/// it and the leasing layer spends the lease for it, counted from when
/// the call was sent: never after the stamp.
pub fn lease_life(w: u64) -> u64 {
    (w / 10).clamp(1_000, 10_000_000)
}

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
///
/// The steps of lua/sliding_window_log.lua: prune, then its `decide`
/// (give back, refuse a cost above the limit, admit, record a report,
/// refuse), each a method of [`Log`].
fn decide(
    now: u64,
    w: u64,
    hit: &Hit<'_>,
    entries: &mut VecDeque<(u64, u64)>,
    sum: &mut u64,
    max_members: usize,
) -> (Decision, u64) {
    let mut log = Log {
        entries,
        sum,
        now,
        w,
        limit: hit.limit,
        max_members,
    };
    log.prune();
    log.shrink();
    let d = if hit.negative {
        log.give_back(hit.hits)
    } else if hit.hits > log.limit && !hit.usage_reports {
        decision(false, log.remaining(), w)
    } else if *log.sum + hit.hits <= log.limit {
        log.admit(hit)
    } else if hit.usage_reports && hit.hits > 0 {
        log.record_report(hit.hits)
    } else {
        decision(false, log.remaining(), log.wait_for(hit.hits))
    };
    (d, log.expires())
}

/// A log as one decision sees it: its entries and their sum, the clock,
/// the window and the limit. Its methods are the script's local functions
/// and the branches of the script's `decide`.
struct Log<'a> {
    /// (timestamp in microseconds, cost), oldest first.
    entries: &'a mut VecDeque<(u64, u64)>,
    /// The costs in `entries`.
    sum: &'a mut u64,
    now: u64,
    w: u64,
    limit: u64,
    max_members: usize,
}

impl Log<'_> {
    /// The script's "Prune the hits that stopped counting": a hit at time
    /// t counts while t > now - w.
    fn prune(&mut self) {
        while let Some(&(ts, cost)) = self.entries.front() {
            if ts + self.w <= self.now {
                self.entries.pop_front();
                *self.sum -= cost;
            } else {
                break;
            }
        }
    }

    /// Memory follows the log down as well as up; a quarter full, so that
    /// a log hovering around one length does not reallocate back and forth
    /// (the embedded store's own step: Redis keeps its memory).
    fn shrink(&mut self) {
        let entries = &mut *self.entries;
        if entries.capacity() > 8 && entries.len() <= entries.capacity() / 4 {
            entries.shrink_to(entries.len() * 2);
        }
    }

    /// The script's `remaining`.
    fn remaining(&self) -> u64 {
        self.limit.saturating_sub(*self.sum)
    }

    /// The script's `oldest_reset`: until the oldest hit stops counting.
    fn oldest_reset(&self) -> u64 {
        self.entries
            .front()
            .map(|&(ts, _)| ts + self.w - self.now)
            .unwrap_or(0)
    }

    /// When the newest hit stops counting (the script's expiry in `save`).
    fn expires(&self) -> u64 {
        self.entries
            .back()
            .map(|&(ts, _)| ts + self.w)
            .unwrap_or(self.now)
    }

    /// The script's negative branch: gives back from the newest hits, not
    /// a lease's (stamped ahead of now: they go back only through the
    /// lease's receipt).
    fn give_back(&mut self, hits: u64) -> Decision {
        let mut back = hits;
        while back > 0 {
            let Some(i) = self.entries.iter().rposition(|&(ts, _)| ts <= self.now) else {
                break;
            };
            let last = &mut self.entries[i];
            let take = back.min(last.1);
            last.1 -= take;
            *self.sum -= take;
            back -= take;
            if last.1 == 0 {
                self.entries.remove(i);
            }
        }
        decision(true, self.remaining(), self.oldest_reset())
    }

    /// The script's admitting branch: a positive cost is recorded at now;
    /// a lease's at the end of its life ([`lease_life`]).
    fn admit(&mut self, hit: &Hit<'_>) -> Decision {
        let mut at = 0;
        if hit.hits > 0 {
            let when = if hit.lease {
                self.now + lease_life(self.w)
            } else {
                self.now
            };
            at = record(
                self.entries,
                when,
                self.w,
                hit.hits,
                self.limit,
                self.max_members,
            );
            *self.sum += hit.hits;
        }
        let d = decision(true, self.limit - *self.sum, self.oldest_reset());
        with_receipt(d, hit, hit.hits, at, at)
    }

    /// The script's usage report branch: a positive cost that does not fit
    /// is recorded all the same (the sum saturating at [`MAX_COUNT`]), on
    /// the newest entry while the log is at or past its limit, and
    /// refused.
    fn record_report(&mut self, hits: u64) -> Decision {
        let add = hits.min(MAX_COUNT - *self.sum);
        match self.entries.back_mut() {
            Some(last) if *self.sum >= self.limit => *last = (last.0.max(self.now), last.1 + add),
            _ if add == 0 => {}
            _ => {
                record(
                    self.entries,
                    self.now,
                    self.w,
                    add,
                    self.limit,
                    self.max_members,
                );
            }
        }
        *self.sum += add;
        decision(false, 0, self.wait_for(0))
    }

    /// The script's `wait_for`: refused, the first moment enough of the
    /// oldest hits have left for a hit of `cost`.
    fn wait_for(&self, cost: u64) -> u64 {
        let mut freed = 0;
        for &(ts, c) in self.entries.iter() {
            freed += c;
            if *self.sum - freed + cost <= self.limit {
                return ts + self.w - self.now;
            }
        }
        self.w
    }
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
    if let Some(&(newest, _)) = entries.back()
        && at < newest
        && newest > now
    {
        // A lease's member is stamped ahead of now: the hit goes in time
        // order (into the first member at or after it when the log is
        // full: it counts longer, never shorter).
        let i = entries.partition_point(|&(ts, _)| ts < at);
        if entries[i].0 == at || full {
            entries[i].1 += cost;
            return entries[i].0;
        }
        grow(entries, max_members);
        entries.insert(i, (at, cost));
        return at;
    }
    if let Some(last) = entries.back_mut() {
        // A rounded time may be ahead of now: members stay in time order.
        at = at.max(last.0);
        if last.0 == at || full {
            last.0 = at;
            last.1 += cost;
            return at;
        }
    }
    grow(entries, max_members);
    entries.push_back((at, cost));
    at
}

/// Room for one more member, grown by hand, doubling up to the room and
/// no further: the default growth could allocate past it.
fn grow(entries: &mut VecDeque<(u64, u64)>, max_members: usize) {
    if entries.len() == entries.capacity() {
        let len = entries.len();
        let target = (len * 2).clamp(4, max_members.max(1));
        entries.reserve_exact(target.saturating_sub(len).max(1));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Unit, Window};
    use crate::storage::{Ahead, Shard};

    const SEC: u64 = 1_000_000;

    fn hit(hits: u64, lease: bool, negative: bool) -> Hit<'static> {
        Hit {
            domain: "d",
            entries: &[],
            algorithm: Algorithm::SlidingWindowLog,
            limit: 10,
            window: Window::new(Unit::Second, 10).unwrap(),
            hits,
            negative,
            usage_reports: false,
            buckets: 2,
            burst: 0,
            shard: Shard::NONE,
            receipt: true,
            also: &[],
            lease,
            ahead: Ahead::NONE,
        }
    }

    fn at(log: &mut Memory, now: u64, h: Hit<'_>) -> Decision {
        log.decide(now, &h, 10, &mut 0)
    }

    /// A lease's hits are stamped at its end (a tenth of the window on),
    /// so they count until that end plus a window: in every trailing
    /// window any hit admitted from it would count in.
    #[test]
    fn a_lease_counts_from_its_end() {
        let t0 = 1_000 * SEC;
        let life = lease_life(10 * SEC);
        assert_eq!(life, SEC);
        let mut log = Memory::default();
        let lease = at(&mut log, t0, hit(4, true, false));
        assert!(lease.admitted);
        let r = lease.receipt.unwrap();
        assert_eq!((r.hits, r.at), (4, t0 + life));
        // A plain hit after it goes in time order, before it.
        assert!(at(&mut log, t0 + 1, hit(1, false, false)).admitted);
        assert_eq!(log.entries, [(t0 + 1, 1), (t0 + life, 4)]);
        // The plain hit has stopped counting, the lease's have not.
        let d = at(&mut log, t0 + 10 * SEC + 1, hit(0, false, false));
        assert_eq!(d.remaining, 6);
        assert_eq!(d.reset_micros, life - 1);
        let d = at(&mut log, t0 + 10 * SEC + life, hit(0, false, false));
        assert_eq!(d.remaining, 10);
    }

    /// A lease gives back what it did not use through its receipt, part
    /// of its member; a client's give-back takes from the newest hits
    /// admitted, never from a lease's (its replica may still spend them).
    #[test]
    fn a_lease_goes_back_only_through_its_receipt() {
        let t0 = 1_000 * SEC;
        let mut log = Memory::default();
        assert!(at(&mut log, t0, hit(2, false, false)).admitted);
        let lease = at(&mut log, t0 + 5, hit(5, true, false));
        let d = at(&mut log, t0 + 10, hit(3, false, true));
        assert_eq!(d.remaining, 5, "only the 2 plain hits went back");
        assert_eq!(log.entries, [(t0 + 5 + SEC, 5)]);
        let r = lease.receipt.unwrap();
        log.undo(
            t0 + 20,
            &hit(3, true, false),
            &Receipt { hits: 3, ..r },
            None,
        );
        assert_eq!(log.entries, [(t0 + 5 + SEC, 2)]);
        assert_eq!(at(&mut log, t0 + 30, hit(0, false, false)).remaining, 8);
    }
}
