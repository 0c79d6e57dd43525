//! Every key a rule file may hold, declared once with where it goes, what
//! it takes, its default and its meaning; and the combinations the loader
//! refuses, each as a small file that shows it. The rule-key reference
//! (`docs/src/reference/rules.md`, written by `scripts/docs`) is made from
//! these; a test holds [`RULE_KEYS`] to the keys the walk accepts, and
//! another loads every [`REFUSED`] example and expects it refused.

/// Where a key is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The top of a file.
    File,
    /// A descriptor: an item of `descriptors` (at any depth).
    Descriptor,
    /// A `rate_limit` mapping, or one item of a `rate_limits` list.
    RateLimit,
    /// One item of a `rate_limit`'s `replaces` list.
    Replaces,
}

impl Place {
    pub const ALL: [Place; 4] = [
        Place::File,
        Place::Descriptor,
        Place::RateLimit,
        Place::Replaces,
    ];

    /// How the reference names the place.
    pub fn as_str(self) -> &'static str {
        match self {
            Place::File => "file",
            Place::Descriptor => "descriptor",
            Place::RateLimit => "rate_limit",
            Place::Replaces => "replaces item",
        }
    }
}

/// One rule-file key.
#[derive(Debug, Clone, Copy)]
pub struct RuleKey {
    pub place: Place,
    pub name: &'static str,
    /// The values it takes, in words.
    pub takes: &'static str,
    /// What an absent key means.
    pub default: &'static str,
    pub meaning: &'static str,
}

const fn k(
    place: Place,
    name: &'static str,
    takes: &'static str,
    default: &'static str,
    meaning: &'static str,
) -> RuleKey {
    RuleKey {
        place,
        name,
        takes,
        default,
        meaning,
    }
}

use Place::{Descriptor, File, RateLimit, Replaces};

