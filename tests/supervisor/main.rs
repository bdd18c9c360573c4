//! The `Supervisor`'s public behaviour, one sub-feature a file:
//!
//! * `children.rs`: the bound, the listing, panics, exact accounting
//!   under concurrency, spawn errors, configuration, auto traits;
//! * `close.rs`: `close`, `wait_idle` and `wait_idle_async` (issue 7);
//! * `waiting.rs`: waiting for capacity (issue 8);
//! * `tasks.rs`: guards in tokio tasks, `spawn_task`, `abort_all`
//!   (issue 7);
//! * `keyed.rs`: keyed admission, `per_key` and `KeyBusy` (issue 10);
//! * `weighted.rs`: children of many units (issue 35).
//!
//! Synchronised with barriers and channels; nothing sleeps and nothing
//! asserts on time. (The `wait_idle` lock-hold fix of issue 7 is checked by
//! `supervisor::tests::wait_idle_scans_without_the_idle_lock`, which needs
//! the crate's internals, and by the loom models.)

#[path = "../common/mod.rs"]
mod common;

mod children;
mod classes;
mod close;
mod keyed;
mod tasks;
mod tenants;
mod waiting;
mod weighted;
