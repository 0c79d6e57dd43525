//! `count_refused: false`: a limiter charged only by requests answered OK.
//! Its hits go to the store as any other, asking for a receipt; once the
//! request's overall answer is known to be OVER_LIMIT, every receipt of
//! such a limiter is taken back ([`Store::undo`]), one call per limiter in
//! its own slot, so it works on a cluster where a request's limiters live
//! apart. Admitted requests cost nothing more: the undo is made only for
//! refused ones. A request already refused when such a limiter would be
//! asked (the other calls are polled once first: a ban, a refusal the
//! over-limit cache or the embedded store gives at once) only checks it:
//! nothing is charged, so nothing is taken back.
//!
//! The answer waits for the undos, so that a caller's next request sees
//! them, but never past the caller's deadline; they run in a task of their
//! own, so a caller that goes away does not cut them short. Until an undo
//! lands the charge counts (about one store round trip): the only error
//! is towards refusing. An undo that fails leaves its charge counted; it
//! is counted (`undos_lost`) and logged at most once a minute, and never
//! changes the answer.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures_util::FutureExt;
use futures_util::future::join_all;

use crate::rules::{Rule, Step};
use crate::storage::cache::LimiterId;
use crate::storage::{Cost, Decision, Receipt, Store};

use super::answer::Outcome;
use super::plan::{Limited, Plan};
use super::{AppliedLimit, Descriptor, Engine, EngineStats, Request, Status};

/// A `count_refused: false` limiter's charge, held until the request's
/// overall answer is known: its receipt, and its decision, which its rule
/// counts only once it stays (a refusal the fixed window recorded is
/// counted over the limit at once, as any refusal). Nothing is copied
/// here: the limiter is named again from the request only to be taken
/// back, so admitted requests pay nothing for it.
pub(super) struct Charge<'r> {
    /// The descriptor's position in the request.
    pub index: usize,
    /// A single limit's receipt (a list's are in its decision's parts).
    pub receipt: Option<Receipt>,
    pub decision: Decision,
    pub rule: Option<&'r Rule>,
    pub steps: Vec<Step<'r>>,
    /// A `rate_limits:` list: each limit with its rule, in the order of
    /// the decision's parts; empty for a single limit, whose limit is its
    /// status's.
    pub parts: Vec<(Option<&'r Rule>, AppliedLimit)>,
}

