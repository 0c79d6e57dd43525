//! One limiter's lease on a replica: what is left of it, and this
//! replica's demand on the limiter, which sizes the next lease.

use std::sync::atomic::Ordering;

use tokio::sync::watch;

use super::key::LeaseKey;
use super::reserved::Reservations;
use super::{
    AHEAD_WINDOW_MICROS, Counters, FORGET_MICROS, IDLE_MICROS, KEEP_DIVISOR, LEASE_SHARE,
    LONG_MICROS, MAX_HORIZON_MICROS, MAX_IDLE_MICROS, MAX_LEASE_DIVISOR, PLENTY_HITS, RECENT_HITS,
    SLOT_MICROS, STORE_SHARE,
};
use crate::limit::algorithms::Leasing;
use crate::limit::{DEFAULT_BUCKETS, MAX_BUCKETS, effective_burst};
use crate::storage::{Ahead, Receipt};

/// One limiter's lease on this replica.
pub(super) struct Held {
    /// Its key's [`super::key::fingerprint`]: the map's hash.
    pub(super) fingerprint: u64,
    pub(super) id: LeaseKey,
    /// Unused hits of the current lease.
    pub(super) tokens: u64,
    /// What the store recorded for the lease, to give unused hits back.
    pub(super) receipt: Option<Receipt>,
    /// The lease counts until then (this replica's monotonic clock, as
    /// every time here).
    pub(super) until: u64,
    /// A lease was refused: hits go to the store alone until then.
    pub(super) tight_until: u64,
    /// Demand: the current slot's index and hits, and the previous slot's.
    /// (Counts saturate: they only estimate a rate.)
    pub(super) slot: u64,
    pub(super) hits: u32,
    pub(super) previous: u32,
    /// Long-run demand: hits after the first, since `since` (halved as it
    /// ages), and the last hit.
    pub(super) seen: u32,
    pub(super) since: u64,
    pub(super) last_seen: u64,
    /// What the store had left after this replica's last call on the
    /// limiter, and the end of the window that was in.
    pub(super) store_left: u64,
    pub(super) store_left_until: u64,
    pub(super) last_used: u64,
    /// A lease call in flight on this limiter: closed when it is over
    /// (answered or dropped). Hits that find no tokens meanwhile wait for
    /// it rather than ask for leases of their own.
    pub(super) asking: Option<watch::Receiver<()>>,
    /// When the lease was asked (this replica's monotonic clock).
    pub(super) leased_at: u64,
    /// Hits reserved in the windows after the lease's, in order.
    pub(super) reserved: Reservations,
    /// When the housekeeping walk looks at this limiter next: the time of
    /// its one live entry in its map's queue (`u64::MAX`: none).
    pub(super) queued: u64,
}

impl Held {
    pub(super) fn new(fingerprint: u64, id: LeaseKey) -> Held {
        Held {
            fingerprint,
            id,
            tokens: 0,
            receipt: None,
            until: 0,
            tight_until: 0,
            slot: 0,
            hits: 0,
            previous: 0,
            seen: 0,
            since: 0,
            last_seen: 0,
            store_left: 0,
            store_left_until: 0,
            last_used: 0,
            asking: None,
            leased_at: 0,
            reserved: Reservations::default(),
            queued: u64::MAX,
        }
    }

    /// Moves to the hits reserved for the window that has begun, once the
    /// lease of the one before is over (what that lease left, and
    /// reservations whose window is over, are forgotten: see
    /// [`Held::lapse`]).
    pub(super) fn roll(&mut self, now: u64, counters: &Counters) {
        if now < self.until || self.reserved.is_empty() {
            return;
        }
        self.lapse(now, counters);
        if let Some(next) = self.reserved.take_first(now) {
            self.tokens = next.tokens;
            self.receipt = Some(next.receipt);
            self.until = next.until;
            self.last_used = now;
            self.leased_at = now;
        }
    }

    /// The earliest time the housekeeping walk may have anything to do
    /// with this limiter, as its demand stands at `now`: a lease or
    /// reservation to forget at its end, an unused lease to give back
    /// (after [`Held::idle_after`] without a use), or the limiter to
    /// forget.
    pub(super) fn due(&self, now: u64) -> u64 {
        let mut due = self
            .tight_until
            .max(self.last_seen.saturating_add(FORGET_MICROS));
        if self.tokens > 0 {
            due = due.min(self.until);
        }
        if let Some(back) = self.back_when_idle(now) {
            due = due.min(back);
        }
        // Their ends come in order: the first's is the soonest.
        self.reserved.first().map_or(due, |r| due.min(r.until))
    }

