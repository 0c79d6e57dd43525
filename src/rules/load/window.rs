//! A limit's window: `unit` and the optional `unit_multiplier` (the
//! reference service's key for a window of several units), checked
//! together.

use super::tree::{MarkedScalarNode, Yaml};
use super::yaml::{Walker, join, line_of};
use crate::limit::{Unit, Window};

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
