//! The generated reference pages (`docs/src/reference/`) are what the code
//! writes, and what else restates a setting or a metric agrees with the
//! code: the CLI's flags, the chart's values and their comments, every
//! hand-written table of settings in README.md and docs/, and a live
//! `/metrics`.
//!
//! `scripts/docs` writes the pages again (this test with
//! `TOLLGATE_WRITE_DOCS=1`).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use tollgate::observe::catalog;
use tollgate::settings::table::{self, Kind, SETTINGS};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn generated_pages_are_what_the_code_writes() {
    let dir = root().join(tollgate::reference::DIR);
    let write = std::env::var("TOLLGATE_WRITE_DOCS").is_ok_and(|v| v == "1");
    let mut stale = Vec::new();
    for (name, text) in tollgate::reference::pages() {
        let path = dir.join(name);
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &text).unwrap();
            println!("wrote {} ({} lines)", path.display(), text.lines().count());
            continue;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        if on_disk != text {
            let first = on_disk
                .lines()
                .zip(text.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| on_disk.lines().count().min(text.lines().count()));
            stale.push(format!(
                "{}/{name}: differs from line {} (the code writes {:?})",
                tollgate::reference::DIR,
                first + 1,
                text.lines().nth(first).unwrap_or("<end of page>")
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "generated reference pages are stale; run scripts/docs and commit them:\n{}",
        stale.join("\n")
    );
}

/// The long flags a command's `--help` lists.
fn help_flags(command: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([command, "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{command} --help failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("--"))
        .map(|l| format!("--{}", l.split([' ', '<', '=']).next().unwrap_or("")))
        .collect()
}

/// `settings::table::FLAGS` is what `serve` and `validate` take, and each
/// flag sets its setting: a bad value is reported under the setting's name.
#[test]
fn flags_are_the_clis() {
    // Flags that set no setting.
    let own = ["--config", "--help", "--allow-empty", "--version"];
    for command in ["serve", "validate"] {
        let listed: BTreeSet<String> = help_flags(command)
            .into_iter()
            .filter(|f| !own.contains(&f.as_str()))
            .collect();
        let declared: BTreeSet<String> = table::FLAGS
            .iter()
            .filter(|(_, _, commands)| commands.contains(&command))
            .map(|(_, f, _)| f.to_string())
            .collect();
        assert_eq!(
            listed, declared,
            "`tollgate {command} --help` and settings::table::FLAGS"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    for (setting, flag, commands) in table::FLAGS {
        let declared = table::find(setting).unwrap_or_else(|| panic!("{setting} in FLAGS"));
        // Only values every kind refuses before anything binds.
        let bogus = match declared.kind {
            Kind::Addr | Kind::Choice(_) | Kind::AtLeast(_) => "bogus",
            _ => continue,
        };
        let command = commands[0];
        let mut args = vec![command.to_string(), flag.to_string(), bogus.to_string()];
        if command == "validate" {
            args.push(dir.path().display().to_string());
        }
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("{setting}={bogus} is not valid")),
            "{args:?} should set {setting}: {stderr}"
        );
    }
}

/// The chart's `TOLLGATE_*` variables rendered straight from a value:
/// value path (`tollgate.maxInFlight`) -> setting name.
fn chart_settings() -> BTreeMap<String, &'static str> {
    let deployment = read(&root().join("helm/tollgate/templates/deployment.yaml"));
    let mut out = BTreeMap::new();
    let mut var: Option<String> = None;
    for line in deployment.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("- name: ") {
            var = v.starts_with("TOLLGATE_").then(|| v.to_string());
            continue;
        }
        let (Some(v), Some(expr)) = (var.take(), line.strip_prefix("value: {{ ")) else {
            continue;
        };
        let Some(expr) = expr.strip_suffix(" }}") else {
            continue;
        };
        let first = expr.split(" | ").next().unwrap_or("");
        let first = first
            .strip_prefix("include \"tollgate.str\" ")
            .unwrap_or(first);
        let path = if let Some(p) = first.strip_prefix("$t.") {
            format!("tollgate.{p}")
        } else if let Some(p) = first.strip_prefix("$r.") {
            format!("redis.{p}")
        } else if let Some(p) = first.strip_prefix(".Values.") {
            p.to_string()
        } else {
            continue;
        };
        let setting = SETTINGS
            .iter()
            .find(|s| table::env_name(s.name) == v)
            .unwrap_or_else(|| panic!("the chart sets {v}, which is no setting"));
        out.insert(path, setting.name);
    }
    assert!(out.len() > 15, "only {} chart values found", out.len());
    out
}

/// values.yaml by dotted path: (value text, comment on its line).
fn chart_values() -> BTreeMap<String, (String, String)> {
    let text = read(&root().join("helm/tollgate/values.yaml"));
    let mut out = BTreeMap::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    for line in text.lines() {
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') || body.starts_with('-') {
            continue;
        }
        let indent = line.len() - body.len();
        let Some((key, rest)) = body.split_once(':') else {
            continue;
        };
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let path: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).chain([key]).collect();
        let (value, comment) = match rest.split_once(" #") {
            Some((v, c)) => (v.trim(), c.trim()),
            None => (rest.trim(), ""),
        };
        let value = value.trim_matches('"').to_string();
        out.insert(path.join("."), (value, comment.to_string()));
        stack.push((indent, key.to_string()));
    }
    out
}

