//! The vocabulary shared by rules, engine and stores: units, algorithms and
//! failure policies. No I/O here.

use std::fmt;
use std::str::FromStr;

pub mod algorithms;
mod calendar;

pub use calendar::{Zone, tzdb_version};

/// A rate-limit time unit. Week, month and year are fixed lengths (7, 30 and
/// 365 days), as the reference service counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    pub fn micros(self) -> u64 {
        self.seconds() * 1_000_000
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Unit {
    type Err = String;

    /// Case-insensitive, as the reference accepts `SECOND` and `second`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        Unit::ALL
            .into_iter()
            .find(|u| u.as_str() == lower)
            .ok_or_else(|| {
                format!(
                    "unknown unit {s:?} (expected second, minute, hour, day, week, month or year)"
                )
            })
    }
}

/// The longest window tollgate counts exactly, in seconds (about 285
/// years): its microseconds stay within [`MAX_EXACT`], where the Redis
/// scripts' doubles are exact.
pub const MAX_WINDOW_SECS: u64 = MAX_EXACT / 1_000_000;

/// A limit's window: `multiplier` whole units (`unit_multiplier` in a rule,
/// 1 when it names none), as the reference service's `unit_multiplier`
/// reads (10 per 5 minutes is `unit: minute, unit_multiplier: 5`). Fixed
/// windows are aligned on multiples of its length since the epoch, unless
/// the window is a calendar one ([`Window::calendar`]): one day, week,
/// month or year of a time zone, aligned on its local boundaries. A
/// staggered window ([`Window::staggered`]) starts its buckets at an
/// offset of the limiter's descriptor instead of on the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    unit: Unit,
    multiplier: u32,
    zone: Option<Zone>,
    staggered: bool,
}

/// Where a fixed window stands at one instant: its index (for an
/// epoch-aligned window, the number of windows since the epoch; for a
/// calendar one, its first second since the epoch) and its end, in
/// microseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub index: u64,
    pub end: u64,
}

impl Window {
    /// One `unit`.
    pub const fn of(unit: Unit) -> Window {
        Window {
            unit,
            multiplier: 1,
            zone: None,
            staggered: false,
        }
    }

    /// One calendar `unit` (a day or longer) of `zone`.
    pub fn calendar(unit: Unit, zone: Zone) -> Result<Window, String> {
        if unit.seconds() < Unit::Day.seconds() {
            return Err(format!(
                "timezone applies to calendar units (day, week, month or year), not {unit}"
            ));
        }
        Ok(Window {
            unit,
            multiplier: 1,
            zone: Some(zone),
            staggered: false,
        })
    }

    /// The time zone of a calendar window.
    pub fn zone(self) -> Option<Zone> {
        self.zone
    }

    /// The window holding `now` (microseconds since the epoch): exact
    /// local boundaries for a calendar window.
    pub fn span(self, now: u64) -> Span {
        if let Some(zone) = self.zone
            && let Some((start, end)) = zone.span(self.unit, now)
        {
            return Span {
                index: start / 1_000_000,
                end,
            };
        }
        // Epoch-aligned (and, for a calendar window, the fallback far
        // outside any clock's years, where the calendar overflows).
        let w = self.micros().max(1);
        let index = now / w;
        Span {
            index,
            end: (index + 1) * w,
        }
    }

    /// `multiplier` units: at least 1, and no longer than
    /// [`MAX_WINDOW_SECS`].
    pub fn new(unit: Unit, multiplier: u32) -> Result<Window, String> {
        if multiplier == 0 {
            return Err(
                "invalid unit multiplier of 0: unit_multiplier must be at least 1 \
                 (the window is unit x unit_multiplier)"
                    .to_string(),
            );
        }
        let secs = unit.seconds() * u64::from(multiplier);
        if secs > MAX_WINDOW_SECS {
            return Err(format!(
                "a window of {multiplier} {unit}s ({secs} seconds) is longer than tollgate \
                 counts exactly ({MAX_WINDOW_SECS} seconds, about 285 years); use at most \
                 unit_multiplier: {}",
                MAX_WINDOW_SECS / unit.seconds()
            ));
        }
        Ok(Window {
            unit,
            multiplier,
            zone: None,
            staggered: false,
        })
    }

