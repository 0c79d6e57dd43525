//! Every metric tollgate exports, declared once for the metrics reference
//! (`docs/src/reference/metrics.md`, written by `scripts/docs`): its
//! OpenTelemetry name, instrument, unit, labels and meaning. The meaning
//! is the instrument's description, word for word. A test here holds the
//! table to the names and descriptions written at the registration sites
//! of this module; `tests/reference.rs` holds it to a live `/metrics`.

/// An instrument's kind, as Prometheus types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instrument {
    Counter,
    Gauge,
    Histogram,
}

impl Instrument {
    /// The Prometheus `# TYPE`.
    pub fn as_str(self) -> &'static str {
        match self {
            Instrument::Counter => "counter",
            Instrument::Gauge => "gauge",
            Instrument::Histogram => "histogram",
        }
    }
}

/// One metric.
#[derive(Debug, Clone)]
pub struct Metric {
    /// The OpenTelemetry name (OTLP), `tollgate.rule.hits`; for the
    /// process metrics, the Prometheus name.
    pub name: String,
    pub instrument: Instrument,
    /// `s` for seconds.
    pub unit: Option<&'static str>,
    pub labels: &'static [&'static str],
    pub meaning: String,
    /// Only on `/metrics`, from the Prometheus client (not OTLP).
    pub process: bool,
}

impl Metric {
    /// Its name on `/metrics`, as the Prometheus exporter writes it: dots
    /// as underscores, the unit as a suffix, `_total` on counters.
    pub fn prometheus_name(&self) -> String {
        if self.process {
            return self.name.clone();
        }
        let mut name = self.name.replace('.', "_");
        if self.unit == Some("s") {
            name.push_str("_seconds");
        }
        if self.instrument == Instrument::Counter {
            name.push_str("_total");
        }
        name
    }
}

/// One declaration: (name, instrument, unit, labels, meaning).
type Row = (
    &'static str,
    Instrument,
    Option<&'static str>,
    &'static [&'static str],
    &'static str,
);

use Instrument::{Counter, Gauge, Histogram};

const RULE: &[&str] = &["domain", "rule"];
const DETAILED: &[&str] = &["domain", "rule", "descriptor"];

/// The per-rule counters, `tollgate.rule.X`; each has a twin,
/// `tollgate.rule.detailed.X`, per descriptor value.
pub const PER_RULE: &[(&str, &str)] = &[
    ("hits", "Hits counted against the rule"),
    ("within_limit", "Hits admitted by the rule"),
    (
        "near_limit",
        "Hits past the near-limit share of the rule's limit, up to the limit",
    ),
    ("over_limit", "Hits over the rule's limit"),
    (
        "shadow_over_limit",
        "Hits over the limit of a shadow-mode rule (answered OK)",
    ),
    (
        "usage_recorded_over_limit",
        "Hits refused but recorded: usage reported past the limit of a usage_reports rule (also in over_limit)",
    ),
    (
        "taken_back",
        "Hits a count_refused: false rule admitted, then took back: another descriptor refused the request (in hits, not in within_limit)",
    ),
];

/// What a detailed twin's description adds to its rule counter's.
pub fn detailed_meaning(help: &str) -> String {
    format!(
        "{help}, per descriptor value of detailed_metric and value_to_metric rules ({} past the cap)",
        crate::rules::OVERFLOW
    )
}

