//! What is true of each algorithm, one module each: its name, its keys,
//! its Lua script, how it leases, what the over-limit cache may keep of
//! its refusals, how RLQS counts on it, how a reset clears it, its bound,
//! and what validation lets it combine with. The layers (engine, leases,
//! cache, keys, Redis, RLQS, guarantees, rule loading) read the
//! algorithm's [`Spec`] through [`Algorithm::spec`], the one place that
//! matches on the algorithm; they do not match on it themselves.
//!
//! A spec is plain data: each layer keeps its own mechanism (the lease
//! layer's two ways to lease, the cache's three ways to answer) and the
//! spec says which one an algorithm uses.

use crate::limit::Algorithm;
use crate::storage::keys::Role;
use crate::storage::{Decision, Hit, Receipt};

pub mod concurrency;
pub mod fixed_window;
pub mod sliding_counter;
pub mod sliding_log;
pub mod token_bucket;

/// The shape of a bound on one limiter's admitted hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Nothing is refused (`shadow_mode`): no bound on what passes.
    None,
    /// In every epoch-aligned window (a calendar window in its zone):
    /// at most the limit.
    Window,
    /// In every trailing window of the limit's length: at most the limit.
    Trailing,
    /// In every run of `buckets - 1` consecutive buckets (each the window
    /// over `buckets - 1`, epoch-aligned or, staggered, starting at an
    /// offset of the descriptor): at most the limit; so at most twice the
    /// limit in any trailing window.
    Buckets,
    /// In any interval of length t: at most burst + rate x t.
    Bucket,
    /// At every instant: at most the limit of admitted takes held (taken
    /// within `max_duration` and not released).
    InFlight,
}

/// Everything the layers ask of an algorithm.
#[derive(Debug)]
pub struct Spec {
    /// As rules and settings spell it.
    pub name: &'static str,
    /// The letter that names it in a limiter's key.
    pub key_code: char,
    /// Whether the counter's bucket count is part of the key (when it is
    /// not the default).
    pub keys_buckets: bool,
    /// Whether the engine staggers its windows ([`crate::limit::Window::staggered`]):
    /// each limiter's buckets start at an offset of its descriptor, so
    /// that the limiters of one rule do not all turn at once (a lease
    /// lives within its bucket: aligned, every limiter would take a new
    /// one at the same instant). Its script then takes where the buckets
    /// start as `ARGV[7]`.
    pub staggered: bool,
    /// Its keys in Redis, in its script's `KEYS` order: the limiter's
    /// key of each role.
    pub roles: &'static [Role],
    /// Its Lua script (`lua/<name>.lua`).
    pub lua: &'static str,
    /// Its number in the batch script.
    pub batch_id: i64,
    /// What its script's fifth argument carries.
    pub param: Param,
    /// How a replica leases it (`lease: true`).
    pub leasing: Leasing,
    /// What the over-limit cache keeps of its refusals.
    pub refusals: Refusals,
    /// How a quota stream's share of it is counted in the store.
    pub rlqs: Rlqs,
    /// What a reset must do beyond deleting its keys.
    pub reset: Reset,
    /// Its bound (README's Guarantees table, the model's oracle).
    pub bound: Bound,
    /// Whether a calendar window (`timezone`) may time it.
    pub calendar: bool,
    /// Rule keys that apply to this algorithm only.
    pub own_keys: &'static [&'static str],
    /// Whether its state keeps an entry per hit admitted, so that
    /// `max_log_limit` caps its limit (a rule's, or a request's own): why,
    /// and what a rule may do instead, as validation says them.
    pub entry_per_hit: Option<(&'static str, &'static str)>,
    /// Whether it may take usage reports (`usage_reports`): costs
    /// recorded whatever the answer.
    pub takes_reports: bool,
    /// A new state of it in the embedded store.
    pub(crate) memory: fn() -> State,
}

/// The script's fifth argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// The counter's bucket count (the others ignore it).
    Buckets,
    /// The bucket's burst, as the store holds it exact.
    Burst,
    /// How long a slot is held at most, in microseconds (carried in
    /// [`Hit::burst`](crate::storage::Hit)).
    MaxDuration,
}

