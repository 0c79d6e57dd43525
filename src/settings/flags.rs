//! The command-line flags that stand for settings, beside the settings
//! table (`table.rs`) they name.

/// The command-line flags that set a setting: (setting, flag, the
/// commands that take it). `src/cmd/cli.rs` declares them; a test holds
/// this list to their `--help`.
pub const FLAGS: &[(&str, &str, &[&str])] = &[
    ("grpc_addr", "--grpc-addr", &["serve"]),
    ("http_addr", "--http-addr", &["serve"]),
    ("debug_addr", "--debug-addr", &["serve"]),
    ("rules_dir", "--rules", &["serve"]),
    (
        "default_algorithm",
        "--default-algorithm",
        &["serve", "validate"],
    ),
    ("max_log_limit", "--max-log-limit", &["validate"]),
    ("store", "--store", &["serve"]),
];

/// The flag that sets `name`, if one does.
pub fn flag(name: &str) -> Option<&'static str> {
    FLAGS
        .iter()
        .find(|(s, _, _)| *s == name)
        .map(|(_, f, _)| *f)
}
