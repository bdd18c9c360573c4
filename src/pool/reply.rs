//! Waiting for a reply: spin, then park, within a deadline.

use crate::error::Error;
use crate::sync::spin_poll;
use std::time::{Duration, Instant};

/// `now + timeout`, or `None` if that is beyond what `Instant` can hold (a
/// wait so long it means "no deadline").
pub(crate) fn deadline_after(now: Instant, timeout: Duration) -> Option<Instant> {
    now.checked_add(timeout)
}

/// Waits for a reply: polls for up to `spin` (the reply to a short request
/// comes in well under the cost of parking), then sleeps.
pub(super) fn wait_reply<T>(
    reply: oneshot::Receiver<Result<T, Error>>,
    spin: Duration,
) -> Result<T, Error> {
    // A dropped reply slot means the worker is gone.
    receive(reply, spin).unwrap_or(Err(Error::Shutdown))
}

/// [`wait_reply`] with a deadline.
pub(super) fn wait_reply_until<T>(
    reply: oneshot::Receiver<Result<T, Error>>,
    spin: Duration,
    deadline: Instant,
) -> Result<T, Error> {
    if let Some(received) = poll_slot(&reply, spin) {
        return received.unwrap_or(Err(Error::Shutdown));
    }
    match reply.recv_deadline(deadline) {
        Ok(outcome) => outcome,
        Err(oneshot::RecvTimeoutError::Timeout) => Err(Error::Timeout),
        Err(oneshot::RecvTimeoutError::Disconnected) => Err(Error::Shutdown),
    }
}

/// [`wait_reply`] for a [`Job::CallPassing`]: the reply, and whether the
/// caller is to pass its key's turn on (never when the worker is gone: the
/// turn went with the request, passed on by `Turn`'s drop).
pub(super) fn wait_passing<T>(
    reply: oneshot::Receiver<(Result<T, Error>, bool)>,
    spin: Duration,
) -> (Result<T, Error>, bool) {
    receive(reply, spin).unwrap_or((Err(Error::Shutdown), false))
}

/// A reply slot's message: polled for up to `spin`, then slept for;
/// `None` if the sender is gone.
pub(super) fn receive<M>(slot: oneshot::Receiver<M>, spin: Duration) -> Option<M> {
    match poll_slot(&slot, spin) {
        Some(received) => received,
        None => slot.recv().ok(),
    }
}

/// Polls a reply slot for up to `spin`: `Some(Some(message))` once it
/// came, `Some(None)` if the sender is gone, `None` if still waiting.
pub(super) fn poll_slot<M>(slot: &oneshot::Receiver<M>, spin: Duration) -> Option<Option<M>> {
    spin_poll(spin, || match slot.try_recv() {
        Ok(message) => Some(Some(message)),
        Err(oneshot::TryRecvError::Disconnected) => Some(None),
        Err(oneshot::TryRecvError::Empty) => None,
    })
}
