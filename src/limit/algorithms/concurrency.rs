//! `concurrency`: at most `requests_per_unit` requests in flight. A take
//! (a positive hit) holds a slot, or is refused when every slot is held; a
//! release (a negative hit on the same descriptor, as Envoy sends at
//! stream done with `is_negative_hits`) frees one; a slot whose release
//! never comes frees itself `max_duration` after its take.
//!
//! Every take is released once, whatever its answer: Envoy's done call
//! comes for refused requests too. So a take that holds no slot (refused,
//! taken back because another limit refused the request, or held across a
//! reset) is *owed* a release, and a release pays what is owed before it
//! frees a slot: a refused request's release never frees a slot another
//! request holds. What is owed lapses `max_duration` after the last take
//! that owes it, and a release beyond what is held and owed frees nothing.
//! A release frees the oldest slot held: whichever request it came from,
//! the slots left are then at least as young as the requests still in
//! flight, so none of them is counted shorter than its `max_duration`.
//!
//! The unit is not a window: a rule says `unit: second`, and
//! `max_duration` (carried where a bucket carries its burst, [`Param`])
//! times a slot.

use std::collections::VecDeque;

use super::*;
use crate::storage::memory::heap::{LOG_MEMBER_BYTES, heap};

pub const SPEC: Spec = Spec {
    name: "concurrency",
    key_code: 'n',
    keys_buckets: false,
    staggered: false,
    roles: &[Role::LogSet, Role::LogMeta],
    lua: include_str!("../../../lua/concurrency.lua"),
    batch_id: 6,
    param: Param::MaxDuration,
    leasing: Leasing::Never(
        "a slot is freed by a later call (its release), which a replica's lease cannot see",
    ),
    refusals: Refusals::Never,
    rlqs: Rlqs::Never,
    reset: Reset::OweHeld,
    bound: Bound::InFlight,
    calendar: false,
    own_keys: &["max_duration"],
    entry_per_hit: Some(("it keeps an entry per slot held", "raise max_log_limit")),
    takes_reports: false,
    memory: || State::Slots(Memory::default()),
};

/// `max_duration` in microseconds, as a hit carries it; at least 1.
fn max_duration(hit: &Hit<'_>) -> u64 {
    hit.burst.max(1)
}

// The embedded store.

/// Its state in the embedded store.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    /// (taken at, slots), oldest first: the admitted takes still held.
    slots: VecDeque<(u64, u64)>,
    held: u64,
    /// Releases owed to takes that hold no slot.
    owed: u64,
    /// When what is owed lapses (microseconds).
    owed_until: u64,
}

impl Embedded for Memory {
    fn decide(
        &mut self,
        now: u64,
        hit: &Hit<'_>,
        max_members: usize,
        expires_at: &mut u64,
    ) -> Decision {
        let d = max_duration(hit);
        self.expire(now, d);
        let out = if hit.hits > hit.limit {
            // More than the limit at once: a take that can never pass
            // owes nothing, and a release that large frees nothing (its
            // take was such a take: Envoy gives both one cost).
            let wait = if hit.negative {
                self.oldest_reset(now, d)
            } else {
                d
            };
            decision(hit.negative, hit.limit.saturating_sub(self.held), wait)
        } else if hit.negative {
            self.release(hit.hits);
            decision(
                true,
                hit.limit.saturating_sub(self.held),
                self.oldest_reset(now, d),
            )
        } else if self.held + hit.hits <= hit.limit {
            if hit.hits > 0 {
                self.take(now, hit.hits, max_members);
            }
            let left = hit.limit - self.held;
            let at = self.slots.back().map_or(now, |&(ts, _)| ts);
            with_receipt(
                decision(true, left, self.oldest_reset(now, d)),
                hit,
                hit.hits,
                at,
                at,
            )
        } else {
            // Refused: its release is still to come, and frees nothing
            // another request holds.
            self.owe(hit.hits, now + d);
            let wait = self.wait_for(now, d, hit.hits, hit.limit);
            decision(false, hit.limit.saturating_sub(self.held), wait)
        };
        *expires_at = self.expires(now, d);
        out
    }

