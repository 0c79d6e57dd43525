//! `fixed_window`: one count per aligned window (or calendar window),
//! reset at the window's end. Exact within a window; at most twice the
//! limit across a boundary.

use super::*;
use crate::limit::Span;
use crate::quota::window::Held;
use crate::storage::Ahead;
use crate::storage::memory::heap::heap;

pub const SPEC: Spec = Spec {
    name: "fixed_window",
    key_code: 'f',
    keys_buckets: false,
    staggered: false,
    roles: &[Role::State],
    lua: include_str!("../../../lua/fixed_window.lua"),
    batch_id: 1,
    param: Param::Buckets,
    leasing: Leasing::Window,
    refusals: Refusals::AllCosts,
    rlqs: Rlqs::Window,
    reset: Reset::MarkWindow,
    bound: Bound::Window,
    calendar: true,
    own_keys: &[],
    entry_per_hit: None,
    takes_reports: true,
    memory: || State::Fixed(Memory::default()),
};

// The embedded store.

/// Its state in the embedded store.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    pub(crate) window: u64,
    pub(crate) count: u64,
    /// Hits reserved in the windows after `window`.
    pub(crate) ahead: [u64; AHEAD],
    /// What quota streams' shares hold of this window and the next
    /// ones; only on a limit they share.
    pub(crate) held: Option<Box<Held>>,
}

impl Embedded for Memory {
    fn decide(&mut self, now: u64, hit: &Hit<'_>, _: usize, expires_at: &mut u64) -> Decision {
        let Memory {
            window,
            count,
            ahead,
            held,
        } = self;
        let (d, exp) = decide(now, hit, window, count, ahead, held);
        *expires_at = (*expires_at).max(exp);
        d
    }

    fn undo(&mut self, now: u64, hit: &Hit<'_>, r: &Receipt, reset_at: Option<u64>) {
        undo(
            now,
            hit,
            r,
            (self.window, reset_at),
            &mut self.count,
            &mut self.ahead,
        );
    }

    fn written_from(&self, hit: &Hit<'_>) -> Option<u64> {
        let fixed = hit.window.zone().is_none();
        (fixed && self.window > 0).then(|| self.window.saturating_mul(hit.window.micros()))
    }

    fn heap_bytes(&self) -> usize {
        self.held
            .as_ref()
            .map_or(0, |h| heap(size_of::<Held>()) + heap(h.capacity_bytes()))
    }
}

