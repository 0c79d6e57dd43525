//! The local over-limit cache: once the store refuses a limiter until some
//! reset time, this replica refuses the same limiter itself until then,
//! without a store call. An abusive client hammering an exhausted limiter
//! then costs one store call per reset instead of one per request.
//!
//! It is a layer in front of any [`Store`] (the embedded store runs it too)
//! and only uses the trait.
//!
//! # When an answer may be cached, and for what
//!
//! The cache must give the answer the store would have given, so it only
//! keeps refusals whose answer cannot change before the reset, except
//! through this replica's own give-backs, which it sees:
//!
//! * `fixed_window`: a refused hit of cost at most the limit leaves the
//!   window's count above the limit (refused hits are counted), so every
//!   later hit of the window, whatever its cost, and every check (cost 0) is
//!   refused with 0 remaining until the window ends. The cache answers those,
//!   and keeps the costs it refused (the store would have counted them): a
//!   give-back first takes from that sum, answered locally as the store would
//!   (the count is still above the limit); only the rest goes to the store,
//!   and the entry is dropped. Where quota streams' shares hold part of the
//!   window (`quota::window`), a refusal is of the count plus what they
//!   hold, which falls when a share shrinks: the store answers such a
//!   refusal with a reset of at most a second, so it is kept no longer. A
//!   give-back taken from the refused sum then leaves those costs counted
//!   in the store, which refuses more, never less, once a share shrinks.
//! * `sliding_window_log`: only refusals of cost 1 are kept. Such a refusal
//!   means the log holds exactly the limit, and nothing leaves it before the
//!   reset (the moment its oldest hit stops counting), so cost-1 hits are
//!   refused with 0 remaining until then; but while leases are out, the
//!   log holds what other replicas leased, and a lease's unspent hits go
//!   back at the end of its life (a tenth of the window within 1 ms and
//!   10 s), so the refusal is answered here for that long at most, its
//!   reset still the log's. A weighted refusal is not kept:
//!   before its reset, older hits leave, the remaining count grows and a
//!   smaller cost fits, which only the store can see. Checks (cost 0) are
//!   always admitted by the log and go to the store; a give-back goes to the
//!   store and drops the entry.
//! * `sliding_window_counter`: refusals are kept per cost (a few costs per
//!   limiter). A hit of the same cost is refused until the reset, as the
//!   store would; but the answer's `remaining` is the one of the refusal,
//!   while the store's estimate falls as the previous bucket's weight does,
//!   so the store may report more remaining meanwhile. Checks and other costs
//!   go to the store; a give-back goes to the store and drops the entry.
//!
//! * `token_bucket`: refusals are kept per cost, as for the counter. A
//!   refused cost takes nothing, tokens come back only with time, and other
//!   replicas only take more: a hit of the same cost is refused until the
//!   reset, which is exactly when the bucket can pay it. Checks and other
//!   costs go to the store; a give-back goes to the store and drops the
//!   entry.
//!
//! * Several limits on one descriptor (`rate_limits:`, [`Hit::also`]): a
//!   refused call records nothing on any of them, so refusals are kept per
//!   cost, as for the counter. The limit that refused a cost refuses it
//!   until its reset whatever the others do (other calls only take more,
//!   except give-backs, which go to the store and drop the entry); the
//!   answer repeats each limit's answer as the store gave it, its reset
//!   moved on by the time since. Checks and other costs go to the store.
//!
//! A hit costing more than the limit is never cached (the store does not
//! record it, so its refusal says nothing about the count).
//!
//! Refusals of a limiter whose hits take receipts (a `count_refused: false`
//! rule) are never kept: a charge on it that is taken back, by this
//! replica or another, reopens it before its reset.
//!
//! A limiter that takes usage reports records every positive cost, so
//! every positive cost goes to the store, refused or not: a cached refusal
//! never hides a report. Only checks (cost 0) are answered here: any
//! refusal it got (of a check, or of a report that took it over) holds for
//! checks until its reset, which is when the recorded usage is back within
//! the limit; a give-back goes to the store and drops the entry.
//!
//! The entry's end is this replica's monotonic clock
//! ([`Clock::monotonic_micros`]) when the call was sent plus the reset the
//! store answered: never later than the store's own reset, at most one round
//! trip earlier (the reset answered locally is that much shorter). A step of
//! the wall clock does not move it: stepped back, the store's window now
//! ends later, and the cache asks the store again at the reset it answered
//! (early is fine: the store decides again); stepped forward, the cache
//! keeps no refusal longer than the store said.
//!
//! The cache is per replica: hits given back through another replica are
//! not seen, and the entries of this one stay until their reset. A refusal
//! that arrives after a give-back was sent is not cached, since the store
//! may have decided it before the give-back.
//!
//! A reset ([`Store::reset`]) through this replica drops the limiter's
//! entries at once; one through another replica moves the store's
//! [`Store::reset_generation`], and the first hit that sees it moved drops
//! every entry (a reset is rare: each limiter still refused costs one more
//! store call). A refusal that arrives after a reset was sent, or after the
//! generation moved, is not cached either.
//!
//! Memory is bounded by `max_entries` limiters, least recently used evicted
//! first. An evicted `fixed_window` entry forgets the costs it refused, so a
//! later give-back in that window finds a lower count than without the cache.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use hashlink::LruCache;