    /// When the lease goes back if unused until then, as its demand
    /// stands at `now`: [`Held::idle_after`] after its last use; `None`
    /// when there is nothing to give back or it is kept idle. A spent
    /// lease's receipt (no tokens) is kept as it is unless it would be
    /// given back: it must not make the walk look every time.
    pub(super) fn back_when_idle(&self, now: u64) -> Option<u64> {
        ((self.tokens > 0 || self.receipt.is_some()) && !self.kept_idle())
            .then(|| self.last_used.saturating_add(self.idle_after(now)))
    }

    /// Forgets what is left of a lease whose window (or life) is over and
    /// the reservations whose window is over: they counted in it. A
    /// sliding counter's lease that goes back at its bucket's end
    /// ([`Held::back_at_end`]) is kept for that, no longer spendable.
    pub(super) fn lapse(&mut self, now: u64, counters: &Counters) {
        let mut lapsed = 0;
        if now >= self.until && self.tokens > 0 && !self.back_at_end() {
            lapsed += std::mem::take(&mut self.tokens);
            self.receipt = None;
        }
        lapsed += self.reserved.lapse(now);
        counters.expired_hits.fetch_add(lapsed, Ordering::Relaxed);
    }

    /// What the next lease reserves in the windows after the current one
    /// (a sliding counter's: in the buckets after the current one, whose
    /// length stands for the window here): on a window of at most
    /// [`AHEAD_WINDOW_MICROS`], when this
    /// replica holds no reservation, the store had plenty left (half the
    /// limit), and a window's demand with its margin (see [`Held::size`])
    /// is at most a [`KEEP_DIVISOR`]-th of the limit (a counter's: as seen
    /// over at least a bucket): that much in each of
    /// the next [`Ahead::MAX_WINDOWS`] windows, so a limiter hit a few
    /// times a window asks the store once every few windows.
    pub(super) fn ahead(&self, now: u64, limit: u64) -> Ahead {
        // A counter reserves in its buckets, `w / (n - 1)` each.
        let w = match self.id.algorithm.spec().leasing {
            Leasing::Window => self.id.window.micros(),
            Leasing::Bucket => {
                let spans = u64::from(self.id.buckets.clamp(DEFAULT_BUCKETS, MAX_BUCKETS)) - 1;
                self.id.window.micros() / spans
            }
            _ => return Ahead::NONE,
        };
        if w > AHEAD_WINDOW_MICROS || !self.reserved.is_empty() || !self.plenty(now, limit) {
            return Ahead::NONE;
        }
        // A counter's demand seen over less than a bucket (or half the
        // long-run span: its start falls behind by at least that once it
        // has aged) says little of the next seven: its second hit would
        // reserve at the rate of one gap, and a replica that then goes
        // idle strands it all, each bucket's weighing in the next one too.
        if self.id.algorithm.spec().leasing == Leasing::Bucket
            && now.saturating_sub(self.since) < w.min(LONG_MICROS / 2)
        {
            return Ahead::NONE;
        }
        let demand = self.rate(now) * w as f64 / 1e6;
        if demand <= 0.0 {
            return Ahead::NONE;
        }
        let each = margin(demand).ceil() as u64;
        if each > limit / KEEP_DIVISOR {
            return Ahead::NONE;
        }
        Ahead {
            windows: Ahead::MAX_WINDOWS,
            hits: each,
        }
    }

    /// Whether the store had plenty left (half the limit) at this
    /// replica's last call; a new window after one with plenty left is
    /// taken to have plenty too (a lease too large for what others took
    /// meanwhile is refused, and the hit decided alone).
    fn plenty(&self, now: u64, limit: u64) -> bool {
        if now < self.store_left_until {
            self.store_left >= limit / 2
        } else {
            self.store_left_until > 0 && self.store_left >= limit / 2
        }
    }

    pub(super) fn observe(&mut self, now: u64, cost: u64) {
        let slot = now / SLOT_MICROS;
        if slot != self.slot {
            self.previous = if slot == self.slot + 1 { self.hits } else { 0 };
            self.slot = slot;
            self.hits = 0;
        }
        let cost = u32::try_from(cost).unwrap_or(u32::MAX);
        self.hits = self.hits.saturating_add(cost);
        if self.last_seen == 0 {
            self.since = now;
        } else {
            self.seen = self.seen.saturating_add(cost);
            let age = now.saturating_sub(self.since);
            if age > LONG_MICROS {
                self.seen /= 2;
                self.since = now - age / 2;
            }
        }
        self.last_seen = now;
    }

    /// This replica's demand on the limiter, in hits per second: the
    /// recent slots' rate, or the long-run rate when the limiter is hit
    /// less often than the slots see (0 until a second hit).
    pub(super) fn rate(&self, now: u64) -> f64 {
        let (recent, long) = self.rates(now);
        recent.map_or(long, |r| r.max(long))
    }

