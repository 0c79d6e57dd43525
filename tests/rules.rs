//! Rule files: matching (table-driven, against `valid/matching.yaml`) and
//! validation (one fixture per error under `invalid/`).

use std::path::{Path, PathBuf};

use tollgate::limit::{Algorithm, FailurePolicy, Unit, Window};
use tollgate::rules::{
    Defaults, LimitSpec, LoadOptions, MAX_DEPTH, MAX_DIR_DEPTH, MAX_ENTRIES, Rule, RuleErrors,
    RuleSet, WalkOptions, load_dir, load_texts, parse_file, walk,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rules")
}

fn matching() -> RuleSet {
    load_dir(&fixtures().join("valid"), &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn find<'a>(set: &'a RuleSet, domain: &str, pairs: &[(&str, &str)]) -> Option<&'a Rule> {
    set.find(domain, &entries(pairs))
}

/// What is being shown, the request's entries, the name of the rule expected.
type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    Option<&'static str>,
);

#[test]
fn matching_table() {
    let set = matching();
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ("exact", &[("path", "/exact")], Some("exact")),
        ("wildcard at the end", &[("path", "/api/users")], Some("api_any")),
        ("first wildcard in file order wins", &[("path", "/api/v1/users")], Some("api_any")),
        ("star matches empty", &[("path", "/api/")], Some("api_any")),
        ("wildcard in the middle", &[("path", "/users/42/profile")], Some("user_profile")),
        ("middle star matches empty", &[("path", "/users//profile")], Some("user_profile")),
        ("middle wildcard needs its suffix", &[("path", "/users/42/posts")], Some("path_default")),
        ("wildcard at the start", &[("path", "/img/logo.png")], Some("png")),
        ("start star matches empty", &[("path", ".png")], Some("png")),
        ("several stars", &[("path", "/aXXbYc")], Some("abc")),
        ("several stars, all empty", &[("path", "/abc")], Some("abc")),
        ("exact beats wildcard", &[("path", "/exact")], Some("exact")),
        ("wildcard beats default", &[("path", "/exactly")], Some("exact_prefix")),
        ("default node", &[("path", "/other")], Some("path_default")),
        ("default node, empty value", &[("path", "")], Some("path_default")),
        ("wildcards are per key", &[("host", "example.com")], Some("any_host")),
        ("lone star matches empty", &[("host", "")], Some("any_host")),
        ("unknown key", &[("nope", "x")], None),
        ("nested exact", &[("tenant", "acme"), ("plan", "gold")], Some("acme_gold")),
        ("no backtracking", &[("tenant", "acme"), ("plan", "silver")], None),
        ("nested default", &[("tenant", "other"), ("plan", "silver")], Some("any_tenant_plan")),
        ("shorter request, node with limit", &[("remote_address", "1.2.3.4")], Some("per_ip")),
        ("full depth", &[("remote_address", "1.2.3.4"), ("path", "/x")], Some("per_ip_path")),
        ("longer request", &[("remote_address", "1.2.3.4"), ("path", "/x"), ("m", "GET")], None),
        ("longer than a leaf", &[("path", "/exact"), ("method", "GET")], None),
        ("shorter request, node without limit", &[("database", "users")], None),
        ("full depth, exact", &[("database", "users"), ("op", "read")], Some("users_read")),
        ("child fails", &[("database", "users"), ("op", "write")], None),
        ("longer than the rule path", &[("database", "users"), ("op", "read"), ("x", "y")], None),
        ("whitelist node", &[("client", "internal")], None),
        ("whitelist's default sibling", &[("client", "partner")], Some("client_default")),
        ("whitelist node has no children", &[("client", "internal"), ("path", "/")], None),
        ("empty request", &[], None),
    ];
    for (what, pairs, want) in cases {
        let got = find(&set, "matching", pairs).map(|r| r.name.as_deref().unwrap_or("<unnamed>"));
        assert_eq!(got, *want, "{what}: {pairs:?}");
    }
}

#[test]
fn unknown_domain_matches_nothing() {
    let set = matching();
    assert!(set.has_domain("matching"));
    assert!(!set.has_domain("other"));
    assert_eq!(find(&set, "other", &[("path", "/exact")]), None);
}

#[test]
fn limits_and_flags_are_parsed() {
    let set = matching();

    let ban = find(&set, "matching", &[("banned", "x")]).unwrap();
    assert_eq!(
        ban.limit,
        LimitSpec::PerUnit {
            requests_per_unit: 0,
            window: Unit::Hour.into()
        }
    );

    let trusted = find(&set, "matching", &[("trusted", "x")]).unwrap();
    assert_eq!(trusted.limit, LimitSpec::Unlimited);

    let user = find(&set, "matching", &[("user", "alice")]).unwrap();
    assert_eq!(
        user,
        &Rule {
            limit: LimitSpec::PerUnit {
                requests_per_unit: 100,
                window: Unit::Minute.into()
            },
            name: Some("per_user".into()),
            replaces: vec!["per_ip".into(), "path_default".into()],
            algorithm: Some(Algorithm::SlidingWindowLog),
            buckets: None,
            burst: None,
            max_duration: None,
            shards: None,
            on_store_error: Some(FailurePolicy::Allow),
            usage_reports: Some(true),
            count_refused: true,
            shadow_mode: true,
            quota_mode: true,
            detailed_metric: true,
            value_to_metric: false,
            share_threshold: false,
            metadata: None,
            source: "matching.yaml:81".into(),
            path: "user".into(),
            stats: Default::default(),
            more: Vec::new(),
            lease: None,
        }
    );

    let shout = find(&set, "matching", &[("shout", "x")]).unwrap();
    assert_eq!(
        shout.limit,
        LimitSpec::PerUnit {
            requests_per_unit: 16,
            window: Unit::Second.into()
        }
    );
    assert_eq!(shout.name, None);
    assert_eq!(shout.algorithm, None);
    assert_eq!(shout.on_store_error, None);
    assert!(!shout.shadow_mode && !shout.quota_mode && !shout.detailed_metric);
    assert!(shout.replaces.is_empty());
}

