//! What the leasing layer does with the calls it does not lease, on a
//! limiter it may hold a lease of: a give-back goes first into the lease,
//! and the answer to a check, a give-back or a descriptor carrying its
//! own cost counts the lease's unused hits, as a leased answer does.

use super::Leasing;
use crate::storage::{Decision, Hit, StoreError};

impl Leasing {
    /// Hits given back (a negative cost) on a limiter this replica leases:
    /// first into its lease in force, up to what was spent of it (the
    /// lease's record in the store still counts them, so spending them
    /// again admits nothing the store has not counted), the rest to the
    /// store. So a give-back restores the budget as it would without
    /// leases, also on a log, whose store gives back only hits admitted
    /// there (never a lease's, stamped ahead).
    pub(super) async fn give_back_hits(&self, hit: Hit<'_>) -> Result<Decision, StoreError> {
        let now = self.clock.monotonic_micros();
        let taken = self
            .existing(&hit, |h| {
                let size = h.receipt.map_or(0, |r| r.hits);
                if now >= h.until || h.tokens >= size {
                    return (0, None);
                }
                let back = hit.hits.min(size - h.tokens);
                h.tokens += back;
                let d = Decision::new(
                    true,
                    h.store_left.saturating_add(h.tokens),
                    h.local_reset(now),
                );
                (back, Some(d))
            })
            .unwrap_or((0, None));
        match taken {
            (back, Some(d)) if back == hit.hits => Ok(d),
            (back, _) => {
                let d = self
                    .inner
                    .hit(Hit {
                        hits: hit.hits - back,
                        ..hit
                    })
                    .await?;
                Ok(self.with_unused(&hit, d))
            }
        }
    }

    /// A store's answer on a limiter this replica leases, its remaining
    /// counting the unused hits of the lease in force (as a hit admitted
    /// from the lease answers).
    pub(super) fn with_unused(&self, hit: &Hit<'_>, d: Decision) -> Decision {
        let now = self.clock.monotonic_micros();
        let unused = self
            .existing(hit, |h| if now < h.until { h.tokens } else { 0 })
            .unwrap_or(0);
        Decision {
            remaining: d.remaining.saturating_add(unused),
            ..d
        }
    }
}
