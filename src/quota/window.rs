//! One count for a limit that Envoys' shares (RLQS) and requests decided
//! one at a time (RLS, and replicas' leases, which take their hits from
//! the same count) both spend, when it is counted in fixed windows.
//!
//! A share of `s` tokens per fill of `F` seconds lets an Envoy admit
//! `s * t / F` requests in any time `t` it holds, plus its bucket's burst.
//! The store reserves that in every window the share covers: a window's
//! reservation is the sum, over the shares granted in it, of `s` times the
//! share's microseconds in the window over `F * 10^6`. A request decided
//! on its own is admitted only while the window's count plus its
//! reservation (rounded up) stays within the limit; a share is granted
//! only what every window it covers has left ([`room`]). So in any window
//! the hits admitted add up to at most the limit plus the Envoys' bursts,
//! the bound RLQS has alone.
//!
//! A share is reserved from its grant to the end of the window its expiry
//! falls in ([`reserved_until`]): its stream reports again before that, so
//! the part of the window it will spend stays its own instead of going to
//! whichever request comes first. At the stream's next report the old
//! share's reservation from [`MARGIN_MICROS`] on is taken back and the new
//! one's added; over the margin, the larger of the two is reserved: it
//! covers the answer's way to Envoy, which enforces the old share until
//! the new one arrives. A share that expires keeps its reservation to the
//! end of that window.
//!
//! Requests decided one at a time take part in the ledger's water-filling
//! as one more holder ([`counted_demand`]: the window's count so far, as a
//! rate), so a busy Envoy does not take the whole limit from them, nor
//! they from it, beyond what the window had already counted.
//!
//! Reservations live in the limiter's own state, one value per window
//! (Redis: fields `q<index>` of its hash and `q`, the last index; the
//! embedded store: [`Held`]). A share covering more than [`MAX_SPAN`]
//! windows (a per-second limit under an assignment time to live of over a
//! minute) is not joined ([`Fixed::fits`]): each protocol then bounds the
//! limit on its own.
//!
//! Pure arithmetic; `lua/rlqs_lease.lua` and `lua/fixed_window.lua` run the
//! same steps on Redis, in floating point (in hits) where this counts in
//! integers (token-microseconds).

use super::{Beside, Grant, Ledger, Report, Terms};

/// The most windows one share's reservation may cover.
pub const MAX_SPAN: u64 = 64;

/// How long after a report the old share stays reserved beside the new
/// one: the time the answer takes to reach Envoy.
pub const MARGIN_MICROS: u64 = 250_000;

/// How long a refusal holds where shares hold part of the window (its
/// reset, which the over-limit cache keeps it for): a share may shrink at
/// its stream's next report, so the window's end would be too long.
pub const REFUSAL_MICROS: u64 = 1_000_000;

/// A limit counted in epoch-aligned fixed windows, which a ledger's
/// shares spend beside requests decided one at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fixed {
    /// Requests per window.
    pub limit: u64,
    pub window_micros: u64,
}

impl Fixed {
    /// Whether a share held `hold_micros` covers at most [`MAX_SPAN`]
    /// windows of `window_micros`, wherever it starts.
    pub fn fits(window_micros: u64, hold_micros: u64) -> bool {
        window_micros > 0 && hold_micros / window_micros + 2 <= MAX_SPAN
    }
}

/// The end of the reservation of a share that expires at `expires`: the
/// end of the window holding its last instant.
pub fn reserved_until(expires: u64, window_micros: u64) -> u64 {
    expires
        .div_ceil(window_micros)
        .saturating_mul(window_micros)
}

/// `[from, to)` cut at window boundaries: each window's index and the
/// microseconds of it inside, in order.
pub fn spread(from: u64, to: u64, window_micros: u64) -> impl Iterator<Item = (u64, u64)> {
    let mut at = from;
    std::iter::from_fn(move || {
        if at >= to {
            return None;
        }
        let index = at / window_micros;
        let end = index
            .saturating_add(1)
            .saturating_mul(window_micros)
            .min(to);
        let part = (index, end - at);
        at = end;
        Some(part)
    })
}

/// Reservations of one limiter, per window, in token-microseconds (hits
/// times `F * 10^6`, so exact in integers), ascending by window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held {
    windows: Vec<(u64, u128)>,
}

impl Held {
    /// Hits reserved in window `index`, rounded up.
    pub fn hits(&self, index: u64, fill_micros: u64) -> u64 {
        let tm = self.get(index);
        u64::try_from(tm.div_ceil(u128::from(fill_micros.max(1)))).unwrap_or(u64::MAX)
    }

    fn get(&self, index: u64) -> u128 {
        self.windows
            .iter()
            .find(|(i, _)| *i == index)
            .map_or(0, |(_, v)| *v)
    }

    /// Reserves a share of `tokens` over `[from, to)`.
    pub fn add(&mut self, tokens: u64, from: u64, to: u64, window_micros: u64) {
        if tokens == 0 {
            return;
        }
        for (index, part) in spread(from, to, window_micros) {
            let tm = u128::from(tokens) * u128::from(part);
            match self.windows.binary_search_by_key(&index, |(i, _)| *i) {
                Ok(at) => self.windows[at].1 += tm,
                Err(at) => self.windows.insert(at, (index, tm)),
            }
        }
    }

