//! `sliding_window_counter`: counts in `buckets` buckets per window,
//! weighted by how much of each the trailing window still covers. Small
//! constant memory; an estimate within its bound (see the Guarantees).

use super::*;

pub const SPEC: Spec = Spec {
    name: "sliding_window_counter",
    key_code: 'c',
    keys_buckets: true,
    roles: &[Role::State],
    lua: include_str!("../../../lua/sliding_window_counter.lua"),
    batch_id: 2,
    param: Param::Buckets,
    leasing: Leasing::Never("a sliding window is decided in the store on every hit"),
    refusals: Refusals::SameCost,
    rlqs: Rlqs::Ledger,
    reset: Reset::Delete,
    bound: Bound::Buckets,
    calendar: false,
    own_keys: &["buckets"],
};
