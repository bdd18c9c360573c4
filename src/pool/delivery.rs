//! Admission and delivery: the unit a request takes (from the caller's shard, never a worker's own when a worker calls its pool) and the mailbox it goes to, waking the worker.

use super::mailbox::Outbox;
use super::{Admission, Inner};
use crate::engine::table::Table;
use crate::error::Error;
use crate::pool::worker::{Envelope, Worker};
use crate::sync::os_thread;

/// Queues `envelope`, which holds a unit of `shard`, in `mailbox`, then
/// runs `queued` (the wake-up that mailbox's readers need). If the
/// mailbox's worker is gone, which it only is once its shard is closed and
/// drained (so this unit was taken just before the close), the unit goes
/// back and the envelope with it: nothing was queued, and the caller
/// refuses.
#[inline]
pub(crate) fn post<W: Worker>(
    mailbox: &Outbox<Envelope<W>>,
    table: &Table,
    shard: usize,
    envelope: Envelope<W>,
    queued: impl FnOnce(),
) -> Result<(), Envelope<W>> {
    match mailbox.send(envelope) {
        Ok(()) => {
            queued();
            Ok(())
        }
        Err(returned) => {
            table.release(shard, false);
            Err(returned)
        }
    }
}

impl<W: Worker> Inner<W> {
    #[inline]
    pub(super) fn admit(&self, admission: Admission) -> Result<usize, Error> {
        match admission {
            Admission::Home => self.table.acquire(),
            Admission::At(start) => self.table.acquire_at(self.table.reduce(start)),
            Admission::Unbounded => self.table.acquire_unbounded(),
            Admission::Wait(deadline) => self.table.acquire_waiting(deadline),
            Admission::Probe => self.table.probe(),
        }
    }

    /// Admission for a call made by this pool's own worker `me`, which
    /// would wait for its reply: never on `me`'s shard, whose queue only
    /// `me` serves.
    #[cold]
    pub(super) fn admit_from_worker(
        &self,
        admission: Admission,
        me: usize,
    ) -> Result<usize, Error> {
        let shards = self.table.shard_count();
        if shards == 1 {
            // Only the caller could serve it. Once shutdown has begun,
            // `Shutdown` is the answer every other caller gets too.
            return Err(if self.table.is_closing() {
                Error::Shutdown
            } else {
                Error::CallingSelf
            });
        }
        match admission {
            Admission::Unbounded => {
                let home = self.table.home_shard();
                let other = if home == me { (me + 1) % shards } else { home };
                self.table.acquire_unbounded_on(other)
            }
            // A worker never waits for its own pool's capacity: a unit
            // handed over could be its own shard's, which only it serves.
            Admission::Home | Admission::At(_) | Admission::Wait(_) | Admission::Probe => {
                self.table.acquire_except(me)
            }
        }
    }

    /// Posts an envelope holding a unit of shard `shard` to its worker; the
    /// envelope back if the worker is gone.
    #[inline]
    pub(super) fn deliver(&self, shard: usize, envelope: Envelope<W>) -> Result<(), Envelope<W>> {
        post(&self.mailboxes[shard], &self.table, shard, envelope, || {
            if let Some(idle) = &self.idle {
                if self.own_private {
                    idle.private_added(shard);
                } else {
                    idle.work_added(shard, || !self.mailboxes[shard].is_empty());
                }
            }
        })
    }

    pub(super) fn shutdown(&self) {
        // 1. Close every shard: a take either came before this (and its
        //    envelope will be handled) or is refused with `Shutdown`.
        self.table.close();
        // 2. Wake every worker so it checks whether its shard is drained;
        //    a worker that already left has dropped its mailbox. Stealing
        //    workers sleep in the idle room, not in their mailbox.
        match &self.idle {
            Some(idle) => idle.wake_all(),
            None => {
                for mailbox in self.mailboxes.iter() {
                    let _ = mailbox.send(Envelope::Wake);
                }
            }
        }
        // 3. Join, unless this is a worker (it cannot wait for itself).
        if self.worker_ids.contains(&os_thread::current().id()) {
            return;
        }
        // Held across the joins, so a concurrent second `shutdown` returns
        // only once the pool is really down. Workers never take it.
        let mut threads = self.threads.lock();
        for thread in threads.drain(..) {
            // The loop catches handler panics; a join error would be a bug
            // in it, and a shutdown must not panic on it.
            let _ = thread.join();
        }
    }
}