    /// The slot the receipt names is no longer held (another limit refused
    /// the request), and its release is owed.
    fn undo(&mut self, _: u64, hit: &Hit<'_>, r: &Receipt, reset_at: Option<u64>) {
        if reset_at.is_some_and(|at| r.at <= at) {
            // The reset already made it owed.
            return;
        }
        // A slot is named by its time here (`at` and `mark` alike); the
        // release is owed whether or not the slot is still found, as the
        // script owes it.
        if r.at == r.mark
            && let Ok(i) = self.slots.binary_search_by(|&(ts, _)| ts.cmp(&r.at))
        {
            let take = r.hits.min(self.slots[i].1);
            self.slots[i].1 -= take;
            self.held = self.held.saturating_sub(take);
            if self.slots[i].1 == 0 {
                self.slots.remove(i);
            }
        }
        self.owe(r.hits, r.at + max_duration(hit));
    }

    fn heap_bytes(&self) -> usize {
        heap(self.slots.capacity() * LOG_MEMBER_BYTES)
    }

    /// Every slot held becomes owed: the requests that hold them are
    /// forgotten, and their releases free nothing taken after the reset.
    fn forget(&mut self, now: u64, hit: &Hit<'_>) {
        let d = max_duration(hit);
        self.expire(now, d);
        if let Some(&(newest, _)) = self.slots.back() {
            self.owe(self.held, newest + d);
        }
        self.slots = VecDeque::new();
        self.held = 0;
    }
}

impl Memory {
    /// Slots whose release never came free themselves; what is owed
    /// lapses.
    fn expire(&mut self, now: u64, d: u64) {
        while let Some(&(ts, n)) = self.slots.front() {
            if ts + d > now {
                break;
            }
            self.slots.pop_front();
            self.held = self.held.saturating_sub(n);
        }
        if self.owed_until <= now {
            self.owed = 0;
        }
        if self.slots.capacity() > 8 && self.slots.len() <= self.slots.capacity() / 4 {
            self.slots.shrink_to(self.slots.len() * 2);
        }
    }

    /// Holds `n` slots from `now`, in at most `max_members` entries (a
    /// full list's newest entry takes them, and the later time: they are
    /// held longer, never shorter).
    fn take(&mut self, now: u64, n: u64, max_members: usize) {
        self.held = self.held.saturating_add(n);
        let full = self.slots.len() >= max_members.max(1);
        // Slots stay in time order (a caller that read the clock before
        // another may decide after it): a take stamped before the newest
        // slot takes the newest's time, held a little longer.
        let at = self.slots.back().map_or(now, |&(ts, _)| ts.max(now));
        if let Some(last) = self.slots.back_mut()
            && (last.0 == at || full)
        {
            last.0 = at;
            last.1 = last.1.saturating_add(n);
            return;
        }
        if self.slots.len() == self.slots.capacity() {
            let len = self.slots.len();
            let target = (len * 2).clamp(4, max_members.max(1));
            self.slots.reserve_exact(target.saturating_sub(len).max(1));
        }
        self.slots.push_back((at, n));
    }

    /// Pays what is owed, then frees the oldest slots.
    fn release(&mut self, n: u64) {
        let pay = n.min(self.owed);
        self.owed -= pay;
        let mut back = n - pay;
        while back > 0 {
            let Some(first) = self.slots.front_mut() else {
                break;
            };
            let take = back.min(first.1);
            first.1 -= take;
            self.held = self.held.saturating_sub(take);
            back -= take;
            if first.1 == 0 {
                self.slots.pop_front();
            }
        }
    }

    fn owe(&mut self, n: u64, until: u64) {
        self.owed = self.owed.saturating_add(n).min(MAX_COUNT);
        self.owed_until = self.owed_until.max(until);
    }

    fn oldest_reset(&self, now: u64, d: u64) -> u64 {
        self.slots.front().map_or(0, |&(ts, _)| ts + d - now)
    }

    /// The first moment enough of the oldest slots free themselves for a
    /// take of `n`.
    fn wait_for(&self, now: u64, d: u64, n: u64, limit: u64) -> u64 {
        let mut freed = 0;
        for &(ts, c) in &self.slots {
            freed += c;
            if self.held.saturating_sub(freed) + n <= limit {
                return ts + d - now;
            }
        }
        d
    }

