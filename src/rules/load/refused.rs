//! The `count_refused` key: whether a limiter is charged by requests that
//! another descriptor refuses. Checked against `usage_reports` (a limiter
//! that records every reported cost cannot also give back what it
//! recorded) and resolved with the `count_refused` setting, so the rule
//! says what it does.

use super::yaml::{Fields, Walker, join, key_line};

impl Walker<'_> {
    /// The rule's `count_refused`: its own value, else `true` when it says
    /// `usage_reports: true` (the two exclude each other), else the
    /// setting. Both said, `count_refused: false` with `usage_reports:
    /// true`, is an error on the `count_refused` key.
    pub(super) fn count_refused(
        &mut self,
        fields: &Fields<'_>,
        usage_reports: Option<bool>,
        path: &str,
    ) -> Option<bool> {
        let own = match fields.get("count_refused") {
            Some(_) => Some(self.flag(fields, path, "count_refused")?),
            None => None,
        };
        if own == Some(false) && usage_reports == Some(true) {
            let line = fields.get("count_refused").and_then(|(k, _)| key_line(k));
            self.error(
                line,
                &join(path, "count_refused"),
                "count_refused: false cannot go with usage_reports: true (a limiter that \
                 records every reported cost does not give back what another descriptor \
                 refused); drop one",
            );
            return None;
        }
        Some(
            own.or((usage_reports == Some(true)).then_some(true))
                .unwrap_or(self.options.count_refused),
        )
    }
}
