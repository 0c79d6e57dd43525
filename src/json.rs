//! `POST /json`: `RateLimitRequest` and `RateLimitResponse` in the proto3
//! JSON mapping (lowerCamelCase names, the original snake_case names also
//! accepted; enums by name or number; 64-bit integers as strings or
//! numbers), so rules can be tried with `curl`.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::proto::rate_limit_response::{self, DescriptorStatus};
use crate::proto::{
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitUnit, rate_limit_descriptor,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<Descriptor>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Integer>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Descriptor {
    #[serde(default)]
    entries: Vec<Entry>,
    #[serde(default)]
    limit: Option<Limit>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Integer>,
    #[serde(default, alias = "is_negative_hits", rename = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limit {
    #[serde(default, alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: Option<Integer>,
    #[serde(default)]
    unit: Option<UnitName>,
}

/// The mapping writes integers as numbers or, for 64-bit ones, strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Integer {
    Number(u64),
    Text(String),
}

impl Integer {
    fn get(&self, field: &str) -> Result<u64, String> {
        match self {
            Integer::Number(n) => Ok(*n),
            Integer::Text(t) => t
                .parse()
                .map_err(|_| format!("{field}: {t:?} is not a non-negative integer")),
        }
    }

    fn get_u32(&self, field: &str) -> Result<u32, String> {
        let n = self.get(field)?;
        u32::try_from(n).map_err(|_| format!("{field}: {n} is above {}", u32::MAX))
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum UnitName {
    Number(i32),
    Name(String),
}

/// Parses a JSON request into the protocol message; the error says what
/// is wrong and where.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let r: Request = serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?;
    let descriptors = r
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let limit = match d.limit {
                None => None,
                Some(l) => Some(rate_limit_descriptor::RateLimitOverride {
                    requests_per_unit: match &l.requests_per_unit {
                        Some(n) => n.get_u32(&format!("descriptors[{i}].limit.requestsPerUnit"))?,
                        None => 0,
                    },
                    unit: match l.unit {
                        None => 0,
                        Some(UnitName::Number(n)) => n,
                        Some(UnitName::Name(name)) => RateLimitUnit::from_str_name(&name)
                            .ok_or_else(|| {
                                format!(
                                    "descriptors[{i}].limit.unit: unknown unit {name:?} (expected SECOND, MINUTE, HOUR, DAY, MONTH or YEAR)"
                                )
                            })? as i32,
                    },
                }),
            };
            Ok(RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| rate_limit_descriptor::Entry {
                        key: e.key.into_bytes(),
                        value: e.value.into_bytes(),
                    })
                    .collect(),
                limit,
                hits_addend: match &d.hits_addend {
                    Some(n) => Some(n.get(&format!("descriptors[{i}].hitsAddend"))?),
                    None => None,
                },
                is_negative_hits: d.is_negative_hits,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(RateLimitRequest {
        domain: r.domain,
        descriptors,
        hits_addend: match &r.hits_addend {
            Some(n) => n.get_u32("hitsAddend")?,
            None => 0,
        },
    })
}

fn code_name(code: i32) -> &'static str {
    rate_limit_response::Code::try_from(code)
        .map(|c| c.as_str_name())
        .unwrap_or("UNKNOWN")
}

/// `1.5s`, as the mapping writes a `google.protobuf.Duration`.
fn duration(d: &prost_types::Duration) -> String {
    if d.nanos == 0 {
        format!("{}s", d.seconds)
    } else {
        let frac = format!("{:09}", d.nanos);
        format!("{}.{}s", d.seconds, frac.trim_end_matches('0'))
    }
}

fn status(s: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    out.insert("code".into(), json!(code_name(s.code)));
    if let Some(l) = &s.current_limit {
        let mut limit = Map::new();
        if !l.name.is_empty() {
            limit.insert("name".into(), json!(l.name));
        }
        limit.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
        let unit = rate_limit_response::rate_limit::Unit::try_from(l.unit)
            .map(|u| u.as_str_name())
            .unwrap_or("UNKNOWN");
        limit.insert("unit".into(), json!(unit));
        out.insert("currentLimit".into(), Value::Object(limit));
    }
    if s.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(s.limit_remaining));
    }
    if let Some(d) = &s.duration_until_reset {
        out.insert("durationUntilReset".into(), json!(duration(d)));
    }
    Value::Object(out)
}

/// The response in the mapping (fields at their default left out, as the
/// mapping does).
pub fn response(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(code_name(r.overall_code)));
    out.insert(
        "statuses".into(),
        Value::Array(r.statuses.iter().map(status).collect()),
    );
    let headers = |list: &[crate::proto::HeaderValue]| {
        Value::Array(
            list.iter()
                .map(|h| json!({"key": h.key, "value": h.value}))
                .collect(),
        )
    };
    if !r.response_headers_to_add.is_empty() {
        out.insert(
            "responseHeadersToAdd".into(),
            headers(&r.response_headers_to_add),
        );
    }
    if !r.request_headers_to_add.is_empty() {
        out.insert(
            "requestHeadersToAdd".into(),
            headers(&r.request_headers_to_add),
        );
    }
    if let Some(md) = &r.dynamic_metadata {
        out.insert("dynamicMetadata".into(), struct_json(md));
    }
    Value::Object(out)
}

/// A `google.protobuf.Struct` in its JSON mapping: the object itself.
fn struct_json(s: &prost_types::Struct) -> Value {
    use prost_types::value::Kind;
    fn value(v: &prost_types::Value) -> Value {
        match &v.kind {
            None | Some(Kind::NullValue(_)) => Value::Null,
            Some(Kind::NumberValue(n)) => json!(n),
            Some(Kind::StringValue(s)) => json!(s),
            Some(Kind::BoolValue(b)) => json!(b),
            Some(Kind::StructValue(s)) => struct_json(s),
            Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value).collect()),
        }
    }
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value(v)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_name_styles_and_string_integers() {
        let r = parse_request(
            br#"{"domain":"d","hits_addend":2,"descriptors":[
                {"entries":[{"key":"k","value":"v"}],"hitsAddend":"7","isNegativeHits":true,
                 "limit":{"requests_per_unit":"5","unit":"MINUTE"}}]}"#,
        )
        .unwrap();
        assert_eq!(r.hits_addend, 2);
        let d = &r.descriptors[0];
        assert_eq!(d.hits_addend, Some(7));
        assert!(d.is_negative_hits);
        let l = d.limit.unwrap();
        assert_eq!(
            (l.requests_per_unit, l.unit),
            (5, RateLimitUnit::Minute as i32)
        );
    }

    #[test]
    fn bad_input_says_what() {
        for (body, want) in [
            (&b"{"[..], "invalid JSON"),
            (br#"{"domain":"d","extra":1}"#, "unknown field `extra`"),
            (
                br#"{"domain":"d","descriptors":[{"limit":{"unit":"WEEKS"}}]}"#,
                "descriptors[0].limit.unit: unknown unit",
            ),
            (br#"{"hitsAddend":"x"}"#, "hitsAddend"),
            (br#"{"hitsAddend":5000000000}"#, "is above"),
        ] {
            let e = parse_request(body).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn durations_as_the_mapping_writes_them() {
        let d = |seconds, nanos| duration(&prost_types::Duration { seconds, nanos });
        assert_eq!(d(3, 0), "3s");
        assert_eq!(d(1, 500_000_000), "1.5s");
        assert_eq!(d(0, 1_000), "0.000001s");
    }
}
