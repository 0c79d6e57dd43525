//! The binary's own modules: the command line, and the client tools that
//! use the library from outside (`check` and `bench` speak RLS to any
//! address; `reset` asks a replica's debug listener to reset limiters;
//! `simulate` drives the embedded store on a virtual clock). The
//! library exports none of them.

mod bench;
mod check;
mod cli;
mod reset;
mod simulate;

pub use cli::main;