#[test]
fn index_layout() {
    let set = matching();
    let root = &set.domains["matching"].root;
    // In file order.
    let wildcards: Vec<&str> = root.wildcard.iter().map(|n| &*n.value).collect();
    assert_eq!(
        wildcards,
        [
            "/api/*",
            "/api/v1/*",
            "/users/*/profile",
            "*.png",
            "/a*b*c",
            "/exact*",
            "*"
        ]
    );
    assert!(root.default.contains_key("path"));
    assert!(
        root.exact
            .contains_key(&(std::sync::Arc::from("path"), std::sync::Arc::from("/exact")))
    );
    assert_eq!(
        set.domains["matching"].file,
        fixtures().join("valid/matching.yaml")
    );
}

#[test]
fn replaces_without_own_name_is_fine() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: other\n";
    let domain = parse_file(Path::new("d.yaml"), text, &LoadOptions::default()).unwrap();
    let rule = domain.root.default["k"].rule.as_ref().unwrap();
    assert_eq!(rule.name, None);
    assert_eq!(rule.replaces, ["other"]);
}

#[test]
fn examples_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/rules");
    let set = load_dir(&dir, &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(set.has_domain("edge_proxy") && set.has_domain("mongo_cps"));
    let name = |domain: &str, pairs: &[(&str, &str)]| {
        find(&set, domain, pairs).map(|r| r.name.clone().unwrap_or_default())
    };
    let login = [("remote_address", "203.0.113.7"), ("path", "/login/sso")];
    assert_eq!(name("edge_proxy", &login).as_deref(), Some("login_per_ip"));
    let search = [("plan", "enterprise"), ("path", "/v1/orgs/acme/search")];
    assert_eq!(
        name("edge_proxy", &search).as_deref(),
        Some("enterprise_search")
    );
    assert_eq!(
        name("edge_proxy", &[("remote_address_class", "monitoring")]),
        None
    );
    assert_eq!(
        name("mongo_cps", &[("database", "users")]).as_deref(),
        Some("")
    );
    let tenant = find(&set, "edge_proxy", &[("tenant", "megacorp")]).unwrap();
    assert_eq!(tenant.shards, Some(8));
}

#[test]
fn empty_directory_is_an_empty_set() {
    let dir = tempfile::tempdir().unwrap();
    let set = load_dir(dir.path(), &LoadOptions::default()).unwrap();
    assert!(set.is_empty());
}

#[test]
fn missing_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let errors = load_dir(&missing, &LoadOptions::default()).unwrap_err();
    assert_eq!(errors.0.len(), 1);
    assert_eq!(errors.0[0].file, missing);
    assert_eq!(errors.0[0].line, None);
    assert!(errors.to_string().contains("cannot read rule directory"));
}

/// The layout of a Kubernetes ConfigMap volume: `x.yaml -> ..data/x.yaml`,
/// `..data -> ..2026_01_01_00_00_00.123`. Each file must load once.
#[cfg(unix)]
#[test]
fn configmap_mount_layout() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let stamp = dir.path().join("..2026_01_01_00_00_00.123");
    std::fs::create_dir(&stamp).unwrap();
    let rule = |d: &str| format!("domain: {d}\ndescriptors:\n  - key: k\n");
    std::fs::write(stamp.join("one.yaml"), rule("one")).unwrap();
    std::fs::write(stamp.join("two.yml"), rule("two")).unwrap();
    std::fs::write(stamp.join("notes.txt"), "not a rule file").unwrap();
    symlink(&stamp, dir.path().join("..data")).unwrap();
    for name in ["one.yaml", "two.yml", "notes.txt"] {
        symlink(Path::new("..data").join(name), dir.path().join(name)).unwrap();
    }
    // A subdirectory is read too; a hidden file is not.
    std::fs::create_dir(dir.path().join("team")).unwrap();
    std::fs::write(dir.path().join("team/three.yaml"), rule("three")).unwrap();
    std::fs::write(dir.path().join(".hidden.yaml"), "not: valid").unwrap();

    let set = load_dir(dir.path(), &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let mut names: Vec<&str> = set.domains.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["one", "three", "two"]);
}

// ---- Validation: one fixture per error. ----

fn invalid(name: &str) -> PathBuf {
    fixtures().join("invalid").join(name)
}

fn errors_of(name: &str) -> RuleErrors {
    let file = invalid(name);
    let text = std::fs::read_to_string(&file).unwrap();
    match parse_file(&file, &text, &LoadOptions::default()) {
        Ok(domain) => panic!("{name} parsed: {domain:?}"),
        Err(errors) => {
            assert!(!errors.0.is_empty());
            errors
        }
    }
}

/// Asserts that one of the errors of the fixture is on `line`, at `path`,
/// and says `reason`.
#[track_caller]
fn assert_error(name: &str, line: usize, path: &str, reason: &str) {
    let errors = errors_of(name);
    let text = errors.to_string();
    let file_name = Path::new(name).file_name().unwrap().to_string_lossy();
    let want = format!("{file_name}:{line}: ");
    let found = text
        .lines()
        .any(|l| l.contains(&want) && l.contains(reason) && (path.is_empty() || l.contains(path)));
    assert!(found, "expected {want}{path}: ...{reason}... in:\n{text}");
    for e in &errors.0 {
        assert_eq!(e.file, invalid(name));
    }
}

#[test]
fn unknown_key() {
    assert_error(
        "unknown_key.yaml",
        12,
        "descriptors[1].descriptors[0].rate_limit.unti: ",
        "unknown key \"unti\" (allowed: unit, requests_per_unit, unit_multiplier, unlimited, name, replaces, algorithm, buckets, burst, shards, on_store_error, usage_reports, count_refused, timezone, lease, max_duration)",
    );
}

