//! Which async worker the running task is: a tokio task-local, set while a
//! worker's loop is polled, so the pool never queues a worker's own call
//! behind that worker (the thread pool keeps the same record in a
//! thread-local; an async worker shares its thread with other tasks, so a
//! thread-local would name the wrong one).

use std::future::Future;

use crate::engine::table::Table;
use crate::pool::worker_loop::pool_id;
use crate::sync::Arc;

tokio::task_local! {
    /// `(pool_id, index)` of the worker whose loop is being polled.
    static CURRENT_WORKER: (usize, usize);
}

/// Runs `future` (a worker's loop) as worker `index` of the pool whose
/// table is `table`.
pub(crate) fn as_worker<F: Future>(
    table: &Arc<Table>,
    index: usize,
    future: F,
) -> impl Future<Output = F::Output> {
    CURRENT_WORKER.scope((pool_id(table), index), future)
}

/// The index of the calling task if it is a worker of the pool whose table
/// is `table`; `None` anywhere else (one task-local read).
///
/// Only the worker's own task is seen: a task the handler spawns is not the
/// worker, and a call from it that the handler then awaits can still wait
/// for the worker itself (the user's cycle, as with two pools).
#[inline]
pub(crate) fn calling_worker(table: &Arc<Table>) -> Option<usize> {
    let id = pool_id(table);
    CURRENT_WORKER
        .try_with(|&(pool, index)| (pool == id).then_some(index))
        .ok()
        .flatten()
}
