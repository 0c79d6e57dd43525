//! The embedded store's lease ledgers: one [`Ledger`] per limiter, all
//! behind one mutex (a report per stream and limiter every few seconds is
//! far from contending for it; it is never held across an `.await`).

use std::collections::HashMap;
use std::sync::Mutex;

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
        let mut ledgers = self.ledgers.lock().unwrap_or_else(|e| e.into_inner());
        if !ledgers.contains_key(&key) && ledgers.len() >= self.max {
            sweep(&mut ledgers, now_micros);
            if ledgers.len() >= self.max {
                return Err(StoreError::Unavailable(format!(
                    "{} lease ledgers held (memory.max_limiters)",
                    self.max
                )));
            }
        }
        let ledger = ledgers.entry(key).or_default();
        Ok(ledger.report(call.holder, call.report, call.terms, now_micros))
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
}

fn sweep(ledgers: &mut HashMap<String, Ledger>, now_micros: u64) {
    ledgers.retain(|_, ledger| {
        ledger.expire(now_micros);
        !ledger.is_empty()
    });
}
