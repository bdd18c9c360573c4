//! The ordered keyed mode's dispatch: a key's request that may run goes to
//! a mailbox every worker takes from, and when it has been handled its
//! key's next queued request goes out the same way.
//!
//! A keyed request takes its unit of capacity as any request does (on any
//! shard, under the pool's waiting policy), then enters its key's queue
//! ([`KeyQueues`]). The one that may run is posted to the *keyed mailbox*
//! of the shard holding its unit, which every worker takes from (in a
//! stealing pool, the shard's own mailbox, which every worker takes from
//! anyway): so a free worker takes the next ready key's request, and a
//! slow or hot key holds one worker at a time, never the requests of other
//! keys queued behind it. A worker that took it from another shard's
//! mailbox gives its unit back to that shard (the envelope carries the
//! shard), so the bound, the drain rule and the wake-up after a release
//! are the stealing pool's (`steal.rs`).
//!
//! # Who passes the turn
//!
//! When a key's request has been handled, its turn passes on: under its
//! stripe's lock, the key's next queued request goes out, or the key is
//! forgotten ([`KeyQueues::finish`]). Whoever does it pulls the stripe's
//! cache line to its core, and the key's next admission pulls it back. So
//! for a blocking `call_keyed`, whose caller reads its reply whatever
//! happens, the worker leaves the turn to the caller when nobody waits in
//! the stripe's queues ([`KeyQueues::anyone_queued`], a count on a line of
//! its own that only queuing writes): the caller passes it on after it
//! reads the reply, and one caller's run of calls on a key keeps the
//! stripe's line on its own core. With the key queues' lock-free slots
//! (`key_queue.rs`), which admit and forget a key kept in a slot with
//! nobody queued by one CAS each, the one-key round trip went from about
//! 1.26x a plain call's to about 1.05x (medians over fresh processes,
//! `benches/results/`).
//!
//! Correctness does not rest on the hint: the turn is passed exactly once,
//! by the worker or by the caller it handed it to with the reply, and the
//! hand-out itself is under the lock either way. A stale "nobody queued"
//! only means that a request queued just after the worker looked waits
//! for the caller to read its reply (it is polling for it) instead of
//! going out from the worker. The worker passes the turn itself when
//! someone is queued, for casts, for `call_keyed_timeout` and
//! `call_keyed_async` (whose callers may leave before the reply), and if
//! the reply cannot be delivered.

use crate::engine::foreign::drop_quietly;
use crate::engine::table::Table;
use crate::error::Error;
use crate::pool::key_queue::{Admit, KeyQueues};
use crate::pool::mailbox::Outbox;
use crate::pool::post;
use crate::pool::steal::Idle;
use crate::pool::worker::{Envelope, Job, Keyed, Worker};
use crate::sync::Arc;

/// The shared part of an ordered pool: the key queues and where a key's
/// ready request is posted.
pub(crate) struct Ordered<W: Worker> {
    keys: KeyQueues<Keyed<W>>,
    /// The keyed mailbox of each shard.
    mailboxes: Box<[Outbox<Envelope<W>>]>,
    /// Where the workers sleep: a posted request rings it.
    idle: Arc<Idle>,
    table: Arc<Table>,
}

impl<W: Worker> Ordered<W> {
    pub(crate) fn new(
        keys: KeyQueues<Keyed<W>>,
        mailboxes: Box<[Outbox<Envelope<W>>]>,
        idle: Arc<Idle>,
        table: Arc<Table>,
    ) -> Self {
        Ordered {
            keys,
            mailboxes,
            idle,
            table,
        }
    }

    /// Queues `job`, which holds a unit of `shard`, behind key `id`'s
    /// earlier requests, or posts it at once if the key is idle.
    ///
    /// # Errors
    ///
    /// [`Error::KeyBusy`] with the job back when the key has its limit of
    /// requests admitted (the unit is given back, uncounted);
    /// [`Error::Shutdown`] if the workers are gone (the unit is given back).
    pub(crate) fn submit(&self, shard: usize, id: u64, job: Job<W>) -> Result<(), (Error, Job<W>)> {
        match self.keys.admit(id, Keyed { id, shard, job }) {
            Admit::Run(keyed) => self
                .post(keyed)
                .map_err(|keyed| (Error::Shutdown, keyed.job)),
            Admit::Queued => Ok(()),
            Admit::Busy(keyed) => {
                self.table.return_unused(shard);
                Err((Error::KeyBusy, keyed.job))
            }
        }
    }

    /// Key `id`'s request has been handled (its unit is back): posts the
    /// key's next request, or forgets the key.
    pub(crate) fn finish(&self, id: u64) {
        if let Some(next) = self.keys.finish(id) {
            if let Err(keyed) = self.post(next) {
                // Unreachable while the pool works: the request holds a
                // unit of its shard, so that shard's worker is alive and
                // holds the mailbox. Its caller is told `Shutdown` (the
                // reply slot drops).
                drop_quietly(keyed);
            }
        }
    }

    /// Posts a request whose turn it is; back if every worker is gone, its
    /// unit given back and its key's turn passed on.
    fn post(&self, keyed: Keyed<W>) -> Result<(), Keyed<W>> {
        let shard = keyed.shard;
        let mailbox = &self.mailboxes[shard];
        post(mailbox, &self.table, shard, Envelope::Keyed(keyed), || {
            self.idle.work_added(shard, || !mailbox.is_empty())
        })
        .map_err(|returned| {
            let Envelope::Keyed(keyed) = returned else {
                unreachable!("a mailbox hands back the envelope it was given");
            };
            // Its unit is back; its key's turn passes on.
            self.finish(keyed.id);
            keyed
        })
    }

    /// Whether a request waits on key `id`'s stripe (a hint).
    #[inline]
    pub(crate) fn anyone_queued(&self, id: u64) -> bool {
        self.keys.anyone_queued(id)
    }

    /// Requests of key `id` admitted and unfinished (a reading).
    #[cfg(test)]
    pub(crate) fn key_load(&self, id: u64) -> usize {
        self.keys.load(id)
    }

    /// Keys with a request admitted (a reading).
    pub(crate) fn busy_keys(&self) -> usize {
        self.keys.keys()
    }
}
