//! A newcomer's first steps, run as the docs write them: the book's "One
//! machine" page (`serve`, `check` four times, `validate`, the metrics
//! loop, `POST /json`; README's quick start is the same two commands),
//! its "Reset" page, its Envoy walkthrough and its plain gRPC client, in
//! the order written, each compared with the output the docs show. The commands are
//! read from the Markdown itself, so an edit that no longer runs, or that
//! prints something else, fails here. Only the addresses change: every
//! server listens on free loopback ports, and `cargo run --` /
//! `target/release/tollgate` run the binary under test (release builds stay
//! out of the test path).
//!
//! Then what a newcomer meets when something is off: a mistyped domain or
//! directory, a cost above the limit, a mistyped variable, a port in use,
//! nothing listening.

#[path = "support/markdown.rs"]
mod markdown;
mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use support::free_port;
use support::process::{Proc, tollgate_bin};

/// The pages whose commands run here.
const ONE_MACHINE: &str = "docs/src/start/one-machine.md";
const RESET: &str = "docs/src/rules/reset.md";
const GRPC_CLIENTS: &str = "docs/src/start/grpc-clients.md";
const ENVOY: &str = "docs/src/start/envoy.md";

/// The first block (from `from` on) whose body starts with `start`, its
/// index, and the block after it (the output the docs show).
fn block(blocks: &[(String, String)], from: usize, start: &str) -> (usize, String, String) {
    let i = (from..blocks.len())
        .find(|&i| blocks[i].1.starts_with(start))
        .unwrap_or_else(|| panic!("no block starting with {start:?} after block {from}"));
    let next = blocks.get(i + 1).map(|b| b.1.clone()).unwrap_or_default();
    (i, blocks[i].1.clone(), next)
}

/// Addresses the docs use, and the free ones the test uses instead.
struct Ports {
    swaps: Vec<(String, String)>,
    grpc: String,
}

impl Ports {
    fn rewrite(&self, text: &str) -> String {
        let mut text = text.to_string();
        for (from, to) in &self.swaps {
            text = text.replace(from.as_str(), to);
        }
        text
    }
}