use crate::clock::Clock;
use crate::limit::algorithms::{Leasing, Refusals, sliding_log};
pub use crate::storage::limiter::{Limiter, LimiterId};
use crate::storage::{BoxFuture, Decision, Group, Hit, Store, StoreError, StoreGauges};

/// Costs remembered per `sliding_window_counter` limiter.
const COSTS_PER_LIMITER: usize = 4;

/// Settings of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    pub enabled: bool,
    /// Limiters held at most; the least recently used is evicted past it.
    pub max_entries: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_entries: 100_000,
        }
    }
}

/// What the cache did since start, for metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CacheCounts {
    /// Hits answered without the store.
    pub hits: u64,
    /// Hits passed to the store.
    pub misses: u64,
    /// Limiters forgotten to stay within `max_entries` (expired ones are not
    /// counted).
    pub evictions: u64,
    /// Limiters held now.
    pub entries: u64,
}

#[derive(Debug, Clone)]
struct Refusal {
    /// The refused cost (`fixed_window`: any cost; stored as 0).
    cost: u64,
    remaining: u64,
    /// Until this instant (this replica's monotonic clock, microseconds):
    /// the store's reset is a duration from its answer, and a step of the
    /// wall clock must not make the cache refuse longer.
    until: u64,
    /// Until when it is answered here (at most `until`): a leased log's
    /// refusal only for a lease's life.
    kept_until: u64,
    /// A limiter with several limits: each limit's answer when the
    /// refusal was cached, and when that was.
    group: Option<(Box<Group>, u64)>,
}

#[derive(Debug)]
struct Entry {
    /// Whose refusals these are (the map is keyed by its fingerprint).
    id: LimiterId,
    refusals: Vec<Refusal>,
    /// `fixed_window`: costs refused here that the store would have counted.
    swallowed: u64,
}

/// What an entry says of a hit, and whether it stays.
enum Kept {
    /// The entry stays; the plan for the hit.
    Keep(Plan),
    /// The entry is dropped, and this cost goes to the store.
    Drop(u64),
}

impl Refusal {
    /// The refusal as answered at `now`: its reset (and each limit's of a
    /// list) moved on by the time since it was kept.
    fn answer(&self, now: u64) -> Decision {
        Decision {
            admitted: false,
            remaining: self.remaining,
            reset_micros: self.until - now,
            receipt: None,
            group: self.group.as_ref().map(|(g, at)| {
                let mut g = g.clone();
                for d in &mut g.parts {
                    d.reset_micros = d.reset_micros.saturating_sub(now.saturating_sub(*at));
                }
                g
            }),
        }
    }
}

