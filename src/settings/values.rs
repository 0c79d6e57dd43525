//! The given values, one text per setting, and typed reads of them that
//! check each against its declaration.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use config::{Config, Value, ValueKind};

use super::table;
use super::{SettingsError, Sources};

/// A merged configuration as one text per setting, keyed by its dotted
/// name; a key that is not a declared setting is an error naming it.
pub(super) fn flatten(config: Config) -> Result<HashMap<String, String>, String> {
    fn walk(prefix: &str, value: Value, out: &mut HashMap<String, String>) -> Result<(), String> {
        match value.kind {
            ValueKind::Table(table) => {
                for (k, v) in table {
                    let name = if prefix.is_empty() {
                        k
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&name, v, out)?;
                }
                Ok(())
            }
            _ if table::find(prefix).is_none() => Err(format!("unknown field `{prefix}`")),
            // An empty YAML value leaves the setting unset.
            ValueKind::Nil => Ok(()),
            ValueKind::Array(_) => Err(format!("{prefix}: expected one value, found a list")),
            _ => {
                let text = value.into_string().map_err(|e| format!("{prefix}: {e}"))?;
                out.insert(prefix.to_string(), text);
                Ok(())
            }
        }
    }
    let mut out = HashMap::new();
    let root: config::Map<String, Value> = config.try_deserialize().map_err(|e| e.to_string())?;
    walk("", Value::new(None, ValueKind::Table(root)), &mut out)?;
    Ok(out)
}

pub(super) fn bad(
    src: &Sources,
    name: &str,
    value: &str,
    reason: impl fmt::Display,
) -> SettingsError {
    SettingsError {
        name: name.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
        origin: src.origin(name),
    }
}

/// The given values and the declaration: each read checks the value (or
/// the default) against its declared kind, so every bad value gets the
/// same error whichever source gave it.
pub(super) struct Values<'a> {
    pub(super) given: HashMap<String, String>,
    pub(super) src: &'a Sources,
    pub(super) read: RefCell<HashSet<&'static str>>,
}

impl Values<'_> {
    /// The given value, else the default, checked against the declared
    /// kind; `None` when neither is set.
    pub(super) fn text(&self, name: &'static str) -> Result<Option<String>, SettingsError> {
        let Some(setting) = table::find(name) else {
            // Reads only declared names; a test reads every one.
            return Err(bad(self.src, name, "", "not a declared setting"));
        };
        self.read.borrow_mut().insert(setting.name);
        let value = match self.given.get(name) {
            Some(v) => v.clone(),
            None => match setting.default {
                Some(d) => d.to_string(),
                None => return Ok(None),
            },
        };
        table::check(setting.kind, &value).map_err(|reason| bad(self.src, name, &value, reason))?;
        Ok(Some(value))
    }

    /// A non-empty text, or `None`.
    pub(super) fn opt_text(&self, name: &'static str) -> Result<Option<String>, SettingsError> {
        Ok(self.text(name)?.filter(|v| !v.trim().is_empty()))
    }

    /// Whether the setting was given at all (else its default applies).
    pub(super) fn is_given(&self, name: &'static str) -> bool {
        self.given.contains_key(name)
    }

    pub(super) fn opt<T: FromStr>(&self, name: &'static str) -> Result<Option<T>, SettingsError>
    where
        T::Err: fmt::Display,
    {
        match self.opt_text(name)? {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .map_err(|e| bad(self.src, name, &v, e)),
        }
    }

    /// A setting that has a default.
    pub(super) fn get<T: FromStr>(&self, name: &'static str) -> Result<T, SettingsError>
    where
        T::Err: fmt::Display,
    {
        self.opt(name)?
            .ok_or_else(|| bad(self.src, name, "", "must not be empty"))
    }

    pub(super) fn flag(&self, name: &'static str) -> Result<Option<bool>, SettingsError> {
        match self.opt_text(name)? {
            None => Ok(None),
            Some(v) => table::parse_bool(&v)
                .map(Some)
                .map_err(|e| bad(self.src, name, &v, e)),
        }
    }

    pub(super) fn bool(&self, name: &'static str) -> Result<bool, SettingsError> {
        Ok(self.flag(name)?.unwrap_or(false))
    }

    pub(super) fn millis(&self, name: &'static str) -> Result<Duration, SettingsError> {
        self.get::<u64>(name).map(Duration::from_millis)
    }

    /// Milliseconds where 0 means never.
    pub(super) fn every(&self, name: &'static str) -> Result<Option<Duration>, SettingsError> {
        let d = self.millis(name)?;
        Ok((!d.is_zero()).then_some(d))
    }

    /// A path to an existing file, or `None` when unset.
    pub(super) fn file(&self, name: &'static str) -> Result<Option<PathBuf>, SettingsError> {
        match self.opt_text(name)? {
            None => Ok(None),
            Some(v) if Path::new(&v).is_file() => Ok(Some(PathBuf::from(v))),
            Some(v) => Err(bad(self.src, name, &v, "no such file")),
        }
    }
}
