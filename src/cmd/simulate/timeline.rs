//! Time lines of the simulation: Poisson arrival times, and the largest
//! count in any trailing window. Plain functions over numbers that use
//! nothing from tollgate, so `tests/buckets.rs` includes this file as it is
//! to script its own traffic and measure it the same way.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

/// Arrival times (microseconds from 0, ascending) of a Poisson process of
/// `per_second` arrivals per second over `duration` microseconds. The same
/// seed gives the same times on every machine (ChaCha8 is portable).
pub fn poisson_arrivals(seed: u64, per_second: f64, duration: u64) -> Vec<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mean_gap = 1_000_000.0 / per_second;
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        // A uniform in (0, 1]: 53 random bits, shifted off zero so ln is
        // finite.
        let u = ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        t += -u.ln() * mean_gap;
        if t >= duration as f64 {
            return out;
        }
        out.push(t as u64);
    }
}

/// The largest number of `times` (ascending) inside any interval
/// `(end - window, end]`.
pub fn max_in_trailing_window(times: &[u64], window: u64) -> u64 {
    let mut best = 0;
    let mut first = 0;
    for (i, &t) in times.iter().enumerate() {
        while times[first] + window <= t {
            first += 1;
        }
        best = best.max(i - first + 1);
    }
    best as u64
}
