//! One [`sidejob`] capacity bound across a fleet of processes, with
//! admission still local.
//!
//! Each node leases a share of a global capacity from Redis and sets its
//! local [`sidejob::Limiter`] (or [`Pool`](sidejob::Pool),
//! [`Supervisor`](sidejob::Supervisor)) capacity to that share with
//! `set_capacity`, so admission stays the same local CAS, with no network
//! round trip per request. A keeper thread renews the lease through one
//! atomic Lua script every renew period, grows it early when the node
//! refuses requests, and drops the local capacity to zero before Redis can
//! give the share away if renewals fail. The design, its invariant and its
//! assumptions are in the crate README.
//!
//! # Example
//!
//! ```no_run
//! use std::{sync::Arc, time::Duration};
//! use sidejob::Limiter;
//! use sidejob_redis::Budget;
//!
//! let budget = Budget::builder()
//!     .url("redis://127.0.0.1:6379/")
//!     .name("orders-db")
//!     .capacity(300)                     // for the whole fleet
//!     .max_hold(Duration::from_secs(3))  // the database's statement timeout
//!     .build()?;
//! let limiter = Arc::new(Limiter::new(1)?); // its capacity is the keeper's to set
//! let keeper = budget.attach(limiter.clone())?;
//! // ... limiter.try_acquire() as usual; keeper.stats() shows the lease.
//! keeper.shutdown(); // the units go back to the fleet at once
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Contents
//!
//! * [`Budget`], [`BudgetBuilder`], [`Fallback`], [`ConfigError`]: the
//!   fleet-wide budget and its checked timing; [`FleetCapacity`] and
//!   [`CapacityMismatch`]: its capacity as a versioned setting, changed
//!   deliberately ([`Budget::set_fleet_capacity`]).
//! * [`Keeper`], [`Resizable`], [`KeeperStats`]: the keepers (one thread
//!   and one connection per Redis address, serving every attached budget)
//!   and the front-ends they drive.
//! * [`LeaseStore`] and its calls; [`RedisStore`] (the Lua scripts),
//!   [`Model`] and [`MemoryStore`] (the same state machine in Rust).
//! * [`Endpoint`]: where Redis is, with its login and TLS CA, never
//!   printed with its password; [`escape_name`]: how a user's name goes
//!   into a key.
//! * [`Core`]: the keeper's decisions as a sans-IO state machine, shared
//!   by the keeper thread and the simulation.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod config;
mod core;
mod endpoint;
mod keeper;
mod model;
mod redis_store;
mod store;
mod sync;

pub use crate::core::{CapacityMismatch, Core, Due, KeeperStats, Reading};
pub use config::{Budget, BudgetBuilder, ConfigError, Fallback};
pub use endpoint::{escape_name, Endpoint, EndpointError};
#[doc(hidden)]
pub use keeper::keeper_thread_running;
pub use keeper::{Keeper, Resizable};
pub use model::{MemoryStore, Meta, Model};
pub use redis_store::{script_source, RedisStore};
pub use store::{
    FleetCapacity, Grant, InitArgs, InitReply, LeaseStore, NodeLease, RenewArgs, RenewReply,
    Status, StoreError,
};
