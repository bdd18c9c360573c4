//! Fail-fast, sharded capacity limits: a Rust take on Erlang's `sidejob`.
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod limiter;
mod probe;
mod stats;
mod sync;
mod table;

#[cfg(all(test, not(loom)))]
mod tests;

pub use error::{ConfigError, Error};
pub use limiter::{Limiter, LimiterBuilder, OwnedPermit, Permit};
pub use probe::Probe;
pub use stats::{Rates, ShardStats, Stats};
