//! `replaces` across a domain: a limit may not drop a limit of requests in
//! flight. A take and its release are two requests (Envoy's stream-done
//! call carries only its own policy's descriptors), so a take a replacing
//! limit dropped would still see its release free a slot another request
//! holds.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::rules::{RuleError, RuleSet};

/// The errors of every rule whose `replaces` names a limit of requests in
/// flight of its domain; `files` are the paths read, by which an error
/// names the rule's file whole.
pub(super) fn replaced_in_flight(set: &RuleSet, files: &[PathBuf]) -> Vec<RuleError> {
    let rules = set.rules();
    let in_flight: HashSet<(&str, &str)> = rules
        .iter()
        .filter(|(_, r)| r.algorithm.is_some_and(|a| a.releases()))
        .filter_map(|(domain, r)| Some((*domain, r.name.as_deref()?)))
        .collect();
    let mut errors = Vec::new();
    for (domain, rule) in &rules {
        for name in &rule.replaces {
            if !in_flight.contains(&(*domain, name.as_str())) {
                continue;
            }
            let short = Path::new(&*rule.source.file);
            let file = files
                .iter()
                .find(|f| f.file_name() == short.file_name())
                .cloned()
                .unwrap_or_else(|| short.to_path_buf());
            errors.push(RuleError {
                file,
                line: Some(rule.source.line as usize),
                path: format!("{}.replaces", rule.path),
                reason: format!(
                    "replaces names {name:?}, a concurrency limit: a take and its release \
                     are two requests, and a release of a take it dropped would free a slot \
                     another request holds; limit the other descriptor instead"
                ),
            });
        }
    }
    errors
}