#[test]
fn empty_domain() {
    assert_error("empty_domain.yaml", 2, "domain: ", "empty domain");
}

#[test]
fn missing_domain() {
    assert_error("missing_domain.yaml", 2, "domain: ", "missing domain");
}

#[test]
fn duplicate_domain() {
    let dir = invalid("duplicate_domain");
    let errors = load_dir(&dir, &LoadOptions::default()).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    let e = &errors.0[0];
    assert_eq!(e.file, dir.join("b.yaml"));
    let text = errors.to_string();
    assert!(text.contains("b.yaml:3: domain: "), "{text}");
    assert!(
        text.contains("duplicate domain \"duplicate_domain\""),
        "{text}"
    );
    assert!(text.contains("a.yaml:2"), "{text}");
}

#[test]
fn empty_key() {
    assert_error(
        "empty_key.yaml",
        6,
        "descriptors[0].descriptors[0].key: ",
        "empty key",
    );
}

#[test]
fn missing_key() {
    assert_error("missing_key.yaml", 8, "descriptors[1].key: ", "missing key");
}

#[test]
fn duplicate_key_value() {
    assert_error(
        "duplicate_key_value.yaml",
        14,
        "descriptors[2]: ",
        "duplicate descriptor: key \"database\" with value \"users\" already defined on line 4",
    );
}

#[test]
fn duplicate_default_key() {
    assert_error(
        "duplicate_default_key.yaml",
        10,
        "descriptors[0].descriptors[1]: ",
        "duplicate descriptor: key \"plan\" without value already defined on line 6",
    );
}

#[test]
fn unit_with_unlimited() {
    assert_error(
        "unit_with_unlimited.yaml",
        8,
        "descriptors[0].rate_limit.unit: ",
        "must not be set together with unlimited: true",
    );
}

#[test]
fn requests_per_unit_with_unlimited() {
    assert_error(
        "requests_per_unit_with_unlimited.yaml",
        7,
        "descriptors[0].rate_limit.requests_per_unit: ",
        "must not be set together with unlimited: true",
    );
}

#[test]
fn unknown_unit() {
    assert_error(
        "unknown_unit.yaml",
        7,
        "descriptors[0].rate_limit.unit: ",
        "unknown unit \"fortnight\"",
    );
}

#[test]
fn missing_unit() {
    assert_error(
        "missing_unit.yaml",
        6,
        "descriptors[0].rate_limit.unit: ",
        "missing unit",
    );
}

#[test]
fn missing_requests_per_unit() {
    assert_error(
        "missing_requests_per_unit.yaml",
        6,
        "descriptors[0].rate_limit.requests_per_unit: ",
        "missing requests_per_unit",
    );
}

#[test]
fn empty_replaces() {
    assert_error(
        "empty_replaces.yaml",
        11,
        "descriptors[0].rate_limit.replaces[1].name: ",
        "empty replaces name",
    );
}

#[test]
fn self_replaces() {
    assert_error(
        "self_replaces.yaml",
        10,
        "descriptors[0].rate_limit.replaces[0].name: ",
        "cannot replace itself",
    );
}

#[test]
fn unknown_algorithm() {
    assert_error(
        "unknown_algorithm.yaml",
        8,
        "descriptors[0].rate_limit.algorithm: ",
        "unknown algorithm \"leaky_bucket\"",
    );
}

#[test]
fn log_limit_above_max() {
    assert_error(
        "log_limit_above_max.yaml",
        9,
        "descriptors[0].rate_limit.requests_per_unit: ",
        "sliding_window_log limit 20000 is above max_log_limit 10000 (a log keeps every admitted hit); use algorithm: sliding_window_counter, or raise max_log_limit",
    );
    // With the defaults only the rule naming the log is refused.
    assert_eq!(errors_of("log_limit_above_max.yaml").0.len(), 1);
}

#[test]
fn buckets_out_of_range() {
    assert_error(
        "buckets_out_of_range.yaml",
        9,
        "descriptors[0].rate_limit.buckets: ",
        "buckets must be from 2 to 60, found 1",
    );
    assert_error(
        "buckets_out_of_range.yaml",
        15,
        "descriptors[1].rate_limit.buckets: ",
        "buckets must be from 2 to 60, found 61",
    );
    // 60 is allowed: only the two rules above are refused.
    assert_eq!(errors_of("buckets_out_of_range.yaml").0.len(), 2);
}

#[test]
fn shards_out_of_range() {
    assert_error(
        "shards_out_of_range.yaml",
        9,
        "descriptors[0].rate_limit.shards: ",
        "shards must be from 1 to 64, found 0",
    );
    assert_error(
        "shards_out_of_range.yaml",
        14,
        "descriptors[1].rate_limit.shards: ",
        "shards must be from 1 to 64, found 65",
    );
    assert_error(
        "shards_out_of_range.yaml",
        19,
        "descriptors[2].rate_limit.shards: ",
        "shards (8) must not exceed requests_per_unit (4)",
    );
    // 64 shards of 64, and shards on a ban, are allowed.
    assert_eq!(errors_of("shards_out_of_range.yaml").0.len(), 3);
}

/// A sharded token bucket's burst is split over its shards, each at least
/// 1: more shards than the burst would admit more at once than the burst.
#[test]
fn shards_above_burst() {
    assert_error(
        "shards_above_burst.yaml",
        12,
        "descriptors[0].rate_limit.shards: ",
        "shards (8) must not exceed burst (4)",
    );
    assert_eq!(errors_of("shards_above_burst.yaml").0.len(), 1);
}

