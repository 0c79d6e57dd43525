//! What a call recorded ([`Receipt`]), and what a lease reserves in the
//! windows after its own ([`Ahead`]).

/// Hits a fixed window's lease reserves in each of the next `windows`
/// windows (a sliding counter's: buckets; at most [`Ahead::MAX_WINDOWS`]),
/// recorded in their counts at once, so a replica can spend them when
/// those windows come without a store call. The store reserves window
/// after window while each has room for `hits` (a counter's: while every
/// trailing window the bucket weighs in, counted from the start of each
/// bucket, holds at most the limit), and stops at the first that has not
/// (or when the hit itself is refused); the receipt's `ahead` says how
/// many it reserved. A counter's reservations count from now in every
/// estimate they will weigh in: hits now are refused where they would
/// take a trailing window to come over the limit. A reservation is taken
/// back with [`Store::undo`](super::Store::undo) and a receipt naming its window
/// ([`Receipt::reserved`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Ahead {
    pub windows: u8,
    pub hits: u64,
}

impl Ahead {
    /// No reservation.
    pub const NONE: Ahead = Ahead {
        windows: 0,
        hits: 0,
    };
    /// The most windows reserved ahead: the state keeps this many
    /// counts after the current window's.
    pub const MAX_WINDOWS: u8 = 7;

    pub fn is_none(self) -> bool {
        self.windows == 0 || self.hits == 0
    }
}

/// Exactly what one call recorded on one limiter, so that it can be taken
/// back ([`Store::undo`](super::Store::undo)) as if the call had never come. Only the store
/// that wrote it (through the same layers) reads it; what `at` and `mark`
/// hold depends on the algorithm and the store:
///
/// | algorithm | `at` | `mark` |
/// |---|---|---|
/// | `fixed_window` | the window's index | windows reserved after it ([`Hit::ahead`](super::Hit::ahead)) |
/// | `sliding_window_counter` | the bucket's index | µs until that bucket ends, from the store's now |
/// | `sliding_window_log` | Redis: the member's sequence number; embedded: its time | the member's time (Redis: its score) |
/// | `token_bucket` | when the tokens were taken (µs) | the bucket's debt right after (units of 1/k µs) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    /// The cost recorded (at least 1).
    pub hits: u64,
    pub at: u64,
    pub mark: u64,
    /// The shard that recorded it (0 when not sharded).
    pub shard: u16,
    /// Windows (a counter's buckets) after `at` that the call reserved
    /// [`Hit::ahead`](super::Hit::ahead) hits in, each: 0 unless it asked to.
    pub ahead: u8,
    /// A receipt of hits reserved ahead (the leasing layer makes one per
    /// window reserved): how many windows after the lease's own `at` is,
    /// so that a give-back takes nothing where a reset came after the
    /// lease, even one before `at` itself. 0 on any other.
    pub reserved: u8,
}
