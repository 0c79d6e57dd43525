//! A receipt taken back: the algorithm's script in its undo mode.

use super::*;

impl RedisStore {
    /// Takes back what `r` recorded: the algorithm's script in its undo
    /// mode, on the limiter's own slot.
    pub(super) async fn take_back(&self, hit: &Hit<'_>, r: &Receipt) -> Result<(), StoreError> {
        let undo = Hit {
            hits: r.hits,
            negative: false,
            usage_reports: false,
            receipt: false,
            ..*hit
        };
        let (slot, mut call) = self.prepare(&undo, &[]);
        // ARGV[4] = 2: undo (4: a token bucket's lease ends); the two
        // after the fixed arguments (and a calendar window's boundaries):
        // where it was recorded.
        call.args[3] = if hit.lease && hit.algorithm.spec().leasing == Leasing::Tokens {
            4
        } else {
            2
        };
        call.args
            .extend([r.at.min(MAX_EXACT) as i64, r.mark.min(MAX_EXACT) as i64]);
        if matches!(
            hit.algorithm.spec().leasing,
            Leasing::Window | Leasing::Bucket
        ) {
            // A reservation's: how many windows after its lease's it is.
            call.args.push(i64::from(r.reserved));
        }
        let timeout = self.inner.command_timeout;
        let reply = match tokio::time::timeout(timeout, self.call(slot, call)).await {
            Err(_) => return Err(StoreError::Timeout(timeout.as_millis() as u64)),
            Ok(reply) => reply?,
        };
        match reply[..] {
            [1] => Ok(()),
            _ => Err(StoreError::Protocol(format!(
                "unexpected undo reply {reply:?}"
            ))),
        }
    }
}