/// `buckets` on another algorithm is refused, whether the rule names it or
/// inherits it from `default_algorithm`.
#[test]
fn buckets_without_counter() {
    assert_error(
        "buckets_without_counter.yaml",
        10,
        "descriptors[0].rate_limit.buckets: ",
        "buckets applies only to sliding_window_counter, not fixed_window",
    );
    // With the default (counter) the inherited rule is fine.
    assert_eq!(errors_of("buckets_without_counter.yaml").0.len(), 1);
    let file = invalid("buckets_without_counter.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let log_default = LoadOptions {
        default_algorithm: Algorithm::SlidingWindowLog,
        ..LoadOptions::default()
    };
    let errors = parse_file(&file, &text, &log_default).unwrap_err();
    assert_eq!(errors.0.len(), 2, "{errors}");
    assert_eq!(errors.0[1].line, Some(15));
    assert!(
        errors.0[1].to_string().ends_with(
            "buckets applies only to sliding_window_counter, not sliding_window_log \
             (the default_algorithm, as the rule names none)"
        ),
        "{errors}"
    );
}

#[test]
fn burst_without_bucket() {
    assert_error(
        "burst_without_bucket.yaml",
        10,
        "descriptors[0].rate_limit.burst: ",
        "burst applies only to token_bucket, not fixed_window",
    );
    // The default (counter) refuses the inherited rule too; a token bucket
    // default takes it.
    let errors = errors_of("burst_without_bucket.yaml");
    assert_eq!(errors.0.len(), 2, "{errors}");
    assert_eq!(errors.0[1].line, Some(15));
    assert!(
        errors.0[1].to_string().ends_with(
            "burst applies only to token_bucket, not sliding_window_counter \
             (the default_algorithm, as the rule names none)"
        ),
        "{errors}"
    );
    let file = invalid("burst_without_bucket.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let bucket_default = LoadOptions {
        default_algorithm: Algorithm::TokenBucket,
        ..LoadOptions::default()
    };
    let errors = parse_file(&file, &text, &bucket_default).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert_eq!(errors.0[0].line, Some(10));
}

#[test]
fn burst_out_of_range() {
    assert_error(
        "burst_out_of_range.yaml",
        11,
        "descriptors[0].rate_limit.burst: ",
        "burst must be from 1 to 4294967295 for this rate, found 0",
    );
    assert_error(
        "burst_out_of_range.yaml",
        17,
        "descriptors[1].rate_limit.burst: ",
        "burst must be from 1 to 285 for this rate, found 286",
    );
    assert_error(
        "burst_out_of_range.yaml",
        21,
        "descriptors[2].rate_limit.requests_per_unit: ",
        "needs a burst (default: requests_per_unit) of at most 285",
    );
    assert_eq!(errors_of("burst_out_of_range.yaml").0.len(), 3);
}