/// Every key, by place, in the order the loader lists them.
pub const RULE_KEYS: &[RuleKey] = &[
    k(
        File,
        "domain",
        "string, not empty",
        "required",
        "the domain requests name; one file per domain, unless `merge_domain_config` merges the files naming it",
    ),
    k(
        File,
        "descriptors",
        "list of descriptors",
        "none: a domain without limits",
        "the first level of descriptors, matched against a request descriptor's first entry",
    ),
    k(
        Descriptor,
        "key",
        "string, not empty",
        "required",
        "the entry key this level matches",
    ),
    k(
        Descriptor,
        "value",
        "string; `*` matches any run of characters, also none",
        "none: the key-only default of the level, one limiter per runtime value",
        "the entry value this descriptor matches: an exact value first, then wildcards in file order, then the key-only default",
    ),
    k(
        Descriptor,
        "rate_limit",
        "mapping of rate_limit keys",
        "none: no limit here (a descriptor with neither a limit nor children is a whitelist)",
        "the limit of a request descriptor whose last entry matches here",
    ),
    k(
        Descriptor,
        "rate_limits",
        "non-empty list of rate_limit mappings",
        "none",
        "several limits on one descriptor, all held, decided together in one store call (not with `rate_limit`)",
    ),
    k(
        Descriptor,
        "descriptors",
        "list of descriptors",
        "none",
        "the next level, matched against the request descriptor's next entry",
    ),
    k(
        Descriptor,
        "shadow_mode",
        "boolean",
        "`false`",
        "`true`: counted, but this descriptor always answers OK",
    ),
    k(
        Descriptor,
        "quota_mode",
        "boolean",
        "`false`",
        "`true`: over the limit only when every quota-mode descriptor of the request is over",
    ),
    k(
        Descriptor,
        "detailed_metric",
        "boolean",
        "`false`",
        "`true`: also counted per runtime value in `tollgate_rule_detailed_*` (up to `metrics.detailed_max_series` values, the rest as `_overflow`)",
    ),
    k(
        Descriptor,
        "value_to_metric",
        "boolean",
        "`false`",
        "`true`: the detailed series name the runtime value where the matched node has none of its own (a key-only node or a wildcard); `detailed_metric` wins when both are set",
    ),
    k(
        Descriptor,
        "share_threshold",
        "boolean",
        "`false`",
        "`true`: every value the wildcard matches counts on one limiter, named by the pattern; on a wildcard value only",
    ),
    k(
        Descriptor,
        "metadata",
        "any mapping",
        "none",
        "shown on `/rlconfig`; with `response_dynamic_metadata`, merged into the answer's `dynamic_metadata` when this descriptor answers OK",
    ),
    k(
        RateLimit,
        "unit",
        "`second`, `minute`, `hour`, `day`, `week`, `month` or `year` (any case)",
        "required, unless `unlimited: true`",
        "the window's unit",
    ),
    k(
        RateLimit,
        "requests_per_unit",
        "whole number from 0 to 4294967295",
        "required, unless `unlimited: true`",
        "hits admitted per window; 0 refuses every request",
    ),
    k(
        RateLimit,
        "unit_multiplier",
        "whole number, at least 1",
        "1",
        "the window is this many units long (a window of at most about 285 years)",
    ),
    k(
        RateLimit,
        "unlimited",
        "boolean",
        "`false`",
        "`true`: never limited (`limit_remaining` 4294967295); no `unit`, `requests_per_unit`, `unit_multiplier` or `timezone` beside it",
    ),
    k(
        RateLimit,
        "name",
        "string",
        "none",
        "reported with the limit, and what `replaces` names",
    ),
    k(
        RateLimit,
        "replaces",
        "list of `{name: ...}`",
        "none",
        "limits of these names are dropped from the same request when this one applies",
    ),
    k(
        RateLimit,
        "algorithm",
        "`fixed_window`, `sliding_window_counter`, `sliding_window_log`, `token_bucket` or `concurrency`",
        "the `default_algorithm` setting; `fixed_window` with `timezone`",
        "how hits are counted",
    ),
    k(
        RateLimit,
        "buckets",
        "whole number from 2 to 60",
        "2",
        "buckets of a `sliding_window_counter` window: more buckets, closer to the exact count",
    ),
    k(
        RateLimit,
        "burst",
        "whole number, from 1 to what the bucket keeps exact",
        "`requests_per_unit`",
        "a `token_bucket`'s size: hits admitted at once after a quiet spell",
    ),
    k(
        RateLimit,
        "shards",
        "whole number from 1 to 64",
        "1",
        "the limit is split over this many sub-limiters (each its own store key, and Redis Cluster slot), each holding a share",
    ),
    k(
        RateLimit,
        "on_store_error",
        "`error`, `allow` or `deny`",
        "the `on_store_error` setting",
        "the answer when the store fails",
    ),
    k(
        RateLimit,
        "usage_reports",
        "boolean",
        "the `usage_reports` setting",
        "`true`: every positive cost is recorded, also past the limit (costs reported after the response); `false`: admitted hits only",
    ),
    k(
        RateLimit,
        "count_refused",
        "boolean",
        "the `count_refused` setting; `true` with `usage_reports: true`",
        "`false`: the limiter is charged only by requests answered OK (a charge another descriptor's refusal made is taken back)",
    ),
    k(
        RateLimit,
        "timezone",
        "an IANA time zone name (`Europe/Berlin`, `UTC`)",
        "none: windows aligned on the epoch",
        "calendar windows: one whole `day`, `week`, `month` or `year` in that zone, on `fixed_window`",
    ),
    k(
        RateLimit,
        "lease",
        "boolean",
        "the `lease` setting, where the limit may be leased",
        "`true`: decided from quota each replica leases from the store, so most hits cost no store call; the limit is never passed",
    ),
    k(
        RateLimit,
        "max_duration",
        "a whole number with its unit: `ms`, `s`, `m` or `h` (such as `500ms` or `30s`), more than 0",
        "required on `concurrency`, refused elsewhere",
        "the longest a request holds its slot: a slot whose release never comes frees itself then",
    ),
    k(
        Replaces,
        "name",
        "string, not empty, not the limit's own name",
        "required",
        "the name of a limit to drop",
    ),
];

/// A combination the loader refuses, shown by the smallest file that
/// holds it.
#[derive(Debug, Clone, Copy)]
pub struct Refused {
    pub what: &'static str,
    pub yaml: &'static str,
}

const fn r(what: &'static str, yaml: &'static str) -> Refused {
    Refused { what, yaml }
}