impl Entry {
    /// What the entry's live refusals (at least one) say of `hit` at
    /// `now` (see the module docs).
    fn answer(&mut self, hit: &Hit<'_>, now: u64) -> Kept {
        if !hit.also.is_empty() {
            // Several limits: a refusal is kept per cost (see the module
            // docs); give-backs and checks go to the store.
            return self.same_cost(hit, now, hit.hits > 0);
        }
        if hit.usage_reports {
            // Reports are recorded whatever the answer: only checks are
            // answered here.
            return self.same_cost(hit, now, hit.hits == 0);
        }
        match hit.algorithm.spec().refusals {
            Refusals::AllCosts => self.any_cost(hit, now),
            Refusals::Never => Kept::Keep(Plan::Forward(hit.hits)),
            Refusals::Single | Refusals::SameCost => self.same_cost(hit, now, hit.hits > 0),
        }
    }

    /// Refusals kept per cost: a give-back drops the entry; a hit whose
    /// cost was refused (when `answerable`) is refused again; any other
    /// goes to the store.
    fn same_cost(&self, hit: &Hit<'_>, now: u64, answerable: bool) -> Kept {
        if hit.negative {
            return Kept::Drop(hit.hits);
        }
        Kept::Keep(match self.refusals.iter().find(|r| r.cost == hit.hits) {
            Some(r) if answerable => Plan::Answer(r.answer(now)),
            _ => Plan::Forward(hit.hits),
        })
    }

    /// A full fixed window: every cost is refused and, within the limit,
    /// swallowed (the store would have counted it); a give-back takes from
    /// what was swallowed first, and only the rest goes to the store.
    fn any_cost(&mut self, hit: &Hit<'_>, now: u64) -> Kept {
        let r = self.refusals[0].clone();
        if hit.negative {
            if hit.hits <= self.swallowed {
                self.swallowed -= hit.hits;
                return Kept::Keep(Plan::Answer(Decision {
                    admitted: true,
                    ..r.answer(now)
                }));
            }
            return Kept::Drop(hit.hits - self.swallowed);
        }
        if hit.hits <= hit.limit {
            self.swallowed += hit.hits;
        }
        Kept::Keep(Plan::Answer(r.answer(now)))
    }
}

enum Plan {
    Answer(Decision),
    /// Send this cost to the store (a give-back may be smaller than asked).
    Forward(u64),
}

/// A [`Store`] that answers exhausted limiters locally. Cheap to share.
pub struct OverLimitCache {
    inner: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// A std mutex: held for a map lookup or insert, never across an
    /// `.await`.
    /// By [`Limiter::fingerprint`]; each entry holds its full id.
    entries: Mutex<LruCache<u64, Entry>>,
    max_entries: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    /// Give-backs and resets sent so far: a refusal decided while one was
    /// in flight may predate it, and is not cached.
    give_backs: AtomicU64,
    /// The store's [`Store::reset_generation`] the entries were kept under.
    generation: AtomicU64,
}

impl OverLimitCache {
    pub fn new(inner: Arc<dyn Store>, clock: Arc<dyn Clock>, max_entries: usize) -> Self {
        let max_entries = max_entries.max(1);
        Self {
            clock,
            entries: Mutex::new(LruCache::new(max_entries)),
            max_entries,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            give_backs: AtomicU64::new(0),
            generation: AtomicU64::new(inner.reset_generation()),
            inner,
        }
    }

    /// `inner` behind a cache when `config` enables one, else `inner` alone.
    pub fn wrap(
        inner: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: CacheConfig,
    ) -> Arc<dyn Store> {
        if config.enabled {
            Arc::new(Self::new(inner, clock, config.max_entries))
        } else {
            inner
        }
    }

    pub fn counts(&self) -> CacheCounts {
        CacheCounts {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            entries: self.lock().len() as u64,
        }
    }

