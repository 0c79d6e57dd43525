//! A descriptor's `metadata`: any mapping, kept as JSON for `/rlconfig`
//! and the answers' dynamic metadata.

use super::tree::Yaml;
use super::yaml::{Walker, kind, line_of};

impl Walker<'_> {
    /// A descriptor's `metadata`: any mapping, kept as JSON (plain
    /// scalars typed as YAML reads them, quoted ones as strings).
    pub(super) fn metadata(
        &mut self,
        node: &Yaml,
        path: &str,
    ) -> Option<std::sync::Arc<serde_json::Map<String, serde_json::Value>>> {
        match to_json(node) {
            serde_json::Value::Object(map) => Some(std::sync::Arc::new(map)),
            _ => {
                self.error(
                    line_of(node),
                    path,
                    format!("expected a metadata mapping, found {}", kind(node)),
                );
                None
            }
        }
    }
}

/// A YAML node as JSON: plain `null`/`~`/empty as null, `true`/`false` as
/// booleans, numbers as numbers; anything quoted stays a string.
fn to_json(node: &Yaml) -> serde_json::Value {
    use serde_json::Value;
    match node {
        Yaml::Scalar(s) => {
            let text = s.as_str();
            if !s.may_coerce() {
                return Value::String(text.to_string());
            }
            match text {
                "" | "~" | "null" | "Null" | "NULL" => Value::Null,
                "true" | "True" | "TRUE" => Value::Bool(true),
                "false" | "False" | "FALSE" => Value::Bool(false),
                _ => {
                    if let Ok(i) = text.parse::<i64>() {
                        Value::from(i)
                    } else if let Some(n) = text
                        .parse::<f64>()
                        .ok()
                        .filter(|f| f.is_finite())
                        .and_then(serde_json::Number::from_f64)
                    {
                        Value::Number(n)
                    } else {
                        Value::String(text.to_string())
                    }
                }
            }
        }
        Yaml::Sequence(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Mapping(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.as_str().to_string(), to_json(v)))
                .collect(),
        ),
    }
}
