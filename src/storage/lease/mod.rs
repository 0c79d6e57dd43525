//! Decisions from leased quota (`lease: true`): a replica takes a lease
//! from the store (one weighted hit, sized to this replica's demand) and
//! admits hits from it locally, without a store call, until the lease is
//! spent or ends. The limit is never passed:
//!
//! - **Fixed window.** A lease is a weighted hit recorded in the window
//!   like any other, used only until its window's end as seen from when
//!   it was asked (the store's reset, counted from the moment the call was
//!   sent, as the over-limit cache counts): every hit admitted here was
//!   recorded in its window before it was admitted.
//! - **Sliding window counter.** A lease is hits recorded in the current
//!   bucket, spent only while that bucket is current (the receipt's mark
//!   says how long, counted from when the call was sent). Every other
//!   replica's estimate already counts them as if admitted when the lease
//!   was taken, so every `buckets - 1` buckets hold at most the limit, as
//!   without leases. What is left when the bucket ends goes back (the
//!   bucket still weighs in the next ones), except a small lease kept
//!   idle; a give-back after a reset in that bucket takes nothing (the
//!   store keeps when the limiter was reset, as a fixed window's).
//! - **Sliding window log.** A lease's hits are stamped in the log at
//!   the end of its life (a tenth of the window, within 1 ms and 10 s:
//!   [`crate::limit::algorithms::sliding_log::lease_life`]), the latest
//!   time one of them can be admitted, and the lease is spent only
//!   until then, counted from when the call was sent. A trailing window
//!   holding any hit admitted from it is one the log counted the whole
//!   lease in when the last of its entries was admitted, so every
//!   trailing window holds at most the limit. What is left at its end
//!   goes back through its receipt (it would count a window more).
//! - **Token bucket.** A lease takes tokens from the bucket and lives
//!   until the end of the lease period after the one it was taken in (the
//!   window, within 1 to 10 s; the store's answer says how long, counted
//!   here from when the call was sent). While it lives its tokens keep
//!   their room in the bucket: the store refills the bucket only up to
//!   its burst less the tokens leased out. So the bucket's tokens plus
//!   the leases' unused ones never pass the burst and grow no faster than
//!   the rate, whenever a lease spends its tokens: the hits admitted are
//!   what one bucket admits. A lease is ended when it is spent (with the
//!   next lease, or when idle), so spent leases do not keep room. The
//!   store takes a lease's unused tokens back only while the lease lives,
//!   into the bucket it was taken from: a give-back that lands after the
//!   lease's life (the bucket has refilled over its tokens since, and
//!   others may have spent them) or after a reset returns nothing.
//!
//! - **Sizing.** A lease is sized to this replica's demand on the
//!   limiter (the recent slots' rate, or for a limiter hit less often a
//!   long-run rate over up to a minute): [`LEASE_SHARE`] of a second of
//!   it, or more when the store has room: the demand until the window
//!   ends within an eighth of what the store had left at the last call
//!   ([`STORE_SHARE`]), and while that is at least half the limit
//!   ("plenty"), [`PLENTY_HITS`] hits of it if they come before the
//!   window ends, and where it is a small part of the limit (at most a
//!   [`KEEP_DIVISOR`]-th) the demand until the window ends with a
//!   margin, so a limiter hit a few times a window asks the store once.
//!   A fixed window starts with its whole limit: a replica whose demand
//!   over a window is within a lease's cap takes a lease of its demand
//!   until the window ends at its first hit in it (within an eighth of
//!   the limit), so a flood through another replica does not starve it.
//!   Never more than [`MAX_LEASE_DIVISOR`]-th of the limit,
//!   so no replica holds much of a limit it does not use; never less than
//!   the hit's cost (a lease of the cost alone is no lease: the hit is
//!   decided in the store). So a limiter hit once every few seconds
//!   still gets leases of many hits on a long window, and near the limit
//!   leases shrink to single hits.
//! - **Reserved ahead.** Where a window's demand with its margin is at
//!   most a [`KEEP_DIVISOR`]-th of the limit, the store had plenty left
//!   and the window is at most [`AHEAD_WINDOW_MICROS`], a lease also
//!   reserves that much in each of the next seven windows
//!   ([`Ahead`]): the store records it in those windows' counts at
//!   once, window after window while each has room. A reservation is
//!   spent once its window has begun, from the window's start as seen
//!   when the answer came (the store's reset counted from then, never
//!   early) to its end as seen from when the lease was asked (never
//!   late, by a replica's clock up to 100 ppm slow), so every hit spent
//!   from it falls in its window. A key hit a few times a window asks the
//!   store about once in eight windows. A counter reserves in its next
//!   seven buckets, each counted from its start in every trailing window
//!   it weighs in (its bound holds however they are spent). A
//!   reservation's receipt says how far after its lease's window it is,
//!   so its give-back after a reset between takes nothing. A limiter's
//!   reservations are one run of fixed size, counted in its bytes.
//! - **One call at a time.** Hits that find the lease spent while the
//!   next is on its way wait for that call (it ends however it ends: an
//!   answer, an error, or its request dropped) and are then decided from
//!   the new lease, rather than each asking for one of their own.
//! - **Near the limit.** A lease the store refuses means the window (or
//!   bucket) has less left than a lease: what the refusal recorded is
//!   taken back, and until the window ends (the bucket: until such a
//!   lease would pass) every hit on the limiter is decided in the store
//!   alone, as without leases, so the last hits are exact.
//! - **Giving back.** Tokens of a lease unused for a few of the
//!   limiter's gaps between hits (at least [`IDLE_MICROS`], at most
//!   [`MAX_IDLE_MICROS`]) go back to the store ([`Store::undo`] with the
//!   lease's receipt: only while its window is current), at the next hit
//!   on the limiter or at the next housekeeping, except a fixed window's
//!   lease taken while the store had plenty left and holding at most a
//!   [`KEEP_DIVISOR`]-th of the limit: it stays until its window ends (a
//!   give-back is a store call); a lease left over when a
//!   larger cost needs a new one goes back first. A window's end forgets
//!   its unused leases (they counted in a window that is over).
//! - **Resets.** A reset through this replica forgets its lease of that
//!   limiter at once and again when the store's reset is done, and a
//!   lease asked before it is done is not kept; a reset through another
//!   moves the store's reset generation, which this replica reads (Redis:
//!   every 200 ms) and then forgets every lease it holds, and a lease
//!   asked across a move is not kept. A give-back that lands after a
//!   reset takes nothing from the fresh count: the store keeps when the
//!   limiter was reset (a fixed window) or when its state began (a token
//!   bucket), and refuses what may have been recorded before. Until it reads the move, a replica may still admit what it
//!   held of a lease taken before the reset: at most a lease, a tenth of
//!   the limit, per replica.
//! - **Lost leases.** A replica that stops holds its unused tokens in the
//!   store until the window ends: at most a lease (a tenth of the limit at
//!   most, [`PLENTY_HITS`] hits or an eighth of what was left when the
//!   replica's demand is lower) per replica is refused to the others for
//!   the rest of that window. That is the bound on under-admission; an
//!   idle replica's kept lease (at most a [`KEEP_DIVISOR`]-th of the
//!   limit, taken while half of it was left) is bounded the same way, and
//!   so are its reservations, which are not given back: at most a
//!   [`KEEP_DIVISOR`]-th of the limit in each of the next seven windows
//!   (a counter's buckets).
//!
//! - **Bounded.** The layer holds at most `lease.max_limiters` limiters
//!   ([`DEFAULT_MAX_LIMITERS`]), a share of it per map, so the values a
//!   client sends bound what it costs. A new limiter past that is decided
//!   in the store as without leases (never refused for it, never admitted
//!   unchecked), counted ([`LeaseCounts::past_cap`]), until limiters idle
//!   for two minutes are forgotten.
//! - **Clocks.** A lease's life, its reservations' and every other time
//!   this layer keeps are on the replica's monotonic clock
//!   ([`Clock::monotonic_micros`]), counted from the store's answer (a
//!   duration): a step of the replica's wall clock (an NTP step, a VM
//!   resumed) never makes a lease last longer than the store said, so it
//!   is never spent in a window where the store counts afresh. A forward
//!   step of the store's own clock does end its window early: the rest
//!   of a lease may then be spent in the next one (the Guarantees page
//!   states it). Only a lease's size reads the wall clock, for the time
//!   left in a fixed window.
//!
//! Everything else goes to the store as before: give-backs, checks,
//! usage reports, limiters that take receipts, lists, sharded limiters
//! and limits in flight (load refuses `lease: true` on them).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

