//! The `tollgate` binary: everything lives in the library.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    tollgate::cli::main()
}
