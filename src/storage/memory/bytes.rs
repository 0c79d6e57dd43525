//! What the embedded store charges each limiter and shard in bytes: the
//! estimate `memory.max_bytes` bounds (see the store's module docs for how
//! it was measured against resident memory).

use std::mem::size_of;

use super::Slot;
pub(crate) use super::heap::{LOG_MEMBER_BYTES, heap};

/// One limiter's node in the map: hashlink boxes the key's `String`, the
/// [`Slot`] and two list links together (88 bytes, a 96-byte chunk on
/// x86_64). Measured once, `VmRSS` before and after a million fixed-window
/// limiters with 24-byte keys on an unbounded store: 163.0 bytes each of
/// resident memory against 162.9 estimated (96 node, 48 key, 18.9 table).
pub(super) const NODE_BYTES: usize = heap(size_of::<(String, Slot)>() + 2 * size_of::<usize>());

/// A map node and the heap copy of an identity of `capacity` bytes.
pub(super) fn entry_bytes(capacity: usize) -> usize {
    NODE_BYTES + heap(capacity)
}

/// What a limiter's state holds on the heap besides its node.
pub(super) fn state_bytes(slot: &Slot) -> usize {
    slot.state.heap_bytes()
}

/// hashbrown's table for `capacity` entries: a pointer and a control byte
/// per bucket (capacity is 7/8 of the buckets, or one less under 8) and a
/// trailing group of 16 control bytes.
pub(super) fn table_bytes(capacity: usize) -> usize {
    let buckets = match capacity {
        0 => return 0,
        c if c < 8 => c + 1,
        c => c / 7 * 8,
    };
    heap(buckets * (size_of::<usize>() + 1) + 16)
}

/// The most members a log can hold in `room` bytes: a ring buffer of `n`
/// members is one allocation of `n * 16` bytes, 16 more with its header.
pub(super) fn log_capacity(room: usize) -> usize {
    room.saturating_sub(heap(LOG_MEMBER_BYTES) - LOG_MEMBER_BYTES) / LOG_MEMBER_BYTES
}
