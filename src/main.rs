//! The `tollgate` binary: everything lives in the library.

#![forbid(unsafe_code)]

// The request path allocates a little per decision on every thread;
// mimalloc's thread-local free lists make that cheaper than the system
// allocator (measured in docs/benchmarks.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tollgate::cli::main()
}
