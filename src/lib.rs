//! Fail-fast, sharded capacity limits: a Rust take on Erlang's `sidejob`.
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod limiter;
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_api;
mod pool;
mod probe;
mod stats;
mod supervisor;
mod sync;
mod table;
#[cfg(all(test, not(loom)))]
mod tests;
mod worker;

pub use error::{ConfigError, Error};
pub use limiter::{Limiter, LimiterBuilder, OwnedPermit, Permit};
pub use pool::{Pool, PoolBuilder, DEFAULT_SPIN_WAIT};
pub use probe::Probe;
pub use stats::{Rates, ShardStats, Stats};
#[cfg(feature = "tokio")]
pub use supervisor::Task;
pub use supervisor::{
    Child, ChildGuard, ChildId, ChildInfo, ChildKind, Supervisor, SupervisorBuilder,
};
pub use worker::Worker;