/// A token bucket rule with and without its burst.
#[test]
fn burst_reaches_the_rule() {
    let text = "domain: b\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      algorithm: token_bucket\n      burst: 100\n  - key: plain\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      algorithm: token_bucket\n";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.yaml"), text).unwrap();
    let set = load_dir(dir.path(), &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let k = find(&set, "b", &[("k", "x")]).unwrap();
    assert_eq!(
        (k.algorithm, k.burst),
        (Some(Algorithm::TokenBucket), Some(100))
    );
    assert_eq!(find(&set, "b", &[("plain", "x")]).unwrap().burst, None);
}

/// A valid `buckets` reaches the rule; without it the rule says `None` (2).
#[test]
fn buckets_reach_the_rule() {
    let text = "domain: b\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n      buckets: 30\n  - key: plain\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("b.yaml"), text).unwrap();
    let set = load_dir(dir.path(), &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(find(&set, "b", &[("k", "x")]).unwrap().buckets, Some(30));
    assert_eq!(find(&set, "b", &[("plain", "x")]).unwrap().buckets, None);
}

/// A rule without `algorithm` inherits `default_algorithm`, and the cap is
/// the `max_log_limit` given, not a constant.
#[test]
fn log_limit_follows_the_load_options() {
    let file = invalid("log_limit_above_max.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let log_default = LoadOptions {
        default_algorithm: Algorithm::SlidingWindowLog,
        ..LoadOptions::default()
    };
    let errors = parse_file(&file, &text, &log_default).unwrap_err();
    let lines: Vec<String> = errors.0.iter().map(|e| e.to_string()).collect();
    assert_eq!(errors.0.len(), 2, "{lines:#?}");
    assert_eq!(errors.0[0].line, Some(9));
    assert_eq!(errors.0[1].line, Some(14));
    assert_eq!(
        errors.0[1].path,
        "descriptors[1].rate_limit.requests_per_unit"
    );
    assert!(
        lines[1].ends_with(
            "log_limit_above_max.yaml:14: descriptors[1].rate_limit.requests_per_unit: \
             sliding_window_log limit 20000 (the default_algorithm, as the rule names none) \
             is above max_log_limit 10000 (a log keeps every admitted hit); use algorithm: \
             sliding_window_counter, or raise max_log_limit"
        ),
        "{lines:#?}"
    );
    // A raised cap accepts both; the counter was never concerned.
    let raised = LoadOptions {
        max_log_limit: 20_000,
        ..log_default
    };
    let domain = parse_file(&file, &text, &raised).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(domain.root.default.len(), 3);
    let lowered = LoadOptions {
        max_log_limit: 19_999,
        ..LoadOptions::default()
    };
    assert_eq!(parse_file(&file, &text, &lowered).unwrap_err().0.len(), 1);
}

#[test]
fn unknown_on_store_error() {
    assert_error(
        "unknown_on_store_error.yaml",
        8,
        "descriptors[0].rate_limit.on_store_error: ",
        "unknown store error policy \"retry\"",
    );
}

#[test]
fn bad_yaml_syntax() {
    assert_error("bad_yaml_syntax.yaml", 6, "", "invalid YAML");
}

#[test]
fn not_a_number() {
    assert_error(
        "not_a_number.yaml",
        7,
        "descriptors[0].rate_limit.requests_per_unit: ",
        "expected a whole number, found \"lots\"",
    );
}

#[test]
fn negative_number() {
    assert_error(
        "negative_number.yaml",
        7,
        "descriptors[0].rate_limit.requests_per_unit: ",
        "must not be negative",
    );
}

#[test]
fn too_large_number() {
    assert_error(
        "too_large_number.yaml",
        7,
        "descriptors[0].rate_limit.requests_per_unit: ",
        "too large",
    );
}

#[test]
fn zero_unit_multiplier() {
    assert_error(
        "zero_unit_multiplier.yaml",
        8,
        "descriptors[0].rate_limit.unit_multiplier: ",
        "invalid unit multiplier of 0: unit_multiplier must be at least 1",
    );
}

#[test]
fn negative_unit_multiplier() {
    assert_error(
        "negative_unit_multiplier.yaml",
        8,
        "descriptors[0].rate_limit.unit_multiplier: ",
        "must not be negative, found -2",
    );
}

#[test]
fn window_too_long() {
    assert_error(
        "window_too_long.yaml",
        8,
        "descriptors[0].rate_limit.unit_multiplier: ",
        "a window of 300 years (9460800000 seconds) is longer than tollgate counts exactly \
         (9007199254 seconds, about 285 years); use at most unit_multiplier: 285",
    );
}

#[test]
fn unit_multiplier_with_unlimited() {
    assert_error(
        "unit_multiplier_with_unlimited.yaml",
        8,
        "descriptors[0].rate_limit.unit_multiplier: ",
        "unit_multiplier must not be set together with unlimited: true",
    );
}

/// `unit_multiplier` (the reference's key): the window is that many units,
/// in every YAML style; without it, one unit; and it counts on `/rlconfig`'s
/// text as the window it makes.
#[test]
fn unit_multiplier_makes_a_window_of_several_units() {
    let text = "domain: w
descriptors:
  - key: five
    rate_limit:
      unit: minute
      requests_per_unit: 20
      unit_multiplier: 5
  - key: one
    rate_limit:
      unit: minute
      requests_per_unit: 25
  - key: flow
    rate_limit: {unit: SECOND, requests_per_unit: 10, unit_multiplier: \"2\", algorithm: token_bucket}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1, unit_multiplier: 1}
";
    let set = load_texts(
        vec![("w.yaml".into(), text.to_string())],
        &LoadOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let limit = |key: &str| find(&set, "w", &[(key, "x")]).unwrap().limit.clone();
    let five = Window::new(Unit::Minute, 5).unwrap();
    assert_eq!(
        limit("five"),
        LimitSpec::PerUnit {
            requests_per_unit: 20,
            window: five
        }
    );
    assert_eq!(
        (five.unit(), five.multiplier(), five.seconds()),
        (Unit::Minute, 5, 300)
    );
    assert_eq!(
        limit("one"),
        LimitSpec::PerUnit {
            requests_per_unit: 25,
            window: Window::of(Unit::Minute)
        }
    );
    assert_eq!(
        limit("flow"),
        LimitSpec::PerUnit {
            requests_per_unit: 10,
            window: Window::new(Unit::Second, 2).unwrap()
        }
    );
    // An explicit 1 is the unit itself.
    assert_eq!(
        limit("plain"),
        LimitSpec::PerUnit {
            requests_per_unit: 1,
            window: Unit::Hour.into()
        }
    );
    let dump = set.describe(Defaults {
        algorithm: Algorithm::FixedWindow,
        lease: true,
    });
    assert!(dump.contains("20/5 minutes fixed_window"), "{dump}");
    assert!(dump.contains("25/minute fixed_window"), "{dump}");
}

#[test]
fn not_a_bool() {
    assert_error(
        "not_a_bool.yaml",
        5,
        "descriptors[0].shadow_mode: ",
        "expected true or false, found \"maybe\"",
    );
}

#[test]
fn duplicate_yaml_key() {
    assert_error(
        "duplicate_yaml_key.yaml",
        8,
        "",
        "duplicate key \"unit\" (first on line 6)",
    );
}

#[test]
fn empty_file() {
    let errors = errors_of("empty_file.yaml");
    assert_eq!(errors.0.len(), 1);
    assert_eq!(errors.0[0].line, None);
    let text = errors.to_string();
    assert!(text.contains("empty_file.yaml: empty rule file"), "{text}");
    // Truly empty too.
    let errors = parse_file(Path::new("blank.yaml"), "", &LoadOptions::default()).unwrap_err();
    assert!(errors.to_string().contains("empty rule file"));
}

#[test]
fn descriptors_not_a_list() {
    assert_error(
        "descriptors_not_a_list.yaml",
        4,
        "descriptors: ",
        "expected a list of descriptors, found a mapping",
    );
}

#[test]
fn count_refused_not_a_bool() {
    assert_error(
        "count_refused_not_a_bool.yaml",
        8,
        "descriptors[0].rate_limit.count_refused: ",
        "expected true or false, found \"sometimes\"",
    );
    assert_error(
        "count_refused_not_a_bool.yaml",
        13,
        "descriptors[1].rate_limit.count_refused: ",
        "expected a string, found a list",
    );
}

#[test]
fn count_refused_with_usage_reports() {
    assert_error(
        "count_refused_with_usage_reports.yaml",
        10,
        "descriptors[0].rate_limit.count_refused: ",
        "count_refused: false cannot go with usage_reports: true",
    );
}

/// A rule's `count_refused` is its own, else `true` when it takes usage
/// reports, else the setting; `/rlconfig`'s text names it when false.
#[test]
fn count_refused_resolves_with_the_setting() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1, count_refused: false}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 1, count_refused: true}\n  - key: c\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: r\n    rate_limit: {unit: minute, requests_per_unit: 1, usage_reports: true}\n";
    for (setting, c) in [(true, true), (false, false)] {
        let options = LoadOptions {
            count_refused: setting,
            ..LoadOptions::default()
        };
        let set = load_texts(vec![(PathBuf::from("d.yaml"), text.to_string())], &options).unwrap();
        let of = |k: &str| find(&set, "d", &[(k, "x")]).unwrap().count_refused;
        assert_eq!(
            [of("a"), of("b"), of("c"), of("r")],
            [false, true, c, true],
            "setting {setting}"
        );
        let described = set.describe(Defaults {
            algorithm: Algorithm::SlidingWindowCounter,
            lease: true,
        });
        assert!(
            described.contains("d.a: 1/minute sliding_window_counter count_refused=false"),
            "{described}"
        );
        assert!(
            !described.contains("d.b: 1/minute sliding_window_counter count_refused"),
            "{described}"
        );
    }
}

#[test]
fn wrong_type() {
    assert_error(
        "wrong_type.yaml",
        5,
        "descriptors[0].rate_limit: ",
        "expected a rate_limit mapping, found a scalar",
    );
}

#[test]
fn several_errors() {
    let errors = errors_of("several_errors.yaml");
    let lines: Vec<Option<usize>> = errors.0.iter().map(|e| e.line).collect();
    assert_eq!(
        lines,
        [Some(7), Some(13), Some(14), Some(19), Some(24)],
        "{errors}"
    );
    for (line, reason) in [
        (7, "unknown unit"),
        (13, "expected a whole number"),
        (14, "empty key"),
        (19, "unknown key \"colour\""),
        (24, "must not be set together with unlimited"),
    ] {
        assert_error("several_errors.yaml", line, "", reason);
    }
}

// ---- Nesting: bounded before the YAML parser, which recurses, runs. ----

/// `descriptors[0].descriptors[0]...`, `levels` deep.
fn descriptor_path(levels: usize) -> String {
    vec!["descriptors[0]"; levels].join(".")
}

#[test]
fn nested_too_deep() {
    assert_eq!(MAX_DEPTH, 64);
    // The 32nd descriptor, on line 68, is the 65th level.
    assert_error(
        "nested_too_deep.yaml",
        68,
        &format!("{}: ", descriptor_path(32)),
        "nested deeper than 64 levels",
    );
    assert_eq!(errors_of("nested_too_deep.yaml").0.len(), 1);
}

/// Parses `text` (a file nested far too deep) and asserts its one error:
/// on `line`, at `path`, about the depth. Before the bound, the deep block
/// files overflowed the test thread's stack (and so the whole process).
#[track_caller]
fn assert_too_deep(text: &str, line: usize, path: &str) {
    let file = Path::new("deep.yaml");
    let errors = parse_file(file, text, &LoadOptions::default()).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    let e = &errors.0[0];
    assert_eq!(e.file, file);
    assert_eq!(e.line, Some(line), "{errors}");
    assert_eq!(e.path, path, "{errors}");
    assert_eq!(e.reason, "nested deeper than 64 levels");
}

/// A file of `depth` levels of block mappings (the root included), one
/// space of indentation per level.
fn block_mappings(depth: usize) -> String {
    let mut text = String::from("domain: deep\n");
    for level in 0..depth - 1 {
        text.push_str(&" ".repeat(level));
        text.push_str("n:\n");
    }
    text.push_str(&" ".repeat(depth - 1));
    text.push_str("n: end\n");
    text
}

#[test]
fn block_mappings_1500_deep() {
    // Level d starts on line d + 1; the path is every key above level 65.
    assert_too_deep(&block_mappings(1500), 66, &vec!["n"; 64].join("."));
}

#[test]
fn block_mappings_5000_deep() {
    assert_too_deep(&block_mappings(5000), 66, &vec!["n"; 64].join("."));
}

#[test]
fn block_descriptors_1500_deep() {
    // As a rule file nests: a list and a mapping per descriptor.
    let mut text = String::from("domain: deep\ndescriptors:\n");
    for level in 0..750 {
        let indent = " ".repeat(2 + 4 * level);
        text.push_str(&format!(
            "{indent}- key: k{level}\n{indent}  descriptors:\n"
        ));
    }
    assert_too_deep(&text, 3 + 2 * 31, &descriptor_path(32));
}

#[test]
fn compact_lists_5000_deep() {
    let text = format!("domain: deep\ndescriptors: \n{}x\n", "- ".repeat(5000));
    assert_too_deep(&text, 3, &format!("descriptors{}", "[0]".repeat(63)));
}

#[test]
fn flow_lists_5000_deep() {
    let text = format!(
        "domain: deep\ndescriptors: {}{}\n",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    // Past 255 brackets the scanner, which reads them ahead of the parser,
    // stops first: the path is where they begin.
    assert_too_deep(&text, 2, "descriptors[0]");
    let text = format!(
        "domain: deep\ndescriptors: {}{}\n",
        "[".repeat(100),
        "]".repeat(100)
    );
    assert_too_deep(&text, 2, &format!("descriptors{}", "[0]".repeat(63)));
}

#[test]
fn flow_mappings_5000_deep() {
    let text = format!(
        "domain: deep\ndescriptors: {}x{}\n",
        "{a: ".repeat(5000),
        "}".repeat(5000)
    );
    assert_too_deep(
        &text,
        2,
        &format!("descriptors.{}", vec!["a"; 63].join(".")),
    );
}

#[test]
fn mixed_styles_deep() {
    // 20 block mappings, 20 compact lists, then flow mappings and lists.
    let mut text = String::from("domain: deep\n");
    for level in 0..20 {
        text.push_str(&format!("{}m:\n", " ".repeat(level)));
    }
    text.push_str(&" ".repeat(20));
    text.push_str(&"- ".repeat(20));
    text.push_str(&"{f: [".repeat(50));
    text.push_str(&"]}".repeat(50));
    text.push('\n');
    // The root and 19 mappings under it hold the 20 keys `m`, then come 20
    // lists: 40 levels. 24 more are 12 flow pairs, so the 65th is the 13th
    // flow mapping, the first item of the 12th flow list.
    let path = format!(
        "{}{}{}",
        vec!["m"; 20].join("."),
        "[0]".repeat(20),
        ".f[0]".repeat(12)
    );
    assert_too_deep(&text, 22, &path);
}

/// The deepest rule the bound allows loads, matches and is described: 31
/// descriptor levels with a limit on the last is 64 levels exactly.
#[test]
fn deepest_allowed_rule_loads() {
    let mut text = String::from("domain: deep\ndescriptors:\n");
    for level in 0..31 {
        let indent = " ".repeat(2 + 4 * level);
        text.push_str(&format!("{indent}- key: k{level}\n"));
        if level < 30 {
            text.push_str(&format!("{indent}  descriptors:\n"));
        } else {
            text.push_str(&format!(
                "{indent}  rate_limit: {{unit: second, requests_per_unit: 3}}\n"
            ));
        }
    }
    let domain = parse_file(Path::new("deepest.yaml"), &text, &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let set = RuleSet {
        domains: [("deep".to_string(), domain)].into(),
    };
    let keys: Vec<String> = (0..31).map(|l| format!("k{l}")).collect();
    let pairs: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "")).collect();
    let rule = find(&set, "deep", &pairs).expect("the deepest rule matches");
    assert_eq!(
        rule.limit,
        LimitSpec::PerUnit {
            requests_per_unit: 3,
            window: Unit::Second.into()
        }
    );
    assert_eq!(rule.path, keys.join("."));
    assert!(
        set.describe(Defaults {
            algorithm: tollgate::limit::Algorithm::SlidingWindowCounter,
            lease: true,
        })
        .contains(&format!("deep.{}: 3/second", keys.join(".")))
    );

    // One more level (a list under the deepest rule) is refused.
    let one_more = text.replace(
        "rate_limit: {unit: second, requests_per_unit: 3}",
        "rate_limit: {unit: second, requests_per_unit: 3, replaces: [{name: x}]}",
    );
    let errors =
        parse_file(Path::new("deeper.yaml"), &one_more, &LoadOptions::default()).unwrap_err();
    assert!(
        errors.to_string().contains("nested deeper than 64 levels"),
        "{errors}"
    );
}

// ---- Directory walks: each directory once, bounded. ----

/// Two links back to the rules directory and one from a subdirectory up to
/// it: every file loads once, under its real path, and the walk ends.
#[cfg(unix)]
#[test]
fn symlink_loops_are_walked_once() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let rule = |d: &str| format!("domain: {d}\ndescriptors:\n  - key: k\n");
    std::fs::write(dir.path().join("one.yaml"), rule("one")).unwrap();
    std::fs::create_dir(dir.path().join("team")).unwrap();
    std::fs::write(dir.path().join("team/two.yaml"), rule("two")).unwrap();
    symlink(".", dir.path().join("a")).unwrap();
    symlink(".", dir.path().join("b")).unwrap();
    symlink("..", dir.path().join("team/up")).unwrap();

    let set = load_dir(dir.path(), &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let mut names: Vec<&str> = set.domains.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["one", "two"]);
    assert_eq!(set.domains["two"].file, dir.path().join("team/two.yaml"));

    // Following linked directories too (as the reload fingerprint does),
    // each file is still found once, by the first path in name order.
    let all = walk(
        dir.path(),
        WalkOptions {
            hidden: true,
            linked_dirs: true,
        },
    )
    .unwrap();
    let paths: Vec<_> = all.iter().map(|f| f.path.clone()).collect();
    assert_eq!(
        paths,
        [
            dir.path().join("one.yaml"),
            dir.path().join("team/two.yaml")
        ]
    );

    // A linked directory that is not a loop is entered by the fingerprint
    // only (the loader enters real directories, as it always has).
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("three.yaml"), rule("three")).unwrap();
    symlink(outside.path(), dir.path().join("linked")).unwrap();
    let set = load_dir(dir.path(), &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(set.len(), 2);
    let all = walk(
        dir.path(),
        WalkOptions {
            hidden: true,
            linked_dirs: true,
        },
    )
    .unwrap();
    assert!(
        all.iter()
            .any(|f| f.path == dir.path().join("linked/three.yaml"))
    );
}