/// How a replica decides from leased quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leasing {
    /// It cannot lease; the reason, as validation gives it.
    Never(&'static str),
    /// A lease is a weighted hit recorded in the current window, spent
    /// until the window ends; a window starts with its whole limit, an
    /// idle lease may be kept to the window's end, and windows ahead may
    /// be reserved.
    Window,
    /// A lease takes tokens that keep their room in the bucket while it
    /// lives (one lease period); the store is told it is a lease, and a
    /// lease is ended even when spent.
    Tokens,
    /// A lease is hits recorded in the current bucket, spent only while
    /// that bucket is current (the receipt's mark says how long, from when
    /// the call was sent); what is left at its end goes back while the
    /// bucket still counts. No reservations ahead, and no bucket starts
    /// with the whole limit (the older buckets still weigh).
    Bucket,
    /// A lease is hits recorded at the end of its life (a tenth of the
    /// window, `sliding_log::lease_life`), the latest time one of them can
    /// be admitted, so they count in every trailing window a real hit of
    /// theirs would count in; the store is told it is a lease, and what is
    /// left at its end goes back (it would count a window more).
    Log,
}

/// What the over-limit cache may answer from a refusal it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusals {
    /// A full window refuses every cost until it ends: the cache keeps
    /// one refusal and answers any cost, and what it refused counts
    /// against give-backs.
    AllCosts,
    /// Only a refusal of a single hit with nothing left says the same of
    /// the next single hit.
    Single,
    /// A refusal says the same of the same cost until its reset.
    SameCost,
    /// None: the store must see every call (a refusal records what it
    /// owes, and a release may come at any moment).
    Never,
}

/// How a quota stream's share is counted in the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rlqs {
    /// In the window's own state, when the window is long enough.
    Window,
    /// As a charge on the bucket.
    Bucket,
    /// In the ledger alone: RLS and RLQS do not share one count.
    Ledger,
    /// Not at all: a quota stream cannot release what it took, so a
    /// bucket that meets it is refused.
    Never,
}

/// What a reset does beyond deleting the limiter's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reset {
    /// Nothing.
    Delete,
    /// Marks the window (or bucket) reset, so that a give-back of hits
    /// recorded before it does not land on the fresh count.
    MarkWindow,
    /// Starts a new bucket after now, so that a lease taken before the
    /// reset gives nothing back into it.
    NewBucket,
    /// Every slot held becomes owed a release, so that the releases of
    /// requests taken before the reset free nothing taken after it.
    OweHeld,
}

impl Algorithm {
    /// The one match on the algorithm: its spec.
    pub fn spec(self) -> &'static Spec {
        match self {
            Algorithm::FixedWindow => &fixed_window::SPEC,
            Algorithm::SlidingWindowCounter => &sliding_counter::SPEC,
            Algorithm::SlidingWindowLog => &sliding_log::SPEC,
            Algorithm::TokenBucket => &token_bucket::SPEC,
            Algorithm::Concurrency => &concurrency::SPEC,
        }
    }

    /// Whether a negative hit on it is a release (of a slot held), not
    /// hits given back: in a `rate_limits:` list with it, a release goes
    /// to it alone, and the rates keep what the request took.
    pub fn releases(self) -> bool {
        self.spec().bound == Bound::InFlight
    }

    /// The algorithms that can lease, as validation lists them.
    pub fn leasable() -> impl Iterator<Item = Algorithm> {
        Algorithm::ALL
            .into_iter()
            .filter(|a| !matches!(a.spec().leasing, Leasing::Never(_)))
    }

    /// The algorithms a rule key applies to, as validation lists them.
    pub fn owning(key: &str) -> impl Iterator<Item = Algorithm> + '_ {
        Algorithm::ALL
            .into_iter()
            .filter(move |a| a.spec().own_keys.contains(&key))
    }
}

// The embedded store: each algorithm's state and decisions, behind one
// dispatch.

/// A limiter's state in the embedded store: its algorithm's own.
#[derive(Debug)]
pub(crate) enum State {
    Fixed(fixed_window::Memory),
    Counter(sliding_counter::Memory),
    Log(sliding_log::Memory),
    Bucket(token_bucket::Memory),
    Slots(concurrency::Memory),
}