    fn lock(&self) -> MutexGuard<'_, LruCache<u64, Entry>> {
        // A poisoned map only means a panic mid-update of plain numbers; the
        // worst left behind is a stale refusal that expires at its reset.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What to do with `hit` on limiter `id` at `now`: answer it from a
    /// refusal kept, or send a cost to the store (dropping an entry that
    /// no longer says anything of it).
    fn plan(&self, id: u64, hit: &Hit<'_>, now: u64) -> Plan {
        let mut map = self.lock();
        let Some(entry) = map.get_mut(&id) else {
            return Plan::Forward(hit.hits);
        };
        if !hit.is(&entry.id) {
            // Another limiter with the same fingerprint: not ours.
            return Plan::Forward(hit.hits);
        }
        entry.refusals.retain(|r| r.kept_until > now);
        let kept = if entry.refusals.is_empty() {
            Kept::Drop(hit.hits)
        } else {
            entry.answer(hit, now)
        };
        match kept {
            Kept::Keep(plan) => plan,
            Kept::Drop(cost) => {
                map.remove(&id);
                Plan::Forward(cost)
            }
        }
    }

    /// Keeps a refusal the store just gave, when the cache may answer it
    /// (see the module docs).
    fn fill(&self, id: u64, hit: &Hit<'_>, d: &Decision, sent_at: u64) {
        // A limiter whose hits take receipts (`count_refused: false`) is
        // never answered here: another request's charge on it, taken back
        // on any replica, reopens it before its reset.
        if d.admitted || hit.negative || hit.receipt || d.reset_micros == 0 {
            return;
        }
        if (0..hit.parts()).any(|i| hit.part(i).algorithm.spec().refusals == Refusals::Never) {
            return;
        }
        let group = d.group.as_ref().map(|g| (g.clone(), sent_at));
        let cost = match hit.algorithm.spec().refusals {
            // Several limits: only refusals of a cost the refusing limit
            // could take at all, kept per cost.
            _ if !hit.also.is_empty() => {
                if hit.usage_reports || hit.hits == 0 || hit.hits > hit.part(d.which()).limit {
                    return;
                }
                hit.hits
            }
            // Whatever refused it (a check, or a report that took the
            // limiter over), checks are refused until its reset: only
            // time or a give-back lowers the recorded usage.
            _ if hit.usage_reports => 0,
            _ if hit.hits == 0 || hit.hits > hit.limit => return,
            Refusals::AllCosts if d.remaining == 0 => 0,
            Refusals::Single if hit.hits == 1 && d.remaining == 0 => 1,
            Refusals::SameCost => hit.hits,
            _ => return,
        };
        let until = sent_at.saturating_add(d.reset_micros);
        let kept_until = match hit.algorithm.spec().leasing {
            // A log's sum counts the hits other replicas leased, and
            // what a lease leaves unspent goes back at the end of its
            // life: its refusal says nothing of later.
            Leasing::Log => {
                until.min(sent_at.saturating_add(sliding_log::lease_life(hit.window.micros())))
            }
            _ => until,
        };
        let refusal = Refusal {
            cost,
            remaining: d.remaining,
            until,
            kept_until,
            group,
        };
        let mut map = self.lock();
        if let Some(entry) = map.get_mut(&id).filter(|e| hit.is(&e.id)) {
            match entry.refusals.iter_mut().find(|r| r.cost == cost) {
                // Concurrent refusals: the later end is as true as the first.
                Some(r) => *r = refusal,
                None => {
                    if entry.refusals.len() >= COSTS_PER_LIMITER {
                        entry.refusals.remove(0);
                    }
                    entry.refusals.push(refusal);
                }
            }
            return;
        }
        // A new limiter, or one taking the place of another with the same
        // fingerprint (which then only loses its cached refusal).
        if map.remove(&id).is_none() && map.len() >= self.max_entries {
            map.remove_lru();
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        map.insert(
            id,
            Entry {
                id: hit.to_id(),
                refusals: vec![refusal],
                swallowed: 0,
            },
        );
    }

    /// Drops `hit`'s limiter's refusals, of every cost, and keeps none
    /// decided before now.
    fn forget(&self, hit: &Hit<'_>) {
        self.give_backs.fetch_add(1, Ordering::SeqCst);
        self.lock().retain(|_, e| {
            let id = &e.id;
            !(*id.domain == *hit.domain
                && *id.entries == *hit.entries
                && id.algorithm == hit.algorithm
                && id.window == hit.window
                && id.shard == hit.shard)
        });
    }

    /// Drops every entry when the store's reset generation moved (another
    /// replica reset a limiter); returns the generation now in force.
    fn follow_resets(&self) -> u64 {
        let generation = self.inner.reset_generation();
        // Read first: every hit passes here, and a write would make every
        // core contend for the line.
        if self.generation.load(Ordering::Acquire) != generation
            && self.generation.swap(generation, Ordering::AcqRel) != generation
        {
            self.lock().clear();
        }
        generation
    }

    /// Drops the entries whose refusals have all expired.
    pub fn sweep(&self) {
        let now = self.clock.monotonic_micros();
        self.lock().retain(|_, e| {
            e.refusals.retain(|r| r.kept_until > now);
            !e.refusals.is_empty()
        });
    }
}

impl Store for OverLimitCache {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            let id = hit.fingerprint();
            // Only durations are timed here (from the store's answers):
            // nothing in the cache is aligned to windows.
            let now = self.clock.monotonic_micros();
            let generation = self.follow_resets();
            let give_backs = self.give_backs.load(Ordering::SeqCst);
            let cost = match self.plan(id, &hit, now) {
                Plan::Answer(d) => {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(d);
                }
                Plan::Forward(cost) => cost,
            };
            self.misses.fetch_add(1, Ordering::Relaxed);
            if hit.negative {
                self.give_backs.fetch_add(1, Ordering::SeqCst);
            }
            let sent = Hit { hits: cost, ..hit };
            let d = self.inner.hit(sent).await?;
            if self.give_backs.load(Ordering::SeqCst) == give_backs
                && self.inner.reset_generation() == generation
            {
                self.fill(id, &sent, &d, now);
            }
            Ok(d)
        })
    }

    /// Drops the limiter's refusals (of every cost; of this shard), passes
    /// the reset on, then drops them again: a refusal the store decided
    /// before the reset may have been kept meanwhile, and one still in
    /// flight is not kept (the reset counts as a give-back).
    fn reset<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.forget(&hit);
            let result = self.inner.reset(hit).await;
            self.forget(&hit);
            result
        })
    }

    fn maintain(&self) {
        self.sweep();
        self.inner.maintain()
    }

    fn gauges(&self) -> StoreGauges {
        StoreGauges {
            over_limit_cache: Some(self.counts()),
            ..self.inner.gauges()
        }
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::limit::Algorithm;
    use crate::limit::Unit;
    use crate::storage::MemoryStore;

    fn entries() -> Vec<(String, String)> {
        vec![("user".to_string(), "mallory".to_string())]
    }

    #[test]
    fn a_hit_and_its_owned_id_are_the_same_limiter() {
        let e = entries();
        let h = hit(&e, Algorithm::SlidingWindowCounter, 1, false);
        let id = LimiterId::of(&h);
        assert_eq!(h.fingerprint(), id.fingerprint());
        assert!(h.is(&id) && id.is(&id));
        // Every part of the identity counts.
        let other_entries = vec![("user".to_string(), "malloryx".to_string())];
        let others = [
            Hit { limit: 6, ..h },
            Hit { buckets: 10, ..h },
            Hit {
                window: Unit::Minute.into(),
                ..h
            },
            Hit {
                algorithm: Algorithm::FixedWindow,
                ..h
            },
            Hit {
                domain: "api2",
                ..h
            },
            Hit {
                entries: &other_entries,
                ..h
            },
        ];
        for o in others {
            assert!(!o.is(&id), "{o:?}");
            assert_ne!(o.fingerprint(), id.fingerprint(), "{o:?}");
        }
        // The cost and direction of a hit are not part of the limiter.
        assert!(
            Hit {
                hits: 9,
                negative: true,
                usage_reports: false,
                ..h
            }
            .is(&id)
        );
    }

    fn hit(
        entries: &[(String, String)],
        algorithm: Algorithm,
        hits: u64,
        negative: bool,
    ) -> Hit<'_> {
        Hit {
            domain: "api",
            entries,
            algorithm,
            limit: 5,
            window: Unit::Second.into(),
            hits,
            negative,
            usage_reports: false,
            buckets: crate::limit::DEFAULT_BUCKETS,
            burst: 0,
            shard: crate::storage::Shard::NONE,
            receipt: false,
            also: &[],
            lease: false,
            ahead: crate::storage::Ahead::NONE,
        }
    }

    /// Runs the same script of hits through a bare store and a cached one
    /// on the same manual clock, and checks every answer matches.
    async fn same_answers(algorithm: Algorithm, script: &[(u64, bool, u64)]) -> CacheCounts {
        let clock = ManualClock::at_micros(1_000_000_000_000 + 300_000);
        let bare = MemoryStore::new(Arc::new(clock.clone()));
        let cached = OverLimitCache::new(
            Arc::new(MemoryStore::new(Arc::new(clock.clone()))),
            Arc::new(clock.clone()),
            16,
        );
        let e = entries();
        for (i, &(hits, negative, advance)) in script.iter().enumerate() {
            let h = hit(&e, algorithm, hits, negative);
            let want = bare.hit(h).await.unwrap();
            let got = cached.hit(h).await.unwrap();
            assert_eq!(got, want, "{algorithm} step {i}: {h:?}");
            clock.advance_micros(advance);
        }
        cached.counts()
    }

    #[tokio::test]
    async fn fixed_window_answers_match_the_store_through_give_backs() {
        let mut script = vec![(1, false, 1000); 12];
        script.extend([
            (0, false, 10),
            (9, false, 10),
            (2, true, 10),
            (1, false, 10),
            (7, true, 10),
            (1, false, 10),
            (1, false, 10),
            (1, false, 800_000),
            (1, false, 10),
        ]);
        let counts = same_answers(Algorithm::FixedWindow, &script).await;
        assert!(counts.hits >= 8, "{counts:?}");
    }

    #[tokio::test]
    async fn log_answers_match_the_store() {
        // 20 ms apart: a refusal is kept a lease's life at most (100 ms
        // on a second), so the ones after it are answered here.
        let mut script = vec![(1, false, 20_000); 12];
        script.extend([
            (0, false, 10),
            (2, false, 10),
            (1, false, 10),
            (1, true, 10),
            (1, false, 10),
            (1, false, 10),
            (1, false, 500_000),
            (1, false, 10),
            (3, false, 300_000),
            (1, false, 10),
        ]);
        let counts = same_answers(Algorithm::SlidingWindowLog, &script).await;
        assert_eq!(counts.hits, 7, "{counts:?}");
    }

    #[tokio::test]
    async fn counter_admits_and_refuses_as_the_store() {
        let clock = ManualClock::at_micros(1_000_000_000_000);
        let bare = MemoryStore::new(Arc::new(clock.clone()));
        let cached = OverLimitCache::new(
            Arc::new(MemoryStore::new(Arc::new(clock.clone()))),
            Arc::new(clock.clone()),
            16,
        );
        let e = entries();
        for step in 0..400 {
            let h = hit(&e, Algorithm::SlidingWindowCounter, 1 + step % 2, false);
            let want = bare.hit(h).await.unwrap();
            let got = cached.hit(h).await.unwrap();
            assert_eq!(got.admitted, want.admitted, "step {step}");
            clock.advance_micros(7_919);
        }
        assert!(cached.counts().hits > 100, "{:?}", cached.counts());
    }

    #[tokio::test]
    async fn bounded_with_least_recently_used_evicted() {
        let clock = ManualClock::at_secs(1_000_000);
        let cached = OverLimitCache::new(
            Arc::new(MemoryStore::new(Arc::new(clock.clone()))),
            Arc::new(clock.clone()),
            3,
        );
        for user in 0..10 {
            let e = vec![("user".to_string(), user.to_string())];
            for _ in 0..7 {
                cached
                    .hit(hit(&e, Algorithm::FixedWindow, 1, false))
                    .await
                    .unwrap();
            }
        }
        let c = cached.counts();
        assert_eq!(c.entries, 3);
        assert_eq!(c.evictions, 7);
        // 5 admitted and 1 refused by the store, then 1 answered here, per user.
        assert_eq!((c.hits, c.misses), (10, 60));
        clock.advance_secs(1);
        cached.sweep();
        assert_eq!(cached.counts().entries, 0);
    }

    /// A full log holds hits other replicas leased; what a lease leaves
    /// unspent goes back at the end of its life, so a refusal is answered
    /// here for a lease's life at most: then the store, which has room
    /// again, is asked (kept until the oldest hit leaves, a day here, the
    /// replica would refuse all day).
    #[tokio::test]
    async fn a_log_s_refusal_is_kept_no_longer_than_a_lease_lives() {
        let clock = ManualClock::at_micros(1_000_000_000_000);
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new(Arc::new(clock.clone())));
        let cached = OverLimitCache::new(store.clone(), Arc::new(clock.clone()), 16);
        let e = entries();
        let day = Hit {
            window: Unit::Day.into(),
            ..hit(&e, Algorithm::SlidingWindowLog, 1, false)
        };
        // Another replica leases 3 of the 5.
        let lease = Hit {
            hits: 3,
            lease: true,
            receipt: true,
            ..day
        };
        let leased = store.hit(lease).await.unwrap();
        assert!(leased.admitted);
        for _ in 0..2 {
            assert!(cached.hit(day).await.unwrap().admitted);
        }
        let refused = cached.hit(day).await.unwrap();
        assert!(!refused.admitted);
        assert!(refused.reset_micros > 23 * 3_600_000_000, "{refused:?}");
        let kept = cached.hit(day).await.unwrap();
        assert!(!kept.admitted);
        assert_eq!(cached.counts().hits, 1);
        // The lease ends unspent: its hits go back.
        store.undo(lease, leased.receipt.unwrap()).await.unwrap();
        clock.advance_micros(sliding_log::lease_life(Unit::Day.micros()));
        let after = cached.hit(day).await.unwrap();
        assert!(after.admitted, "still refused from the cache: {after:?}");
    }

    /// The wall clock stepping back (an NTP step, a VM resumed) does not
    /// keep a refusal past the reset the store answered: the cache times it
    /// on the monotonic clock, and past it asks the store, which here counts
    /// afresh in the window the wall clock stepped back into.
    #[tokio::test]
    async fn a_wall_step_back_does_not_keep_a_refusal_past_its_reset() {
        let clock = ManualClock::at_micros(1_000_000_000_000 + 300_000);
        let cached = OverLimitCache::new(
            Arc::new(MemoryStore::new(Arc::new(clock.clone()))),
            Arc::new(clock.clone()),
            16,
        );
        let e = entries();
        let h = hit(&e, Algorithm::FixedWindow, 1, false);
        for _ in 0..5 {
            assert!(cached.hit(h).await.unwrap().admitted);
        }
        let refused = cached.hit(h).await.unwrap();
        assert!(!refused.admitted);
        assert_eq!(refused.reset_micros, 700_000);
        clock.step_wall_micros(-10_000_000);
        // Still refused here until the reset, as the store answered it.
        let kept = cached.hit(h).await.unwrap();
        assert!(!kept.admitted);
        assert_eq!(kept.reset_micros, 700_000, "{kept:?}");
        assert_eq!(cached.counts().hits, 1);
        clock.advance_micros(700_000);
        // Past the reset the store answers, not the cache: it counts on in
        // the window it wrote, which ends 10 s later on the stepped clock.
        let after = cached.hit(h).await.unwrap();
        assert_eq!(
            cached.counts().hits,
            1,
            "refused from the cache past its reset: {after:?}"
        );
        assert!(!after.admitted, "{after:?}");
        assert_eq!(after.reset_micros, 10_000_000, "{after:?}");
    }
}
