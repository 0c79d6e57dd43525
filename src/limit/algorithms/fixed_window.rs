//! `fixed_window`: one count per aligned window (or calendar window),
//! reset at the window's end. Exact within a window; at most twice the
//! limit across a boundary.

use super::*;

pub const SPEC: Spec = Spec {
    name: "fixed_window",
    key_code: 'f',
    keys_buckets: false,
    roles: &[Role::State],
    lua: include_str!("../../../lua/fixed_window.lua"),
    batch_id: 1,
    param: Param::Buckets,
    leasing: Leasing::Window,
    refusals: Refusals::AllCosts,
    rlqs: Rlqs::Window,
    reset: Reset::MarkWindow,
    bound: Bound::Window,
    calendar: true,
    own_keys: &[],
};
