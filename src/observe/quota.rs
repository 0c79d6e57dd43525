//! The quota service's (RLQS) instruments, read at collection time from
//! its counters. Labels are fixed words (kinds, reasons), never bucket
//! values; usage per rule is on the rule's own counters
//! (`tollgate.rule.*`), with RLS's bounds.

use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use crate::rlqs::{QuotaStats, Skip};

pub(super) fn register(meter: &Meter, stats: Arc<QuotaStats>) {
    let s = stats.clone();
    meter
        .u64_observable_gauge("tollgate.rlqs.streams")
        .with_description("Quota (RLQS) streams open on this replica")
        .with_callback(move |o| o.observe(s.snapshot().streams_open, &[]))
        .build();
    let s = stats.clone();
    meter
        .u64_observable_counter("tollgate.rlqs.streams_refused")
        .with_description("Quota (RLQS) streams refused past rlqs.max_streams")
        .with_callback(move |o| o.observe(s.snapshot().streams_refused, &[]))
        .build();
    let s = stats.clone();
    meter
        .u64_observable_gauge("tollgate.rlqs.buckets")
        .with_description("Buckets answered on this replica's open quota streams")
        .with_callback(move |o| o.observe(s.snapshot().buckets, &[]))
        .build();
    let s = stats.clone();
    meter
        .u64_observable_counter("tollgate.rlqs.assignments")
        .with_description(
            "Quota actions sent: token_bucket (a share of a limit), allow_all, deny_all, abandon",
        )
        .with_callback(move |o| {
            let now = s.snapshot();
            for (kind, n) in [
                ("token_bucket", now.token_buckets),
                ("allow_all", now.allow_all),
                ("deny_all", now.deny_all),
                ("abandon", now.abandoned),
            ] {
                o.observe(n, &[KeyValue::new("kind", kind)]);
            }
        })
        .build();
    let s = stats.clone();
    meter
        .u64_observable_counter("tollgate.rlqs.reported")
        .with_description("Requests Envoy reported on quota streams, by its decision")
        .with_callback(move |o| {
            let now = s.snapshot();
            o.observe(now.reported_allowed, &[KeyValue::new("result", "allowed")]);
            o.observe(now.reported_denied, &[KeyValue::new("result", "denied")]);
        })
        .build();
    let s = stats.clone();
    meter
        .u64_observable_counter("tollgate.rlqs.skipped")
        .with_description("Buckets of usage reports skipped, by reason")
        .with_callback(move |o| {
            let now = s.snapshot();
            for (why, n) in Skip::ALL.iter().zip(now.skipped) {
                o.observe(n, &[KeyValue::new("reason", why.as_str())]);
            }
        })
        .build();
    meter
        .u64_observable_counter("tollgate.rlqs.store_failures")
        .with_description(
            "Lease calls the store failed (answered with the last share while it holds, else on_store_error)",
        )
        .with_callback(move |o| o.observe(stats.snapshot().store_errors, &[]))
        .build();
}
