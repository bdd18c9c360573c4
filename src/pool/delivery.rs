//! Delivery: the mailbox a request goes to, waking its worker, and the
//! pool's shutdown. (The unit it takes is the table's `Admission`.)

use super::mailbox::Outbox;
use super::Inner;
use crate::engine::table::Table;
use crate::pool::worker::{Envelope, Weighed, Worker};
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
    /// Posts an envelope holding a unit of shard `shard` to its worker; the
    /// envelope back if the worker is gone.
    #[inline]
    pub(super) fn deliver(&self, shard: usize, envelope: Envelope<W>) -> Result<(), Envelope<W>> {
        post(&self.mailboxes[shard], &self.table, shard, envelope, || {
            self.queued(shard);
        })
    }

    /// The wake-up a delivery to shard `shard`'s mailbox needs.
    #[inline(always)]
    fn queued(&self, shard: usize) {
        if let Some(idle) = &self.routing.idle {
            if self.routing.own_private {
                idle.private_added(shard);
            } else {
                idle.work_added(shard, || !self.mailboxes[shard].is_empty());
            }
        }
    }

    /// Posts a weighed request to the mailbox of `shard`, one of the
    /// shards its grant holds units of (so that worker cannot drain and
    /// leave while it is queued). If the worker is gone, the whole grant
    /// goes back and the request with it.
    #[cold]
    pub(super) fn deliver_weighed(
        &self,
        shard: usize,
        weighed: Box<Weighed<W>>,
    ) -> Result<(), Box<Weighed<W>>> {
        debug_assert!(weighed.grant.parts().iter().any(|p| p.shard == shard));
        match self.mailboxes[shard].send(Envelope::Weighed(weighed)) {
            Ok(()) => {
                self.queued(shard);
                Ok(())
            }
            Err(Envelope::Weighed(weighed)) => {
                self.table.release_grant(&weighed.grant, false);
                Err(weighed)
            }
            Err(_) => unreachable!("a mailbox hands back the envelope it was given"),
        }
    }

    pub(super) fn shutdown(&self) {
        // 1. Close every shard: a take either came before this (and its
        //    envelope will be handled) or is refused with `Shutdown`.
        self.table.close();
        // 2. Wake every worker so it checks whether its shard is drained;
        //    a worker that already left has dropped its mailbox. Stealing
        //    workers sleep in the idle room, not in their mailbox.
        match &self.routing.idle {
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
