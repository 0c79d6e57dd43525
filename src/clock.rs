//! Time, injected. The engine and the embedded store never read the wall
//! clock themselves; they ask a [`Clock`], so tests can hold time still and
//! move it by hand. (Redis scripts read the Redis server's clock instead.)
//!
//! A clock tells two times: the wall clock ([`Clock::now_micros`]), which
//! windows are aligned to and which may step back or forward (an NTP step,
//! a VM resumed), and a monotonic one ([`Clock::monotonic_micros`]), which
//! only moves on: what lasts a duration on this replica (a lease's life,
//! counted from the store's answer) is timed on it, so no step of the wall
//! clock makes it last longer.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch, and a monotonic reading.
pub trait Clock: Send + Sync + 'static {
    fn now_micros(&self) -> u64;

    /// Microseconds on a clock that never goes back, from an origin of
    /// the clock's own (never 0): only differences between two readings
    /// mean anything. A clock that cannot tell one answers its wall clock.
    fn monotonic_micros(&self) -> u64 {
        self.now_micros()
    }
}

/// The real wall clock, and `Instant` for monotonic time.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

/// The monotonic origin: the first reading's `Instant`, and the wall
/// clock then, so monotonic readings start near wall time (never 0).
fn origin() -> &'static (Instant, u64) {
    static ORIGIN: OnceLock<(Instant, u64)> = OnceLock::new();
    ORIGIN.get_or_init(|| (Instant::now(), wall_micros().max(1)))
}

fn wall_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl Clock for SystemClock {
    fn now_micros(&self) -> u64 {
        wall_micros()
    }

    fn monotonic_micros(&self) -> u64 {
        let (at, base) = origin();
        base.saturating_add(at.elapsed().as_micros() as u64)
    }
}

/// A clock that only moves when told to. Cheap to clone; clones share time.
///
/// Both times move together ([`ManualClock::advance_micros`]), and the
/// monotonic one starts at the wall time it is made at; the wall clock
/// alone may also step ([`ManualClock::step_wall_micros`], or
/// [`ManualClock::set_micros`] to an earlier time), as a host's clock
/// does.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<Times>);

#[derive(Debug, Default)]
struct Times {
    monotonic: AtomicU64,
    /// The wall clock less the monotonic one.
    wall_offset: AtomicI64,
}

impl ManualClock {
    pub fn at_micros(micros: u64) -> Self {
        Self(Arc::new(Times {
            monotonic: AtomicU64::new(micros),
            wall_offset: AtomicI64::new(0),
        }))
    }

    pub fn at_secs(secs: u64) -> Self {
        Self::at_micros(secs * 1_000_000)
    }

    /// Sets the wall clock: forward, time passes (both times move); back,
    /// the wall clock steps back while monotonic time stays.
    pub fn set_micros(&self, micros: u64) {
        let wall = self.now_micros();
        if micros >= wall {
            self.advance_micros(micros - wall);
        } else {
            self.step_wall_micros(-((wall - micros) as i64));
        }
    }

    pub fn advance_micros(&self, micros: u64) {
        self.0.monotonic.fetch_add(micros, Ordering::SeqCst);
    }

    pub fn advance_secs(&self, secs: u64) {
        self.advance_micros(secs * 1_000_000);
    }

    /// Steps the wall clock by `delta` microseconds (back when negative),
    /// monotonic time staying where it is.
    pub fn step_wall_micros(&self, delta: i64) {
        self.0.wall_offset.fetch_add(delta, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        let m = self.0.monotonic.load(Ordering::SeqCst);
        m.saturating_add_signed(self.0.wall_offset.load(Ordering::SeqCst))
    }

    fn monotonic_micros(&self) -> u64 {
        self.0.monotonic.load(Ordering::SeqCst)
    }
}