/// Where the chart renders a value as a setting, its default is the
/// setting's, and a comment listing the choices lists the setting's.
#[test]
fn chart_values_agree_with_the_settings() {
    let values = chart_values();
    for (path, setting) in chart_settings() {
        let declared = table::find(setting).unwrap();
        let (value, comment) = values
            .get(&path)
            .unwrap_or_else(|| panic!("deployment.yaml renders {path}, which values.yaml lacks"));
        match declared.default {
            None => assert_eq!(
                value, "",
                "values.yaml {path}: {setting} is unset by default"
            ),
            Some(d) => assert_eq!(value, d, "values.yaml {path}: the default of {setting}"),
        }
        if let Kind::Choice(words) = declared.kind
            && comment.contains(" | ")
        {
            let listed: BTreeSet<&str> = comment.split(" | ").map(str::trim).collect();
            let declared: BTreeSet<&str> = words.iter().copied().collect();
            assert_eq!(
                listed, declared,
                "values.yaml {path}: the choices of {setting}"
            );
        }
    }
}

/// Every Markdown file a person writes: README.md and docs/, but not the
/// generated pages.
fn hand_written() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.ends_with(tollgate::reference::DIR) || p.ends_with("book") {
                continue;
            }
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut out = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut out);
    out.sort();
    out
}

/// A table cell's names: `a` / `b` / `TOLLGATE_A` / `--a`, the variables
/// and flags dropped; a bare name after a dotted one is its sibling
/// (`redis.connectTimeoutMs` / `commandTimeoutMs`).
fn names(cell: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in cell.split(" / ") {
        let Some(name) = part
            .trim()
            .strip_prefix('`')
            .and_then(|n| n.split('`').next())
        else {
            continue;
        };
        if name.starts_with("TOLLGATE_") || name.starts_with("--") || name.contains(' ') {
            continue;
        }
        let name = match out.first().and_then(|f| f.rsplit_once('.')) {
            Some((prefix, _)) if !name.contains('.') => format!("{prefix}.{name}"),
            _ => name.to_string(),
        };
        out.push(name);
    }
    out
}

