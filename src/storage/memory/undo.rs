//! Taking back what a receipt says one call recorded, on one limiter's
//! state, with the semantics of the scripts' undo mode in `lua/` (each
//! algorithm's own, in [`crate::limit::algorithms`]): at most what the
//! receipt names, from where it was recorded, and only while that still
//! counts; what can no longer be told apart stays counted (see
//! [`crate::storage::Store::undo`]).

use super::*;

/// Takes back what `r` recorded on the limiter of `key` in `shard`
/// (locked by the caller).
pub(super) fn take_back_in(shard: &mut Shard, key: &str, hit: &Hit<'_>, r: &Receipt, now: u64) {
    let reset_at = shard
        .resets
        .get(key)
        .filter(|&&(_, until)| now < until)
        .map(|&(at, _)| at);
    let Some(slot) = shard.slots.get_mut(key) else {
        return;
    };
    let before = state_bytes(slot);
    slot.state.ops().undo(now, hit, r, reset_at);
    shard.held = shard.held.saturating_sub(before) + state_bytes(slot);
}
