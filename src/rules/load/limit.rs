//! The limit of a `rate_limit` block: `unlimited: true`, or
//! `requests_per_unit` per `unit` (times `unit_multiplier`).

use super::yaml::{Fields, Walker, join, key_line};
use crate::limit::Unit;
use crate::rules::LimitSpec;

impl Walker<'_> {
    /// The block's limit: unlimited, with none of the per-unit keys set,
    /// or per unit. `owner_line` is where a missing key is reported.
    /// `None` when it is refused.
    pub(super) fn limit_spec(
        &mut self,
        fields: &Fields<'_>,
        owner_line: Option<usize>,
        path: &str,
    ) -> Option<LimitSpec> {
        let unlimited = self.flag(fields, path, "unlimited").unwrap_or(false);
        if unlimited {
            self.unlimited_alone(fields, path);
            return Some(LimitSpec::Unlimited);
        }
        self.per_unit(fields, owner_line, path)
    }

    /// Refuses each per-unit key set together with `unlimited: true`.
    fn unlimited_alone(&mut self, fields: &Fields<'_>, path: &str) {
        for name in ["unit", "requests_per_unit", "unit_multiplier", "timezone"] {
            if let Some((k, _)) = fields.get(name) {
                self.error(
                    key_line(k),
                    &join(path, name),
                    format!("{name} must not be set together with unlimited: true"),
                );
            }
        }
    }

    /// `requests_per_unit` per `unit` (times `unit_multiplier`), both
    /// required.
    fn per_unit(
        &mut self,
        fields: &Fields<'_>,
        owner_line: Option<usize>,
        path: &str,
    ) -> Option<LimitSpec> {
        let unit = match fields.get("unit") {
            None => {
                self.error(
                    owner_line,
                    &join(path, "unit"),
                    "missing unit (required unless unlimited: true)",
                );
                None
            }
            Some((_, v)) => self.parsed::<Unit>(v, &join(path, "unit")),
        };
        let window = self.window(unit, fields.get("unit_multiplier"), path);
        let requests_per_unit = match fields.get("requests_per_unit") {
            None => {
                self.error(
                    owner_line,
                    &join(path, "requests_per_unit"),
                    "missing requests_per_unit (required unless unlimited: true)",
                );
                None
            }
            Some((_, v)) => self.number(v, &join(path, "requests_per_unit")),
        };
        match (window, requests_per_unit) {
            (Some(window), Some(requests_per_unit)) => Some(LimitSpec::PerUnit {
                requests_per_unit,
                window,
            }),
            _ => None,
        }
    }
}