mod counts;
mod given;
mod granted;
mod held;
mod hits;
mod key;
mod reserved;
mod walk;

use counts::Counters;
pub use counts::LeaseCounts;
use granted::Asked;
use held::Held;
use hits::{capacity, horizon, lease_hit, leased, store_hit};
use walk::{HeldMap, SHARDS, lock};

use crate::clock::Clock;
use crate::storage::{Ahead, BoxFuture, Decision, Hit, Receipt, Store, StoreError, StoreGauges};

/// Near the limit, a lease holds about this share of a second of the
/// replica's demand.
pub const LEASE_SHARE: f64 = 0.2;
/// A lease is at most the limit divided by this.
pub const MAX_LEASE_DIVISOR: u64 = 10;
/// Unused tokens of a lease go back after this long without a hit (at
/// least; a limiter hit less often waits a few of its gaps, up to
/// [`MAX_IDLE_MICROS`]), checked this often.
pub const IDLE_MICROS: u64 = 250_000;
/// The longest wait before an idle lease goes back.
pub const MAX_IDLE_MICROS: u64 = 10_000_000;
/// While the store has plenty left (at least half the limit after the
/// last lease), a lease on a limiter hit less often holds this many of
/// its hits (the demand of the time they take to come), as long as that
/// ends before its window does and within [`MAX_HORIZON_MICROS`].
pub const PLENTY_HITS: f64 = 32.0;
/// A lease holds at most this share of what the store had left (when
/// more than [`LEASE_SHARE`] of a second of demand).
pub const STORE_SHARE: u64 = 8;
/// The furthest ahead a lease looks.
pub const MAX_HORIZON_MICROS: u64 = 60_000_000;
/// A lease reserves hits in the next windows ([`crate::storage::Ahead`])
/// only on fixed windows at most this long.
pub const AHEAD_WINDOW_MICROS: u64 = 60_000_000;
/// An idle fixed-window lease taken while the store had plenty left is
/// kept until its window ends when it holds at most the limit divided by
/// this (a give-back costs a store call); a larger one goes back.
pub const KEEP_DIVISOR: u64 = 100;
/// Demand is counted in slots of this length: the current and the
/// previous slot make the estimate.
const SLOT_MICROS: u64 = 250_000;
/// The slots tell a rate from this many hits on; fewer, the long-run
/// estimate does.
const RECENT_HITS: u64 = 8;
/// The long-run estimate (for limiters hit less often than a slot) counts
/// hits over at most about this long.
const LONG_MICROS: u64 = 60_000_000;
/// A limiter not hit for this long is forgotten (with its estimates).
const FORGET_MICROS: u64 = 2 * LONG_MICROS;
/// Limiters the layer holds at most, by default (`lease.max_limiters`):
/// about 370 bytes each (a slot of its maps, its key's text, its place in
/// the walk queue) and 80 more while it holds reservations ahead, so some
/// 90 MB at most (`tests/lease.rs` measures both beside the same rule
/// without leases).
pub const DEFAULT_MAX_LIMITERS: usize = 200_000;

