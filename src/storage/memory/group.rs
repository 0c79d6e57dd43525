//! A hit on several limits of one descriptor (`rate_limits:`,
//! [`Hit::also`]) in one atomic step: the shards that hold its limiters
//! are locked together (in index order, so two groups never wait on each
//! other), every limit decides the cost as it would alone, and when one
//! refuses, what the others recorded is taken back before the locks are
//! released: nobody sees a part of the call. A usage report is recorded on
//! every limit whatever they answer, as each records it alone.

use super::*;

pub(super) fn decide(store: &MemoryStore, hit: &Hit<'_>) -> Decision {
    let now = store.clock.now_micros();
    // Each limit asks for a receipt, so that its charge can be taken back
    // when another refuses; the caller sees the receipts only when it
    // asked for them.
    let rollback = !hit.usage_reports && !hit.negative && hit.hits > 0;
    let parts: Vec<Hit<'_>> = (0..hit.parts())
        .map(|i| Hit {
            receipt: hit.receipt || rollback,
            ..hit.part(i)
        })
        .collect();
    let keys: Vec<String> = parts.iter().map(|p| store.keys.local(p)).collect();
    if keys
        .iter()
        .any(|k| store.too_long(entry_bytes(k.capacity())))
    {
        // As for one limit (see the module docs): decided as new and
        // forgotten at once.
        store.evictions.fetch_add(1, Ordering::Relaxed);
        let decisions = parts
            .iter()
            .map(|p| apply(&mut new_slot(p.algorithm), now, p, 1))
            .collect();
        return finish(hit, decisions, false);
    }
    let shard_of: Vec<usize> = keys.iter().map(|k| store.shard_of(k)).collect();
    let mut order = shard_of.clone();
    order.sort_unstable();
    order.dedup();
    let mut guards: Vec<_> = order.iter().map(|&i| lock(&store.shards[i])).collect();
    let guard = |i: usize| order.binary_search(&shard_of[i]).unwrap_or(0);
    let mut decisions = Vec::with_capacity(parts.len());
    for (i, (part, key)) in parts.iter().zip(&keys).enumerate() {
        let d = store.decide_in(&mut guards[guard(i)], key.clone(), part, now);
        decisions.push(d);
    }
    let refused = decisions.iter().any(|d| !d.admitted);
    if refused && rollback {
        for (i, d) in decisions.iter_mut().enumerate() {
            if let Some(r) = d.receipt.take() {
                take_back_in(&mut guards[guard(i)], &keys[i], &parts[i], &r, now);
            }
        }
    }
    drop(guards);
    finish(hit, decisions, refused)
}

/// The list's answer; receipts only where the caller asked for them.
fn finish(hit: &Hit<'_>, mut parts: Vec<Decision>, refused: bool) -> Decision {
    if !hit.receipt || refused {
        for d in &mut parts {
            d.receipt = None;
        }
    }
    Decision::of_parts(parts)
}