    /// The recent slots' rate (when they hold enough hits to tell one)
    /// and the long-run rate, in hits per second.
    fn rates(&self, now: u64) -> (Option<f64>, f64) {
        let slot = now / SLOT_MICROS;
        let counted = match slot.saturating_sub(self.slot) {
            0 => u64::from(self.hits) + u64::from(self.previous),
            1 => u64::from(self.hits),
            _ => 0,
        };
        let age = now.saturating_sub(self.since).max(SLOT_MICROS);
        let long = f64::from(self.seen) / (age as f64 / 1e6);
        if counted < RECENT_HITS {
            // Too few for the slots to tell a rate.
            return (None, long);
        }
        // The hit that opened the span is not a gap's worth of demand.
        let span = SLOT_MICROS + now % SLOT_MICROS;
        let recent = (counted - 1) as f64 / (span as f64 / 1e6);
        (Some(recent), long)
    }

    /// The size of the next lease for a hit of `cost`, from this
    /// replica's demand, at least the cost and at most a tenth of the
    /// limit ([`MAX_LEASE_DIVISOR`]); the largest of:
    /// - [`LEASE_SHARE`] of a second of demand;
    /// - the demand until the window's `end` (this replica's monotonic clock, never
    ///   further than [`MAX_HORIZON_MICROS`]) within an eighth of what the
    ///   store had left at the last call ([`STORE_SHARE`]); at a fixed
    ///   window's first call, of a replica whose demand over a window is
    ///   within the cap, within an eighth of the whole limit;
    /// - while the store has plenty left (half the limit), [`PLENTY_HITS`]
    ///   of that demand, and where it is at most a [`KEEP_DIVISOR`]-th of
    ///   the limit, the demand with a margin (twice it and two hits,
    ///   within [`PLENTY_HITS`] or a quarter more than it).
    ///
    /// Near the limit it shrinks to the cost: the last hits are decided
    /// in the store.
    pub(super) fn size(&self, now: u64, cost: u64, limit: u64, end: u64) -> u64 {
        let rate = self.rate(now);
        let mut wanted = rate * LEASE_SHARE;
        if rate > 0.0 {
            let secs_left = end.saturating_sub(now).min(MAX_HORIZON_MICROS) as f64 / 1e6;
            let current = now < self.store_left_until;
            let mut until_end = rate * secs_left;
            let store_left = if current {
                self.store_left
            } else if self.id.algorithm.spec().leasing == Leasing::Window {
                // A fixed window starts with its whole limit: a replica
                // whose demand over a window (its recent rate, when the
                // slots tell one) is within a lease's cap takes the rest
                // of it at its first hit, so a flood on another replica
                // does not starve it. A bucket's tokens are not known
                // before a call.
                let (recent, long) = self.rates(now);
                let steady = recent.unwrap_or(long);
                let window = self.id.window.micros() as f64 / 1e6;
                if steady * window <= (limit / MAX_LEASE_DIVISOR) as f64 {
                    until_end = steady * secs_left;
                    limit
                } else {
                    0
                }
            } else {
                0
            };
            wanted = wanted.max(until_end.min((store_left / STORE_SHARE) as f64));
            if self.id.algorithm.spec().leasing == Leasing::Log && rate * secs_left < 1.0 {
                // Less than a hit expected over a log's lease life: the
                // lease would go back nearly whole, two store calls for
                // one hit. Decided in the store instead.
                return cost;
            }
            if matches!(
                self.id.algorithm.spec().leasing,
                Leasing::Bucket | Leasing::Log
            ) {
                // A counter's lease is spent only within its bucket, a
                // log's within its life, and what is left counts on
                // until it is given back: no more than the demand until
                // then, with a margin.
                wanted = wanted.min(margin(rate * secs_left));
            }
            if self.plenty(now, limit) {
                let demand = rate * secs_left;
                wanted = wanted.max(PLENTY_HITS.min(demand));
                // Where that is a small part of the limit, a margin on the
                // demand until the window ends, so a limiter hit a few
                // times a window asks once.
                wanted = wanted.max(margin(demand).min((limit / KEEP_DIVISOR) as f64));
            }
        }
        (wanted.ceil() as u64).clamp(cost, (limit / MAX_LEASE_DIVISOR).max(cost))
    }