/// Every hand-written table with a `default` column that names settings
/// (first column `setting`) or chart values rendered as settings (first
/// column `value`) gives the declared default: README's and
/// docs/deploy.md's tables, wherever they go, until they link here instead.
#[test]
fn hand_written_tables_agree_with_the_settings() {
    let chart = chart_settings();
    let mut checked = 0;
    for file in hand_written() {
        let text = read(&file);
        let shown = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        let mut namespace = None;
        for (n, line) in text.lines().enumerate() {
            let cells: Vec<&str> = line
                .trim()
                .trim_matches('|')
                .split(" | ")
                .map(str::trim)
                .collect();
            if !line.starts_with('|') {
                namespace = None;
                continue;
            }
            if !line.starts_with("| `") {
                // A header row decides what the table's names are.
                if cells
                    .get(1)
                    .is_some_and(|c| c.eq_ignore_ascii_case("default"))
                {
                    let first = cells[0].to_ascii_lowercase();
                    namespace = if first.starts_with("setting") {
                        Some(false)
                    } else if first.starts_with("value") {
                        Some(true)
                    } else {
                        None
                    };
                }
                continue;
            }
            let (Some(chart_table), Some(default_cell)) = (namespace, cells.get(1)) else {
                continue;
            };
            let names = names(cells[0]);
            let defaults: Vec<&str> = if names.len() > 1 {
                default_cell.split(" / ").collect()
            } else {
                vec![default_cell]
            };
            if defaults.len() != names.len() {
                continue;
            }
            for (name, default) in names.iter().zip(defaults) {
                let setting =
                    if chart_table {
                        chart.get(name).copied()
                    } else {
                        Some(table::find(name).map(|s| s.name).unwrap_or_else(|| {
                            panic!("{shown}:{}: {name:?} is not a setting", n + 1)
                        }))
                    };
                let Some(setting) = setting.and_then(table::find) else {
                    continue;
                };
                let written = default.split('`').nth(1).unwrap_or(default.trim());
                let unset =
                    ["unset", "none", "\"\"", ""].contains(&written) || written.starts_with("as ");
                match setting.default {
                    Some(d) if !unset => assert_eq!(
                        written,
                        d,
                        "{shown}:{}: the default of {} (run scripts/docs, or link to the reference)",
                        n + 1,
                        setting.name
                    ),
                    None => assert!(
                        unset,
                        "{shown}:{}: {} is unset by default",
                        n + 1,
                        setting.name
                    ),
                    Some(_) => {}
                }
                checked += 1;
            }
        }
    }
    println!("{checked} hand-written defaults checked");
}

/// `/metrics` of a running server (rules with detailed series and a
/// lease, a refused call) has no family the catalog lacks, each with the
/// catalog's type, description and labels.
#[tokio::test]
async fn live_metrics_are_in_the_catalog() {
    use support::tollgate::{Tollgate, descriptor};
    let rules = "domain: ref\ndescriptors:\n  - key: tenant\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 1, algorithm: fixed_window}\n  - key: leased\n    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window, lease: true}\n";
    let t = Tollgate::start(&[("ref.yaml", rules)], &[]).await;
    for entries in [[("tenant", "a")], [("tenant", "a")], [("leased", "x")]] {
        t.ask(
            envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
                domain: "ref".into(),
                descriptors: vec![descriptor(&entries)],
                hits_addend: 0,
            },
        )
        .await;
    }
    let (status, body) = support::http_get(t.http, "/metrics").await;
    assert_eq!(status, 200);
    let all = catalog::metrics();
    let by_name: BTreeMap<String, &catalog::Metric> =
        all.iter().map(|m| (m.prometheus_name(), m)).collect();
    let mut families = BTreeMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            let m = by_name
                .get(name)
                .unwrap_or_else(|| panic!("{name} is on /metrics but not in observe::catalog"));
            assert_eq!(kind, m.instrument.as_str(), "the type of {name}");
            families.insert(name.to_string(), *m);
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            if let Some(m) = by_name.get(name) {
                assert_eq!(help, m.meaning, "the description of {name}");
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let series = line.split(' ').next().unwrap();
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| families.contains_key(*f)))
                .unwrap_or(name);
            let m = families
                .get(family)
                .unwrap_or_else(|| panic!("a series of an unknown family: {line}"));
            for label in labels
                .trim_end_matches('}')
                .split(',')
                .filter(|l| !l.is_empty())
            {
                let label = label.split('=').next().unwrap();
                assert!(
                    label == "le" || m.labels.contains(&label),
                    "{family} has label {label}, which the catalog does not list"
                );
            }
        }
    }
    for expected in [
        "tollgate_rule_hits_total",
        "tollgate_rule_detailed_hits_total",
        "tollgate_request_duration_seconds",
        "tollgate_lease_taken_total",
    ] {
        assert!(
            families.contains_key(expected),
            "{expected} is not on /metrics:\n{body}"
        );
    }
    println!(
        "{} families on /metrics, all in the catalog",
        families.len()
    );
    t.stop().await;
}
