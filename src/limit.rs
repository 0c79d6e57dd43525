//! The vocabulary shared by rules, engine and stores: units, algorithms and
//! failure policies. No I/O here.

use std::fmt;
use std::str::FromStr;

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
}

impl Algorithm {
    pub const ALL: [Algorithm; 3] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::SlidingWindowLog,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::SlidingWindowLog => "sliding_window_log",
        }
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
                format!(
                    "unknown algorithm {s:?} (expected fixed_window, sliding_window_counter or sliding_window_log)"
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
