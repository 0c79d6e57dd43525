//! `sliding_window_log`: every admitted hit with its time. Exact in every
//! trailing window; memory per hit, so its limit is capped
//! (`max_log_limit`).

use super::*;

pub const SPEC: Spec = Spec {
    name: "sliding_window_log",
    key_code: 'l',
    keys_buckets: false,
    roles: &[Role::LogSet, Role::LogMeta],
    lua: include_str!("../../../lua/sliding_window_log.lua"),
    batch_id: 3,
    param: Param::Buckets,
    leasing: Leasing::Never("a sliding window is decided in the store on every hit"),
    refusals: Refusals::Single,
    rlqs: Rlqs::Ledger,
    reset: Reset::Delete,
    bound: Bound::Trailing,
    calendar: false,
    own_keys: &[],
};
