//! A store wrapper that times every call, counts failures by node and kind,
//! and, inside a sampled trace, records the call as a child span. A hit
//! decided from a lease ([`Store::decide_here`]) reaches no store and is
//! neither timed nor traced.

use std::sync::Arc;
use std::time::Instant;

use opentelemetry::trace::{Span, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};

use super::{Instruments, node_label};
use crate::storage::{BoxFuture, Decision, Hit, Store, StoreError};

/// Wraps the store the engine calls. Everything but `hit` is passed through.
pub struct ObservedStore {
    inner: Arc<dyn Store>,
    instruments: Arc<Instruments>,
}

impl ObservedStore {
    pub fn new(inner: Arc<dyn Store>, instruments: Arc<Instruments>) -> Self {
        Self { inner, instruments }
    }
}

fn outcome(result: &Result<Decision, StoreError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(StoreError::Timeout(_)) => "timeout",
        Err(StoreError::Unavailable(_) | StoreError::Moved(_)) => "unavailable",
        Err(StoreError::Protocol(_)) => "protocol",
        Err(StoreError::CircuitOpen) => "circuit_open",
        Err(StoreError::Overloaded(_)) => "overloaded",
    }
}

impl Store for ObservedStore {
    fn hit<'a>(&'a self, hit: Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(async move {
            // A decision from a lease is no store call: not timed.
            if let Some(d) = self.inner.decide_here(&hit) {
                return Ok(d);
            }
            let node = self.inner.node(&hit);
            let backend = self.inner.kind();
            // The engine runs inside the request span's context (see
            // `service`); only a sampled one gets children.
            let span = self.instruments.tracer.as_ref().and_then(|tracer| {
                let cx = Context::current();
                cx.span().span_context().is_sampled().then(|| {
                    tracer
                        .span_builder("store.hit")
                        .with_kind(SpanKind::Client)
                        .with_attributes([
                            KeyValue::new("tollgate.algorithm", hit.algorithm.as_str()),
                            KeyValue::new("tollgate.store.backend", backend),
                            KeyValue::new("tollgate.store.node", node.to_string()),
                        ])
                        .start_with_context(tracer, &cx)
                })
            });
            let started = Instant::now();
            let result = self.inner.hit(hit).await;
            let elapsed = started.elapsed().as_secs_f64();
            let outcome = outcome(&result);
            if result.is_ok() {
                self.instruments.store_ok(backend, &node).record(elapsed);
            } else {
                let node_label = node_label(&node);
                let attrs = [
                    KeyValue::new("backend", backend),
                    KeyValue::new("node", node_label.clone()),
                    KeyValue::new("outcome", outcome),
                ];
                self.instruments.store_duration.record(elapsed, &attrs);
                let attrs = [
                    KeyValue::new("backend", backend),
                    KeyValue::new("node", node_label),
                    KeyValue::new("kind", outcome),
                ];
                self.instruments.store_errors.add(1, &attrs);
            }
            if let Some(mut span) = span {
                span.set_attribute(KeyValue::new("tollgate.store.outcome", outcome));
                if let Err(e) = &result {
                    span.set_status(Status::error(e.to_string()));
                }
                span.end();
            }
            result
        })
    }

    fn wrapped(&self) -> Option<&dyn Store> {
        Some(&*self.inner)
    }
}
