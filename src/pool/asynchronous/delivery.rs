//! Delivery for an async pool: waiting for a unit and sending, the
//! mailbox a request goes to (waking a sleeping worker), shutdown. (The
//! unit a request takes is the table's `Admission`.)

use super::mailbox::{Envelope, Heavy, Weighed};
use super::worker::{AsyncEnvelope, AsyncWorker};
use super::{Inner, ReplyReceiver, Unsent};
use crate::engine::ask::Ask;
use crate::engine::table::Grant;
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

    /// Waits under the room's policy for the units `ask` describes (to
    /// its deadline at most), then sends `job`: the wait of a
    /// `call_with_async` or `cast_with` whose first take was refused. Cancel
    /// safe: units handed to a dropped wait go to the next waiter or back.
    pub(super) async fn wait_with(
        &self,
        ask: Ask,
        job: Unsent<W>,
        me: Option<usize>,
    ) -> Result<Option<ReplyReceiver<W>>, Error> {
        if ask.is_one() {
            return self.wait_and_send(job, ask.deadline()).await;
        }
        let grant = self.table.admit_async(ask).await?;
        self.deliver_weighed(grant, job, me)
    }

    /// A worker's take of many units: never waiting, starting past its own
    /// shard, refused with `Overload` if every unit came from its own
    /// (only it serves that shard: the request would queue behind itself).
    pub(super) fn admit_weighed_from_worker(&self, ask: &Ask, me: usize) -> Result<Grant, Error> {
        if self.table.shard_count() == 1 {
            return Err(if self.table.is_closing() {
                Error::Shutdown
            } else {
                Error::CallingSelf
            });
        }
        let grant = self.table.admit(&Ask {
            how: crate::engine::ask::How::At(me + 1),
            ..*ask
        })?;
        if grant.parts().iter().all(|p| p.shard == me) {
            self.table.release_grant(&grant, false);
            return Err(Error::Overload);
        }
        Ok(grant)
    }

    /// Posts a weighed request of `grant` (`job` with its reply slot for a
    /// call) to the worker of a shard the grant holds units of (not `me`'s,
    /// for a worker's call); the receiver of a call's reply. If no worker
    /// can take it, the whole grant goes back: `Shutdown`.
    pub(super) fn deliver_weighed(
        &self,
        grant: Grant,
        job: Unsent<W>,
        me: Option<usize>,
    ) -> Result<Option<ReplyReceiver<W>>, Error> {
        let shard = grant
            .parts()
            .iter()
            .map(|p| p.shard)
            .find(|&shard| Some(shard) != me)
            .unwrap_or(grant.shard);
        let (job, receiver) = match job {
            Unsent::Call(request) => {
                let (reply, receiver) = oneshot::channel();
                (Heavy::Call(request, reply), Some(receiver))
            }
            Unsent::Cast(message) => (Heavy::Cast(message), None),
        };
        let envelope = Envelope::Weighed(Box::new(Weighed { grant, job }));
        match self.mailboxes.deliver(shard, envelope) {
            Ok(()) => Ok(receiver),
            Err(returned) => {
                returned.give_back(&self.table, shard);
                Err(Error::Shutdown)
            }
        }
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