/// The leasing layer over any store. Cheap to share.
pub struct Leasing {
    inner: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// By [`Limiter::fingerprint`] in [`SHARDS`] maps (picked by the
    /// fingerprint), each with its walk queue (see [`walk`]), so the
    /// housekeeping walk holds up a sixteenth of the limiters at a time;
    /// each entry confirmed by its id. Std mutexes, never held across an
    /// `.await`.
    held: Box<[HeldMap]>,
    /// Per map, the earliest time in its walk queue (see [`Held::due`]):
    /// lowered by every change that queues a limiter, set by the walk
    /// under the map's lock, which skips a map until then without
    /// taking its lock.
    due: Box<[AtomicU64]>,
    /// The store's reset generation the leases were taken under.
    generation: AtomicU64,
    /// Resets through this replica so far.
    resets: AtomicU64,
    /// Limiters one map may hold ([`DEFAULT_MAX_LIMITERS`] or the
    /// setting, divided among the maps, rounded down, at least one).
    per_map: usize,
    counters: Counters,
}

enum Step {
    Answer(Decision),
    /// Ask the store for a lease of this many hits (and reservations in
    /// the next windows), first giving back what is left of the previous
    /// one; while the sender lives, other hits on the limiter wait for
    /// this lease.
    Lease(u64, Ahead, Option<Receipt>, Option<watch::Sender<()>>),
    /// Wait until the lease call in flight is over, then look again.
    Wait(watch::Receiver<()>),
    /// Decide the hit in the store alone (near the limit).
    Alone(Option<Receipt>),
}

