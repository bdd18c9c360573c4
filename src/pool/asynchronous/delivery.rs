//! Admission and delivery for an async pool: the unit a request takes (never on the calling worker's own shard) and the mailbox it goes to, waking a sleeping worker.

use super::mailbox::Envelope;
use super::worker::{AsyncEnvelope, AsyncWorker};
use super::{Inner, ReplyReceiver, Unsent};
use crate::error::Error;
use std::time::Instant;
use tokio::sync::oneshot;

/// How a request takes its unit.
#[derive(Clone, Copy)]
pub(super) enum Admission {
    /// Fail fast, counting an `Overload`.
    Try,
    /// Fail fast without counting an `Overload`: the caller waits next.
    Probe,
}

impl<W: AsyncWorker> Inner<W> {
    #[inline]
    pub(super) fn admit(&self, admission: Admission) -> Result<usize, Error> {
        match admission {
            Admission::Try => self.table.acquire(),
            Admission::Probe => self.table.probe(),
        }
    }

    /// Admission for a call made by this pool's own worker `me`, which
    /// waits for its reply: never on `me`'s shard, whose queue only `me`
    /// serves, and never waiting.
    #[cold]
    pub(super) fn admit_from_worker(&self, me: usize) -> Result<usize, Error> {
        if self.table.shard_count() == 1 {
            return Err(if self.table.is_closing() {
                Error::Shutdown
            } else {
                Error::CallingSelf
            });
        }
        self.table.acquire_except(me)
    }

    /// Waits under the room's policy for a unit (until `deadline` at most),
    /// then sends `job`; the reply's receiver for a call.
    pub(super) async fn wait_and_send(
        &self,
        job: Unsent<W>,
        deadline: Option<Instant>,
    ) -> Result<Option<ReplyReceiver<W>>, Error> {
        let shard = self.table.acquire_async(deadline).await?;
        let (envelope, receiver) = match job {
            Unsent::Call(request) => {
                let (reply, receiver) = oneshot::channel();
                (Envelope::Call(request, reply), Some(receiver))
            }
            Unsent::Cast(message) => (Envelope::Cast(message), None),
        };
        match self.deliver(shard, envelope) {
            Ok(()) => Ok(receiver),
            Err(_) => Err(Error::Shutdown),
        }
    }

    /// [`wait_and_send`](Self::wait_and_send) for a call.
    pub(super) async fn wait_and_call(
        &self,
        job: Unsent<W>,
        deadline: Option<Instant>,
    ) -> Result<ReplyReceiver<W>, Error> {
        // A call's job always gives a receiver; `None` cannot come.
        self.wait_and_send(job, deadline)
            .await?
            .ok_or(Error::Shutdown)
    }

    /// Posts an envelope holding a unit of shard `shard`; the envelope back
    /// if the worker is gone (its unit is given back first).
    #[inline]
    pub(super) fn deliver(
        &self,
        shard: usize,
        envelope: AsyncEnvelope<W>,
    ) -> Result<(), AsyncEnvelope<W>> {
        let delivered = self.mailboxes.deliver(shard, envelope);
        if delivered.is_err() {
            // The worker is gone: its shard closed and drained (this unit
            // was taken just before the close), or the runtime dropped it.
            // Nothing was queued.
            self.table.release(shard, false);
        }
        delivered
    }

    pub(super) fn shutdown(&self) {
        // 1. Close every shard: a take either came before this (and its
        //    envelope will be handled) or is refused with `Shutdown`.
        self.table.close();
        // 2. Wake every worker so it checks whether its shard is drained.
        self.mailboxes.wake_all(|| Envelope::Wake);
    }
}
