//! The keys of a limit on requests in flight (an algorithm whose
//! [`Param`] is `max_duration`): `max_duration` itself, and the keys that
//! have no meaning there.

use super::yaml::{Fields, Walker, join, key_line, line_of};
use crate::limit::algorithms::Param;
use crate::limit::{Algorithm, MAX_WINDOW_SECS, Unit};
use crate::rules::LimitSpec;

/// `max_duration`'s forms, as errors name them.
const FORMS: &str = "a whole number with its unit: ms, s, m or h (such as 500ms or 30s)";

/// A duration written `500ms`, `30s`, `2m` or `1h`, in microseconds; at
/// least 1 ms and at most [`MAX_WINDOW_SECS`].
pub(crate) fn parse_duration(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let micros_per = match unit {
        "ms" => 1_000,
        "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        _ => return Err(format!("max_duration must be {FORMS}, found {text:?}")),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("max_duration must be {FORMS}, found {text:?}"))?;
    match n.checked_mul(micros_per) {
        Some(0) => Err(format!(
            "max_duration must be more than 0, found {text:?}: a slot whose release never \
             comes must free itself"
        )),
        Some(m) if m <= MAX_WINDOW_SECS * 1_000_000 => Ok(m),
        _ => Err(format!(
            "max_duration {text} is longer than tollgate counts exactly ({MAX_WINDOW_SECS} s)"
        )),
    }
}

impl Walker<'_> {
    /// `max_duration`, on the algorithms it belongs to, where it is
    /// required; and on those, the keys a limit in flight refuses. `None`
    /// when the rule has none (or it was refused).
    pub(super) fn max_duration(
        &mut self,
        fields: &Fields<'_>,
        algorithm: Option<Algorithm>,
        limit: Option<&LimitSpec>,
        owner_line: Option<usize>,
        path: &str,
    ) -> Option<u64> {
        let effective = algorithm.unwrap_or(self.options.default_algorithm);
        let own = effective.spec().param == Param::MaxDuration;
        let at = join(path, "max_duration");
        let value = match fields.get("max_duration") {
            Some((key, _)) if !own => {
                let reason = self.not_its_own("max_duration", algorithm)?;
                self.error(key_line(key), &at, reason);
                None
            }
            Some((_, node)) => {
                let text = self.string(node, &at)?;
                match parse_duration(&text) {
                    Ok(m) => Some(m),
                    Err(reason) => {
                        self.error(line_of(node), &at, reason);
                        None
                    }
                }
            }
            None if own => {
                self.error(
                    owner_line,
                    &at,
                    format!(
                        "{effective} needs max_duration, the longest a request holds its slot \
                         ({FORMS}): a slot whose release never comes frees itself then"
                    ),
                );
                None
            }
            None => None,
        };
        if own {
            self.in_flight_only(fields, effective, limit, path);
        }
        value
    }

    /// The keys that mean nothing on a limit of requests in flight.
    fn in_flight_only(
        &mut self,
        fields: &Fields<'_>,
        effective: Algorithm,
        limit: Option<&LimitSpec>,
        path: &str,
    ) {
        if let (Some(LimitSpec::PerUnit { window, .. }), Some((_, node))) =
            (limit, fields.get("unit"))
            && window.unit() != Unit::Second
        {
            self.error(
                line_of(node),
                &join(path, "unit"),
                format!(
                    "{effective} counts requests in flight, not per unit: unit must be second \
                     (max_duration times a slot), found {}",
                    window.unit()
                ),
            );
        }
        let refused: [(&str, &str); 3] = [
            (
                "unit_multiplier",
                "it counts requests in flight, not per window",
            ),
            (
                "shards",
                "a release must find the count its take is in, and shards split it",
            ),
            (
                "usage_reports",
                "a take is decided before the request, and freed by its release",
            ),
        ];
        for (key, why) in refused {
            if let Some((k, _)) = fields.get(key) {
                self.error(
                    key_line(k),
                    &join(path, key),
                    format!("{key} has no place on {effective}: {why}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_has_its_unit() {
        assert_eq!(parse_duration("500ms"), Ok(500_000));
        assert_eq!(parse_duration("30s"), Ok(30_000_000));
        assert_eq!(parse_duration("2m"), Ok(120_000_000));
        assert_eq!(parse_duration("1h"), Ok(3_600_000_000));
        for bad in ["30", "s", "1.5s", "-1s", "10 d", ""] {
            assert!(
                parse_duration(bad).unwrap_err().contains("ms, s, m or h"),
                "{bad}"
            );
        }
        assert!(parse_duration("0s").unwrap_err().contains("more than 0"));
        assert!(
            parse_duration("99999999999h")
                .unwrap_err()
                .contains("longer")
        );
    }
}
