//! The limits of a `rate_limits:` list ([`Hit::also`]) in one script
//! call: the batch script's group function ([`scripts::GROUP`]) runs each
//! limit's algorithm on the cost, exactly as its own script would, and
//! takes back what they recorded when one refuses, in the same atomic
//! step (a usage report is recorded on every limit, as each records it
//! alone). Every limit's keys share the descriptor's hash tag, so the
//! call has one slot and goes wherever a single limit's call would,
//! batched with others or alone (then as a batch of one, its keys
//! declared, so a cluster redirects it).

use super::*;

impl RedisStore {
    /// The group call of `hit` and the further costs `more`.
    pub(super) fn prepare_group(&self, hit: &Hit<'_>, more: &[Cost]) -> (u16, Call) {
        let reports = hit.usage_reports;
        let n = hit.parts();
        let mut slot = 0;
        let mut keys = Vec::new();
        let mut head = vec![n as i64, 1 + more.len() as i64];
        let mut tail = Vec::new();
        for i in 0..n {
            let (s, call) = self.prepare(&hit.part(i), &[]);
            if i == 0 {
                slot = s;
            }
            let mut args = call.args;
            // ARGV[6]: record every report on every limit, or answer with
            // receipts, so a refusal can be taken back.
            args[5] = if reports { 1 } else { 2 };
            head.extend([
                call.algorithm.map_or(0, scripts::batch_id),
                call.keys.len() as i64,
                args.len() as i64,
            ]);
            keys.extend(call.keys);
            tail.extend(args);
        }
        head.extend(tail);
        for cost in more {
            head.push(cost.hits.min(MAX_EXACT) as i64);
            head.push(i64::from(cost.negative));
        }
        let call = Call {
            algorithm: None,
            keys,
            args: head,
        };
        (slot, call)
    }

    /// Decides `hit`, then the same list with each cost of `more`: one
    /// decision per cost, each holding every limit's own answer.
    pub(super) async fn run_group(
        &self,
        hit: &Hit<'_>,
        more: &[Cost],
    ) -> Result<Vec<Decision>, StoreError> {
        let (slot, call) = self.prepare_group(hit, more);
        let timeout = self.inner.command_timeout;
        let reply = match tokio::time::timeout(timeout, self.call(slot, call)).await {
            Err(_) => return Err(StoreError::Timeout(timeout.as_millis() as u64)),
            Ok(reply) => reply?,
        };
        let unexpected = || StoreError::Protocol(format!("unexpected script reply {reply:?}"));
        let width = if hit.usage_reports { 3 } else { 6 };
        let n = hit.parts();
        if reply.len() != width * n * (1 + more.len()) {
            return Err(unexpected());
        }
        let mut out = Vec::with_capacity(1 + more.len());
        for chunk in reply.chunks_exact(width * n) {
            let mut parts = Vec::with_capacity(n);
            for d in chunk.chunks_exact(width) {
                let [admitted, remaining, reset] = d[..3] else {
                    return Err(unexpected());
                };
                if !(0..=1).contains(&admitted) || remaining < 0 || reset < 0 {
                    return Err(unexpected());
                }
                let receipt = match d[3..] {
                    [hits, at, mark] if hits > 0 && at >= 0 && mark >= 0 => Some(Receipt {
                        hits: hits as u64,
                        at: at as u64,
                        mark: mark as u64,
                        shard: hit.shard.index,
                        ahead: 0,
                        reserved: 0,
                    }),
                    _ => None,
                };
                parts.push(Decision {
                    receipt,
                    ..Decision::new(admitted == 1, remaining as u64, reset as u64)
                });
            }
            let refused = parts.iter().any(|d| !d.admitted);
            if !hit.receipt || refused {
                // Taken back already, or not asked for.
                for d in &mut parts {
                    d.receipt = None;
                }
            }
            out.push(Decision::of_parts(parts));
        }
        Ok(out)
    }
}
