//! A limit's window: `unit` and the optional `unit_multiplier` (the
//! reference service's key for a window of several units), checked
//! together; and `timezone`, which makes it a calendar window.

use super::tree::{MarkedScalarNode, Yaml};
use super::yaml::{Walker, join, key_line, line_of};
use crate::limit::{Algorithm, Unit, Window, Zone};
use crate::rules::LimitSpec;

impl Walker<'_> {
    /// `unit_multiplier` units: absent means 1; 0, a negative number or a
    /// window past [`crate::limit::MAX_WINDOW_SECS`] is an error at the
    /// multiplier's line. `None` on error, or when `unit` was missing or
    /// wrong (already reported).
    pub(super) fn window(
        &mut self,
        unit: Option<Unit>,
        multiplier: Option<(&MarkedScalarNode, &Yaml)>,
        path: &str,
    ) -> Option<Window> {
        let Some((_, node)) = multiplier else {
            return unit.map(Window::of);
        };
        let path = join(path, "unit_multiplier");
        let n = self.number(node, &path)?;
        match Window::new(unit?, n) {
            Ok(window) => Some(window),
            Err(reason) => {
                self.error(line_of(node), &path, reason);
                None
            }
        }
    }
}

impl Walker<'_> {
    /// `timezone`: the limit counts in calendar windows of that zone
    /// (one `day`, `week`, `month` or `year`), on `fixed_window` alone;
    /// a rule naming no algorithm gets `fixed_window` whatever the
    /// `default_algorithm`. Each wrong combination is an error at the
    /// `timezone` line. Returns the limit and algorithm to use; both
    /// unchanged without a `timezone`. Called once per limit.
    pub(super) fn timezone(
        &mut self,
        field: Option<(&MarkedScalarNode, &Yaml)>,
        limit: Option<LimitSpec>,
        algorithm: Option<Algorithm>,
        has_multiplier: bool,
        path: &str,
    ) -> (Option<LimitSpec>, Option<Algorithm>) {
        let Some((key, node)) = field else {
            return (limit, algorithm);
        };
        let path = join(path, "timezone");
        let at = line_of(node).or(key_line(key));
        let zone = self
            .string(node, &path)
            .and_then(|name| match Zone::named(&name) {
                Ok(zone) => Some(zone),
                Err(reason) => {
                    self.error(at, &path, reason);
                    None
                }
            });
        if has_multiplier {
            self.error(
                at,
                &path,
                "timezone counts one whole day, week, month or year: unit_multiplier \
                 must not be set with it",
            );
        }
        if let Some(other) = algorithm.filter(|a| !a.spec().calendar) {
            let calendar: Vec<&str> = Algorithm::ALL
                .into_iter()
                .filter(|a| a.spec().calendar)
                .map(Algorithm::as_str)
                .collect();
            self.error(
                at,
                &path,
                format!(
                    "timezone applies only to algorithm: {} (calendar windows), not {other}",
                    calendar.join(" or ")
                ),
            );
        }
        let limit = match (limit, zone) {
            (
                Some(LimitSpec::PerUnit {
                    requests_per_unit,
                    window,
                }),
                Some(zone),
            ) => match Window::calendar(window.unit(), zone) {
                Ok(window) => Some(LimitSpec::PerUnit {
                    requests_per_unit,
                    window,
                }),
                Err(reason) => {
                    self.error(at, &path, reason);
                    None
                }
            },
            (limit, _) => limit,
        };
        // The algorithm a calendar may time (there is one).
        (
            limit,
            Algorithm::ALL.into_iter().find(|a| a.spec().calendar),
        )
    }
}
