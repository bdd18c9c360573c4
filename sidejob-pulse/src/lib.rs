//! Dedicated keyed workers across nodes, on Redis: each long-running job
//! has a key, and the key's job runs on exactly one worker of the whole
//! fleet at a time, while workers join and leave and jobs move to their
//! new owners.
//!
//! A [`Node`] joins a named pool on a Redis. It dispatches jobs
//! ([`Node::dispatch`]), stops them ([`Node::stop`]), sends them
//! notifications ([`Node::notify`]), and shuts the whole pool down
//! ([`Node::shutdown`]). Unless it is client-only, it hosts [`Worker`]s,
//! each running the user's [`Handler`] with a sidejob
//! [`Limiter`](sidejob::Limiter) bounding its running jobs. A key's owner
//! is chosen by jump consistent hash over the live workers, so adding a
//! worker to `n` moves about `1/(n+1)` of the keys, all to it, and
//! removing one moves only its keys. Every start carries a fencing
//! [`Token`] larger than any before it for that key.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::mpsc;
//! use sidejob_pulse::{Handler, Job, Node, StopReason, Token};
//!
//! struct Tenant(mpsc::Sender<String>);
//! impl Handler for Tenant {
//!     fn start(&mut self, job: Job) {
//!         self.0.send(format!("start {} #{}", job.key, job.token)).unwrap();
//!     }
//!     fn stop(&mut self, key: &str, _: Token, why: StopReason) {
//!         self.0.send(format!("stop {key} {why:?}")).unwrap();
//!     }
//! }
//!
//! let (tx, rx) = mpsc::channel();
//! let node = Node::builder().name("tenants").url("redis://127.0.0.1:6379/").join()?;
//! let _worker = node.add_worker(100, Tenant(tx))?;
//! node.dispatch("tenant-1", b"{}")?;
//! assert!(rx.recv().unwrap().starts_with("start tenant-1"));
//! node.shutdown()?;
//! # Ok::<(), sidejob_pulse::Error>(())
//! ```
//!
//! The design (keys in Redis, the scripts, how ownership moves, which
//! failures need the fencing token) is in the crate README.
//!
//! # Contents
//!
//! * [`Node`], [`NodeBuilder`], [`PoolState`]: a process's handle on a
//!   pool; [`Generation`]: which incarnation of the pool's state in Redis
//!   acknowledged a job (it changes when Redis loses state).
//! * [`Worker`], [`Handler`], [`Job`], [`StopReason`], [`Token`]: what
//!   runs the jobs.
//! * [`Durability`]: what an acknowledgement waits for (the primary, a
//!   replica by `WAIT`, or the primary's fsynced AOF).
//! * [`Error`], [`ConfigError`], [`RedisError`]: every failure.
//! * [`Endpoint`], [`EndpointError`]: Redis' address, login and TLS CA
//!   (re-exported from `sidejob-redis`: `use sidejob_pulse::Endpoint`; an
//!   `EndpointError` converts into [`Error`] with `?`).

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(missing_debug_implementations)]

mod durability;
mod error;
mod generation;
mod job;
mod node;
mod route;
mod run;
#[cfg(test)]
mod script_model;
mod shared;
mod store;
mod worker;

/// The README's example, compiled as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctest;

pub use durability::Durability;
pub use error::{ConfigError, Error, RedisError};
pub use generation::Generation;
pub use job::{Handler, Job, StopReason, Token, MAX_KEY_LEN, MAX_PAYLOAD_LEN};
pub use node::{Node, NodeBuilder, PoolState};
pub use sidejob_redis::{Endpoint, EndpointError};
pub use worker::Worker;
