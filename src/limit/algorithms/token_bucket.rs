//! `token_bucket`: `burst` tokens refilled at `requests_per_unit` per
//! `unit` (the generic cell rate algorithm: one stored arrival time).
//! Exact, constant memory; the burst is its own number.

use super::*;

pub const SPEC: Spec = Spec {
    name: "token_bucket",
    key_code: 't',
    keys_buckets: false,
    roles: &[Role::State],
    lua: include_str!("../../../lua/token_bucket.lua"),
    batch_id: 4,
    param: Param::Burst,
    leasing: Leasing::Tokens,
    refusals: Refusals::SameCost,
    rlqs: Rlqs::Bucket,
    reset: Reset::NewBucket,
    bound: Bound::Bucket,
    calendar: false,
    own_keys: &["burst"],
};
