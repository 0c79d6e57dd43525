//! `RateLimitConfig` resources into rule texts. Each resource is written
//! out as the rule file it stands for (in JSON, which the rule loader reads
//! as YAML), so resources go through exactly the checks files do, and an
//! error names the resource and the YAML path of the field
//! (`xds/<name>:7: descriptors[0].rate_limit.unit: ...`).

use std::path::PathBuf;

use prost::Message;
use prost_types::Any;
use prost_types::value::Kind;
use serde_json::{Map, Value, json};

use crate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

/// The resource type tollgate subscribes to.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Each resource as `(xds/<name or domain>, rule text)`, or why one cannot
/// be read at all.
pub(super) fn texts(resources: &[Any]) -> Result<Vec<(PathBuf, String)>, String> {
    let mut out = Vec::with_capacity(resources.len());
    for (i, any) in resources.iter().enumerate() {
        if any.type_url != TYPE_URL {
            return Err(format!(
                "resource {i}: type {:?}, expected {TYPE_URL}",
                any.type_url
            ));
        }
        let config = RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| format!("resource {i}: not a RateLimitConfig: {e}"))?;
        let name = if config.name.is_empty() {
            config.domain.clone()
        } else {
            config.name.clone()
        };
        let text = serde_json::to_string_pretty(&config_json(&config))
            .map_err(|e| format!("resource {name:?}: {e}"))?;
        out.push((PathBuf::from(format!("xds/{name}")), text));
    }
    Ok(out)
}

fn config_json(c: &RateLimitConfig) -> Value {
    json!({
        "domain": c.domain,
        "descriptors": c.descriptors.iter().map(descriptor_json).collect::<Vec<_>>(),
    })
}

/// A descriptor as its YAML mapping; fields at their proto default are
/// left out, as an absent YAML key reads.
fn descriptor_json(d: &RateLimitDescriptor) -> Value {
    let mut m = Map::new();
    m.insert("key".into(), json!(d.key));
    if !d.value.is_empty() {
        m.insert("value".into(), json!(d.value));
    }
    if let Some(p) = &d.rate_limit {
        m.insert("rate_limit".into(), policy_json(p));
    }
    if !d.descriptors.is_empty() {
        let children: Vec<Value> = d.descriptors.iter().map(descriptor_json).collect();
        m.insert("descriptors".into(), Value::Array(children));
    }
    for (on, name) in [
        (d.shadow_mode, "shadow_mode"),
        (d.detailed_metric, "detailed_metric"),
        (d.quota_mode, "quota_mode"),
    ] {
        if on {
            m.insert(name.into(), json!(true));
        }
    }
    if let Some(md) = &d.metadata {
        m.insert("metadata".into(), struct_json(md));
    }
    Value::Object(m)
}

fn policy_json(p: &RateLimitPolicy) -> Value {
    let mut m = Map::new();
    let unit = RateLimitUnit::try_from(p.unit).unwrap_or(RateLimitUnit::Unknown);
    if p.unlimited {
        m.insert("unlimited".into(), json!(true));
        // A unit or a limit beside `unlimited` is refused, as in a file.
        if unit != RateLimitUnit::Unknown {
            m.insert("unit".into(), json!(unit_name(unit)));
        }
        if p.requests_per_unit != 0 {
            m.insert("requests_per_unit".into(), json!(p.requests_per_unit));
        }
    } else {
        m.insert("unit".into(), json!(unit_name(unit)));
        m.insert("requests_per_unit".into(), json!(p.requests_per_unit));
    }
    if !p.name.is_empty() {
        m.insert("name".into(), json!(p.name));
    }
    if !p.replaces.is_empty() {
        let replaces: Vec<Value> = p.replaces.iter().map(|r| json!({"name": r.name})).collect();
        m.insert("replaces".into(), Value::Array(replaces));
    }
    Value::Object(m)
}

fn unit_name(u: RateLimitUnit) -> &'static str {
    match u {
        RateLimitUnit::Unknown => "unknown",
        RateLimitUnit::Second => "second",
        RateLimitUnit::Minute => "minute",
        RateLimitUnit::Hour => "hour",
        RateLimitUnit::Day => "day",
        RateLimitUnit::Week => "week",
        RateLimitUnit::Month => "month",
        RateLimitUnit::Year => "year",
    }
}

fn struct_json(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &prost_types::Value) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map(|n| {
                // Whole numbers stay whole, as YAML would read them.
                match n.as_f64() {
                    Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => json!(f as i64),
                    _ => Value::Number(n),
                }
            })
            .unwrap_or(Value::Null),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_json).collect()),
    }
}
