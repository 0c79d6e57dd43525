//! The real `tollgate` binary as a child process, with exactly the
//! environment given (nothing inherited), its output lines collected, killed
//! on drop.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub fn tollgate_bin() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_tollgate"))
}

pub struct Proc {
    pub child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    /// Runs `tollgate <args>` with only `env` in its environment, and a
    /// debug listener on a free port unless `env` names one: tests run
    /// side by side, and the default debug port is fixed.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Proc {
        let mut command = Command::new(tollgate_bin());
        command.args(args);
        Proc::spawn_command(command, env)
    }

    /// As `spawn`, with the open-file limit (`ulimit -n`) set to `files`.
    pub fn spawn_with_open_files(args: &[&str], env: &[(&str, &str)], files: u32) -> Proc {
        let mut command = Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(format!("ulimit -n {files} && exec \"$0\" \"$@\""))
            .arg(tollgate_bin())
            .args(args);
        Proc::spawn_command(command, env)
    }

    fn spawn_command(mut command: Command, env: &[(&str, &str)]) -> Proc {
        let debug = (!env.iter().any(|(k, _)| *k == "TOLLGATE_DEBUG_ADDR"))
            .then_some(("TOLLGATE_DEBUG_ADDR", "127.0.0.1:0"));
        let mut child = command
            .env_clear()
            .envs(env.iter().chain(debug.iter()).map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Proc { child, lines }
    }

    /// Every line printed so far, stdout and stderr interleaved as read.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// The first line containing `what`, waiting up to `timeout` for it.
    pub fn wait_for_line(&self, what: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.lines().into_iter().find(|l| l.contains(what)) {
                return l;
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {what:?} in {:#?}",
                self.lines()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
