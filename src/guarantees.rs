//! What tollgate promises about the hits it admits: one list, by
//! algorithm and by the features a rule combines. README's Guarantees
//! table is [`markdown`] of [`TABLE`] (`tests/model.rs` holds the two
//! equal), and the model checker's oracle (`tests/model.rs`) checks every
//! limiter's history against [`promise`] of its rule, read from here and
//! nowhere else.
//!
//! A promise is a bound on the hits admitted to one limiter (a rule's
//! limit for one descriptor value, or for a shared wildcard's pattern),
//! counted from the answers alone: a descriptor answered OK under a
//! limit, in an answer whose overall code is OK, admitted its cost. Usage
//! reports (a descriptor carrying its own cost on a rule with
//! `usage_reports`) are recorded whatever they answer and admit nothing:
//! they only take room. Each bound then grows by what the rules say may
//! add room: hits given back, a reset, the bursts of Envoys' own buckets.

use crate::limit::Algorithm;
use crate::limit::algorithms::Rlqs;

pub use crate::limit::algorithms::Bound;

/// What a rule combines, as far as its bound depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    pub algorithm: Algorithm,
    pub shadow: bool,
    pub lease: bool,
    /// Envoys take quota shares of the limit (RLQS) beside requests.
    pub rlqs: bool,
    pub shards: u16,
    pub calendar: bool,
}

/// A limiter's bound and what may add to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Promise {
    pub bound: Bound,
    /// Hits given back (`is_negative_hits`) make that much room again:
    /// in the same window (a bucket: within the interval; the sliding
    /// windows: within two windows before its end).
    pub given_back: bool,
    /// After a reset through one replica, each other replica may still
    /// admit what it held of a lease taken before it, until it reads the
    /// reset: at most the limit (a bucket: its burst) divided by this, per
    /// other replica, after the reset. 0: nothing.
    pub reset_lease_divisor: u64,
    /// RLQS and RLS on one count: the bound holds for both together, plus
    /// what the Envoys' own buckets were given at each assignment (their
    /// bursts). `false` with `rlqs`: each protocol keeps the bound alone.
    pub one_count: bool,
}

/// One row of the table: the first row whose `applies` says yes is a
/// rule's promise.
pub struct Row {
    /// The combination, as README's table names it.
    pub combination: &'static str,
    pub bound_text: &'static str,
    pub faults_text: &'static str,
    /// The tests that check it.
    pub checked_by: &'static str,
    pub applies: fn(&Features) -> bool,
    pub bound: fn(&Features) -> Bound,
}

fn counted(f: &Features) -> bool {
    matches!(f.algorithm.spec().rlqs, Rlqs::Window | Rlqs::Bucket) && f.shards <= 1 && !f.calendar
}

fn of_algorithm(f: &Features) -> Bound {
    f.algorithm.spec().bound
}

const FAULTS: &str = "replica crashes, wall-clock steps, store errors, calls cut after the write, a slow store, concurrent callers (some while the first ones' calls are in flight, coalesced), resets, reloads";

/// A lease call cut after its write is left out: the ledger then holds a
/// share the stream never heard of, while Envoy spends its last one.
const RLQS_FAULTS: &str = "streams closing and reopening, Envoys moving between replicas and restarting, replica crashes, resets, store errors (a lease call cut after its write excepted), a slow store, and the faults above on RLS";