/// Epoch-aligned fixed window, or a calendar one (its index the first
/// second of the local day, week, month or year). Every counted hit stays
/// counted, admitted or not (as the reference service does), except a
/// cost above the limit, which can never pass and is not recorded unless
/// the limiter takes usage reports. What quota streams' shares hold of a
/// window (`held`, [`crate::quota::window`]) is spent with its count: a
/// hit is admitted only while both stay within the limit.
///
/// The steps of lua/fixed_window.lua: read the window's count ([`roll`]),
/// decide the hit (give back, refuse a cost above the limit, or count it),
/// then reserve ahead for an admitted lease ([`reserve_ahead`]).
fn decide(
    now: u64,
    hit: &Hit<'_>,
    window: &mut u64,
    count: &mut u64,
    ahead: &mut [u64; AHEAD],
    held: &mut Option<Box<Held>>,
) -> (Decision, u64) {
    let Span {
        index: mut idx,
        mut end,
    } = hit.window.span(now);
    let fixed = hit.window.zone().is_none();
    let w = hit.window.micros();
    if fixed && *window > idx && *count > 0 {
        // A window written after `now`: the clock stepped back. Counted
        // on in that window until the clock passes its end, as the script
        // does.
        end = end.saturating_add((*window - idx).saturating_mul(w));
        idx = *window;
    }
    if *window != idx {
        roll(idx, fixed, window, count, ahead, held);
    }
    let now_shared = shared(held, hit, idx);
    let limit = hit.limit;
    let reset = end - now;
    let left = |count: u64| limit.saturating_sub(count.saturating_add(now_shared));
    if hit.negative {
        *count = count.saturating_sub(hit.hits);
        let d = decision(true, left(*count), reset);
        return (d, expires(ahead, held, end, w));
    }
    if hit.hits > limit && !hit.usage_reports {
        let d = decision(false, left(*count), reset);
        return (d, expires(ahead, held, end, w));
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
    let mut granted = 0;
    if admitted && fixed && hit.receipt && !hit.ahead.is_none() {
        granted = reserve_ahead(hit, idx, ahead, held);
    }
    let mut d = with_receipt(d, hit, *count - before, idx, granted);
    if let Some(r) = d.receipt.as_mut() {
        r.ahead = granted as u8;
    }
    (d, expires(ahead, held, end, w))
}

/// Moves the state to window `idx`, as the script reads the count: the
/// hits reserved for this window by leases taken in an earlier one are
/// its count (a calendar window reserves none), and what the shares held
/// of windows gone by is forgotten.
fn roll(
    idx: u64,
    fixed: bool,
    window: &mut u64,
    count: &mut u64,
    ahead: &mut [u64; AHEAD],
    held: &mut Option<Box<Held>>,
) {
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

/// Hits the shares hold of window `i` (the script's `shared` and `held`);
/// nothing to work out (on every decision) where no share holds any.
fn shared(held: &Option<Box<Held>>, hit: &Hit<'_>, i: u64) -> u64 {
    held.as_ref().map_or(0, |h| {
        h.hits(
            i,
            crate::quota::fill_secs(hit.window).saturating_mul(1_000_000),
        )
    })
}

/// When the state holds nothing that still counts: the end of the current
/// window, of the last one reserved ahead, or of the last one the shares
/// hold, whichever is last (the script's `keep`).
fn expires(ahead: &[u64; AHEAD], held: &Option<Box<Held>>, end: u64, w: u64) -> u64 {
    let last = ahead
        .iter()
        .rposition(|&a| a > 0)
        .map_or(0, |j| j as u64 + 1);
    let shares = held
        .as_ref()
        .and_then(|h| h.last())
        .map_or(0, |i| (i + 1).saturating_mul(w));
    (end + last * w).max(shares)
}

/// The script's "Reservations in the next windows, for an admitted lease":
/// the lease's hits in each of the next windows, window after window while
/// each has room beside what the shares hold of it. Returns the windows
/// reserved.
fn reserve_ahead(
    hit: &Hit<'_>,
    idx: u64,
    ahead: &mut [u64; AHEAD],
    held: &Option<Box<Held>>,
) -> u64 {
    let limit = hit.limit;
    let mut granted = 0;
    let wanted = usize::from(hit.ahead.windows.min(Ahead::MAX_WINDOWS));
    for (j, a) in ahead.iter_mut().take(wanted).enumerate() {
        let room = limit.saturating_sub(shared(held, hit, idx + 1 + j as u64));
        if a.saturating_add(hit.ahead.hits) > room {
            break;
        }
        *a += hit.ahead.hits;
        granted += 1;
    }
    granted
}

/// The count of window `index` as a fixed window's state holds it, without
/// moving the state: the current window's count, the hits reserved ahead
/// in a later one, or nothing.
pub(crate) fn counted_at(window: u64, count: u64, ahead: &[u64; AHEAD], index: u64) -> u64 {
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
pub(crate) const AHEAD: usize = Ahead::MAX_WINDOWS as usize;

/// Fixed window: the count of the receipt's window, only while that
/// window is the current one (a later window never counted the hit), or
/// the hits reserved in it, while it is still to come; and only where
/// what it recorded may not predate the limiter's last reset (`reset_at`):
/// a reset deleted that count, and the count after it holds other hits.
/// The receipt names its window, not when it was recorded, so a window
/// the reset fell in (or, for a reservation, one of the seven windows
/// before it, which may have reserved it, or the windows back to the one
/// its receipt says its lease was taken in) gives nothing back after a
/// reset: an error towards refusing.
fn undo(
    now: u64,
    hit: &Hit<'_>,
    r: &Receipt,
    (window, reset_at): (u64, Option<u64>),
    count: &mut u64,
    ahead: &mut [u64; AHEAD],
) {
    let idx = hit.window.span(now).index;
    // After a clock step back, the window written is still the current
    // one (as in `decide`).
    let idx = if hit.window.zone().is_none() && *count > 0 {
        idx.max(window)
    } else {
        idx
    };
    if let Some(reset_at) = reset_at {
        // The first window whose calls may have recorded it: its own, or
        // for a reservation the earliest that could have reserved it.
        let first = r.at.saturating_sub(u64::from(r.reserved));
        let first = if r.at > idx {
            first.min(r.at.saturating_sub(AHEAD as u64))
        } else {
            first
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
