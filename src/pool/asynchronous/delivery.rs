//! Delivery for an async pool: waiting for a unit and sending, the
//! mailbox a request goes to (waking a sleeping worker), shutdown. (The
//! unit a request takes is the table's `Admission`.)

use super::mailbox::Envelope;
use super::worker::{AsyncEnvelope, AsyncWorker};
use super::{Inner, ReplyReceiver, Unsent};
use crate::error::Error;
use std::time::Instant;

impl<W: AsyncWorker> Inner<W> {
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
