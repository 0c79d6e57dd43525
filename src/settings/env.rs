//! What a `TOLLGATE_*` variable is: a setting, a Kubernetes service link
//! (ignored without a word), or a stray (a warning naming it).

use super::keys;
use super::table::{ENV_PREFIX, env_name};

/// What a `TOLLGATE_*` variable is to us.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum EnvVar {
    /// Sets this setting.
    Setting(&'static str),
    /// Put there by Kubernetes for a Service whose name starts with
    /// `tollgate` (service links): not ours, ignored without a word.
    ServiceLink,
    Unknown,
}

pub(super) fn classify_env(var: &str, value: &str) -> EnvVar {
    let Some(rest) = var.strip_prefix(ENV_PREFIX) else {
        return EnvVar::Unknown;
    };
    if let Some(key) = keys().find(|k| env_name(k) == var) {
        return EnvVar::Setting(key);
    }
    // The kubelet's service-link names, for a Service `tollgate[-x]` with
    // ports: X_SERVICE_HOST, X_SERVICE_PORT, X_SERVICE_PORT_<NAME>, X_PORT
    // (tcp://ip:port), X_PORT_<n>_<PROTO>, and that with _PROTO/_PORT/_ADDR.
    let words: Vec<&str> = rest.split('_').collect();
    let is_proto = |w: &str| matches!(w, "TCP" | "UDP" | "SCTP");
    let is_number = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit());
    for (i, w) in words.iter().enumerate() {
        let tail = &words[i + 1..];
        match (*w, tail) {
            ("SERVICE", ["HOST"]) | ("SERVICE", ["PORT", ..]) => return EnvVar::ServiceLink,
            ("PORT", [])
                if ["tcp://", "udp://", "sctp://"]
                    .iter()
                    .any(|p| value.starts_with(p)) =>
            {
                return EnvVar::ServiceLink;
            }
            ("PORT", [n, proto]) if is_number(n) && is_proto(proto) => {
                return EnvVar::ServiceLink;
            }
            ("PORT", [n, proto, "PROTO" | "PORT" | "ADDR"]) if is_number(n) && is_proto(proto) => {
                return EnvVar::ServiceLink;
            }
            _ => {}
        }
    }
    EnvVar::Unknown
}

/// The setting variable nearest to a stray `var`, for the warning: the one
/// fewest edits away, when that is at most half the stray's name (past
/// that it would be a guess); ties go to the longer common start, since
/// people mistype the end of a name more often than its start.
pub(super) fn nearest(var: &str) -> Option<String> {
    let stray = var.strip_prefix(ENV_PREFIX)?;
    keys()
        .map(env_name)
        .map(|name| {
            let known = &name[ENV_PREFIX.len()..];
            let common = stray
                .bytes()
                .zip(known.bytes())
                .take_while(|(a, b)| a == b)
                .count();
            (edits(stray, known), usize::MAX - common, name)
        })
        .min()
        .filter(|(distance, _, _)| *distance <= stray.len().div_ceil(2))
        .map(|(_, _, name)| name)
}

/// Levenshtein distance over bytes (variable names are ASCII).
fn edits(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}