    /// The same length, its buckets starting at an offset of each
    /// limiter's descriptor rather than on the epoch, so that the
    /// limiters of one rule do not all turn their buckets at once (a
    /// `sliding_window_counter`'s: see
    /// [`crate::limit::algorithms::sliding_counter::phase`]). The engine
    /// places every window of an algorithm whose spec says
    /// [`Spec::staggered`](crate::limit::algorithms::Spec::staggered).
    pub fn staggered(self) -> Window {
        Window {
            staggered: true,
            ..self
        }
    }

    /// The same window with its buckets where an unstaggered one has
    /// them: how RLQS names a limit's lease ledger, which its hits share.
    pub fn unstaggered(self) -> Window {
        Window {
            staggered: false,
            ..self
        }
    }

    /// Whether its buckets start at an offset of the descriptor.
    pub fn is_staggered(self) -> bool {
        self.staggered
    }

    pub fn unit(self) -> Unit {
        self.unit
    }

    pub fn multiplier(self) -> u32 {
        self.multiplier
    }

    /// The length in seconds; for a calendar window, its unit's nominal
    /// length (a month 30 days): a size, never a boundary ([`Window::span`]).
    pub fn seconds(self) -> u64 {
        self.unit.seconds() * u64::from(self.multiplier)
    }

    pub fn micros(self) -> u64 {
        self.seconds() * 1_000_000
    }
}

impl From<Unit> for Window {
    fn from(unit: Unit) -> Self {
        Window::of(unit)
    }
}

/// `minute` for one unit, `5 minutes` for several, `month in
/// Europe/Berlin` for a calendar window.
impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(zone) = self.zone {
            write!(f, "{} in {zone}", self.unit)
        } else if self.multiplier == 1 {
            write!(f, "{}", self.unit)
        } else {
            write!(f, "{} {}s", self.multiplier, self.unit)
        }
    }
}

/// How a limiter counts. Chosen per rule; the default comes from settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Epoch-aligned windows; every hit counts. Admits up to 2x the limit
    /// across a boundary.
    FixedWindow,
    /// N epoch-aligned buckets (2 by default), the oldest weighted by how much
    /// of it still overlaps the trailing window. Constant memory, approximate;
    /// more buckets, closer to the exact count.
    SlidingWindowCounter,
    /// Every admitted hit with its timestamp. Exact; memory per hit.
    SlidingWindowLog,
    /// A bucket of `burst` tokens refilled at `requests_per_unit` per
    /// `unit` (the generic cell rate algorithm: one stored arrival time).
    /// Exact, constant memory; the burst is its own number.
    TokenBucket,
    /// At most `requests_per_unit` requests in flight: a take holds a
    /// slot until its release (a negative hit) or `max_duration`.
    Concurrency,
}

impl Algorithm {
    pub const ALL: [Algorithm; 5] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
        Algorithm::TokenBucket,
        Algorithm::Concurrency,
    ];

    pub fn as_str(self) -> &'static str {
        self.spec().name
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.as_str()).collect();
                let (last, rest) = names.split_last().expect("algorithms");
                format!(
                    "unknown algorithm {s:?} (expected {} or {last})",
                    rest.join(", ")
                )
            })
    }
}

/// Buckets of a `sliding_window_counter` when the rule names none: the
/// previous window and the current one.
pub const DEFAULT_BUCKETS: u8 = 2;

/// The most buckets a counter may have: its state is one hash field per
/// bucket, and past 60 the estimate gains little (see the README table).
pub const MAX_BUCKETS: u8 = 60;