    /// Takes back what [`Held::add`] reserved for a share of `tokens` over
    /// `[from, to)` (never below zero).
    pub fn take_back(&mut self, tokens: u64, from: u64, to: u64, window_micros: u64) {
        for (index, part) in spread(from, to, window_micros) {
            let tm = u128::from(tokens) * u128::from(part);
            if let Ok(at) = self.windows.binary_search_by_key(&index, |(i, _)| *i) {
                self.windows[at].1 = self.windows[at].1.saturating_sub(tm);
            }
        }
        self.windows.retain(|(_, v)| *v > 0);
    }

    /// Drops the windows before `index`: gone by.
    pub fn forget_before(&mut self, index: u64) {
        self.windows.retain(|(i, _)| *i >= index);
    }

    /// The last window holding a reservation.
    pub fn last(&self) -> Option<u64> {
        self.windows.last().map(|(i, _)| *i)
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }

    /// Heap bytes of its windows.
    pub fn capacity_bytes(&self) -> usize {
        self.windows.capacity() * std::mem::size_of::<(u64, u128)>()
    }
}

/// The most tokens per fill a share over `[from, to)` may be granted:
/// in every window it covers, `counted(window)` (the window's count, or
/// the hits reserved in it ahead by replicas' leases) plus the
/// reservations plus the share's own stay within `limit`. `credit(window)`
/// is token-microseconds of the window already reserved for the share
/// (see [`report`]).
#[allow(clippy::too_many_arguments)]
pub fn room(
    limit: u64,
    fill_micros: u64,
    held: &Held,
    counted: impl Fn(u64) -> u64,
    from: u64,
    to: u64,
    window_micros: u64,
    credit: impl Fn(u64) -> u128,
) -> u64 {
    spread(from, to, window_micros)
        .map(|(index, part)| {
            let total = u128::from(limit.saturating_sub(counted(index))) * u128::from(fill_micros);
            let left = total.saturating_sub(held.get(index)) + credit(index);
            u64::try_from(left / u128::from(part)).unwrap_or(u64::MAX)
        })
        .min()
        .unwrap_or(u64::MAX)
}

/// The demand of requests decided one at a time, in tokens per fill: the
/// current window's count over the time it has run (at least a quarter of
/// the window, so that a window's first hits do not read as a flood),
/// capped at `capacity`.
pub fn counted_demand(
    count: u64,
    now: u64,
    window_micros: u64,
    fill_micros: u64,
    capacity: u64,
) -> u64 {
    let elapsed = (now % window_micros).max(window_micros / 4).max(1);
    let rate = (u128::from(count) * u128::from(fill_micros)).div_ceil(u128::from(elapsed));
    u64::try_from(rate.min(u128::from(capacity))).unwrap_or(capacity)
}

/// One stream's report on a limit counted in fixed windows: the ledger's
/// grant, capped by what the windows leave, with the stream's old
/// reservation taken back and its new one made in `held`.
/// `counted(index)` reads the limiter's count of a window (see [`room`]).
#[allow(clippy::too_many_arguments)]
pub fn report(
    ledger: &mut Ledger,
    held: &mut Held,
    counted: impl Fn(u64) -> u64,
    holder: &str,
    usage: Report,
    terms: Terms,
    limit: Fixed,
    now: u64,
) -> Grant {
    let w = limit.window_micros.max(1);
    let fill = terms.fill_secs.saturating_mul(1_000_000).max(1);
    held.forget_before(now / w);
    // The old share stays reserved for the margin (while the answer is on
    // its way, Envoy spends it), unless it ends sooner.
    let (old, margin_end) = match ledger.share(holder, now) {
        Some(old) => {
            let end = reserved_until(old.expires_micros, w);
            let margin_end = now.saturating_add(MARGIN_MICROS).min(end);
            held.take_back(old.granted, margin_end, end, w);
            (old.granted, margin_end)
        }
        None => (0, now),
    };
    let to = reserved_until(now.saturating_add(terms.hold_micros), w);
    // Over the margin the reservation is the larger of the two shares: a
    // share up to the old one is reserved after the margin only; a larger
    // one also its excess over the margin, where the old one's part counts
    // for it.
    let after = room(limit.limit, fill, held, &counted, margin_end, to, w, |_| 0);
    let over = room(limit.limit, fill, held, &counted, now, to, w, |index| {
        u128::from(old) * u128::from(overlap(now, margin_end, index, w))
    });
    let cap = if over > old { over } else { after.min(old) };
    let beside = Beside {
        demand: counted_demand(counted(now / w), now, w, fill, terms.capacity),
        room: cap,
    };
    let grant = ledger.report_beside(holder, usage, terms, now, Some(beside), true);
    held.add(grant.tokens, margin_end, to, w);
    if grant.tokens > old {
        held.add(grant.tokens - old, now, margin_end, w);
    }
    grant
}

/// Microseconds of `[from, to)` in window `index`.
fn overlap(from: u64, to: u64, index: u64, window_micros: u64) -> u64 {
    let start = index.saturating_mul(window_micros).max(from);
    let end = index
        .saturating_add(1)
        .saturating_mul(window_micros)
        .min(to);
    end.saturating_sub(start)
}

#[cfg(test)]
mod tests;
