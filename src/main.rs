//! The `tollgate` binary: the command line and the client tools (`cmd`);
//! the service itself lives in the library.

#![forbid(unsafe_code)]

mod cmd;

fn main() -> std::process::ExitCode {
    cmd::main()
}
