//! Which async worker is running: the thread pool's thread-local record
//! (`pool/worker_loop.rs`), set only while one of an async worker's own
//! polls runs (its handler's, its factory's, its `terminate`'s) and
//! restored after, so the pool never queues a worker's own call behind
//! that worker, and never lets it wait for its own capacity.
//!
//! Why not a tokio task-local around the whole worker loop: it swaps the
//! record in and out on every poll of the loop, sleeping or not, and cost
//! a one-task `call_async` round trip about 50 instructions in 2,200
//! (callgrind, `benches/async_pool.rs`'s shape); the record is only ever
//! read by code a handler runs, which runs inside one of these polls. (A
//! plain thread-local set for the whole loop would name the wrong task:
//! an async worker shares its thread with other tasks.)

use crate::engine::table::Table;
use crate::pool::worker_loop::{self, pool_id};
use crate::sync::Arc;

/// The record of worker `index` of the pool whose table is `table`.
#[inline]
pub(crate) fn worker_id(table: &Arc<Table>, index: usize) -> (usize, usize) {
    (pool_id(table), index)
}

/// Runs `f` (one poll, or one call of the factory) as worker `worker`.
#[inline]
pub(crate) fn as_worker<R>(worker: (usize, usize), f: impl FnOnce() -> R) -> R {
    worker_loop::as_worker_while(worker, f)
}

/// The index of the calling code if a worker of the pool whose table is
/// `table` runs it; `None` anywhere else (one thread-local read).
///
/// Only the worker's own polls are seen: a task the handler spawns is not
/// the worker, and a call from it that the handler then awaits can still
/// wait for the worker itself (the user's cycle, as with two pools).
#[inline]
pub(crate) fn calling_worker(table: &Arc<Table>) -> Option<usize> {
    worker_loop::calling_worker(table)
}