pub const TABLE: &[Row] = &[
    Row {
        combination: "`shadow_mode: true`, any algorithm",
        bound_text: "none: counted, always answered OK",
        faults_text: "-",
        checked_by: "`tests/model.rs`",
        applies: |f| f.shadow,
        bound: |_| Bound::None,
    },
    Row {
        combination: "`fixed_window` (also calendar, sharded, in a list, leased)",
        bound_text: "at most the limit in every aligned window",
        faults_text: FAULTS,
        checked_by: "`tests/model.rs`",
        applies: |f| of_algorithm(f) == Bound::Window && !f.rlqs,
        bound: of_algorithm,
    },
    Row {
        combination: "`sliding_window_log` (also sharded, in a list, leased)",
        bound_text: "at most the limit in every trailing window",
        faults_text: FAULTS,
        checked_by: "`tests/model.rs`",
        applies: |f| of_algorithm(f) == Bound::Trailing && !f.rlqs,
        bound: of_algorithm,
    },
    Row {
        combination: "`sliding_window_counter` (also sharded, in a list, leased, its leases reserving hits in the buckets ahead)",
        bound_text: "at most the limit in every `buckets - 1` consecutive buckets, which start at an offset of each descriptor (so at most 2x in a trailing window)",
        faults_text: FAULTS,
        checked_by: "`tests/model.rs`",
        applies: |f| of_algorithm(f) == Bound::Buckets && !f.rlqs,
        bound: of_algorithm,
    },
    Row {
        combination: "`token_bucket` (also sharded, in a list, leased)",
        bound_text: "at most burst + rate x t in any interval t",
        faults_text: FAULTS,
        checked_by: "`tests/model.rs`",
        applies: |f| of_algorithm(f) == Bound::Bucket && !f.rlqs,
        bound: of_algorithm,
    },
    Row {
        combination: "`concurrency` (also in a list, with `count_refused: false`, reset)",
        bound_text: "at most the limit of takes held at any instant (admitted within the last `max_duration` and not released); so in any `max_duration`, at most the limit plus the releases within it. A refused take's release frees nothing",
        faults_text: FAULTS,
        checked_by: "`tests/model.rs`, `tests/concurrency.rs`, `tests/envoy_concurrency.rs`",
        applies: |f| of_algorithm(f) == Bound::InFlight && !f.rlqs,
        bound: of_algorithm,
    },
    Row {
        combination: "RLQS beside RLS, `fixed_window` or `token_bucket`, not sharded, not calendar (also in a list, under `share_threshold`, leased)",
        bound_text: "the algorithm's bound for both protocols together, plus the Envoys' buckets' bursts: what they hold as the window (a bucket: the interval) begins and what they are given beyond their rates within it",
        faults_text: RLQS_FAULTS,
        checked_by: "`tests/model.rs`, `tests/lease.rs`, `tests/rlqs.rs`",
        applies: |f| f.rlqs && counted(f),
        bound: of_algorithm,
    },
    Row {
        combination: "RLQS beside RLS, any other rule (the sliding windows, sharded; a calendar limit, which RLQS skips: Envoy's `no_assignment_behavior` applies; `concurrency`, whose buckets RLQS denies, as a quota stream cannot release what it took)",
        bound_text: "the algorithm's bound for each protocol alone (RLQS: plus the Envoys' buckets' bursts)",
        faults_text: RLQS_FAULTS,
        checked_by: "`tests/model.rs`, `tests/lease.rs`, `tests/rlqs.rs`",
        applies: |f| f.rlqs,
        bound: of_algorithm,
    },
];

