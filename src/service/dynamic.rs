//! `RateLimitResponse.dynamic_metadata` (with `response_dynamic_metadata`
//! on): what Envoy's rate-limit filter stores as dynamic metadata under its
//! own name, for access logs and later filters. Laid out as the reference
//! service lays it out:
//!
//! ```text
//! domain: "<domain>"
//! descriptors: [{entries: ["key=value", ...], hitsAddend?: n}, ...]
//! hitsAddend: n                  (the request's, when not 0)
//! metadata: {...}                (the rules' `metadata` of descriptors
//!                                 answered OK, merged: the first wins,
//!                                 mappings merge key by key)
//! ```

use prost_types::value::Kind;
use prost_types::{ListValue, Struct, Value};
use serde_json::{Map, Value as Json};

use crate::engine::{Request, Response};

pub(super) fn dynamic_metadata(req: &Request, decision: &Response) -> Struct {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("domain".to_string(), string(&req.domain));
    let descriptors = req
        .descriptors
        .iter()
        .map(|d| {
            let mut f = std::collections::BTreeMap::new();
            let entries = d
                .entries
                .iter()
                .map(|(k, v)| string(&format!("{k}={v}")))
                .collect();
            f.insert("entries".to_string(), list(entries));
            if let Some(h) = d.hits {
                f.insert("hitsAddend".to_string(), number(h as f64));
            }
            value(Kind::StructValue(Struct { fields: f }))
        })
        .collect();
    fields.insert("descriptors".to_string(), list(descriptors));
    if req.hits != 0 {
        fields.insert("hitsAddend".to_string(), number(req.hits as f64));
    }
    let mut merged = Map::new();
    for m in &decision.metadata {
        merge(&mut merged, m);
    }
    if !merged.is_empty() {
        fields.insert("metadata".to_string(), from_json(&Json::Object(merged)));
    }
    Struct { fields }
}

/// Adds `src` to `dest`: a key already there keeps its value, except that
/// two mappings merge key by key.
fn merge(dest: &mut Map<String, Json>, src: &Map<String, Json>) {
    for (k, v) in src {
        match (dest.get_mut(k), v) {
            (Some(Json::Object(d)), Json::Object(s)) => merge(d, s),
            (Some(_), _) => {}
            (None, _) => {
                dest.insert(k.clone(), v.clone());
            }
        }
    }
}

fn from_json(j: &Json) -> Value {
    value(match j {
        Json::Null => Kind::NullValue(0),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(from_json).collect(),
        }),
        Json::Object(map) => Kind::StructValue(Struct {
            fields: map.iter().map(|(k, v)| (k.clone(), from_json(v))).collect(),
        }),
    })
}

fn value(kind: Kind) -> Value {
    Value { kind: Some(kind) }
}

fn string(s: &str) -> Value {
    value(Kind::StringValue(s.to_string()))
}

fn number(n: f64) -> Value {
    value(Kind::NumberValue(n))
}

fn list(values: Vec<Value>) -> Value {
    value(Kind::ListValue(ListValue { values }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_wins_and_mappings_merge() {
        let a: Map<String, Json> =
            serde_json::from_str(r#"{"name":"a","svc":{"x":1},"n":[1]}"#).unwrap();
        let b: Map<String, Json> =
            serde_json::from_str(r#"{"name":"b","svc":{"x":2,"y":3},"other":true}"#).unwrap();
        let mut m = Map::new();
        merge(&mut m, &a);
        merge(&mut m, &b);
        assert_eq!(
            Json::Object(m),
            serde_json::json!({"name":"a","svc":{"x":1,"y":3},"n":[1],"other":true})
        );
    }
}
