//! The engine: the sharded admission table every front-end drives, and the
//! pieces it is made of.
//!
//! * `table`: shards, the full-shard bitmap, probe, CAS and release; the
//!   gate of a resize and the control lock. The hot path is here, in
//!   `Table::try_at`, `Shard::try_take` and `Table::release`.
//! * `ask`: the request description, [`Ask`](crate::units::Ask): the
//!   one argument of the table's front door (`table/admission.rs`).
//! * `class`: priority classes, [`Class`](crate::Class), and the headroom
//!   each may fill, split into per-shard lines (`table/classed.rs` takes
//!   under them).
//! * `split`: how a capacity is split over the shards.
//! * `grant`: the units a table admitted together, as plain data.
//! * `waiters`: the bounded waiting room.
//! * `alarm`: the one deadline watcher that times out async waiters.
//! * `foreign`: running code the crate does not own over a batch (wakers),
//!   each item's turn coming whatever the ones before it do.
//! * `probe`: where a caller starts (its thread's index or its CPU).
//! * `threads`: what the front-ends that start worker threads share (how
//!   many at most, how long a waiting thread spins).

#[cfg(not(loom))]
pub(crate) mod alarm;
pub(crate) mod ask;
pub(crate) mod class;
pub(crate) mod foreign;
pub(crate) mod grant;
pub(crate) mod keys;
pub(crate) mod probe;
pub(crate) mod split;
pub(crate) mod table;
pub(crate) mod threads;
pub(crate) mod waiters;
