//! The clocks of a case: on the embedded store one virtual clock (Tokio's
//! paused time), on Redis the real one; and time passing, with the
//! Envoys' filters ticking as it does.

use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::{Clock, SystemClock};

use super::envoy::Envoy;
use super::record::Observe;
use super::world::World;

/// The virtual clock: Tokio's paused time, counted from the case's
/// start. The one clock of a case on the embedded store: the store, the
/// replicas and every sleep read it, so a slow store's wait (a give-back
/// landing late, a call its deadline cuts) passes for the store as for
/// the caller, and Tokio's own moves of paused time (when every task
/// waits on a timer) move it too.
pub struct VirtualClock {
    origin: tokio::time::Instant,
    start: u64,
}

impl VirtualClock {
    pub fn at_micros(start: u64) -> Self {
        Self {
            origin: tokio::time::Instant::now(),
            start,
        }
    }

    pub async fn advance_micros(&self, micros: u64) {
        tokio::time::advance(Duration::from_micros(micros)).await;
    }
}

impl Clock for VirtualClock {
    fn now_micros(&self) -> u64 {
        self.start + self.origin.elapsed().as_micros() as u64
    }
}

pub struct Clocks {
    pub virtual_clock: Option<Arc<VirtualClock>>,
}

impl Clocks {
    pub fn now(&self) -> u64 {
        match &self.virtual_clock {
            Some(c) => c.now_micros(),
            None => SystemClock.now_micros(),
        }
    }
}

/// Time passes: the virtual clock, and Tokio's with it (so the leasing
/// layer's housekeeping runs when it would), stopping wherever an Envoy
/// has requests or a report due; on the real clock a short sleep, then
/// the Envoys catch up.
pub async fn advance(
    clocks: &Clocks,
    micros: u64,
    envoys: &mut [Envoy],
    world: &World,
    obs: &mut Observe<'_>,
    seq: usize,
) {
    match &clocks.virtual_clock {
        Some(c) => {
            let target = c.now_micros() + micros;
            loop {
                let now = c.now_micros();
                let next = envoys
                    .iter()
                    .map(Envoy::next_event)
                    .min()
                    .unwrap_or(u64::MAX)
                    // Paused time may have moved past the target on its
                    // own (every task waiting on a slow store's timer).
                    .clamp(now, target.max(now));
                c.advance_micros(next - now).await;
                for e in envoys.iter_mut() {
                    if e.next_event() <= next {
                        let server = &world.replicas[e.replica].quota;
                        e.tick(next, seq, server, obs).await;
                    }
                }
                if next >= target {
                    break;
                }
            }
        }
        None => {
            tokio::time::sleep(Duration::from_micros(micros.min(30_000))).await;
            for e in envoys.iter_mut() {
                let now = clocks.now();
                if e.next_event() <= now {
                    let server = &world.replicas[e.replica].quota;
                    e.tick(now, seq, server, obs).await;
                }
            }
        }
    }
}
