//! The command line: `serve`, `validate`, `check`, `reset`, `bench`,
//! `simulate` and `simulate-rlqs`.
//! `main` only calls [`main`] here.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use tollgate::settings::{Settings, Sources};

#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version,
    about = "A global rate-limit service for Envoy"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the RLS gRPC API and the HTTP health check.
    Serve(ServeArgs),
    /// Check a directory of rule files; prints every error, exits 1 if any
    /// (or if the directory holds no rule file, unless --allow-empty).
    Validate(ValidateArgs),
    /// Send one ShouldRateLimit request and print the answer. Exit codes:
    /// 0 OK, 1 the call failed, 2 OVER_LIMIT, 3 OK but the domain has no
    /// rules on that server, 64 bad flags.
    Check(CheckArgs),
    /// Reset the limiters of descriptors through a replica's debug
    /// listener (POST /reset) and print what was reset. Exit codes: 0
    /// reset, 1 nothing reset (no such domain or limiter, a store error,
    /// no answer), 64 bad flags.
    Reset(super::reset::ResetArgs),
    /// Load-test an RLS address (tollgate or any Envoy rate-limit service).
    Bench(super::bench::BenchArgs),
    /// Measure how far sliding_window_counter admits over its limit, per
    /// bucket count, on a virtual clock; prints a table.
    Simulate(super::simulate::SimulateArgs),
    /// Simulate N Envoys sharing one limit through the quota service
    /// (RLQS) on a virtual clock; prints a table.
    SimulateRlqs(super::simulate::rlqs::SimulateRlqsArgs),
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Settings file (YAML). Environment variables TOLLGATE_* and flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory of rule files.
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// gRPC listen address [default: 0.0.0.0:8081].
    #[arg(long)]
    pub grpc_addr: Option<String>,
    /// HTTP listen address [default: 0.0.0.0:8080].
    #[arg(long)]
    pub http_addr: Option<String>,
    /// Debug listen address (`/rlconfig`, `/debug/*`), or `off`
    /// [default: 127.0.0.1:6070].
    #[arg(long)]
    pub debug_addr: Option<String>,
    /// Algorithm of rules that name none [default: sliding_window_counter].
    #[arg(long)]
    pub default_algorithm: Option<String>,
    /// `memory` or a Redis URL (redis://, rediss://, redis-cluster://, redis-sentinel://).
    #[arg(long)]
    pub store: Option<String>,
}

/// The settings that decide whether a rule is acceptable come from the same
/// sources as for `serve`, so a directory that validates also loads.
#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// The rules directory.
    pub dir: PathBuf,
    /// Settings file (YAML). Environment variables TOLLGATE_* and flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Algorithm of rules that name none [default: sliding_window_counter].
    #[arg(long)]
    pub default_algorithm: Option<String>,
    /// Largest requests_per_unit of a sliding_window_log limit [default: 10000].
    #[arg(long)]
    pub max_log_limit: Option<String>,
    /// Accept a directory that holds no rule file (by default an error, so
    /// that a mistyped path does not look valid).
    #[arg(long)]
    pub allow_empty: bool,
}

impl ValidateArgs {
    fn sources(&self) -> Sources {
        let overrides = [
            ("default_algorithm", &self.default_algorithm),
            ("max_log_limit", &self.max_log_limit),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.clone().map(|v| (k.to_string(), v)))
        .collect();
        Sources {
            file: self.config.clone(),
            env: Sources::process_env(),
            overrides,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub target: super::check::Target,
    /// Request hits_addend (0 counts as 1).
    #[arg(long, default_value_t = 0)]
    pub hits: u32,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
}

/// Exit code for bad settings (EX_USAGE).
pub const EXIT_BAD_SETTINGS: u8 = 64;

/// `check`'s exit code when the answer is OVER_LIMIT.
pub const EXIT_OVER_LIMIT: u8 = 2;
/// `check`'s exit code when the server has no rules for the domain.
pub const EXIT_NO_DOMAIN: u8 = 3;

/// What `serve --help` (and `validate --help`) add after the flags: every
/// setting with its variable and default, from the one declaration.
fn settings_help() -> String {
    use tollgate::settings::table::SETTINGS;
    let mut text = String::from(
        "Settings: a YAML file (--config), then TOLLGATE_* variables, then flags. \
         Every setting, its variable and its default (docs/src/reference/settings.md has them all):\n",
    );
    for s in SETTINGS {
        let default = s.default.map_or("unset".to_string(), |d| {
            if d.is_empty() {
                "\"\"".to_string()
            } else {
                d.to_string()
            }
        });
        text.push_str(&format!(
            "  {} ({}) [default: {default}]\n      {}\n",
            s.name,
            tollgate::settings::env_name(s.name),
            s.meaning
        ));
    }
    text
}

pub fn main() -> ExitCode {
    let short = "Every setting, with its TOLLGATE_* variable and default: --help";
    let command = Cli::command()
        .mut_subcommand("serve", |c| {
            c.after_help(short).after_long_help(settings_help())
        })
        .mut_subcommand("validate", |c| {
            c.after_help(short).after_long_help(settings_help())
        });
    let parsed = command
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => return usage_error(&e),
    };
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Validate(args) => validate(&args),
        Command::Check(args) => check(args),
        Command::Reset(args) => reset(args),
        Command::Bench(args) => super::bench::main(args),
        Command::Simulate(args) => super::simulate::main(args),
        Command::SimulateRlqs(args) => super::simulate::rlqs::main(args),
    }
}