/// Every other instrument, in the order the reference lists them.
const ROWS: &[Row] = &[
    (
        "tollgate.request.duration",
        Histogram,
        Some("s"),
        &["code", "grpc_status"],
        "ShouldRateLimit calls by overall code and gRPC status",
    ),
    (
        "tollgate.request.descriptors",
        Histogram,
        None,
        &[],
        "Descriptors per ShouldRateLimit call",
    ),
    (
        "tollgate.requests.refused",
        Counter,
        None,
        &["reason"],
        "Calls failed on their input (invalid) or past max_in_flight with on_overload=error (overloaded)",
    ),
    (
        "tollgate.cost_above_limit",
        Counter,
        None,
        RULE,
        "Calls refused because their cost is above the rule's limit (a token bucket's burst; each limit of a rate_limits list): they can never pass, and their answer carries no duration_until_reset",
    ),
    ("tollgate.rules.loaded", Gauge, None, &[], "Rules in force"),
    (
        "tollgate.rules.reloads",
        Counter,
        None,
        &["result"],
        "Changed rule directories loaded (success) or refused (failure)",
    ),
    (
        "tollgate.resets",
        Counter,
        None,
        RULE,
        "Limiters reset through the debug listener (POST /reset), by rule (empty for a caller's override)",
    ),
    (
        "tollgate.undos",
        Counter,
        None,
        &[],
        "Charges of count_refused: false limiters taken back because another descriptor refused the request",
    ),
    (
        "tollgate.undos_lost",
        Counter,
        None,
        &[],
        "Charges of count_refused: false limiters that could not be taken back (the store failed or was overloaded): they stay counted",
    ),
    (
        "tollgate.store.duration",
        Histogram,
        Some("s"),
        &["backend", "node", "outcome"],
        "Store calls by backend, node and outcome",
    ),
    (
        "tollgate.store.errors",
        Counter,
        None,
        &["backend", "node", "kind"],
        "Failed store calls by backend, node and kind (timeout, unavailable, protocol, circuit_open)",
    ),
    (
        "tollgate.store.failures_answered",
        Counter,
        None,
        &["policy"],
        "Store failures by the answer given: the policy failed the call, allowed or denied",
    ),
    (
        "tollgate.overload.answered",
        Counter,
        None,
        &["policy"],
        "Store calls past max_in_flight by the answer on_overload gave: failed, allowed or denied",
    ),
    (
        "tollgate.deadline_exceeded",
        Counter,
        None,
        &[],
        "Store calls cut off, or not made, because the caller's deadline passed",
    ),
    (
        "tollgate.store.circuit_open",
        Gauge,
        None,
        &["backend", "node"],
        "1 while calls to this node are refused by its open circuit",
    ),
    (
        "tollgate.store.script_loads",
        Counter,
        None,
        &["backend"],
        "Times the Lua scripts were loaded into Redis (connects and reconnects)",
    ),
    (
        "tollgate.store.redirects",
        Counter,
        None,
        &["backend"],
        "Redis Cluster: calls sent again because their slot had moved or was moving (MOVED, ASK, TRYAGAIN, CLUSTERDOWN)",
    ),
    (
        "tollgate.store.batches",
        Counter,
        None,
        &["kind"],
        "Redis: batches of several script calls sent as one EVALSHA (kind=batches) and the calls they carried (kind=calls)",
    ),
    (
        "tollgate.store.limiters",
        Gauge,
        None,
        &[],
        "Limiters held by the embedded store",
    ),
    (
        "tollgate.store.bytes",
        Gauge,
        None,
        &[],
        "Bytes the embedded store's limiters take, by its estimate (bounded by memory.max_bytes)",
    ),
    (
        "tollgate.store.evictions",
        Counter,
        None,
        &[],
        "Limiters the embedded store forgot to stay within memory.max_limiters and memory.max_bytes",
    ),
    (
        "tollgate.coalesce.batches",
        Counter,
        None,
        &[],
        "Store calls that carried hits queued behind a call in flight",
    ),
    (
        "tollgate.coalesce.hits",
        Counter,
        None,
        &[],
        "Hits decided in those calls",
    ),
    (
        "tollgate.over_limit_cache.hits",
        Counter,
        None,
        &[],
        "Calls answered OVER_LIMIT by the local over-limit cache, without the store",
    ),
    (
        "tollgate.over_limit_cache.misses",
        Counter,
        None,
        &[],
        "Calls the over-limit cache passed to the store",
    ),
    (
        "tollgate.over_limit_cache.evictions",
        Counter,
        None,
        &[],
        "Limiters the over-limit cache forgot to stay within over_limit_cache.max_entries",
    ),
    (
        "tollgate.over_limit_cache.entries",
        Gauge,
        None,
        &[],
        "Limiters held by the over-limit cache",
    ),
    (
        "tollgate.lease.taken",
        Counter,
        None,
        &[],
        "Leases the store granted",
    ),
    (
        "tollgate.lease.taken_hits",
        Counter,
        None,
        &[],
        "Hits the granted leases held",
    ),
    (
        "tollgate.lease.reserved_hits",
        Counter,
        None,
        &[],
        "Hits the granted leases reserved in the windows after their own (of the hits they held)",
    ),
    (
        "tollgate.lease.returned_hits",
        Counter,
        None,
        &[],
        "Unused hits of leases given back to the store",
    ),
    (
        "tollgate.lease.expired_hits",
        Counter,
        None,
        &[],
        "Unused hits of leases whose window ended (counted in it)",
    ),
    (
        "tollgate.lease.local_decisions",
        Counter,
        None,
        &[],
        "Hits admitted from a lease, without a store call",
    ),
    (
        "tollgate.lease.store_calls",
        Counter,
        None,
        &[],
        "Store calls for leased limiters: leases, give-backs and hits decided in the store near the limit",
    ),
    (
        "tollgate.lease.walked_limiters",
        Counter,
        None,
        &[],
        "Leased limiters the housekeeping walk looked at (only where one may have a lease to give back or forget)",
    ),
    (
        "tollgate.lease.past_cap_hits",
        Counter,
        None,
        &[],
        "Leased hits on limiters past lease.max_limiters, decided in the store as without leases",
    ),
    (
        "tollgate.lease.limiters",
        Gauge,
        None,
        &[],
        "Leased limiters held (at most lease.max_limiters)",
    ),
    (
        "tollgate.lease.bytes",
        Gauge,
        None,
        &[],
        "Bytes the leased limiters take: their maps' slots, walk queues and keys (about lease.max_limiters x 400 at most)",
    ),
    (
        "tollgate.rlqs.streams",
        Gauge,
        None,
        &[],
        "Quota (RLQS) streams open on this replica",
    ),
    (
        "tollgate.rlqs.streams_refused",
        Counter,
        None,
        &[],
        "Quota (RLQS) streams refused past rlqs.max_streams",
    ),
    (
        "tollgate.rlqs.buckets",
        Gauge,
        None,
        &[],
        "Buckets answered on this replica's open quota streams",
    ),
    (
        "tollgate.rlqs.assignments",
        Counter,
        None,
        &["kind"],
        "Quota actions sent: token_bucket (a share of a limit), allow_all, deny_all, abandon",
    ),
    (
        "tollgate.rlqs.reported",
        Counter,
        None,
        &["result"],
        "Requests Envoy reported on quota streams, by its decision",
    ),
    (
        "tollgate.rlqs.skipped",
        Counter,
        None,
        &["reason"],
        "Buckets of usage reports skipped, by reason",
    ),
    (
        "tollgate.rlqs.store_failures",
        Counter,
        None,
        &[],
        "Lease calls the store failed (answered with the last share while it holds, else on_store_error)",
    ),
    (
        "tollgate.http.connections_closed",
        Counter,
        None,
        &["reason"],
        "HTTP connections the server closed: past max_connections (refused) or idle past idle_timeout (idle)",
    ),
];