/// What a descriptor's answer is when its store cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailurePolicy {
    /// The whole call fails with gRPC UNAVAILABLE, so Envoy's
    /// `failure_mode_deny` decides.
    #[default]
    Error,
    /// The descriptor is OK (fail open).
    Allow,
    /// The descriptor is OVER_LIMIT (fail closed).
    Deny,
}

impl FailurePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Error => "error",
            FailurePolicy::Allow => "allow",
            FailurePolicy::Deny => "deny",
        }
    }
}

impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailurePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "error" => Ok(FailurePolicy::Error),
            "allow" => Ok(FailurePolicy::Allow),
            "deny" => Ok(FailurePolicy::Deny),
            _ => Err(format!(
                "unknown store error policy {s:?} (expected error, allow or deny)"
            )),
        }
    }
}

/// The most shards (`rate_limit.shards`) a limit may be split over: enough
/// to spread one limiter over every primary of a large cluster.
pub const MAX_SHARDS: u16 = 64;

/// Where the token bucket's arithmetic stays exact: the Redis scripts count
/// in Lua numbers, doubles, exact below 2^53.
pub const MAX_EXACT: u64 = 1 << 53;

/// The token bucket's scale for `limit` per window of `w` microseconds:
/// `(step, k)` with `step = w / g` and `k = limit / g`, `g` their greatest
/// common divisor. Time is counted in units of `1 / k` microsecond, in
/// which one token refills in exactly `step` units: no rounding anywhere.
pub fn bucket_scale(limit: u64, w: u64) -> (u64, u64) {
    let (mut a, mut b) = (limit.max(1), w.max(1));
    while b != 0 {
        (a, b) = (b, a % b);
    }
    (w.max(1) / a, limit.max(1) / a)
}

/// The period of a token bucket's leases (`lease: true`), in microseconds:
/// its window, within 1 to 10 seconds. A lease lives until the end of the
/// period after the one it was taken in (`lua/token_bucket.lua`).
pub fn lease_period(w: u64) -> u64 {
    w.clamp(1_000_000, 10_000_000)
}

/// The largest `burst` a token bucket of `limit` per `window` keeps exact:
/// `burst x step` must stay within [`MAX_EXACT`].
pub fn max_burst(limit: u64, window: Window) -> u64 {
    let (step, _) = bucket_scale(limit, window.micros());
    MAX_EXACT / step
}

/// The burst a token bucket uses: the one asked for (0: the limit), within
/// 1..=[`max_burst`]. Rules are refused at load past the bound; a limit a
/// request overrides is held to it here.
pub fn effective_burst(burst: u64, limit: u64, window: Window) -> u64 {
    let asked = if burst == 0 { limit } else { burst };
    asked.clamp(1, max_burst(limit, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_whole_units() {
        let w = Window::new(Unit::Minute, 5).unwrap();
        assert_eq!((w.seconds(), w.micros()), (300, 300_000_000));
        assert_eq!(w.to_string(), "5 minutes");
        assert_eq!(Window::of(Unit::Hour).to_string(), "hour");
        assert_eq!(Window::of(Unit::Day), Window::new(Unit::Day, 1).unwrap());
        assert!(
            Window::new(Unit::Second, 0)
                .unwrap_err()
                .contains("at least 1")
        );
        // Every multiplier of a second fits; a year's bound is 285.
        assert!(Window::new(Unit::Second, u32::MAX).is_ok());
        assert!(Window::new(Unit::Year, 285).is_ok());
        let err = Window::new(Unit::Year, 286).unwrap_err();
        assert!(err.contains("at most unit_multiplier: 285"), "{err}");
        for unit in Unit::ALL {
            let most = u32::try_from(MAX_WINDOW_SECS / unit.seconds()).unwrap_or(u32::MAX);
            assert!(Window::new(unit, most).unwrap().micros() <= MAX_EXACT);
        }
    }
}