impl<'r> Charge<'r> {
    /// The charge of descriptor `index`, when the store recorded something
    /// for it.
    pub fn of(index: usize, limited: &Limited<'r>, d: &Decision) -> Option<Charge<'r>> {
        let parts = match &d.group {
            None => {
                d.receipt?;
                Vec::new()
            }
            Some(g) => {
                g.parts.iter().find_map(|p| p.receipt)?;
                (0..g.parts.len())
                    .map(|i| {
                        let (rule, limit) = limited.part(i);
                        (rule, limit.clone())
                    })
                    .collect()
            }
        };
        Some(Charge {
            index,
            receipt: d.receipt,
            decision: d.clone(),
            rule: limited.rule,
            steps: limited.steps.clone(),
            parts,
        })
    }

    /// Whether its rules' counts wait for the overall answer.
    pub fn defers_count(&self) -> bool {
        self.decision.admitted
            && (self.rule.is_some() || self.parts.iter().any(|(r, _)| r.is_some()))
    }
}

impl Engine {
    /// The outcomes of a request with `count_refused: false` limiters.
    /// The other descriptors' calls are polled once first: an answer the
    /// store's layers give at once (a ban, a refusal of the over-limit
    /// cache) can already refuse the request, and then those limiters are
    /// only checked (a cost of 0: the status says where they stand, and
    /// there is nothing to take back), marked in `checked`. Otherwise
    /// they are charged with the others, concurrently.
    pub(super) async fn outcomes<F, Fut>(
        &self,
        plans: &[Plan<'_>],
        req: &Request,
        checked: &mut [bool],
        call: F,
    ) -> Vec<Outcome>
    where
        F: Fn(usize, bool) -> Fut,
        Fut: Future<Output = Outcome>,
    {
        let n = plans.len();
        let mut first: Vec<Option<Pin<Box<Fut>>>> = (0..n)
            .map(|i| (!plans[i].takes_receipts()).then(|| Box::pin(call(i, false))))
            .collect();
        let mut ready: Vec<Option<Outcome>> = (0..n).map(|_| None).collect();
        let mut refused = false;
        for i in 0..n {
            let Some(f) = first[i].as_mut() else {
                continue;
            };
            if let Some(outcome) = f.now_or_never() {
                refused |= refuses(&plans[i], &req.descriptors[i], &outcome);
                ready[i] = Some(outcome);
                first[i] = None;
            }
        }
        let pending = (0..n).filter(|&i| ready[i].is_none()).map(|i| {
            first[i].take().unwrap_or_else(|| {
                // A give-back is made whatever the answer; and a count in
                // flight is charged and given back (its release is then
                // owed), never only checked: the refused request's release
                // will come, and must free nothing another holds.
                checked[i] = refused && !req.descriptors[i].negative && !releases(&plans[i]);
                Box::pin(call(i, checked[i]))
            })
        });
        let mut rest = join_all(pending).await.into_iter();
        ready
            .into_iter()
            .map(|r| r.or_else(|| rest.next()).flatten())
            .collect()
    }

    /// Settles the charges of a request: counted on their rules when it was
    /// answered OK; taken back (and counted as such) when it was `refused`.
    pub(super) async fn settle(
        &self,
        charges: Vec<Charge<'_>>,
        refused: bool,
        req: &Request,
        identities: &[Cow<'_, [(String, String)]>],
        statuses: &[Status],
    ) {
        let request_hits = if req.hits == 0 { 1 } else { req.hits };
        let mut undos = Vec::new();
        for c in charges {
            let (entries, d) = (&identities[c.index], &req.descriptors[c.index]);
            let hits = d.hits.unwrap_or(request_hits);
            if let Some(group) = &c.decision.group {
                // A `rate_limits:` list: each limit's own answer and
                // receipt.
                for ((rule, limit), own) in c.parts.iter().zip(&group.parts) {
                    if let Some(rule) = rule.filter(|_| c.decision.admitted) {
                        if refused {
                            self.count_taken_back(rule, entries, &c.steps, hits);
                        } else {
                            self.count(rule, entries, &c.steps, hits, limit, own);
                        }
                    }
                    if refused && let Some(r) = own.receipt {
                        let hit = super::hit_of(&req.domain, entries, d, limit, request_hits);
                        undos.push((LimiterId::of(&hit), r));
                    }
                }
                continue;
            }
            let Some(limit) = &statuses[c.index].limit else {
                continue;
            };
            let Some(receipt) = c.receipt else {
                continue;
            };
            if let Some(rule) = c.rule.filter(|_| c.decision.admitted) {
                if refused {
                    self.count_taken_back(rule, entries, &c.steps, hits);
                } else {
                    self.count(rule, entries, &c.steps, hits, limit, &c.decision);
                }
            }
            if refused {
                let hit = super::hit_of(&req.domain, entries, d, limit, request_hits);
                undos.push((LimiterId::of(&hit), receipt));
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
        match req.deadline {
            Some(deadline) => {
                let _ = tokio::time::timeout_at(deadline, task).await;
            }
            None => {
                let _ = task.await;
            }
        }
    }

    pub(super) fn count_taken_back(
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

/// Whether a plan counts requests in flight (on any limit of its list).
fn releases(plan: &Plan<'_>) -> bool {
    let Plan::Limited(l) = plan else {
        return false;
    };
    l.limit.algorithm.releases() || l.also.iter().any(|(_, a)| a.algorithm.releases())
}

/// Whether a descriptor's outcome refuses the request whatever the others
/// answer: a refusal (or a ban) of a rule in neither shadow nor quota mode.
fn refuses(plan: &Plan<'_>, d: &Descriptor, outcome: &Outcome) -> bool {
    let Plan::Limited(l) = plan else {
        return false;
    };
    if l.rule.is_some_and(|r| r.shadow_mode || r.quota_mode) {
        return false;
    }
    match outcome {
        None => true,
        Some(Ok(decision)) => !decision.admitted && !d.negative,
        Some(Err(_)) => false,
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
    use crate::storage::{BoxFuture, Hit, MemoryStore, StoreError};

    /// The embedded store, answering after a yield (as a store over the
    /// network would, so no answer is known before every call is made),
    /// whose undos fail.
    struct NoUndo(MemoryStore);

    impl Store for NoUndo {
        fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
            Box::pin(async move {
                tokio::task::yield_now().await;
                self.0.hit(hit).await
            })
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
        let text = "domain: d\ndescriptors:\n  - key: site\n    rate_limit: {unit: hour, requests_per_unit: 10, count_refused: false}\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
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
        // The user's one hit, then requests the user's limit refuses.
        let user = request(&[&[("user", "u")]]);
        let r = engine.should_rate_limit(&user).await.unwrap();
        assert_eq!(r.overall, Code::Ok);
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
