//! The caller's trace context from gRPC metadata: W3C `traceparent` (and
//! `tracestate`), else B3 as Envoy sends it, single (`b3`) or multi
//! (`x-b3-traceid`, `x-b3-spanid`, `x-b3-sampled`, `x-b3-flags`).

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::MetadataMap;

struct Metadata<'a>(&'a MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// The context to parent a server span on: the caller's span when the
/// metadata carries a valid one, else an empty context (a new trace).
/// Malformed headers are ignored, as if absent.
pub fn extract(metadata: &MetadataMap) -> Context {
    let get = |k: &str| metadata.get(k).and_then(|v| v.to_str().ok());
    if get("traceparent").is_some() {
        let cx = TraceContextPropagator::new().extract(&Metadata(metadata));
        if cx.span().span_context().is_valid() {
            return cx;
        }
    }
    let b3 = match get("b3") {
        Some(single) => b3_single(single),
        None => b3_multi(
            get("x-b3-traceid"),
            get("x-b3-spanid"),
            get("x-b3-sampled"),
            get("x-b3-flags"),
        ),
    };
    match b3 {
        Some(sc) => Context::new().with_remote_span_context(sc),
        None => Context::new(),
    }
}

/// B3 trace ids are 16 or 32 hex digits; 16 are the low half.
fn trace_id(hex: &str) -> Option<TraceId> {
    if !(hex.len() == 16 || hex.len() == 32) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let id = TraceId::from_hex(hex).ok()?;
    (id != TraceId::INVALID).then_some(id)
}

fn span_id(hex: &str) -> Option<SpanId> {
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let id = SpanId::from_hex(hex).ok()?;
    (id != SpanId::INVALID).then_some(id)
}

/// `1` and debug (`d`, or `x-b3-flags: 1`) are sampled, `0` is not; a
/// context without a decision is sampled, so the trace it belongs to is
/// not cut short here.
fn span_context(trace: &str, span: &str, sampled: bool) -> Option<SpanContext> {
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    Some(SpanContext::new(
        trace_id(trace)?,
        span_id(span)?,
        flags,
        true,
        TraceState::default(),
    ))
}

/// `{trace}-{span}[-{sampling}[-{parent}]]`; a lone sampling state carries
/// no context.
fn b3_single(value: &str) -> Option<SpanContext> {
    let mut parts = value.trim().split('-');
    let trace = parts.next()?;
    let span = parts.next()?;
    let sampled = match parts.next() {
        None | Some("1") | Some("d") => true,
        Some("0") => false,
        Some(_) => return None,
    };
    span_context(trace, span, sampled)
}

fn b3_multi(
    trace: Option<&str>,
    span: Option<&str>,
    sampled: Option<&str>,
    flags: Option<&str>,
) -> Option<SpanContext> {
    let sampled = flags == Some("1")
        || match sampled {
            None | Some("1") | Some("true") => true,
            Some("0") | Some("false") => false,
            Some(_) => return None,
        };
    span_context(trace?.trim(), span?.trim(), sampled)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(pairs: &[(&'static str, &'static str)]) -> MetadataMap {
        let mut m = MetadataMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    }

    fn ids(cx: &Context) -> (String, String, bool) {
        let sc = cx.span().span_context().clone();
        (
            sc.trace_id().to_string(),
            sc.span_id().to_string(),
            sc.is_sampled(),
        )
    }

    #[test]
    fn traceparent() {
        let cx = extract(&md(&[(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )]));
        assert_eq!(
            ids(&cx),
            (
                "0af7651916cd43dd8448eb211c80319c".into(),
                "b7ad6b7169203331".into(),
                true
            )
        );
    }

    #[test]
    fn b3_single_and_multi() {
        let cx = extract(&md(&[(
            "b3",
            "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90",
        )]));
        assert_eq!(
            ids(&cx),
            (
                "80f198ee56343ba864fe8b2a57d3eff7".into(),
                "e457b5a2e4d86bd1".into(),
                true
            )
        );
        let cx = extract(&md(&[
            ("x-b3-traceid", "64fe8b2a57d3eff7"),
            ("x-b3-spanid", "e457b5a2e4d86bd1"),
            ("x-b3-sampled", "0"),
        ]));
        assert_eq!(
            ids(&cx),
            (
                "000000000000000064fe8b2a57d3eff7".into(),
                "e457b5a2e4d86bd1".into(),
                false
            )
        );
    }

    #[test]
    fn malformed_headers_start_a_new_trace() {
        for pairs in [
            &[("traceparent", "00-zz-b7ad6b7169203331-01")][..],
            &[("b3", "1")][..],
            &[("b3", "abc-def")][..],
            &[
                ("x-b3-traceid", "0000000000000000"),
                ("x-b3-spanid", "e457b5a2e4d86bd1"),
            ][..],
            &[("x-b3-traceid", "64fe8b2a57d3eff7")][..],
        ] {
            let cx = extract(&md(pairs));
            assert!(!cx.span().span_context().is_valid(), "{pairs:?}");
        }
    }
}