/// What the embedded store asks of a limiter's state, with the semantics
/// of the algorithm's script in `lua/`.
pub(crate) trait Embedded {
    /// Decides `hit` at `now` and records it in one step (a log in at
    /// most `max_members` members), and moves `expires_at`, after which
    /// the state holds nothing that still counts.
    fn decide(
        &mut self,
        now: u64,
        hit: &Hit<'_>,
        max_members: usize,
        expires_at: &mut u64,
    ) -> Decision;
    /// Takes back what the receipt `r` says one call recorded, only
    /// while it still counts; `reset_at`: the limiter's last reset, while
    /// a give-back may still predate it.
    fn undo(&mut self, now: u64, hit: &Hit<'_>, r: &Receipt, reset_at: Option<u64>);
    /// What the state holds on the heap.
    fn heap_bytes(&self) -> usize;
    /// What a reset does to a state kept after it (see [`Reset`]).
    fn forget(&mut self, _now: u64, _hit: &Hit<'_>) {}
    /// When the window (a counter's bucket) the state last wrote starts,
    /// on the store's clock: after now only when the clock stepped back.
    /// A reset is marked no earlier (the scripts' `x`).
    fn written_from(&self, _hit: &Hit<'_>) -> Option<u64> {
        None
    }
}

impl State {
    /// A new state for `algorithm`.
    pub(crate) fn of(algorithm: Algorithm) -> State {
        (algorithm.spec().memory)()
    }

    /// The one dispatch on a state.
    pub(crate) fn ops(&mut self) -> &mut dyn Embedded {
        match self {
            State::Fixed(m) => m,
            State::Counter(m) => m,
            State::Log(m) => m,
            State::Bucket(m) => m,
            State::Slots(m) => m,
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        match self {
            State::Fixed(m) => m.heap_bytes(),
            State::Counter(m) => m.heap_bytes(),
            State::Log(m) => m.heap_bytes(),
            State::Bucket(m) => m.heap_bytes(),
            State::Slots(m) => m.heap_bytes(),
        }
    }

    /// A fixed window's state (a quota stream's reservation reads it).
    pub(crate) fn as_fixed_mut(&mut self) -> Option<&mut fixed_window::Memory> {
        match self {
            State::Fixed(m) => Some(m),
            _ => None,
        }
    }
}

/// A duration in microseconds as rules write it: `500ms`, `30s`, `2m`,
/// `1h` (the largest unit that divides it).
pub fn duration_text(micros: u64) -> String {
    let ms = micros / 1_000;
    match ms {
        _ if ms > 0 && ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms > 0 && ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms > 0 && ms.is_multiple_of(1_000) => format!("{}s", ms / 1_000),
        _ => format!("{ms}ms"),
    }
}

/// Recorded usage saturates here, as in the scripts (Redis Lua numbers are
/// doubles, exact below 2^53): a usage report may carry any cost, and a
/// limiter that far over its limit is refused for its whole window anyway.
pub(crate) const MAX_COUNT: u64 = 1 << 53;

/// `d` with a receipt of `recorded` hits at `at` (and `mark`), when the
/// hit asked for one and something was recorded.
pub(crate) fn with_receipt(
    mut d: Decision,
    hit: &Hit<'_>,
    recorded: u64,
    at: u64,
    mark: u64,
) -> Decision {
    if hit.receipt && recorded > 0 {
        d.receipt = Some(Receipt {
            hits: recorded,
            at,
            mark,
            shard: hit.shard.index,
            ahead: 0,
            reserved: 0,
        });
    }
    d
}

pub(crate) fn decision(admitted: bool, remaining: u64, reset_micros: u64) -> Decision {
    Decision::new(admitted, remaining, reset_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_is_as_small_as_the_largest_algorithm_s() {
        // The embedded store's estimate of its memory (and the memory
        // tests) count on this: a new algorithm's state must not grow it.
        assert!(size_of::<State>() <= size_of::<fixed_window::Memory>() + 8);
    }

    #[test]
    fn each_algorithm_has_its_own_name_letter_and_batch_number() {
        let specs: Vec<&Spec> = Algorithm::ALL.iter().map(|a| a.spec()).collect();
        for (i, a) in specs.iter().enumerate() {
            for b in &specs[i + 1..] {
                assert_ne!(a.name, b.name);
                assert_ne!(a.key_code, b.key_code);
                assert_ne!(a.batch_id, b.batch_id);
            }
        }
        for a in Algorithm::ALL {
            assert_eq!(a.spec().name.parse::<Algorithm>(), Ok(a));
        }
    }
}
