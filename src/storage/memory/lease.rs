//! The embedded store's lease ledgers: one [`Ledger`] per limiter, all
//! behind one mutex (a report per stream and limiter every few seconds is
//! far from contending for it; it is never held across an `.await`).

use std::collections::HashMap;
use std::sync::Mutex;

use super::{MemoryStore, lock};
use crate::limit::Algorithm;
use crate::limit::algorithms::fixed_window::{self, counted_at};
use crate::quota::{self, Counted, window};
use crate::quota::{Grant, Ledger};
use crate::storage::keys::KeyBuilder;
use crate::storage::{LeaseCall, StoreError};

/// The ledgers, bounded in number.
#[derive(Debug)]
pub(super) struct Leases {
    ledgers: Mutex<HashMap<String, Ledger>>,
    max: usize,
}

impl Leases {
    pub(super) fn new(max: usize) -> Self {
        Self {
            ledgers: Mutex::default(),
            max: max.max(1),
        }
    }

    pub(super) fn lease(
        &self,
        keys: &KeyBuilder,
        call: &LeaseCall<'_>,
        now_micros: u64,
    ) -> Result<Grant, StoreError> {
        let key = keys.local(&call.limiter());
        self.with(&key, now_micros, |ledger| {
            ledger.report(call.holder, call.report, call.terms, now_micros)
        })
    }

    /// Drops the ledger of `limiter` ([`crate::storage::Hit::ledger`]):
    /// every share and demand in it.
    pub(super) fn forget(&self, keys: &KeyBuilder, limiter: &crate::storage::Hit<'_>) {
        let key = keys.local(limiter);
        self.ledgers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
    }

    /// Drops shares no longer in force, and ledgers left empty.
    pub(super) fn sweep(&self, now_micros: u64) {
        sweep(
            &mut self.ledgers.lock().unwrap_or_else(|e| e.into_inner()),
            now_micros,
        );
    }

    /// Runs `f` on the ledger of `key` (made if new, within the bound on
    /// ledgers), under the ledgers' lock.
    fn with<T>(
        &self,
        key: &str,
        now_micros: u64,
        f: impl FnOnce(&mut Ledger) -> T,
    ) -> Result<T, StoreError> {
        let mut ledgers = self.ledgers.lock().unwrap_or_else(|e| e.into_inner());
        if !ledgers.contains_key(key) && ledgers.len() >= self.max {
            sweep(&mut ledgers, now_micros);
            if ledgers.len() >= self.max {
                return Err(StoreError::Unavailable(format!(
                    "{} lease ledgers held (memory.max_limiters)",
                    self.max
                )));
            }
        }
        Ok(f(ledgers.entry(key.to_owned()).or_default()))
    }
}

fn sweep(ledgers: &mut HashMap<String, Ledger>, now_micros: u64) {
    ledgers.retain(|_, ledger| {
        ledger.expire(now_micros);
        !ledger.is_empty()
    });
}

impl MemoryStore {
    /// A report on a limit that requests decided one at a time count here
    /// too ([`crate::quota::Counted`]): the ledger under the ledgers' lock,
    /// then, within it, the limiter's state under its shard's lock (the
    /// only place that holds both, in that order), so the grant and what
    /// it does to the limiter are one step against decisions.
    pub(super) fn lease_counted(
        &self,
        call: &LeaseCall<'_>,
        counted: Counted,
        now: u64,
    ) -> Result<Grant, StoreError> {
        let ledger_key = self.keys.local(&call.limiter());
        self.leases.with(&ledger_key, now, |ledger| match counted {
            Counted::Window(fixed) => self.reserve(ledger, ledger_key.clone(), call, fixed, now),
            Counted::Bucket(b) => {
                let c = quota::bucket::report(ledger, call.holder, call.report, call.terms, now);
                for (hits, negative) in [(c.give_back, true), (c.charge, false)] {
                    if hits > 0 {
                        self.decide(&call.bucket(b, hits, negative));
                    }
                }
                c.grant
            }
        })
    }

    /// A fixed window's part: the grant within what the windows leave,
    /// and its reservations in the limiter's state ([`window::report`]).
    fn reserve(
        &self,
        ledger: &mut Ledger,
        key: String,
        call: &LeaseCall<'_>,
        fixed: window::Fixed,
        now: u64,
    ) -> Grant {
        let w = fixed.window_micros.max(1);
        let mut shard = lock(&self.shards[self.shard_of(&key)]);
        self.with_slot(&mut shard, key, Algorithm::FixedWindow, now, |slot| {
            let Some(fixed_window::Memory {
                window,
                count,
                ahead,
                held,
            }) = slot.state.as_fixed_mut()
            else {
                // The key names a fixed window: never another state.
                return ledger.report(call.holder, call.report, call.terms, now);
            };
            let mut h = held.take().unwrap_or_default();
            let at = |i: u64| counted_at(*window, *count, ahead, i);
            let grant = window::report(
                ledger,
                &mut h,
                at,
                call.holder,
                call.report,
                call.terms,
                fixed,
                now,
            );
            if let Some(last) = h.last() {
                slot.expires_at = slot.expires_at.max((last + 1).saturating_mul(w));
                *held = Some(h);
            }
            grant
        })
    }
}