/// What load refuses beyond a key's own type, with default settings.
pub const REFUSED: &[Refused] = &[
    r(
        "an unknown key",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, units: 2}\n",
    ),
    r("no domain", "descriptors: []\n"),
    r("an empty domain", "domain: \"\"\n"),
    r(
        "a descriptor without key",
        "domain: d\ndescriptors:\n  - value: v\n",
    ),
    r(
        "a key and value defined twice at one level",
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
    ),
    r(
        "`rate_limit` and `rate_limits` together",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits:\n      - {unit: hour, requests_per_unit: 10}\n",
    ),
    r(
        "a limit without `unit`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n",
    ),
    r(
        "a limit without `requests_per_unit`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n",
    ),
    r(
        "`unlimited: true` with a unit",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
    ),
    r(
        "`unit_multiplier: 0`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 0}\n",
    ),
    r(
        "`share_threshold` on a value without `*`",
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n",
    ),
    r(
        "a limit that replaces itself",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n",
    ),
    r(
        "an empty `replaces` name",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 1, replaces: [{name: \"\"}]}\n",
    ),
    r(
        "`buckets` on another algorithm than `sliding_window_counter`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 1, algorithm: fixed_window, buckets: 10}\n",
    ),
    r(
        "`buckets` outside 2 to 60",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, buckets: 61}\n",
    ),
    r(
        "`burst` on another algorithm than `token_bucket`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 5}\n",
    ),
    r(
        "`burst: 0`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 0}\n",
    ),
    r(
        "`shards` outside 1 to 64",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100, shards: 65}\n",
    ),
    r(
        "more `shards` than `requests_per_unit`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2, shards: 4}\n",
    ),
    r(
        "more `shards` than `burst`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 100, algorithm: token_bucket, burst: 2, shards: 4}\n",
    ),
    r(
        "a `sliding_window_log` limit above `max_log_limit`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 20000, algorithm: sliding_window_log}\n",
    ),
    r(
        "`timezone` with `unit_multiplier`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: day, requests_per_unit: 1, unit_multiplier: 2, timezone: UTC}\n",
    ),
    r(
        "`timezone` with another algorithm than `fixed_window`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: day, requests_per_unit: 1, algorithm: token_bucket, timezone: UTC}\n",
    ),
    r(
        "`timezone` with a unit shorter than a day",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, timezone: UTC}\n",
    ),
    r(
        "an unknown `timezone`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, timezone: Mars/Olympus}\n",
    ),
    r(
        "`count_refused: false` with `usage_reports: true`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 1, usage_reports: true, count_refused: false}\n",
    ),
    r(
        "`lease: true` on a calendar window",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 1, timezone: UTC, lease: true}\n",
    ),
    r(
        "`lease: true` with `shards`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 10, algorithm: fixed_window, shards: 2, lease: true}\n",
    ),
    r(
        "`lease: true` with `usage_reports: true`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 1, algorithm: fixed_window, usage_reports: true, lease: true}\n",
    ),
    r(
        "`lease: true` with `count_refused: false`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 1, algorithm: fixed_window, count_refused: false, lease: true}\n",
    ),
    r(
        "`concurrency` without `max_duration`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, algorithm: concurrency}\n",
    ),
    r(
        "`max_duration` on another algorithm than `concurrency`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 5, algorithm: fixed_window, max_duration: 30s}\n",
    ),
    r(
        "`concurrency` with a unit other than `second`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: minute, requests_per_unit: 5, algorithm: concurrency, max_duration: 30s}\n",
    ),
    r(
        "`concurrency` with `unit_multiplier`, `shards` or `usage_reports`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, unit_multiplier: 2, requests_per_unit: 5, algorithm: concurrency, max_duration: 30s}\n",
    ),
    r(
        "`lease: true` on `concurrency`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 5, algorithm: concurrency, max_duration: 30s, lease: true}\n",
    ),
    r(
        "`replaces` naming a `concurrency` limit",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      {unit: second, requests_per_unit: 5, algorithm: concurrency, max_duration: 30s, name: c}\n  - key: p\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: c}]}\n",
    ),
    r(
        "an empty `rate_limits` list",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits: []\n",
    ),
    r(
        "`unlimited` in a `rate_limits` list",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unlimited: true}\n",
    ),
    r(
        "`lease: true` in a `rate_limits` list",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 1, algorithm: fixed_window, lease: true}\n      - {unit: hour, requests_per_unit: 10, algorithm: fixed_window}\n",
    ),
    r(
        "limits of a `rate_limits` list that differ in `shards`, `on_store_error`, `usage_reports` or `count_refused`",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 10, on_store_error: allow}\n      - {unit: hour, requests_per_unit: 100}\n",
    ),
    r(
        "two limits of a `rate_limits` list with the same window and algorithm",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: minute, requests_per_unit: 10}\n      - {unit: second, requests_per_unit: 100, unit_multiplier: 60}\n",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{LoadOptions, load_texts};
    use std::path::PathBuf;

    fn loaded(yaml: &str) -> Result<(), Vec<String>> {
        load_texts(
            vec![(PathBuf::from("x.yaml"), yaml.to_string())],
            &LoadOptions::default(),
        )
        .map(|_| ())
        .map_err(|e| e.0.into_iter().map(|e| e.reason).collect())
    }

    /// The table names exactly the keys the walk accepts, place by place
    /// and in the walk's order, so the reference cannot miss one.
    #[test]
    fn the_table_is_the_keys_the_loader_accepts() {
        let accepted = |place| match place {
            Place::File => super::super::build::ROOT_KEYS,
            Place::Descriptor => super::super::build::DESCRIPTOR_KEYS,
            Place::RateLimit => super::super::build::RATE_LIMIT_KEYS,
            Place::Replaces => super::super::replaces::REPLACES_KEYS,
        };
        for place in Place::ALL {
            let table: Vec<&str> = RULE_KEYS
                .iter()
                .filter(|k| k.place == place)
                .map(|k| k.name)
                .collect();
            assert_eq!(
                table,
                accepted(place),
                "RULE_KEYS and the keys a {} accepts",
                place.as_str()
            );
        }
    }

    /// A key outside the table is refused wherever it is written.
    #[test]
    fn a_key_not_in_the_table_is_refused() {
        for yaml in [
            "domain: d\nlimits: []\n",
            "domain: d\ndescriptors:\n  - key: k\n    limit: 1\n",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, per: 1}\n",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{id: a}]}\n",
        ] {
            let reasons = loaded(yaml).unwrap_err();
            assert!(
                reasons.iter().any(|r| r.starts_with("unknown key")),
                "{yaml}: {reasons:?}"
            );
        }
    }

    /// Every example is refused, for one reason: the reference shows it.
    #[test]
    fn every_refused_example_is_refused_once() {
        for example in REFUSED {
            match loaded(example.yaml) {
                Ok(()) => panic!("{}: loaded\n{}", example.what, example.yaml),
                Err(reasons) => assert_eq!(
                    reasons.len(),
                    1,
                    "{}: {reasons:?}\n{}",
                    example.what,
                    example.yaml
                ),
            }
        }
    }

    /// The file every key of the table can be written in at once (with
    /// a list and a token bucket beside it) loads.
    #[test]
    fn every_key_together_loads() {
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    value: \"v*\"\n    shadow_mode: true\n    quota_mode: false\n    detailed_metric: true\n    value_to_metric: true\n    share_threshold: true\n    metadata: {team: a}\n    rate_limit:\n      unit: day\n      requests_per_unit: 10\n      name: a\n      replaces: [{name: b}]\n      algorithm: fixed_window\n      on_store_error: allow\n      usage_reports: false\n      count_refused: true\n      timezone: UTC\n      lease: false\n    descriptors:\n      - key: c\n        rate_limit: {unit: second, requests_per_unit: 10, unit_multiplier: 2, algorithm: token_bucket, burst: 5, shards: 2}\n      - key: e\n        rate_limit: {unit: second, requests_per_unit: 10, algorithm: sliding_window_counter, buckets: 4}\n      - key: u\n        rate_limit: {unlimited: true}\n      - key: n\n        rate_limit: {unit: second, requests_per_unit: 5, algorithm: concurrency, max_duration: 30s}\n      - key: l\n        rate_limits:\n          - {unit: second, requests_per_unit: 1}\n          - {unit: hour, requests_per_unit: 10}\n";
        assert_eq!(loaded(yaml), Ok(()));
        let written: std::collections::HashSet<&str> = yaml
            .split(['\n', '{', ',', '['])
            .filter_map(|l| l.trim().trim_start_matches("- ").split(':').next())
            .collect();
        for key in RULE_KEYS {
            assert!(
                written.contains(key.name),
                "{} is not in the file",
                key.name
            );
        }
    }
}
