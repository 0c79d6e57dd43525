//! tollgate: a global rate-limit service speaking Envoy's `RateLimitService`
//! v3 protocol, with fixed windows, sliding window counters and sliding window
//! logs, on an embedded store or Redis.
//!
//! Start at [`server::run`] for the service and at [`engine::Engine`] for the
//! decision logic; `ARCHITECTURE.md` has the map.
//!
//! The library is the service: it exports no command line and no client
//! tools. The binary's own modules hold those (`check`, the load generator
//! `bench`, `simulate`), built on this public API alone.

#![forbid(unsafe_code)]

pub mod clock;
pub mod engine;
pub mod guarantees;
pub mod json;
pub mod limit;
pub mod observe;
pub mod proto;
pub mod quota;
pub mod reference;
pub mod reload;
pub mod rlqs;
pub mod rules;
pub mod server;
pub mod service;
pub mod settings;
pub mod storage;
pub mod tls;
pub mod xds;
