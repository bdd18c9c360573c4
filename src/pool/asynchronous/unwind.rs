//! `catch_unwind` for a future: runs it to completion, or catches the panic
//! of any of its polls, and drops it in place under a catch as well. An
//! async worker's handler future is user code; no panic of it, of its
//! output's or of its own `Drop`, may end the worker's loop. Each poll and
//! the drop run as the worker (`current.rs`).

use std::any::Any;
use std::future::{poll_fn, Future};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::task::Poll;

use super::current::as_worker;
use crate::engine::foreign::drop_payload;

/// Runs `future` to its end as worker `worker` (`current.rs`). `Err` with
/// the payload if a poll panicked; the future is then dropped at once (a
/// panic from that drop is caught and dropped too).
pub(crate) async fn guarded<F: Future>(
    worker: (usize, usize),
    future: F,
) -> Result<F::Output, Box<dyn Any + Send>> {
    guarded_noting(worker, future, || {}).await
}

/// [`guarded`], calling `on_pending` (the crate's code, outside the catch)
/// at the future's first `Pending`: for a handler, whose worker is then
/// away (`pool/async_idle.rs`).
pub(crate) async fn guarded_noting<F: Future>(
    worker: (usize, usize),
    future: F,
    on_pending: impl FnOnce(),
) -> Result<F::Output, Box<dyn Any + Send>> {
    let mut on_pending = Some(on_pending);
    // Pinned inside an `Option` so it can be dropped in place, under a
    // catch, as soon as it is done: `Pin::set` drops the old value where it
    // lies, which pinning allows. Dropped in the poll that finished it, as
    // the worker still: one record swap per poll.
    let mut slot = pin!(Some(future));
    poll_fn(|cx| {
        as_worker(worker, || {
            let Some(future) = slot.as_mut().as_pin_mut() else {
                // Not polled again once it has answered (below).
                return Poll::Pending;
            };
            let outcome = match catch_unwind(AssertUnwindSafe(|| future.poll(cx))) {
                Ok(Poll::Pending) => {
                    if let Some(on_pending) = on_pending.take() {
                        on_pending();
                    }
                    return Poll::Pending;
                }
                Ok(Poll::Ready(output)) => Ok(output),
                Err(payload) => Err(payload),
            };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| slot.set(None))) {
                drop_payload(payload);
            }
            Poll::Ready(outcome)
        })
    })
    .await
}