impl Leasing {
    /// `inner` behind a leasing layer, with the task that gives idle
    /// leases back every [`IDLE_MICROS`] while the layer lives (it must
    /// be called inside a Tokio runtime).
    pub fn wrap(inner: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Arc<Leasing> {
        Leasing::wrap_with(inner, clock, DEFAULT_MAX_LIMITERS)
    }

    /// [`Leasing::wrap`], holding at most `max_limiters` limiters.
    pub fn wrap_with(
        inner: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        max_limiters: usize,
    ) -> Arc<Leasing> {
        let layer = Arc::new(Leasing::with_max_limiters(inner, clock, max_limiters));
        let weak = Arc::downgrade(&layer);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(std::time::Duration::from_micros(IDLE_MICROS));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(layer) = weak.upgrade() else {
                    return;
                };
                layer.give_back_idle().await;
            }
        });
        layer
    }

    pub fn new(inner: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        Leasing::with_max_limiters(inner, clock, DEFAULT_MAX_LIMITERS)
    }

    /// A layer holding at most `max_limiters` limiters (see
    /// [`Leasing::with_held`]); without its housekeeping task.
    pub fn with_max_limiters(
        inner: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        max_limiters: usize,
    ) -> Self {
        let generation = AtomicU64::new(inner.reset_generation());
        Self {
            inner,
            clock,
            held: (0..SHARDS).map(|_| HeldMap::default()).collect(),
            due: Leasing::new_due(),
            generation,
            resets: AtomicU64::new(0),
            per_map: (max_limiters / SHARDS).max(1),
            counters: Counters::default(),
        }
    }

    pub fn counts(&self) -> LeaseCounts {
        let (mut limiters, mut reserving, mut bytes) = (0, 0, 0);
        for map in self.held.iter().map(lock) {
            limiters += map.len() as u64;
            reserving += map.reserving() as u64;
            bytes += map.heap_bytes() as u64;
        }
        LeaseCounts {
            limiters,
            reserving,
            bytes,
            ..self.counters.read()
        }
    }

    /// `f` on the limiter of `hit` (made if new), under its map's lock, at
    /// `now`; the limiter is queued for the walk when its time came
    /// forward, and the map's time with it. `None` when the limiter is
    /// new and its map holds all it may: what a client's values create
    /// stays bounded, and such a limiter's hits go to the store as
    /// without leases (neither refused nor admitted unchecked) until the
    /// walk has forgotten limiters idle for [`FORGET_MICROS`].
    fn with_held<T>(&self, hit: &Hit<'_>, now: u64, f: impl FnOnce(&mut Held) -> T) -> Option<T> {
        let fingerprint = key::fingerprint(hit);
        let shard = (fingerprint % SHARDS as u64) as usize;
        let (out, due) = lock(&self.held[shard]).with(fingerprint, hit, now, self.per_map, f)?;
        if due != u64::MAX {
            self.due[shard].fetch_min(due, Ordering::Relaxed);
        }
        Some(out)
    }

    /// What to do with `hit` now; `first` on its first look (its demand
    /// is counted once, not again after waiting for a lease).
    fn step(&self, hit: &Hit<'_>, now: u64, first: bool) -> Step {
        let step = self.with_held(hit, now, |h| {
            if first {
                h.observe(now, hit.hits);
            }
            h.roll(now, &self.counters);
            if let Some(d) = self.spend(h, hit, now) {
                return Step::Answer(d);
            }
            if now < h.tight_until {
                return Step::Alone(h.take_unused(now, &self.counters));
            }
            if let Some(rx) = h.in_flight() {
                // A lease is on its way: one call for all the hits that
                // run out meanwhile.
                return Step::Wait(rx);
            }
            let unused = h.take_unused(now, &self.counters);
            let end = horizon(hit, now, self.clock.now_micros());
            let size = h.size(now, hit.hits, capacity(hit), end);
            let ahead = if size > hit.hits {
                h.ahead(now, capacity(hit))
            } else {
                Ahead::NONE
            };
            let asking = (size > hit.hits).then(|| {
                let (tx, rx) = watch::channel(());
                h.asking = Some(rx);
                tx
            });
            Step::Lease(size, ahead, unused, asking)
        });
        step.unwrap_or_else(|| {
            self.counters.past_cap.fetch_add(1, Ordering::Relaxed);
            Step::Alone(None)
        })
    }

    /// `hit` admitted from the lease `h` holds now, if it covers it.
    fn spend(&self, h: &mut Held, hit: &Hit<'_>, now: u64) -> Option<Decision> {
        if now < h.until && h.tokens >= hit.hits {
            h.tokens -= hit.hits;
            h.last_used = now;
            self.counters.local.fetch_add(1, Ordering::Relaxed);
            // What the store had left, and the lease's unused hits: on
            // one replica, what the store alone would answer.
            let remaining = h.store_left.saturating_add(h.tokens);
            return Some(Decision::new(true, remaining, h.local_reset(now)));
        }
        None
    }

    /// Gives `unused` hits of a lease back to the store.
    async fn give_back(&self, hit: &Hit<'_>, unused: Option<Receipt>) {
        let Some(r) = unused else {
            return;
        };
        self.counters.store_calls.fetch_add(1, Ordering::Relaxed);
        if self.inner.undo(lease_hit(hit, r.hits), r).await.is_ok() {
            self.counters
                .returned_hits
                .fetch_add(r.hits, Ordering::Relaxed);
        }
    }

    /// Forgets every lease when the store's reset generation moved (a
    /// reset through another replica); the generation read.
    fn follow_resets(&self) -> u64 {
        let now = self.inner.reset_generation();
        if self.generation.swap(now, Ordering::AcqRel) != now {
            for shard in self.held.iter() {
                lock(shard).clear();
            }
        }
        now
    }

    /// The resets seen so far: the store's generation and this replica's.
    fn resets_seen(&self) -> (u64, u64) {
        (self.follow_resets(), self.resets.load(Ordering::Acquire))
    }

    /// The resets as they stand, without forgetting any lease (safe under
    /// a map's lock).
    fn generation_now(&self) -> (u64, u64) {
        (
            self.inner.reset_generation(),
            self.resets.load(Ordering::Acquire),
        )
    }

    /// `f` on this replica's entry of `hit`'s limiter, if it holds one.
    fn existing<T>(&self, hit: &Hit<'_>, f: impl FnOnce(&mut Held) -> T) -> Option<T> {
        let fingerprint = key::fingerprint(hit);
        let shard = (fingerprint % SHARDS as u64) as usize;
        lock(&self.held[shard]).existing(fingerprint, hit, f)
    }

    /// Forgets this replica's lease of `hit`'s limiter, if it holds one.
    fn forget(&self, hit: &Hit<'_>) {
        self.existing(hit, |h| {
            (h.tokens, h.receipt, h.tight_until) = (0, None, 0);
            h.reserved.clear();
        });
    }

    /// A leased hit whose first step (taken at `now`, after reading the
    /// reset `generation`) was `step`: what the store's answers make of it.
    async fn leased(
        &self,
        hit: Hit<'_>,
        generation: (u64, u64),
        mut now: u64,
        mut step: Step,
    ) -> Result<Decision, StoreError> {
        let (size, ahead, unused, asking) = loop {
            match step {
                Step::Answer(d) => return Ok(d),
                Step::Alone(unused) => {
                    self.counters.store_calls.fetch_add(1, Ordering::Relaxed);
                    // What the old lease gives back goes beside the hit
                    // (each is safe in either order: a give-back only adds
                    // room).
                    let (_, d) = tokio::join!(
                        self.give_back(&hit, unused),
                        self.inner.hit(store_hit(&hit, hit.hits))
                    );
                    return d;
                }
                Step::Lease(size, ahead, unused, asking) => break (size, ahead, unused, asking),
                Step::Wait(mut rx) => {
                    // Ends when the call in flight is over (its sender is
                    // dropped), however it ends.
                    let _ = rx.changed().await;
                    now = self.clock.monotonic_micros();
                    step = self.step(&hit, now, false);
                }
            }
        };
        let lease = if size > hit.hits {
            Hit {
                ahead,
                ..lease_hit(&hit, size)
            }
        } else {
            store_hit(&hit, size)
        };
        self.counters.store_calls.fetch_add(1, Ordering::Relaxed);
        let (_, d) = tokio::join!(self.give_back(&hit, unused), self.inner.hit(lease));
        let d = d?;
        let answered = self.clock.monotonic_micros();
        let asked = Asked {
            hit: &hit,
            lease,
            size,
            ahead,
            now,
            answered,
            generation,
        };
        if !d.admitted {
            return self.refused(asked, d, asking).await;
        }
        let until = now.saturating_add(d.reset_micros);
        if size == hit.hits {
            // No lease: the hit was decided in the store.
            self.with_held(&hit, answered, |h| {
                h.store_left = d.remaining;
                h.store_left_until = until;
            });
            return Ok(d);
        }
        self.keep(asked, d, asking).await
    }
}

