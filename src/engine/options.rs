//! The engine's settings and the counts of what requests met.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::limit::{Algorithm, FailurePolicy};

/// Settings the engine applies where a rule is silent.
#[derive(Debug, Clone, Copy)]
pub struct EngineOptions {
    pub default_algorithm: Algorithm,
    pub on_store_error: FailurePolicy,
    /// What a store call refused by the in-flight gate answers
    /// (`storage::gate`); rules' own `on_store_error` does not apply.
    pub on_overload: FailurePolicy,
    /// Global shadow mode: count everything, always answer OK overall.
    pub shadow_mode: bool,
    /// Largest `requests_per_unit` a `sliding_window_log` limit may have
    /// (one stored member per admitted hit); request overrides above it are
    /// refused.
    pub max_log_limit: u32,
    /// Hits past this share of a limit count as near it, in rule stats.
    pub near_limit_ratio: f64,
    /// Distinct descriptor values a `detailed_metric` rule counts apart;
    /// the rest share one overflow series.
    pub detailed_metric_max_series: usize,
    /// Longest value kept as it is in a limiter's identity; longer ones
    /// enter it as a digest (`storage::keys::identity_value`).
    pub max_value_bytes: usize,
    /// `usage_reports` of rules that do not say. `None`: rules that name
    /// no algorithm record every positive cost, as the reference's fixed
    /// window does (Envoy Gateway's rules name none, and its cost reports
    /// must close a budget); rules that name one record admitted hits.
    pub usage_reports: Option<bool>,
    /// `count_refused` of request overrides (rules carry their own,
    /// resolved with the setting at load): `false` takes back what a
    /// request answered OVER_LIMIT charged.
    pub count_refused: bool,
    /// `lease` of rules that do not say, for those that may be leased.
    pub lease: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            default_algorithm: Algorithm::SlidingWindowCounter,
            on_store_error: FailurePolicy::Error,
            on_overload: FailurePolicy::Error,
            shadow_mode: false,
            max_log_limit: 10_000,
            near_limit_ratio: 0.8,
            detailed_metric_max_series: 100,
            max_value_bytes: crate::storage::keys::DEFAULT_MAX_VALUE_BYTES,
            usage_reports: None,
            count_refused: true,
            lease: true,
        }
    }
}

/// Counts of what requests met, for logs and metrics: per-request failures
/// are counted here instead of being logged one by one.
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Store calls that failed, by the answer given: the policy said error
    /// (the request failed), allow, or deny.
    pub store_errors_failed: AtomicU64,
    pub store_errors_allowed: AtomicU64,
    pub store_errors_denied: AtomicU64,
    /// Store calls cut off, or never made, because the caller's deadline
    /// passed.
    pub deadline_exceeded: AtomicU64,
    /// Store calls refused by the in-flight gate, by the answer given
    /// (`on_overload`).
    pub overloaded_failed: AtomicU64,
    pub overloaded_allowed: AtomicU64,
    pub overloaded_denied: AtomicU64,
    /// Charges of `count_refused: false` limiters taken back after the
    /// request was answered OVER_LIMIT, and those that could not be (the
    /// store failed or was overloaded: they stay counted).
    pub undos: AtomicU64,
    pub undos_lost: AtomicU64,
    /// When a lost undo was last logged (seconds of the engine's clock):
    /// at most one line a minute.
    pub(super) undo_logged: AtomicU64,
    /// Limiters reset, by domain and rule path (empty for a caller's
    /// override): labels from the rule files only. A std mutex: resets are
    /// rare, and it is never held across an `.await`.
    resets: Mutex<BTreeMap<(String, String), u64>>,
    /// Calls refused because their cost is above the limit (they can
    /// never pass), by rule: its file, then its path (a file is one
    /// domain's, so the metric names the domain from the rules in force).
    /// Labels from the rule files only; a request override's belong to
    /// no rule. A std mutex, never held across an `.await`, taken only by
    /// such calls.
    cost_above_limit: Mutex<BTreeMap<Arc<str>, BTreeMap<String, u64>>>,
}

impl EngineStats {
    pub(super) fn record_reset(&self, domain: &str, rule: &str) {
        let mut resets = self.resets.lock().unwrap_or_else(|e| e.into_inner());
        *resets
            .entry((domain.to_string(), rule.to_string()))
            .or_default() += 1;
    }

    pub(super) fn record_cost_above_limit(&self, file: &Arc<str>, path: &str) {
        let mut counts = self
            .cost_above_limit
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let rules = counts.entry(file.clone()).or_default();
        match rules.get_mut(path) {
            Some(n) => *n += 1,
            None => {
                rules.insert(path.to_string(), 1);
            }
        }
    }

    /// Calls refused so far because their cost is above the limit of the
    /// rule at `path` in the rule file `file`.
    pub fn cost_above_limit(&self, file: &str, path: &str) -> u64 {
        let counts = self
            .cost_above_limit
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        counts
            .get(file)
            .and_then(|rules| rules.get(path))
            .copied()
            .unwrap_or(0)
    }

    /// Limiters reset so far, by domain and rule path.
    pub fn resets(&self) -> Vec<((String, String), u64)> {
        let resets = self.resets.lock().unwrap_or_else(|e| e.into_inner());
        resets.iter().map(|(k, n)| (k.clone(), *n)).collect()
    }

    /// Every store failure answered so far, whatever the policy.
    pub fn store_errors(&self) -> u64 {
        self.store_errors_failed.load(Ordering::Relaxed)
            + self.store_errors_allowed.load(Ordering::Relaxed)
            + self.store_errors_denied.load(Ordering::Relaxed)
    }
}