/// `--help` and `--version` print and exit 0; every other command-line
/// error is a usage error: EX_USAGE (64), as for bad settings, so that a
/// script never takes a mistyped flag of `check` for its OVER_LIMIT (2).
fn usage_error(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let _ = e.print();
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
        _ => ExitCode::from(EXIT_BAD_SETTINGS),
    }
}

impl ServeArgs {
    fn sources(&self) -> Sources {
        let mut overrides = Vec::new();
        let mut set = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                overrides.push((k.to_string(), v));
            }
        };
        set(
            "rules_dir",
            self.rules.as_ref().map(|p| p.display().to_string()),
        );
        set("grpc_addr", self.grpc_addr.clone());
        set("http_addr", self.http_addr.clone());
        set("debug_addr", self.debug_addr.clone());
        set("default_algorithm", self.default_algorithm.clone());
        set("store", self.store.clone());
        Sources {
            file: self.config.clone(),
            env: Sources::process_env(),
            overrides,
        }
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

fn serve(args: ServeArgs) -> ExitCode {
    // Settings are validated before anything else happens.
    let settings = match Settings::load(&args.sources()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_BAD_SETTINGS);
        }
    };
    let logger = tollgate::observe::logger(
        settings.log_format,
        &settings.log,
        std::io::stdout,
        std::io::IsTerminal::is_terminal(&std::io::stdout()),
    );
    // `try_init` also forwards the `log` crate's records (rustls, fred).
    if tracing_subscriber::util::SubscriberInitExt::try_init(logger).is_err() {
        eprintln!("tollgate: a logger was already installed");
    }
    for warning in &settings.warnings {
        tracing::warn!("{warning}");
    }
    let result = runtime()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(tollgate::server::serve(&settings, drain_signal())));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Once, in the log (where an operator's collector looks), not
            // again on stderr.
            tracing::error!("{}", tollgate::observe::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Resolves on the first SIGTERM or SIGINT, which starts the drain; a
/// second one stops the process at once (an impatient Ctrl-C on a laptop).
async fn drain_signal() {
    shutdown_signal().await;
    tokio::spawn(async {
        shutdown_signal().await;
        eprintln!("tollgate: second signal; stopping without draining");
        std::process::exit(1);
    });
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

fn validate(args: &ValidateArgs) -> ExitCode {
    let settings = match Settings::load(&args.sources()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_BAD_SETTINGS);
        }
    };
    // What `serve` logs at startup (a mistyped TOLLGATE_* variable, with
    // the nearest setting), said here too: these are the same settings.
    for warning in &settings.warnings {
        eprintln!("warning: {warning}");
    }
    let dir = &args.dir;
    match tollgate::rules::load_dir(dir, &tollgate::server::rule_options(&settings)) {
        Ok(set) if set.is_empty() && !args.allow_empty => {
            eprintln!(
                "{}: no rule file (*.yaml, *.yml) found; give --allow-empty if that is intended",
                dir.display()
            );
            ExitCode::from(1)
        }
        Ok(set) => {
            let mut names: Vec<&str> = set.domains.keys().map(String::as_str).collect();
            names.sort_unstable();
            println!(
                "{}: {} domain(s) valid: {}",
                dir.display(),
                names.len(),
                names.join(", ")
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            eprintln!("{} error(s)", errors.0.len());
            ExitCode::from(1)
        }
    }
}

fn reset(args: super::reset::ResetArgs) -> ExitCode {
    let descriptors = match args
        .descriptors
        .iter()
        .map(|d| super::check::parse_descriptor(d).map_err(|e| format!("--descriptor {e}")))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_BAD_SETTINGS);
        }
    };
    let body = super::reset::body(&args.domain, &descriptors);
    let timeout = Duration::from_millis(args.timeout_ms);
    let result = runtime()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(super::reset::call(&args.addr, body, timeout)));
    match result {
        Ok(answer) if answer.status == 200 => {
            print!("{}", super::reset::render(&answer.body));
            ExitCode::SUCCESS
        }
        Ok(answer) => {
            let message = answer.body["error"].as_str().unwrap_or("no message");
            eprintln!("tollgate reset: HTTP {}: {message}", answer.status);
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("tollgate reset: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check(args: CheckArgs) -> ExitCode {
    let descriptors = match args.target.parsed_descriptors() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_BAD_SETTINGS);
        }
    };
    let tls = match args.target.client_tls() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("tollgate check: {e:#}");
            return ExitCode::from(EXIT_BAD_SETTINGS);
        }
    };
    let req = super::check::request(&args.target.domain, &descriptors, args.hits);
    let timeout = Duration::from_millis(args.timeout_ms);
    let result = runtime().map_err(anyhow::Error::from).and_then(|rt| {
        rt.block_on(super::check::call(
            &args.target.addr,
            tls.as_ref(),
            req.clone(),
            timeout,
        ))
    });
    match result {
        Ok(answer) => {
            print!("{}", super::check::render(&req, &answer.response));
            if answer.unknown_domain {
                println!(
                    "note: the server has no rules for domain {:?}: every descriptor is OK with no limit",
                    args.target.domain
                );
            }
            if answer.response.overall_code
                == tollgate::proto::rate_limit_response::Code::OverLimit as i32
            {
                ExitCode::from(EXIT_OVER_LIMIT)
            } else if answer.unknown_domain {
                ExitCode::from(EXIT_NO_DOMAIN)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!(
                "tollgate check: {}",
                tollgate::observe::error_chain(e.as_ref())
            );
            ExitCode::FAILURE
        }
    }
}