/// Runs documented shell lines with `sh`: `cargo run [-q] -- ARGS` and
/// `tollgate ARGS` run the binary under test, and `check` goes to the
/// quick start's server (the docs use its default address).
fn sh(script: &str, ports: &Ports) -> Output {
    let prelude = r#"
cargo() {
  case "$1" in run) shift ;; *) echo "unexpected: cargo $*" >&2; return 99 ;; esac
  while [ "$1" != "--" ]; do shift; done
  shift
  tollgate "$@"
}
tollgate() {
  if [ "$1" = check ]; then shift; "$TOLLGATE_BIN" check --addr "$TOLLGATE_TEST_GRPC" "$@"
  else "$TOLLGATE_BIN" "$@"; fi
}
"#;
    let script = ports
        .rewrite(script)
        .replace("target/release/tollgate", "tollgate");
    Command::new("sh")
        .arg("-c")
        .arg(format!("{prelude}\n{script}"))
        .env("TOLLGATE_BIN", tollgate_bin())
        .env("TOLLGATE_TEST_GRPC", &ports.grpc)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn show(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}stderr:\n{}",
        o.status.code(),
        stdout(o),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The serve command of a doc line (`[VAR=value ...] tollgate serve ARGS`,
/// `cargo run -- serve ARGS`, a trailing `&`), started on free ports.
fn spawn_documented(line: &str, ports: &Ports, env: &[(&str, &str)]) -> Proc {
    let line = ports.rewrite(line);
    let mut words: Vec<&str> = line.split_whitespace().filter(|w| *w != "&").collect();
    let mut vars: Vec<(String, String)> = Vec::new();
    while let Some((k, v)) = words.first().and_then(|w| w.split_once('=')) {
        vars.push((k.to_string(), v.to_string()));
        words.remove(0);
    }
    let args: Vec<&str> = match words.as_slice() {
        ["cargo", "run", "--", rest @ ..] => rest.to_vec(),
        ["target/release/tollgate" | "tollgate", rest @ ..] => rest.to_vec(),
        other => panic!("not a serve command: {other:?}"),
    };
    assert_eq!(args.first(), Some(&"serve"), "{line}");
    let mut all: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    all.extend_from_slice(env);
    let p = Proc::spawn(&args, &all);
    p.wait_for_line("gRPC listening", Duration::from_secs(30));
    p
}

/// The book's first page, top to bottom, then its reset page; README's
/// quick start is the page's first two commands and the answer shown.
#[test]
fn first_steps_run_as_written() {
    let page = std::fs::read_to_string(ONE_MACHINE).unwrap();
    let reset = std::fs::read_to_string(RESET).unwrap();
    let mut blocks = markdown::fenced(&page, false);
    let readme = markdown::fenced(&std::fs::read_to_string("README.md").unwrap(), false);
    for start in [
        "cargo run -- serve --rules examples/rules",
        "cargo run -- check --domain demo",
    ] {
        let (_, ours, shown) = block(&blocks, 0, start);
        let (_, theirs, theirs_shown) = block(&readme, 0, start);
        assert_eq!(
            (theirs, theirs_shown),
            (ours, shown),
            "README's quick start differs from {ONE_MACHINE}"
        );
    }
    blocks.extend(markdown::fenced(&reset, false));
    let (grpc, http, debug) = (free_port(), free_port(), free_port());
    let ports = Ports {
        swaps: vec![
            ("localhost:8080".into(), format!("127.0.0.1:{http}")),
            ("localhost:6070".into(), format!("127.0.0.1:{debug}")),
        ],
        grpc: format!("127.0.0.1:{grpc}"),
    };

    // Quick start: the server, on the example rules.
    let (at, serve, _) = block(&blocks, 0, "cargo run -- serve --rules examples/rules");
    assert_eq!(serve.trim(), "cargo run -- serve --rules examples/rules");
    let (g, h, d) = (
        format!("127.0.0.1:{grpc}"),
        format!("127.0.0.1:{http}"),
        format!("127.0.0.1:{debug}"),
    );
    let server = spawn_documented(
        serve.trim(),
        &ports,
        &[
            ("TOLLGATE_GRPC_ADDR", &g),
            ("TOLLGATE_HTTP_ADDR", &h),
            ("TOLLGATE_DEBUG_ADDR", &d),
        ],
    );

    // `check`, and the answer shown; three more make the fourth refused.
    let (at, check, shown) = block(&blocks, at, "cargo run -- check --domain demo");
    let first = sh(&check, &ports);
    assert_eq!(first.status.code(), Some(0), "{}", show(&first));
    assert_eq!(stdout(&first), shown, "the check answer shown");
    sh(&check, &ports);
    sh(&check, &ports);
    let fourth = sh(&check, &ports);
    assert_eq!(fourth.status.code(), Some(2), "{}", show(&fourth));
    let out = stdout(&fourth);
    assert!(
        out.starts_with("overall: OVER_LIMIT\n") && out.contains(" remaining=0 reset="),
        "{out}"
    );

    // `validate`, and what it prints.
    let (at, validate, shown) = block(&blocks, at, "cargo run -- validate examples/rules");
    let o = sh(&validate, &ports);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o), shown, "the validate output shown");

    // Metrics: the loop refuses, and the rule's refusals are counted.
    let (at, metrics, _) = block(&blocks, at, "for i in 1 2 3 4; do cargo run -q -- check");
    let o = sh(&metrics, &ports);
    let out = stdout(&o);
    let refused = out
        .lines()
        .find(|l| l.starts_with("tollgate_rule_over_limit_total{"))
        .unwrap_or_else(|| panic!("no over-limit count in:\n{}", show(&o)));
    let count: f64 = refused.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(count >= 4.0, "{refused}");

    // POST /json: the answer shown (the quick start's limit is spent by
    // now, so the example asks another).
    let (_, json, shown) = block(&blocks, at, "curl -s localhost:8080/json");
    let o = sh(&json, &ports);
    let got: serde_json::Value =
        serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}: {}", show(&o)));
    let want: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(got, want, "the POST /json answer shown");

    // Resetting a limiter: the quick start's is spent by the checks above;
    // the reset page's curl resets it (the answer shown), and so does its
    // command line.
    let spent = sh(&check, &ports);
    assert_eq!(spent.status.code(), Some(2), "{}", show(&spent));
    let (_, reset, shown) = block(&blocks, 0, "curl -s localhost:6070/reset");
    let o = sh(&reset, &ports);
    let got: serde_json::Value =
        serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| panic!("{e}: {}", show(&o)));
    let want: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(got, want, "the POST /reset answer shown");
    for _ in 0..3 {
        let o = sh(&check, &ports);
        assert_eq!(o.status.code(), Some(0), "after the reset: {}", show(&o));
    }
    let (_, cli, shown) = block(&blocks, 0, "cargo run -- reset --addr");
    let o = sh(&cli, &ports);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o), shown, "the tollgate reset output shown");
    let o = sh(&check, &ports);
    assert_eq!(
        o.status.code(),
        Some(0),
        "after the CLI's reset: {}",
        show(&o)
    );
    drop(server);
}