#[test]
fn directories_nested_too_deep_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut deepest = dir.path().to_path_buf();
    for level in 0..MAX_DIR_DEPTH {
        deepest.push(format!("d{level}"));
    }
    std::fs::create_dir_all(&deepest).unwrap();
    std::fs::write(
        deepest.join("ok.yaml"),
        "domain: ok\ndescriptors:\n  - key: k\n",
    )
    .unwrap();
    let set = load_dir(dir.path(), &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(set.has_domain("ok"));

    std::fs::create_dir(deepest.join("one_more")).unwrap();
    let errors = load_dir(dir.path(), &LoadOptions::default()).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert_eq!(errors.0[0].file, deepest.join("one_more"));
    assert!(
        errors
            .to_string()
            .contains("rule directories nested deeper than 16 levels"),
        "{errors}"
    );
}

#[test]
fn too_many_entries_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    // Hidden entries count: they are read all the same.
    for i in 0..MAX_ENTRIES {
        std::fs::write(dir.path().join(format!(".n{i}")), "").unwrap();
    }
    let set = load_dir(dir.path(), &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(set.is_empty());
    std::fs::write(dir.path().join("one_more.txt"), "").unwrap();
    let errors = load_dir(dir.path(), &LoadOptions::default()).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    assert_eq!(errors.0[0].file, dir.path());
    assert!(
        errors.to_string().contains("more than 10000 entries"),
        "{errors}"
    );
}

