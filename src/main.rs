//! The `tollgate` binary: the command line and the client tools (`cmd`);
//! the service itself lives in the library.

#![forbid(unsafe_code)]

mod cmd;

/// jemalloc: the service allocates a few small buffers per call, freed on
/// other threads; glibc's malloc spent a quarter of a decision's CPU on
/// them under load (the book's benchmarks pages, docs/src/benchmarks/).
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    cmd::main()
}
