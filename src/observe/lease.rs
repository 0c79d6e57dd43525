//! The leasing layer's instruments (`lease: true` limiters), read at
//! collection time from its counters; no labels.

use std::sync::Arc;

use opentelemetry::metrics::Meter;

use crate::storage::Store;
use crate::storage::lease::LeaseCounts;

pub(super) fn register(meter: &Meter, store: Arc<dyn Store>) {
    type Pick = fn(&LeaseCounts) -> u64;
    let all: [(&str, &str, Pick); 9] = [
        ("tollgate.lease.taken", "Leases the store granted", |c| {
            c.taken
        }),
        (
            "tollgate.lease.taken_hits",
            "Hits the granted leases held",
            |c| c.taken_hits,
        ),
        (
            "tollgate.lease.reserved_hits",
            "Hits the granted leases reserved in the windows after their own (of the hits they held)",
            |c| c.reserved_hits,
        ),
        (
            "tollgate.lease.returned_hits",
            "Unused hits of leases given back to the store",
            |c| c.returned_hits,
        ),
        (
            "tollgate.lease.expired_hits",
            "Unused hits of leases whose window ended (counted in it)",
            |c| c.expired_hits,
        ),
        (
            "tollgate.lease.local_decisions",
            "Hits admitted from a lease, without a store call",
            |c| c.local,
        ),
        (
            "tollgate.lease.store_calls",
            "Store calls for leased limiters: leases, give-backs and hits decided in the store near the limit",
            |c| c.store_calls,
        ),
        (
            "tollgate.lease.walked_limiters",
            "Leased limiters the housekeeping walk looked at (only where one may have a lease to give back or forget)",
            |c| c.walked,
        ),
        (
            "tollgate.lease.past_cap_hits",
            "Leased hits on limiters past lease.max_limiters, decided in the store as without leases",
            |c| c.past_cap,
        ),
    ];
    for (name, description, pick) in all {
        let store = store.clone();
        meter
            .u64_observable_counter(name)
            .with_description(description)
            .with_callback(move |o| {
                if let Some(c) = store.gauges().lease {
                    o.observe(pick(&c), &[]);
                }
            })
            .build();
    }
    let held = store.clone();
    meter
        .u64_observable_gauge("tollgate.lease.limiters")
        .with_description("Leased limiters held (at most lease.max_limiters)")
        .with_callback(move |o| {
            if let Some(c) = held.gauges().lease {
                o.observe(c.limiters, &[]);
            }
        })
        .build();
    meter
        .u64_observable_gauge("tollgate.lease.bytes")
        .with_description("Bytes the leased limiters take: their maps' slots, walk queues and keys (about lease.max_limiters x 400 at most)")
        .with_callback(move |o| {
            if let Some(c) = store.gauges().lease {
                o.observe(c.bytes, &[]);
            }
        })
        .build();
}