    fn expires(&self, now: u64, d: u64) -> u64 {
        let slots = self.slots.back().map_or(now, |&(ts, _)| ts + d);
        if self.owed > 0 {
            slots.max(self.owed_until)
        } else {
            slots
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Unit, Window};
    use crate::storage::{Ahead, Shard};

    fn hit(limit: u64, hits: u64, negative: bool) -> Hit<'static> {
        Hit {
            domain: "d",
            entries: &[],
            algorithm: Algorithm::Concurrency,
            limit,
            window: Window::of(Unit::Second),
            hits,
            negative,
            usage_reports: false,
            buckets: 2,
            burst: 1_000,
            shard: Shard::NONE,
            receipt: true,
            also: &[],
            lease: false,
            ahead: Ahead::NONE,
        }
    }

    fn run(m: &mut Memory, now: u64, limit: u64, hits: u64, negative: bool) -> Decision {
        let mut exp = 0;
        m.decide(now, &hit(limit, hits, negative), 100, &mut exp)
    }

    #[test]
    fn a_refused_take_owes_its_release_and_frees_no_slot() {
        let mut m = Memory::default();
        assert!(run(&mut m, 0, 2, 1, false).admitted);
        assert!(run(&mut m, 1, 2, 1, false).admitted);
        assert!(!run(&mut m, 2, 2, 1, false).admitted);
        // The refused request's release pays what it owes.
        run(&mut m, 3, 2, 1, true);
        assert!(!run(&mut m, 4, 2, 1, false).admitted);
        run(&mut m, 5, 2, 1, true);
        // An admitted request's release frees a slot.
        run(&mut m, 6, 2, 1, true);
        assert!(run(&mut m, 7, 2, 1, false).admitted);
    }

    #[test]
    fn a_slot_frees_itself_after_max_duration_and_releases_never_go_below_zero() {
        let mut m = Memory::default();
        assert!(run(&mut m, 0, 1, 1, false).admitted);
        assert!(!run(&mut m, 999, 1, 1, false).admitted);
        run(&mut m, 999, 1, 1, true);
        assert!(run(&mut m, 1_000, 1, 1, false).admitted);
        for t in 1_001..1_010 {
            run(&mut m, t, 1, 1, true);
        }
        assert_eq!(m.held, 0);
        assert!(run(&mut m, 1_010, 1, 1, false).admitted);
        assert!(!run(&mut m, 1_011, 1, 1, false).admitted);
    }

    #[test]
    fn more_than_the_limit_at_once_owes_nothing_and_frees_nothing() {
        let mut m = Memory::default();
        assert!(run(&mut m, 0, 2, 1, false).admitted);
        assert!(!run(&mut m, 1, 2, u64::MAX, false).admitted);
        assert!(!run(&mut m, 2, 2, 3, false).admitted);
        // Their releases: nothing freed, nothing owed was paid.
        run(&mut m, 3, 2, u64::MAX, true);
        run(&mut m, 4, 2, 3, true);
        assert_eq!((m.held, m.owed), (1, 0));
        assert!(run(&mut m, 5, 2, 1, false).admitted);
        assert!(!run(&mut m, 6, 2, 1, false).admitted);
    }

    #[test]
    fn slots_stay_in_time_order_and_each_undo_finds_its_own() {
        let mut m = Memory::default();
        let mut exp = 0;
        let late = m.decide(10, &hit(3, 1, false), 100, &mut exp);
        // A caller that read the clock earlier, deciding after.
        let early = m.decide(5, &hit(3, 1, false), 100, &mut exp);
        assert!(
            m.slots
                .iter()
                .zip(m.slots.iter().skip(1))
                .all(|(a, b)| a.0 <= b.0)
        );
        for d in [early, late] {
            m.undo(11, &hit(3, 1, false), &d.receipt.unwrap(), None);
        }
        assert_eq!(m.held, 0, "both taken back");
    }

    #[test]
    fn a_reset_forgets_the_slots_and_their_releases_free_nothing_after_it() {
        let mut m = Memory::default();
        assert!(run(&mut m, 0, 1, 1, false).admitted);
        m.forget(1, &hit(1, 1, false));
        assert!(run(&mut m, 2, 1, 1, false).admitted);
        // The release of the take before the reset.
        run(&mut m, 3, 1, 1, true);
        assert!(!run(&mut m, 4, 1, 1, false).admitted);
    }
}
