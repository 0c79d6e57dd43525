//! The token bucket's `burst` key, checked against the rule's algorithm
//! (named or inherited from `default_algorithm`) and against what the
//! bucket keeps exact.

use super::tree::{MarkedScalarNode, Yaml};
use super::yaml::{Walker, join, key_line, line_of};
use crate::limit::algorithms::Param;
use crate::limit::{Algorithm, MAX_EXACT, max_burst};
use crate::rules::LimitSpec;

impl Walker<'_> {
    /// `burst`: on a token bucket only (named by the rule or inherited from
    /// `default_algorithm`), a whole number from 1 to what the bucket keeps
    /// exact ([`max_burst`]). A token bucket without one takes its
    /// `requests_per_unit`, which must be within the same bound.
    pub(super) fn burst(
        &mut self,
        field: Option<(&MarkedScalarNode, &Yaml)>,
        algorithm: Option<Algorithm>,
        limit: Option<&LimitSpec>,
        rpu_line: Option<usize>,
        path: &str,
    ) -> Option<u64> {
        let effective = algorithm.unwrap_or(self.options.default_algorithm);
        let burst_path = join(path, "burst");
        let Some((key, node)) = field else {
            if let (
                Param::Burst,
                Some(LimitSpec::PerUnit {
                    requests_per_unit,
                    window,
                }),
            ) = (effective.spec().param, limit)
            {
                let max = max_burst(u64::from(*requests_per_unit), *window);
                if u64::from(*requests_per_unit) > max {
                    self.error(
                        rpu_line,
                        &join(path, "requests_per_unit"),
                        format!(
                            "token_bucket {requests_per_unit} per {window} needs a burst (default: \
                             requests_per_unit) of at most {max} to stay exact; set burst, or \
                             use a shorter window"
                        ),
                    );
                }
            }
            return None;
        };
        if let Some(reason) = self.not_its_own("burst", algorithm) {
            self.error(key_line(key), &burst_path, reason);
            return None;
        }
        let n = u64::from(self.number(node, &burst_path)?);
        let max = match limit {
            Some(LimitSpec::PerUnit {
                requests_per_unit,
                window,
            }) if *requests_per_unit > 0 => max_burst(u64::from(*requests_per_unit), *window),
            _ => MAX_EXACT,
        }
        .min(u64::from(u32::MAX));
        if n == 0 || n > max {
            self.error(
                line_of(node),
                &burst_path,
                format!("burst must be from 1 to {max} for this rate, found {n}"),
            );
            return None;
        }
        Some(n)
    }
}