/// Every row adds the same allowances to its bound: written once.
pub const ALLOWANCES: &[&str] = &[
    "Hits given back (`is_negative_hits`) make that much room again.",
    "Usage reports are recorded whatever they answer and admit nothing: requests' admitted hits keep the bound.",
    "`concurrency` counts on every take being released once, whatever its answer (Envoy's stream-done call does so): a release first pays what refused takes owe, then frees the oldest slot. A release whose take never reached the store (its call failed before the write, or `on_store_error: allow` answered it), that comes after its slot's `max_duration`, or that lands before the take-back of its request refused elsewhere (`count_refused: false`, behind a store slower than the caller's deadline), frees a slot another request holds: one more in flight, for each.",
    "With `lease`, a reset through one replica forgets that replica's lease at once; each other replica may still spend what it held of a lease taken before the reset, until it reads the reset (Redis: within 200 ms): at most a tenth of the limit (a bucket: of its burst) per other replica, in the window holding the reset, and what it reserved in a window (a counter's bucket) that begins before it reads the reset: at most a hundredth of the limit more.",
    "`on_store_error: allow` answers OK a descriptor whose store call failed or outlived its deadline, without counting it (a quota stream assigns its bucket `ALLOW_ALL` when no assignment of it is in force): those hits come on top of the bound (`deny` refuses them; `error`, the default, fails the call with `UNAVAILABLE` and Envoy's `failure_mode_deny` decides).",
    "A replica that crashes loses its leases: they only admit less, for the rest of their window (a sliding counter's: while their bucket still counts, up to a window after it; a sliding log's: until a window after the lease's life, a tenth of the window within 1 ms and 10 s), and what they reserved in the next windows (a fixed window's, a sliding counter's buckets; a hundredth of the limit at most in each of seven) stays counted there; so does what a replica that goes idle reserved.",
    "A lease lasts as long as the store's answer said, on the replica's monotonic clock: a step of the replica's wall clock changes nothing, but a forward step of the store's clock (the Redis host's) ends its window (a sliding counter's: its bucket; a sliding log's: the window its hits count in) early, and each replica may then spend the rest of a lease in the next one: at most a tenth of the limit (a bucket: of its burst) per replica, once per step; and what it reserved in the windows (a counter's buckets) after it, each in a later one than it counts in: at most a hundredth of the limit per replica in each window, for up to seven windows.",
    "During a rolling upgrade from a version whose sliding counters reserve nothing ahead, its replicas do not count the new ones' reservations in the buckets they reach: up to those reservations more (a hundredth of the limit per new replica in each bucket) until the old replicas are gone.",
    "A step back of the store's clock (the Redis host's, a failover to a replica whose clock is behind): a fixed window counts on in the window it last wrote until the clock passes that window's end, the sliding counter in the bucket it last wrote (from that bucket's start), the sliding log keeps its later entries and the token bucket its later time: they refuse for up to the step longer, never admit more (`tests/contract.rs`, `tests/algorithms.rs`, `tests/token_bucket.rs`), except what leases reserved in the windows (a counter's buckets) after the one written, which replicas spend as those windows begin on their own clocks while the store still counts in it: up to those reservations more, a hundredth of the limit per replica in each window. A calendar window finds a window it did not record and counts afresh: up to one more limit.",
    "A Redis failover loses what the old primary recorded and had not yet sent to its replica (Redis replicates asynchronously): a limiter can admit that much again, and with leases the leases and reservations in those writes, which replicas still spend: up to a tenth of the limit per replica in the window, and a hundredth per replica in each of the seven windows (a sliding counter's buckets) after it.",
    "A leased sliding log's hits are recorded at the end of their lease's life, so each counts up to that life (a tenth of the window, within 1 ms and 10 s) longer than it would unleased: it admits less, never more (a flooded log of 1,000 a second, 0.94 to 1.00 of what it admits unleased, `tests/lease.rs`).",
    "A request's own limit (an override, `limit` in the descriptor) keeps the bound of its algorithm's row (the `default_algorithm` setting) for the limit it names. It counts on one count with overrides of other limits and with a rule's limit of the same algorithm and unit on those entries: that only takes room, and what one of them gives back makes room for all.",
    "While a quota report's answer is on its way to Envoy (behind a slow store, up to the command timeout for each limit the bucket meets), Envoy spends its old assignment: when the report lowered its share, the difference over that time comes on top of the bound.",
    "A reset forgets the Envoys' shares of the limiter too: what each Envoy spends until a report of it reaches the store again comes on top of the limit (while the store fails, the stream re-sends the last assignment: up to its time to live).",
];

/// The promise for a rule combining `f`: the first row of [`TABLE`] that
/// applies (every combination has one).
pub fn promise(f: &Features) -> Promise {
    let row = TABLE
        .iter()
        .find(|r| (r.applies)(f))
        .expect("the last row applies to every RLQS combination, the others to the rest");
    Promise {
        bound: (row.bound)(f),
        given_back: true,
        reset_lease_divisor: if f.lease {
            crate::storage::lease::MAX_LEASE_DIVISOR
        } else {
            0
        },
        one_count: f.rlqs && counted(f),
    }
}

/// README's Guarantees table.
pub fn markdown() -> String {
    let mut out = String::from(
        "| combination | bound on admitted hits | under | checked by |\n|---|---|---|---|\n",
    );
    for r in TABLE {
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            r.combination, r.bound_text, r.faults_text, r.checked_by
        ));
    }
    out.push('\n');
    for a in ALLOWANCES {
        out.push_str(&format!("- {a}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(algorithm: Algorithm) -> Features {
        Features {
            algorithm,
            shadow: false,
            lease: false,
            rlqs: false,
            shards: 1,
            calendar: false,
        }
    }

    #[test]
    fn every_combination_has_one_promise() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindowLog,
            Algorithm::SlidingWindowCounter,
            Algorithm::TokenBucket,
        ] {
            for bits in 0..16u8 {
                let f = Features {
                    shadow: bits & 1 != 0,
                    lease: bits & 2 != 0,
                    rlqs: bits & 4 != 0,
                    shards: if bits & 8 != 0 { 4 } else { 1 },
                    ..features(algorithm)
                };
                let p = promise(&f);
                assert_eq!(p.bound == Bound::None, f.shadow, "{f:?}");
            }
        }
        assert!(
            promise(&Features {
                rlqs: true,
                ..features(Algorithm::TokenBucket)
            })
            .one_count
        );
        assert!(
            !promise(&Features {
                rlqs: true,
                ..features(Algorithm::SlidingWindowLog)
            })
            .one_count
        );
    }
}
