//! The YAML walk with positions: nodes read with their line and their path
//! in the file, every problem of a file collected (not only the first), and
//! scalars read as the reference's `yaml.v2` reads them into Go fields.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use super::tree::{MarkedMappingNode, MarkedScalarNode, Yaml};

use super::LoadOptions;
use crate::rules::RuleError;

pub(super) fn line_of(node: &Yaml) -> Option<usize> {
    node.span().start().map(|m| m.line())
}

pub(super) fn key_line(key: &MarkedScalarNode) -> Option<usize> {
    key.span().start().map(|m| m.line())
}

pub(super) fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

pub(super) fn kind(node: &Yaml) -> &'static str {
    match node {
        Yaml::Scalar(_) => "a scalar",
        Yaml::Mapping(_) => "a mapping",
        Yaml::Sequence(_) => "a list",
    }
}

/// A plain `null`, `~` or empty scalar: the key is treated as absent.
fn is_null(node: &Yaml) -> bool {
    matches!(node, Yaml::Scalar(s) if s.may_coerce()
        && matches!(s.as_str(), "" | "~" | "null" | "Null" | "NULL"))
}

/// A mapping's entries by name, with unknown keys already reported. Null
/// values are dropped, so `unit: ~` reads as no `unit`.
pub(super) struct Fields<'y> {
    entries: Vec<(&'y str, &'y MarkedScalarNode<'y>, &'y Yaml<'y>)>,
}

impl<'y> Fields<'y> {
    pub(super) fn get(&self, name: &str) -> Option<(&'y MarkedScalarNode<'y>, &'y Yaml<'y>)> {
        self.entries
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, k, v)| (*k, *v))
    }
}

pub(super) struct Walker<'f> {
    file: &'f Path,
    pub(super) options: &'f LoadOptions,
    /// `file_name` for `Rule::source`, shared by the file's rules.
    pub(super) short: Arc<str>,
    pub(super) errors: Vec<RuleError>,
    /// Descriptor keys met so far: a file's nodes share each key.
    keys: HashSet<Arc<str>>,
}

impl<'f> Walker<'f> {
    pub(super) fn new(file: &'f Path, options: &'f LoadOptions) -> Self {
        let short: Arc<str> = file
            .file_name()
            .map_or_else(
                || file.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            )
            .into();
        Walker {
            file,
            options,
            short,
            errors: Vec::new(),
            keys: HashSet::new(),
        }
    }

    /// The file's one copy of descriptor key `key`.
    pub(super) fn intern(&mut self, key: String) -> Arc<str> {
        if let Some(k) = self.keys.get(key.as_str()) {
            return k.clone();
        }
        let k: Arc<str> = key.into();
        self.keys.insert(k.clone());
        k
    }

    pub(super) fn error(&mut self, line: Option<usize>, path: &str, reason: impl Into<String>) {
        self.errors.push(RuleError {
            file: self.file.to_path_buf(),
            line,
            path: path.to_string(),
            reason: reason.into(),
        });
    }

    pub(super) fn fields<'y>(
        &mut self,
        map: &'y MarkedMappingNode<'y>,
        path: &str,
        allowed: &[&str],
    ) -> Fields<'y> {
        let mut entries = Vec::new();
        for (key, value) in map.iter() {
            let name = key.as_str();
            if !allowed.contains(&name) {
                self.error(
                    key_line(key),
                    &join(path, name),
                    format!("unknown key {name:?} (allowed: {})", allowed.join(", ")),
                );
            } else if !is_null(value) {
                entries.push((name, key, value));
            }
        }
        Fields { entries }
    }

    pub(super) fn string(&mut self, node: &Yaml, path: &str) -> Option<String> {
        match node {
            Yaml::Scalar(s) => Some(s.as_str().to_string()),
            other => {
                self.error(
                    line_of(other),
                    path,
                    format!("expected a string, found {}", kind(other)),
                );
                None
            }
        }
    }

    /// An optional boolean descriptor flag: `None` only on error.
    pub(super) fn flag(&mut self, fields: &Fields<'_>, path: &str, name: &str) -> Option<bool> {
        let Some((_, node)) = fields.get(name) else {
            return Some(false);
        };
        let path = join(path, name);
        let text = self.string(node, &path)?;
        // The YAML 1.1 spellings that the reference's yaml.v2 accepts.
        match text.as_str() {
            "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
            "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
            _ => {
                self.error(
                    line_of(node),
                    &path,
                    format!("expected true or false, found {text:?}"),
                );
                None
            }
        }
    }

    pub(super) fn number(&mut self, node: &Yaml, path: &str) -> Option<u32> {
        let text = self.string(node, path)?;
        match parse_u32(&text) {
            Ok(n) => Some(n),
            Err(reason) => {
                self.error(line_of(node), path, reason);
                None
            }
        }
    }

    pub(super) fn parsed<T: std::str::FromStr<Err = String>>(
        &mut self,
        node: &Yaml,
        path: &str,
    ) -> Option<T> {
        let text = self.string(node, path)?;
        match text.parse::<T>() {
            Ok(v) => Some(v),
            Err(reason) => {
                self.error(line_of(node), path, reason);
                None
            }
        }
    }
}

/// A whole number from 0 to `u32::MAX`; `_` may separate digits, as in YAML.
fn parse_u32(text: &str) -> Result<u32, String> {
    let t = text.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let digits: String = digits.chars().filter(|&c| c != '_').collect();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected a whole number, found {text:?}"));
    }
    if negative && digits.bytes().any(|b| b != b'0') {
        return Err(format!("must not be negative, found {text}"));
    }
    digits
        .parse::<u32>()
        .map_err(|_| format!("too large, found {text} (at most {})", u32::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(parse_u32("0"), Ok(0));
        assert_eq!(parse_u32("1_000"), Ok(1000));
        assert_eq!(parse_u32("+7"), Ok(7));
        assert_eq!(parse_u32("-0"), Ok(0));
        assert_eq!(parse_u32("4294967295"), Ok(u32::MAX));
        assert!(parse_u32("4294967296").unwrap_err().contains("too large"));
        assert!(
            parse_u32("99999999999999999999999")
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_u32("-1").unwrap_err().contains("negative"));
        assert!(parse_u32("lots").unwrap_err().contains("whole number"));
        assert!(parse_u32("1.5").unwrap_err().contains("whole number"));
        assert!(parse_u32("").unwrap_err().contains("whole number"));
    }
}