#[test]
fn timezone_with_hour() {
    assert_error(
        "timezone_with_hour.yaml",
        9,
        "descriptors[0].rate_limit.timezone: ",
        "timezone applies to calendar units (day, week, month or year), not hour",
    );
}

#[test]
fn timezone_with_unit_multiplier() {
    assert_error(
        "timezone_with_unit_multiplier.yaml",
        9,
        "descriptors[0].rate_limit.timezone: ",
        "unit_multiplier must not be set with it",
    );
}

#[test]
fn timezone_with_algorithm() {
    assert_error(
        "timezone_with_algorithm.yaml",
        9,
        "descriptors[0].rate_limit.timezone: ",
        "timezone applies only to algorithm: fixed_window (calendar windows), not token_bucket",
    );
}

#[test]
fn unknown_timezone() {
    assert_error(
        "unknown_timezone.yaml",
        8,
        "descriptors[0].rate_limit.timezone: ",
        "unknown time zone \"Europe/Berln\"",
    );
}

/// A rule with `timezone` and no algorithm counts in calendar windows
/// whatever the default algorithm; the zone's name is its canonical one.
#[test]
fn timezone_counts_in_calendar_windows_whatever_the_default() {
    let text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, \
                requests_per_unit: 10, timezone: europe/berlin}\n  - key: plain\n    \
                rate_limit: {unit: month, requests_per_unit: 10}\n";
    // Every algorithm settings take as the default (not one that needs a
    // key of its own, as concurrency needs max_duration).
    for default in Algorithm::ALL.into_iter().filter(|a| !a.releases()) {
        let options = LoadOptions {
            default_algorithm: default,
            ..LoadOptions::default()
        };
        let set = load_texts(vec![(PathBuf::from("d.yaml"), text.to_string())], &options)
            .unwrap_or_else(|e| panic!("{e}"));
        let rule = set.find("d", &entries(&[("k", "1")])).unwrap();
        assert_eq!(rule.algorithm, Some(Algorithm::FixedWindow));
        let LimitSpec::PerUnit { window, .. } = rule.limit else {
            panic!("{:?}", rule.limit)
        };
        assert_eq!(window.unit(), Unit::Month);
        assert_eq!(window.zone().map(|z| z.name()), Some("Europe/Berlin"));
        assert_eq!(window.to_string(), "month in Europe/Berlin");
        let plain = set.find("d", &entries(&[("plain", "1")])).unwrap();
        assert_eq!(plain.algorithm, None);
        assert_eq!(
            plain.limit,
            LimitSpec::PerUnit {
                requests_per_unit: 10,
                window: Window::of(Unit::Month)
            }
        );
    }
}

