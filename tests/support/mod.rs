//! Shared by the integration tests: real Redis processes and small helpers.
//! Each test binary uses part of it.
#![allow(dead_code)]

pub mod process;
pub mod redis;
pub mod tollgate;

use std::sync::atomic::{AtomicU64, Ordering};

/// A domain no other test case uses, so cases never share counters (also
/// across runs against a long-lived Redis).
pub fn unique_domain(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{name}-{}-{nanos:x}-{n}", std::process::id())
}
