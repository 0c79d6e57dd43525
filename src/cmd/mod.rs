//! The binary's own modules: the command line, and the client tools that
//! use the library from outside (`check` and `bench` speak RLS to any
//! address; `simulate` drives the embedded store on a virtual clock). The
//! library exports none of them.

mod bench;
mod check;
mod cli;
mod simulate;

pub use cli::main;