/// The process metrics the Prometheus client reads from `/proc` (Linux),
/// by their Prometheus names; not pushed over OTLP.
const PROCESS: &[Row] = &[
    (
        "process_cpu_seconds_total",
        Counter,
        None,
        &[],
        "Total user and system CPU time spent in seconds.",
    ),
    (
        "process_open_fds",
        Gauge,
        None,
        &[],
        "Number of open file descriptors.",
    ),
    (
        "process_max_fds",
        Gauge,
        None,
        &[],
        "Maximum number of open file descriptors.",
    ),
    (
        "process_virtual_memory_bytes",
        Gauge,
        None,
        &[],
        "Virtual memory size in bytes.",
    ),
    (
        "process_virtual_memory_max_bytes",
        Gauge,
        None,
        &[],
        "Maximum amount of virtual memory available in bytes.",
    ),
    (
        "process_resident_memory_bytes",
        Gauge,
        None,
        &[],
        "Resident memory size in bytes.",
    ),
    (
        "process_start_time_seconds",
        Gauge,
        None,
        &[],
        "Start time of the process since unix epoch in seconds.",
    ),
    (
        "process_threads",
        Gauge,
        None,
        &[],
        "Number of OS threads in the process.",
    ),
];

/// Every metric: the per-rule counters and their detailed twins first,
/// then the others, then the process's.
pub fn metrics() -> Vec<Metric> {
    let row = |(name, instrument, unit, labels, meaning): &Row, process| Metric {
        name: name.to_string(),
        instrument: *instrument,
        unit: *unit,
        labels,
        meaning: meaning.to_string(),
        process,
    };
    let mut out = Vec::new();
    for (suffix, help) in PER_RULE {
        out.push(Metric {
            name: format!("tollgate.rule.{suffix}"),
            instrument: Counter,
            unit: None,
            labels: RULE,
            meaning: help.to_string(),
            process: false,
        });
    }
    for (suffix, help) in PER_RULE {
        out.push(Metric {
            name: format!("tollgate.rule.detailed.{suffix}"),
            instrument: Counter,
            unit: None,
            labels: DETAILED,
            meaning: detailed_meaning(help),
            process: false,
        });
    }
    out.extend(ROWS.iter().map(|r| row(r, false)));
    out.extend(PROCESS.iter().map(|r| row(r, true)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every source file of this module but this one, which holds the
    /// table: instruments are built here alone (see the module's doc).
    fn sources() -> String {
        fn walk(dir: &std::path::Path, out: &mut String) {
            let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
            entries.sort_by_key(|e| e.path());
            for e in entries {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("catalog.rs") {
                    out.push_str(&std::fs::read_to_string(&p).unwrap());
                }
            }
        }
        let mut out = String::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/observe"),
            &mut out,
        );
        out
    }

    /// Every `"tollgate.…"` name the code builds an instrument of is a
    /// row, and every row's name and description are written where it is
    /// built: a new metric without a row, or a description changed on one
    /// side, fails here.
    #[test]
    fn the_table_is_what_the_code_registers() {
        let all = metrics();
        let source = sources();
        let mut named = Vec::new();
        for piece in source.split("\"tollgate.").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '{' | '}'))
                .collect();
            let after = &piece[name.len()..];
            if name.contains('{') || !after.starts_with('"') {
                continue;
            }
            // Span attributes (`tollgate.store.backend`) are no metrics.
            if !source.contains(&format!("KeyValue::new(\"tollgate.{name}\"")) {
                named.push(format!("tollgate.{name}"));
            }
        }
        assert!(named.len() > 30, "only {} names found", named.len());
        for name in &named {
            assert!(
                all.iter().any(|m| &m.name == name),
                "{name} is registered but not in observe::catalog"
            );
        }
        for m in all.iter().filter(|m| !m.process) {
            // The per-rule counters are registered over PER_RULE itself.
            if m.name.starts_with("tollgate.rule.") {
                continue;
            }
            assert!(
                named.contains(&m.name),
                "{} is in the catalog but registered nowhere",
                m.name
            );
            assert!(
                source.contains(&format!("\"{}\"", m.meaning)),
                "the description of {} is not the one registered: {:?}",
                m.name,
                m.meaning
            );
        }
    }
}