    /// The reset of a hit admitted from the lease `now`: a fixed window's
    /// end; a sliding counter's as the store answered the lease; for a token bucket, as the store answers, the time until the
    /// bucket is full again, estimated from what the store had left when
    /// the lease was taken, what it refilled since at the rate, and the
    /// lease's unused tokens (which count as in the bucket).
    pub(super) fn local_reset(&self, now: u64) -> u64 {
        let life = self.until.saturating_sub(now);
        match self.id.algorithm.spec().leasing {
            Leasing::Tokens => {}
            // As the store answered: until the oldest hit counted then
            // stops counting.
            Leasing::Bucket | Leasing::Log => return self.store_left_until.saturating_sub(now),
            _ => return life,
        }
        let burst = effective_burst(self.id.burst, self.id.limit, self.id.window) as f64;
        let window = self.id.window.micros() as f64;
        let per_micro = self.id.limit as f64 / window;
        let refilled = now.saturating_sub(self.leased_at) as f64 * per_micro;
        let missing = burst - self.store_left as f64 - self.tokens as f64 - refilled;
        if missing <= 0.0 {
            0
        } else {
            (missing / per_micro).ceil() as u64
        }
    }

    /// Drops the lease call's channel once the call is over: what waited
    /// on it holds its own, and a channel kept would hold its memory for
    /// as long as the limiter. (A call that ends in a lease or a refusal
    /// drops it itself; this is for one that failed or was cut.)
    pub(super) fn drop_closed_ask(&mut self) {
        if self
            .asking
            .as_ref()
            .is_some_and(|rx| rx.has_changed().is_err())
        {
            self.asking = None;
        }
    }

    /// The lease call in flight on this limiter, if one is.
    pub(super) fn in_flight(&self) -> Option<watch::Receiver<()>> {
        self.asking
            .as_ref()
            .filter(|rx| rx.has_changed().is_ok())
            .cloned()
    }

    /// Whether what is left of the lease goes back to the store once its
    /// bucket (life) is over: a sliding counter's, unless it is kept idle
    /// (small, taken while the store had plenty left), and a log's. The
    /// bucket still weighs in the next ones, and a log's hits count a
    /// window past the lease's end, so unused hits would count against
    /// what comes next.
    pub(super) fn back_at_end(&self) -> bool {
        match self.id.algorithm.spec().leasing {
            Leasing::Bucket => !self.kept_idle(),
            // A log's unused hits would count a window past the lease's
            // end.
            Leasing::Log => true,
            _ => false,
        }
    }

    /// Whether an idle lease is kept until its window ends
    /// rather than given back: a fixed window's (a sliding counter's whose
    /// bucket is its window), while the store had plenty left (half the
    /// limit) at this replica's last call, holding at most
    /// [`KEEP_DIVISOR`]-th of the limit (a give-back is a store call; what
    /// such a lease strands is small).
    pub(super) fn kept_idle(&self) -> bool {
        self.store_left >= self.id.limit / 2
            && match self.id.algorithm.spec().leasing {
                Leasing::Window => true,
                // What a counter's kept lease strands weighs in the next
                // buckets too: kept only where a bucket is the window,
                // so it strands once a window, as a fixed window's does.
                Leasing::Bucket => self.id.buckets <= 2,
                _ => false,
            }
            && self.tokens <= self.id.limit / KEEP_DIVISOR
    }

    /// How long the lease waits unused before it goes back: eight of the
    /// limiter's gaps between hits, within [`IDLE_MICROS`] and
    /// [`MAX_IDLE_MICROS`].
    pub(super) fn idle_after(&self, now: u64) -> u64 {
        let rate = self.rate(now);
        if rate <= 0.0 {
            return IDLE_MICROS;
        }
        ((8e6 / rate) as u64).clamp(IDLE_MICROS, MAX_IDLE_MICROS)
    }

    /// The unused part of a lease still in force, taken out to be given
    /// back; a lease past its window is forgotten (a sliding counter's
    /// goes back while its bucket counts: the store takes it back only
    /// from a bucket still in the trailing window).
    ///
    /// A token bucket's lease is ended even when spent (the receipt then
    /// gives back nothing): until it ends or its life does, the bucket
    /// keeps room for its tokens.
    pub(super) fn take_unused(&mut self, now: u64, counters: &Counters) -> Option<Receipt> {
        let tokens = std::mem::take(&mut self.tokens);
        let receipt = self.receipt.take();
        if tokens == 0 && self.id.algorithm.spec().leasing != Leasing::Tokens {
            return None;
        }
        if now >= self.until && !self.back_at_end() {
            counters.expired_hits.fetch_add(tokens, Ordering::Relaxed);
            return None;
        }
        receipt.map(|r| Receipt {
            hits: tokens.min(r.hits),
            ..r
        })
    }
}

/// A demand with its margin: twice it and two hits, within a quarter more
/// or [`PLENTY_HITS`].
fn margin(demand: f64) -> f64 {
    (2.0 * demand + 2.0).min(PLENTY_HITS.max(1.25 * demand))
}