/// The book's "Plain gRPC clients" page: the quota job against its own
/// server.
#[test]
fn grpc_client_example_runs_as_written() {
    let python = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .output();
    assert!(
        python.is_ok_and(|o| o.status.success()),
        "Python 3 with grpcio and grpcio-tools is needed (scripts/test installs them)"
    );
    let section = std::fs::read_to_string(GRPC_CLIENTS).unwrap();
    let blocks = markdown::fenced(&section, false);
    let (_, run, shown) = block(&blocks, 0, "cargo build --release");
    let (grpc, http) = (free_port(), free_port());
    let ports = Ports {
        swaps: vec![
            ("127.0.0.1:18081".into(), format!("127.0.0.1:{grpc}")),
            ("127.0.0.1:18080".into(), format!("127.0.0.1:{http}")),
        ],
        grpc: format!("127.0.0.1:{grpc}"),
    };
    // Lines joined at `\`, then: setup (already done by the test's build
    // and checked above), the server, the job, the server's end.
    let lines: Vec<String> = run
        .replace("\\\n", " ")
        .lines()
        .map(|l| l.split(" # ").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let mut server = None;
    let mut job = None;
    for line in &lines {
        if line.starts_with("cargo build") || line.contains("venv") || line.contains("pip") {
            continue;
        } else if line.ends_with('&') {
            server = Some(spawn_documented(line, &ports, &[]));
        } else if line.starts_with("python3 ") {
            job = Some(sh(line, &ports));
        } else if line == "kill $!" {
            drop(server.take().expect("a server to stop"));
        } else {
            panic!("a line the test does not know: {line}");
        }
    }
    let job = job.expect("the job's line");
    assert_eq!(job.status.code(), Some(0), "{}", show(&job));
    // Until the first wait, exactly as shown; then the waits, and what is
    // left after them, depend on when each call was made (a busy machine
    // spreads them): every call still happens, in order, and every wait is
    // within the window.
    let got = stdout(&job);
    let got: Vec<&str> = got.lines().collect();
    let shown: Vec<&str> = shown.lines().collect();
    let first_wait = shown
        .iter()
        .position(|l| l.starts_with("over budget; waiting "))
        .expect("the docs show a wait");
    assert_eq!(got[..first_wait], shown[..first_wait], "{got:#?}");
    let mut calls = 0;
    let mut waits = 0;
    for line in &got {
        if let Some(wait) = line.strip_prefix("over budget; waiting ") {
            // Printed to the millisecond: a call that lands within half
            // a millisecond of the window's end (a busy machine spreads
            // the calls) prints 0.000.
            let secs: f64 = wait.trim_end_matches('s').parse().unwrap();
            assert!((0.0..=1.0).contains(&secs), "{line}");
            waits += 1;
        } else {
            calls += 1;
            let remaining = line
                .strip_prefix(&format!("call {calls}: spent 30, remaining "))
                .unwrap_or_else(|| panic!("{got:#?}"));
            // The range the page gives.
            assert!(
                ["70", "40", "10"].contains(&remaining),
                "{remaining}: {got:#?}"
            );
        }
    }
    assert_eq!(calls, 5, "{got:#?}");
    assert!((1..=2).contains(&waits), "one or two waits: {got:#?}");
}

fn tollgate(args: &[&str]) -> Output {
    Command::new(tollgate_bin())
        .args(args)
        .env_clear()
        .output()
        .unwrap()
}

/// The quota job stops with a clear line where it used to loop or
/// succeed with no limit applied.
#[test]
fn quota_job_refuses_what_can_never_pass() {
    let grpc = free_port();
    let g = format!("127.0.0.1:{grpc}");
    let h = format!("127.0.0.1:{}", free_port());
    let _server = spawn_documented(
        "tollgate serve --rules examples/client/rules",
        &Ports {
            swaps: vec![],
            grpc: g.clone(),
        },
        &[("TOLLGATE_GRPC_ADDR", &g), ("TOLLGATE_HTTP_ADDR", &h)],
    );
    let job = |extra: &[&str]| {
        let mut args = vec!["examples/client/quota_job.py", "--addr", &g];
        args.extend_from_slice(extra);
        Command::new("python3").args(&args).output().unwrap()
    };
    let o = job(&["--calls", "1", "--cost", "150"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("a call costs 150 but the whole budget is 100 per second: it can never pass"),
        "{}",
        show(&o)
    );
    let o = job(&["--calls", "1", "--domain", "upstream_quotas"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(&format!(
            "the server at {g} has no rules for domain 'upstream_quotas': no budget applies"
        )),
        "{}",
        show(&o)
    );
    let o = job(&["--calls", "1", "--api", "other"]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("no rule of domain 'upstream_quota' limits upstream_api=other"),
        "{}",
        show(&o)
    );
}

/// `check`: a domain without rules is named, and each outcome has its
/// exit code; a refused connection reads once.
#[test]
fn check_says_what_it_found() {
    let g = format!("127.0.0.1:{}", free_port());
    let h = format!("127.0.0.1:{}", free_port());
    let _server = spawn_documented(
        "tollgate serve --rules examples/rules",
        &Ports {
            swaps: vec![],
            grpc: g.clone(),
        },
        &[("TOLLGATE_GRPC_ADDR", &g), ("TOLLGATE_HTTP_ADDR", &h)],
    );
    let o = tollgate(&[
        "check",
        "--addr",
        &g,
        "--domain",
        "dmeo",
        "--descriptor",
        "algorithm=log",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", show(&o));
    assert_eq!(
        stdout(&o),
        "overall: OK\ndescriptor 0 [algorithm=log]: OK no limit\n\
         note: the server has no rules for domain \"dmeo\": every descriptor is OK with no limit\n"
    );
    // A known domain with no matching rule is a plain OK.
    let o = tollgate(&[
        "check",
        "--addr",
        &g,
        "--domain",
        "demo",
        "--descriptor",
        "algorithm=none",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        stdout(&o),
        "overall: OK\ndescriptor 0 [algorithm=none]: OK no limit\n"
    );

    let closed = format!("127.0.0.1:{}", free_port());
    let o = tollgate(&[
        "check",
        "--addr",
        &closed,
        "--domain",
        "demo",
        "--descriptor",
        "a=b",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("tollgate check: connecting to {closed}: ")),
        "{err}"
    );
    assert_eq!(err.matches("tcp connect error").count(), 1, "{err}");
    let o = tollgate(&["check", "--domain", "demo", "--descriptor", "novalue"]);
    assert_eq!(o.status.code(), Some(64), "{}", show(&o));
}

/// `validate`: a directory with no rule file is an error unless meant.
#[test]
fn validate_refuses_a_directory_without_rules() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let o = tollgate(&["validate", path]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        format!(
            "{path}: no rule file (*.yaml, *.yml) found; give --allow-empty if that is intended\n"
        )
    );
    let o = tollgate(&["validate", "--allow-empty", path]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(stdout(&o), format!("{path}: 0 domain(s) valid: \n"));
    let missing = dir.path().join("nowhere");
    let o = tollgate(&["validate", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(!Path::new(&missing).exists());
}

/// `serve --help` lists every setting with its variable; `-h` points there.
#[test]
fn serve_help_lists_every_setting() {
    let o = tollgate(&["serve", "--help"]);
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    let help = stdout(&o);
    for s in tollgate::settings::table::SETTINGS {
        let line = format!("  {} ({})", s.name, tollgate::settings::env_name(s.name));
        assert!(help.contains(&line), "{line:?} missing from:\n{help}");
    }
    let short = stdout(&tollgate(&["serve", "-h"]));
    assert!(
        short.contains("TOLLGATE_* variable and default: --help"),
        "{short}"
    );
}

/// A mistyped variable is answered with the nearest setting; a startup
/// error is printed once.
#[test]
fn startup_messages_are_said_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let http = format!("127.0.0.1:{}", free_port());
    let mut p = Proc::spawn(
        &["serve"],
        &[
            ("TOLLGATE_GRPC_ADDR", &addr),
            ("TOLLGATE_HTTP_ADDR", &http),
            ("TOLLGATE_GRPC_PORTT", "9000"),
        ],
    );
    let status = p.child.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    std::thread::sleep(Duration::from_millis(200));
    let lines = p.lines();
    let warning = lines
        .iter()
        .find(|l| l.contains("TOLLGATE_GRPC_PORTT"))
        .unwrap_or_else(|| panic!("{lines:#?}"));
    assert!(
        warning.contains(
            "TOLLGATE_GRPC_PORTT is not a tollgate setting; ignored (did you mean TOLLGATE_GRPC_ADDR?)"
        ),
        "{warning}"
    );
    let errors: Vec<&String> = lines.iter().filter(|l| l.contains(&addr)).collect();
    assert_eq!(errors.len(), 1, "{lines:#?}");
    assert!(errors[0].contains("ERROR"), "{lines:#?}");
}

/// Every command-line mistake is a usage error, exit 64 (EX_USAGE), for
/// every subcommand: never `check`'s 2, which means OVER_LIMIT.
#[test]
fn usage_errors_exit_64() {
    for args in [
        &[
            "check",
            "--domain",
            "demo",
            "--descriptor",
            "a=b",
            "--hits",
            "abc",
        ][..],
        &["check", "--descriptor", "a=b"],
        &["check", "--domian", "demo", "--descriptor", "a=b"],
        &["check", "--domain", "demo", "--descriptor", "novalue"],
        &["validate"],
        &["validate", "--bogus", "examples/rules"],
        &["serve", "--grpc-port", "9000"],
        &["bench", "--bogus"],
        &["simulate", "--bogus"],
        &["reset", "--domain", "demo"],
        &["reset", "--domain", "demo", "--descriptor", "novalue"],
        &["nosuchcommand"],
    ] {
        let o = tollgate(args);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", show(&o));
        assert!(!o.stderr.is_empty(), "{args:?}: says why");
    }
    for args in [&["--help"][..], &["check", "--help"], &["--version"]] {
        let o = tollgate(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", show(&o));
    }
}

/// `validate` reads settings as `serve` does, and says so when a
/// `TOLLGATE_*` variable is no setting, with the nearest one.
#[test]
fn validate_warns_of_a_mistyped_variable() {
    let o = Command::new(tollgate_bin())
        .args(["validate", "examples/rules"])
        .env_clear()
        .env("TOLLGATE_GRPC_PORTT", "9000")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", show(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "warning: TOLLGATE_GRPC_PORTT is not a tollgate setting; ignored (did you mean TOLLGATE_GRPC_ADDR?)\n"
    );
}

/// Two servers on one host: `--debug-addr` moves (or turns off) the debug
/// listener, which would otherwise collide on 127.0.0.1:6070.
#[test]
fn two_servers_on_one_host_with_debug_addr() {
    let port = || format!("127.0.0.1:{}", free_port());
    let (debug_a, debug_b) = (port(), port());
    let mut servers = Vec::new();
    for debug in [debug_a.as_str(), debug_b.as_str(), "off"] {
        let (g, h) = (port(), port());
        let p = Proc::spawn(
            &[
                "serve",
                "--rules",
                "examples/rules",
                "--grpc-addr",
                &g,
                "--http-addr",
                &h,
                "--debug-addr",
                debug,
            ],
            &[],
        );
        p.wait_for_line("gRPC listening", Duration::from_secs(30));
        servers.push(p);
    }
    for debug in [&debug_a, &debug_b] {
        let o = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
            .arg(format!("http://{debug}/rlconfig"))
            .output()
            .unwrap();
        assert_eq!(stdout(&o), "200", "{debug}: {}", show(&o));
    }
}

/// The book's Envoy page, its walkthrough: tollgate, the stand-in upstream
/// and a real Envoy 1.40 with the example bootstrap (its ports moved to
/// free ones), then the documented requests, each compared with the output
/// shown.
#[test]
fn envoy_walkthrough_runs_through_envoy() {
    let page = std::fs::read_to_string(ENVOY).unwrap();
    let section = page
        .split_once("## Try it through Envoy on one machine")
        .unwrap()
        .1
        .split_once("\n## ")
        .unwrap()
        .0;
    let blocks = markdown::fenced(section, false);
    let (at, run, shown) = block(&blocks, 0, "cargo build --release");
    let (grpc, http, upstream, listener, admin) = (
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    );
    let ports = Ports {
        swaps: vec![
            ("localhost:10000".into(), format!("127.0.0.1:{listener}")),
            ("upstream.py 8000".into(), format!("upstream.py {upstream}")),
        ],
        grpc: format!("127.0.0.1:{grpc}"),
    };
    let lines: Vec<String> = run
        .split("\nfor ")
        .next()
        .unwrap()
        .lines()
        .map(|l| l.split(" # ").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let mut server = None;
    let mut stand_in = None;
    let mut envoy = None;
    for line in &lines {
        if line.starts_with("cargo build") {
            continue;
        } else if line.contains("tollgate serve") {
            let (g, h) = (format!("127.0.0.1:{grpc}"), format!("127.0.0.1:{http}"));
            server = Some(spawn_documented(
                line,
                &ports,
                &[("TOLLGATE_GRPC_ADDR", &g), ("TOLLGATE_HTTP_ADDR", &h)],
            ));
        } else if line.starts_with("python3 examples/envoy/upstream.py") {
            let line = ports.rewrite(line);
            let words: Vec<&str> = line.split_whitespace().filter(|w| *w != "&").collect();
            stand_in = Some(ChildGuard(
                Command::new(words[0]).args(&words[1..]).spawn().unwrap(),
            ));
        } else if line == "envoy -c examples/envoy/envoy.yaml &" {
            let config = support::envoy::rewrite_ports(
                &std::fs::read_to_string("examples/envoy/envoy.yaml").unwrap(),
                &[
                    (9901, admin),
                    (10000, listener),
                    (8000, upstream),
                    (8081, grpc),
                ],
            );
            envoy = Some(support::envoy::Envoy::start(
                &config,
                std::net::SocketAddr::from(([127, 0, 0, 1], admin)),
            ));
        } else {
            panic!("a line the test does not know: {line}");
        }
    }
    assert!(server.is_some() && stand_in.is_some() && envoy.is_some());
    support::redis::wait_until("the upstream listens", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", upstream)).is_ok()
    });
    let searches = format!("for {}", run.split_once("\nfor ").unwrap().1);
    let o = sh(&searches, &ports);
    assert_eq!(stdout(&o), shown, "the three searches: {}", show(&o));
    let (_, headers, shown) = block(&blocks, at + 1, "curl -s -D -");
    let o = sh(&headers, &ports);
    assert_eq!(stdout(&o), shown, "the headers: {}", show(&o));
}

/// A child process killed when the test ends, however it ends.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