/// Every fixture has a test above, and a directory load reports the errors
/// of every file, not only the first failing one.
#[test]
fn invalid_directory_reports_every_file() {
    let dir = fixtures().join("invalid");
    let errors = load_dir(&dir, &LoadOptions::default()).unwrap_err();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.push(path.join("b.yaml"));
        } else {
            files.push(path);
        }
    }
    for file in files {
        assert!(
            errors.0.iter().any(|e| e.file == file),
            "no error for {}:\n{errors}",
            file.display()
        );
    }
}

/// `rate_limits:` lists: each mistake with its line and path, and a good
/// list beside them loads.
#[test]
fn rate_limits_mistakes() {
    let name = "rate_limits.yaml";
    assert_error(
        name,
        6,
        "descriptors[0].rate_limits: ",
        "rate_limit and rate_limits together",
    );
    assert_error(
        name,
        9,
        "descriptors[1].rate_limits: ",
        "an empty rate_limits list",
    );
    assert_error(
        name,
        11,
        "descriptors[2].rate_limits: ",
        "expected a list of rate limits, found a mapping",
    );
    assert_error(
        name,
        15,
        "descriptors[3].rate_limits[1].unlimited: ",
        "unlimited has no place in a rate_limits list",
    );
    assert_error(
        name,
        19,
        "descriptors[4].rate_limits[1].shards: ",
        "shards must be the same on every limit of a rate_limits list (they are decided together, in one store call): not set here, 4 on the first",
    );
    assert_error(
        name,
        23,
        "descriptors[5].rate_limits[1]: ",
        "this limit counts the same window (60 seconds) with the same algorithm (sliding_window_counter) as limit 0",
    );
    assert_error(
        name,
        27,
        "descriptors[6].rate_limits[1].per: ",
        "unknown key \"per\"",
    );
    assert_error(
        name,
        31,
        "descriptors[7].rate_limits[1].count_refused: ",
        "count_refused must be the same on every limit",
    );
    assert_eq!(errors_of(name).0.len(), 8, "{}", errors_of(name));
}

/// `lease: true` only where its bound holds: each other case with its
/// line and reason.
#[test]
fn lease_where_it_cannot_hold() {
    let name = "lease.yaml";
    assert_error(
        name,
        5,
        "descriptors[0].rate_limit.lease: ",
        "lease: true applies to fixed_window, sliding_window_counter, sliding_window_log, token_bucket only, not concurrency",
    );
    assert_error(
        name,
        7,
        "descriptors[1].rate_limit.lease: ",
        "lease: true cannot go with count_refused: false",
    );
    assert_error(
        name,
        9,
        "descriptors[2].rate_limit.lease: ",
        "a leased limiter needs none",
    );
    assert_error(
        name,
        11,
        "descriptors[3].rate_limit.lease: ",
        "lease: true cannot go with usage_reports: true",
    );
    assert_error(
        name,
        13,
        "descriptors[4].rate_limit.lease: ",
        "does not apply to a calendar window",
    );
    assert_error(
        name,
        16,
        "descriptors[5].rate_limits[0].lease: ",
        "lease: true has no place in a rate_limits list",
    );
    assert_eq!(errors_of(name).0.len(), 6, "{}", errors_of(name));
}