impl Store for Leasing {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        if leased(&hit) {
            // Most leased hits are answered from the lease at once: their
            // future is then just the answer, not the whole state of a
            // lease call (a kilobyte, allocated and copied per hit).
            let generation = self.resets_seen();
            let now = self.clock.monotonic_micros();
            return match self.step(&hit, now, true) {
                Step::Answer(d) => Box::pin(std::future::ready(Ok(d))),
                step => Box::pin(self.leased(hit, generation, now, step)),
            };
        }
        // Below, `lease` tells a store that a hit is a lease: only leases
        // made here carry it.
        let hit = Hit {
            lease: false,
            ..hit
        };
        // A give-back, a check or a descriptor carrying its own cost (never
        // leased) on a limiter this replica may hold a lease of: its
        // answer counts the lease's unused hits, as a leased one does.
        let as_hit = Hit {
            hits: 1,
            negative: false,
            lease: true,
            ..hit
        };
        if !leased(&as_hit) {
            return self.inner.hit(hit);
        }
        if hit.negative && hit.hits > 0 {
            return Box::pin(self.give_back_hits(hit));
        }
        Box::pin(async move {
            let d = self.inner.hit(hit).await?;
            Ok(self.with_unused(&hit, d))
        })
    }

    /// A hit its lease covers, decided as [`Store::hit`] would decide it
    /// (its demand counted); anything else is left to `hit`.
    fn decide_here(&self, hit: &Hit<'_>) -> Option<Decision> {
        if !leased(hit) {
            return None;
        }
        self.follow_resets();
        let now = self.clock.monotonic_micros();
        self.with_held(hit, now, |h| {
            h.roll(now, &self.counters);
            let d = self.spend(h, hit, now)?;
            h.observe(now, hit.hits);
            Some(d)
        })
        .flatten()
    }

    /// Forgets this replica's lease of the limiter (the reset gives the
    /// whole limit back; what the lease held is not given again), resets
    /// it below, and once that is done moves this replica's resets again
    /// and forgets the lease again: a lease asked before the store's reset
    /// completed counted in what the reset deleted, so it is refused when
    /// its answer comes after this, and forgotten here when it came
    /// before.
    fn reset<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.resets.fetch_add(1, Ordering::AcqRel);
            self.forget(&hit);
            let done = self.inner.reset(hit).await;
            self.resets.fetch_add(1, Ordering::AcqRel);
            self.forget(&hit);
            done
        })
    }

    fn gauges(&self) -> StoreGauges {
        StoreGauges {
            lease: Some(self.counts()),
            ..self.inner.gauges()
        }
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}
