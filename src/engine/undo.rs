//! `count_refused: false`: a limiter charged only by requests answered OK.
//! Its hits go to the store as any other, asking for a receipt; once the
//! request's overall answer is known to be OVER_LIMIT, every receipt of
//! such a limiter is taken back ([`Store::undo`]), one call per limiter in
//! its own slot, so it works on a cluster where a request's limiters live
//! apart. Admitted requests cost nothing more: the undo is made only for
//! refused ones.
//!
//! The answer waits for the undos, so that a caller's next request sees
//! them, but never past the caller's deadline; they run in a task of their
//! own, so a caller that goes away does not cut them short. Until an undo
//! lands the charge counts (about one store round trip): the only error
//! is towards refusing. An undo that fails leaves its charge counted; it
//! is counted (`undos_lost`) and logged at most once a minute, and never
//! changes the answer.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::future::join_all;
use tokio::time::Instant;

use crate::rules::{Rule, Step};
use crate::storage::cache::LimiterId;
use crate::storage::{Cost, Decision, Hit, Receipt, Store};

use super::{AppliedLimit, Engine, EngineStats};

/// A `count_refused: false` limiter's charge, held until the request's
/// overall answer is known: its receipt, and what its rule's counters
/// need when the charge was an admission (counted only once it stays).
pub(super) struct Charge<'r> {
    pub id: LimiterId,
    pub receipt: Receipt,
    /// The rule's share, for an admitted charge (a refused one the fixed
    /// window recorded is counted over the limit at once, as any refusal).
    pub admitted: Option<Admitted<'r>>,
}

pub(super) struct Admitted<'r> {
    pub rule: &'r Rule,
    pub index: usize,
    pub steps: Vec<Step<'r>>,
    pub hits: u64,
    pub limit: AppliedLimit,
    pub decision: Decision,
}

impl Engine {
    /// The charge of `hit`, when its limiter does not count refused
    /// requests and the store recorded something.
    pub(super) fn charge<'r>(
        hit: &Hit<'_>,
        decision: &Decision,
        admitted: impl FnOnce() -> Option<Admitted<'r>>,
    ) -> Option<Charge<'r>> {
        let receipt = decision.receipt.filter(|_| hit.receipt)?;
        Some(Charge {
            id: LimiterId::of(hit),
            receipt,
            admitted: if decision.admitted { admitted() } else { None },
        })
    }

    /// Settles the charges of a request: counted on their rules when it was
    /// answered OK; taken back (and counted as such) when it was refused.
    pub(super) async fn settle(
        &self,
        charges: Vec<Charge<'_>>,
        refused: bool,
        identities: &[std::borrow::Cow<'_, [(String, String)]>],
        deadline: Option<Instant>,
    ) {
        let mut undos = Vec::new();
        for charge in charges {
            if let Some(a) = charge.admitted {
                if refused {
                    self.count_taken_back(a.rule, &identities[a.index], &a.steps, a.hits);
                } else {
                    let entries = &identities[a.index];
                    self.count(a.rule, entries, &a.steps, a.hits, &a.limit, &a.decision);
                }
            }
            if refused {
                undos.push((charge.id, charge.receipt));
            }
        }
        if undos.is_empty() {
            return;
        }
        let task = tokio::spawn(take_back(
            self.store.clone(),
            self.stats.clone(),
            undos,
            self.clock.now_micros() / 1_000_000,
        ));
        match deadline {
            Some(deadline) => {
                let _ = tokio::time::timeout_at(deadline, task).await;
            }
            None => {
                let _ = task.await;
            }
        }
    }

    fn count_taken_back(
        &self,
        rule: &Rule,
        entries: &[(String, String)],
        steps: &[Step<'_>],
        hits: u64,
    ) {
        rule.stats.counts().record_taken_back(hits);
        if let Some(value) = super::answer::metric_label(rule, entries, steps) {
            rule.stats
                .detailed(&value, self.options.detailed_metric_max_series)
                .record_taken_back(hits);
        }
    }
}

/// Takes back every receipt, each in its own store call, at once.
async fn take_back(
    store: Arc<dyn Store>,
    stats: Arc<EngineStats>,
    undos: Vec<(LimiterId, Receipt)>,
    now_secs: u64,
) {
    let calls = undos.iter().map(|(id, r)| {
        let cost = Cost {
            hits: r.hits,
            negative: false,
        };
        store.undo(id.hit(cost), *r)
    });
    for result in join_all(calls).await {
        let Err(e) = result else {
            stats.undos.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let lost = stats.undos_lost.fetch_add(1, Ordering::Relaxed) + 1;
        // One line a minute at most: an outage must not flood the log.
        let last = stats.undo_logged.load(Ordering::Relaxed);
        if (last == 0 || now_secs >= last + 60)
            && stats
                .undo_logged
                .compare_exchange(last, now_secs.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                lost,
                error = %e,
                "a refused request's charge on a count_refused: false limiter could not be taken back; it stays counted"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::clock::SystemClock;
    use crate::engine::{Code, Descriptor, EngineOptions, Request, RulesHandle};
    use crate::rules::{LoadOptions, load_texts};
    use crate::storage::{BoxFuture, MemoryStore, StoreError};

    /// The embedded store, whose undos fail.
    struct NoUndo(MemoryStore);

    impl Store for NoUndo {
        fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
            self.0.hit(hit)
        }

        fn undo<'a>(&'a self, _: Hit<'a>, _: Receipt) -> BoxFuture<'a, Result<(), StoreError>> {
            Box::pin(async { Err(StoreError::Unavailable("down".into())) })
        }
    }

    fn request(entries: &[&[(&str, &str)]]) -> Request {
        Request {
            domain: "d".into(),
            descriptors: entries
                .iter()
                .map(|e| Descriptor {
                    entries: e
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    ..Descriptor::default()
                })
                .collect(),
            ..Request::default()
        }
    }

    /// A lost undo is counted, leaves the charge counted, and never turns
    /// the answer into an error.
    #[tokio::test]
    async fn a_lost_undo_is_counted_and_changes_no_answer() {
        let text = "domain: d\ndescriptors:\n  - key: site\n    rate_limit: {unit: hour, requests_per_unit: 10, count_refused: false}\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 0}\n";
        let rules = load_texts(
            vec![(PathBuf::from("d.yaml"), text.into())],
            &LoadOptions::default(),
        )
        .unwrap();
        let store = Arc::new(NoUndo(MemoryStore::default()));
        let engine = Engine::new(
            RulesHandle::new(rules),
            store,
            Arc::new(SystemClock),
            EngineOptions::default(),
        );
        let refused = request(&[&[("site", "s")], &[("user", "u")]]);
        for _ in 0..2 {
            let r = engine.should_rate_limit(&refused).await.unwrap();
            assert_eq!(r.overall, Code::OverLimit);
        }
        assert_eq!(engine.stats().undos_lost.load(Ordering::Relaxed), 2);
        assert_eq!(engine.stats().undos.load(Ordering::Relaxed), 0);
        let r = engine
            .should_rate_limit(&request(&[&[("site", "s")]]))
            .await
            .unwrap();
        assert_eq!(r.statuses[0].remaining, 7, "both charges stayed");
    }
}
