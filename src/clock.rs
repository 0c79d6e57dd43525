//! Time, injected. The engine and the embedded store never read the wall
//! clock themselves; they ask a [`Clock`], so tests can hold time still and
//! move it by hand. (Redis scripts read the Redis server's clock instead.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now_micros(&self) -> u64;
}

/// The real wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to. Cheap to clone; clones share time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn at_micros(micros: u64) -> Self {
        Self(Arc::new(AtomicU64::new(micros)))
    }

    pub fn at_secs(secs: u64) -> Self {
        Self::at_micros(secs * 1_000_000)
    }

    pub fn set_micros(&self, micros: u64) {
        self.0.store(micros, Ordering::SeqCst);
    }

    pub fn advance_micros(&self, micros: u64) {
        self.0.fetch_add(micros, Ordering::SeqCst);
    }

    pub fn advance_secs(&self, secs: u64) {
        self.advance_micros(secs * 1_000_000);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
