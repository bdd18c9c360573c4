//! The loop each pool worker thread runs: receive, handle under
//! `catch_unwind`, release the unit (a plain pool's casts' units in runs,
//! see `Batch`), reply; rebuild after a panic; drain and `terminate` on
//! shutdown. The loop also records, in a thread-local, which pool and
//! worker its thread is, so the pool never queues a worker's own call
//! behind that worker.
//!
//! No panic ends the loop: not a handler's, not one from dropping a request,
//! a reply nobody waits for, a broken worker state or a panic payload. Each
//! envelope's unit is held by a guard that gives it back on every path.

use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::adaptive::{Feed, FeedSlot, Outcome};
use crate::engine::foreign::{drop_payload, drop_quietly};
use crate::engine::table::{Batch, Grant, Held, Table, Unit};
use crate::error::Error;
use crate::pool::mailbox::{Inbox, Look, Outbox};
use crate::pool::ordered::Ordered;
use crate::pool::steal::{self, Idle};
use crate::pool::worker::{Envelope, Factory, Heavy, Job, Keyed, Weighed, Worker};
use crate::sync::{const_thread_local, spin_poll, Arc};

const_thread_local! {
    /// Which pool worker the current thread is: `(pool_id, index)` while a
    /// worker loop runs on it, `(NOT_A_WORKER, 0)` otherwise. Read on every
    /// call that waits for a reply, so a worker's call is never queued
    /// behind the worker itself.
    static CURRENT_WORKER: Cell<(usize, usize)> = Cell::new((NOT_A_WORKER, 0));
}

/// No table lives at address 0.
const NOT_A_WORKER: usize = 0;

const_thread_local! {
    /// The key (its hash) of the ordered keyed request the current worker
    /// thread is handling, if any: a call for that same key from inside
    /// the handler would queue behind the handler itself.
    static CURRENT_KEY: Cell<Option<u64>> = Cell::new(None);
}

/// The key of the ordered keyed request the calling thread is handling
/// (one thread-local read); `None` outside a keyed handler.
#[inline]
pub(crate) fn calling_key() -> Option<u64> {
    CURRENT_KEY.with(Cell::get)
}

/// A pool's identity: the address of its table.
///
/// Why the table and not the pool's `Inner`: a worker thread holds an `Arc`
/// to its table for as long as its identity is recorded (the `Inner` may be
/// gone first, when the last handle is dropped on a worker), so no other
/// pool's table can be allocated at that address meanwhile.
#[inline]
pub(crate) fn pool_id(table: &Arc<Table>) -> usize {
    Arc::as_ptr(table) as usize
}

/// The index of the calling thread if it is a worker of the pool whose table
/// is `table`; `None` on every other thread (one thread-local read).
#[inline]
pub(crate) fn calling_worker(table: &Arc<Table>) -> Option<usize> {
    let (pool, index) = CURRENT_WORKER.with(Cell::get);
    (pool == pool_id(table)).then_some(index)
}

/// Runs `f` as worker `worker` (`(pool_id, index)`) as far as
/// [`calling_worker`] on this thread can tell, then puts back what was
/// recorded before, even if `f` unwinds: an async worker shares its thread
/// with other tasks, so it is the worker only while one of its own polls
/// runs (`pool/asynchronous/current.rs`).
#[cfg(feature = "tokio")]
#[inline]
pub(crate) fn as_worker_while<R>(worker: (usize, usize), f: impl FnOnce() -> R) -> R {
    /// Puts the earlier record back when dropped.
    struct Restore((usize, usize));
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT_WORKER.with(|current| current.set(self.0));
        }
    }
    let _restore = Restore(CURRENT_WORKER.with(|current| current.replace(worker)));
    f()
}

/// One worker thread's loop.
pub(crate) struct WorkerLoop<W: Worker> {
    pub(crate) index: usize,
    pub(crate) table: Arc<Table>,
    pub(crate) mailbox: Inbox<Envelope<W>>,
    pub(crate) factory: Arc<Factory<W>>,
    pub(crate) core: Option<core_affinity::CoreId>,
    /// How long to poll an empty mailbox before parking.
    pub(crate) spin: Duration,
    /// Set when the pool steals, or has an ordered keyed mode: every
    /// mailbox any worker may take from (this one's at `index`), the
    /// private one, and the room where free workers sleep.
    pub(crate) steal: Option<Stealing<W>>,
    /// The key queues, if the pool's keyed mode is ordered.
    pub(crate) ordered: Option<Arc<Ordered<W>>>,
    /// An adaptive controller's feed, once one is attached: read once per
    /// request, each handler timed into it.
    pub(crate) feed: std::sync::Arc<FeedSlot>,
    /// Set when a sample found the controller's interval passed: the tick
    /// runs after the request is answered.
    pub(crate) due: Cell<Option<Duration>>,
    /// Every worker's mailbox, in a pool of several workers that each wait
    /// on their own (no `steal`): a weighed request's units on another
    /// worker's shard may be the last that keep that worker from leaving
    /// after a shutdown, so their release posts it a `Wake`.
    pub(crate) owners: Option<Box<[Outbox<Envelope<W>>]>>,
}

/// What a worker of a stealing (or ordered keyed) pool takes work from.
pub(crate) struct Stealing<W: Worker> {
    /// Mailboxes any worker takes from: every worker's own mailbox in a
    /// stealing pool; the keyed mailboxes in an ordered pool that does not
    /// steal.
    pub(crate) mailboxes: Box<[Inbox<Envelope<W>>]>,
    /// A mailbox only this worker takes from: pinned keyed requests in a
    /// stealing pool; the worker's own mailbox in an ordered pool that
    /// does not steal.
    pub(crate) private: Option<Inbox<Envelope<W>>>,
    pub(crate) idle: Arc<Idle>,
}

impl<W: Worker> WorkerLoop<W> {
    pub(crate) fn run(self) {
        if let Some(core) = self.core {
            // Best effort: pinning is a performance hint, not a promise.
            let _ = core_affinity::set_for_current(core);
        }
        CURRENT_WORKER.with(|current| current.set((pool_id(&self.table), self.index)));
        let mut state = self.build();
        let shard = self.table.shard(self.index);
        let mut stole = false;
        let mut batch = Batch::new(self.index, self.batch_size());
        while let Some((from, envelope)) = self.next_envelope(stole, &mut batch) {
            stole = from != self.index;
            let from = envelope.shard(from);
            // Nothing that happens to one envelope may end the loop: a dead
            // worker would strand every unit queued behind it, and its shard
            // would answer `Shutdown` while the pool is not shut down. The
            // handlers and every user drop are already caught inside
            // `process`; this catch is the backstop for whatever is not.
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| {
                self.process(&mut state, envelope, from, &mut batch);
            })) {
                drop_payload(payload);
            }
            if let Some(at) = self.due.take() {
                self.tick(at);
            }
            let Some(stealing) = &self.steal else {
                // The plain loop checks for the end when its mailbox is
                // empty (`next_envelope`), not after every envelope: the
                // check reads the shard's line, which the producer writes.
                batch.give_back_if_full(&self.table);
                continue;
            };
            steal::after_release(&stealing.idle, self.index, from);
            if drained(shard) {
                stealing.idle.leave(self.index);
                break;
            }
        }
        // Every path out of the loop gave the batch back already.
        debug_assert_eq!(batch.held, 0);
        if let Some(mut worker) = state {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| worker.terminate())) {
                drop_payload(payload);
            }
            drop_quietly(worker);
        }
        CURRENT_WORKER.with(|current| current.set((NOT_A_WORKER, 0)));
    }

    /// Handles one envelope taken from shard `from`'s mailbox (this
    /// worker's own, or another's when it steals) and gives its unit back to
    /// that shard, on every path: the [`Unit`] guard releases it if
    /// anything unwinds before the explicit release.
    fn process(
        &self,
        state: &mut Option<W>,
        envelope: Envelope<W>,
        from: usize,
        batch: &mut Batch,
    ) {
        match envelope {
            Envelope::Call(request, reply) => {
                let unit = Unit::new(&self.table, from);
                let outcome = self.handle(state, move |worker| worker.handle_call(request));
                // The unit goes back before the reply is delivered, and
                // the batch's with it: a caller that gets its answer and
                // calls again at once never meets its own stale unit, nor
                // one of a cast handled before its call.
                batch.give_back_with(&self.table, unit, outcome.is_err());
                self.polling_next();
                // A caller that timed out or dropped its future is gone;
                // the request still ran, and that is all it is owed. The
                // unsent reply is dropped here, on the worker: a panic in
                // its `Drop` must not reach the loop.
                drop_quietly(reply.send(outcome));
            }
            Envelope::Cast(message) => {
                let unit = Unit::new(&self.table, from);
                let outcome = self.handle(state, move |worker| worker.handle_cast(message));
                batch.keep(unit, outcome.is_err());
            }
            Envelope::Keyed(Keyed { id, shard, job }) => {
                debug_assert_eq!(shard, from);
                let unit = Unit::new(&self.table, shard);
                // Passed on (the key's next request goes out) after the
                // unit is back and before the reply: a caller that gets
                // its answer and sends the key's next request finds the
                // key's slot free, as it finds its unit.
                let turn = Turn {
                    ordered: self.ordered.as_deref(),
                    id,
                };
                match job {
                    Job::Call(request, reply) => {
                        let outcome = self.handle_keyed(state, id, unit, move |worker| {
                            worker.handle_call(request)
                        });
                        self.polling_next();
                        turn.pass();
                        drop_quietly(reply.send(outcome));
                    }
                    Job::CallPassing(request, reply) => {
                        let outcome = self.handle_keyed(state, id, unit, move |worker| {
                            worker.handle_call(request)
                        });
                        self.polling_next();
                        if turn.anyone_queued() {
                            turn.pass();
                            drop_quietly(reply.send((outcome, false)));
                        } else {
                            match reply.send((outcome, true)) {
                                // The caller reads the reply and passes the
                                // turn on.
                                Ok(()) => turn.leave(),
                                Err(returned) => {
                                    // The caller is gone (it cannot be, while
                                    // it blocks for the reply; but a turn is
                                    // never stranded).
                                    turn.pass();
                                    drop_quietly(returned);
                                }
                            }
                        }
                    }
                    Job::Cast(message) => {
                        // A cast answers nobody: a panic is counted by the
                        // unit's release.
                        let _ = self.handle_keyed(state, id, unit, move |worker| {
                            worker.handle_cast(message)
                        });
                        turn.pass();
                    }
                }
            }
            Envelope::Weighed(weighed) => self.process_weighed(state, *weighed, batch),
            Envelope::Wake => {}
        }
    }

    /// Handles a request of many units and gives its whole grant back,
    /// on every path (the [`Held`] guard releases it if anything unwinds
    /// first); a call's before its reply, with the batch's units.
    #[cold]
    #[inline(never)]
    fn process_weighed(&self, state: &mut Option<W>, weighed: Weighed<W>, batch: &mut Batch) {
        let Weighed { grant, job } = weighed;
        let held = Held::new(&self.table, grant);
        match job {
            Heavy::Call(request, reply) => {
                let outcome = self.handle(state, move |worker| worker.handle_call(request));
                batch.give_back(&self.table);
                let grant = held.release(outcome.is_err());
                self.wake_owners(&grant);
                self.polling_next();
                drop_quietly(reply.send(outcome));
            }
            Heavy::Cast(message) => {
                let outcome = self.handle(state, move |worker| worker.handle_cast(message));
                let grant = held.release(outcome.is_err());
                self.wake_owners(&grant);
            }
        }
    }

    /// After a weighed request gave back `grant`'s units: every other
    /// worker whose shard got units back re-checks its exit rule, as
    /// [`steal::after_release`] does for a stolen unit, and for the same
    /// reason unconditionally (a check of "is that shard closed?" here
    /// would race the close: they are different words).
    fn wake_owners(&self, grant: &Grant) {
        let others = grant.parts().into_iter().filter(|p| p.shard != self.index);
        if let Some(stealing) = &self.steal {
            if others.count() > 0 {
                stealing.idle.wake_all();
            }
        } else if let Some(owners) = &self.owners {
            for part in others {
                // A worker already gone needs no wake-up.
                let _ = owners[part.shard].send(Envelope::Wake);
            }
        }
    }

    /// How many finished casts' units this worker may keep before it gives
    /// them back: 1 (none kept) in a stealing or ordered pool, whose
    /// workers handle other shards' units too; else an eighth of its
    /// shard's limit, at most [`BATCH_MAX`].
    fn batch_size(&self) -> usize {
        if self.steal.is_some() || self.ordered.is_some() {
            return 1;
        }
        (self.table.shard(self.index).limit() / 8).clamp(1, BATCH_MAX)
    }

    /// The next envelope: polled for up to `spin`, so a busy worker takes
    /// its next request without a futex round trip, then waited for, so an
    /// idle worker costs no CPU. `None` once every sender is gone. With the
    /// mailbox it came from (the shard whose unit it holds).
    ///
    /// A stealing worker also takes from the other mailboxes, and sleeps in
    /// the pool's [`Idle`] room instead of its own channel; it returns
    /// `None` once its shard is drained (see `steal.rs`).
    fn next_envelope(&self, stole: bool, batch: &mut Batch) -> Option<(usize, Envelope<W>)> {
        if let Some(stealing) = &self.steal {
            let shard = self.table.shard(self.index);
            return steal::next(
                self.index,
                &stealing.mailboxes,
                stealing.private.as_ref(),
                &stealing.idle,
                self.spin,
                stole,
                || drained(shard),
            );
        }
        // The plain loop: the mailbox first, without waiting. Found empty,
        // the batch goes back and the worker checks whether its shard is
        // drained (after a shutdown's `Wake`, it is once the mailbox runs
        // empty), then polls and waits.
        match self.mailbox.try_recv() {
            Look::Took(envelope) => return Some((self.index, envelope)),
            Look::Gone => {
                batch.give_back(&self.table);
                return None;
            }
            Look::Empty => {
                batch.give_back(&self.table);
                // A resize may have changed the limit; the give-back just
                // brought the shard's line here, so the read is a hit.
                batch.size = self.batch_size();
                if drained(self.table.shard(self.index)) {
                    return None;
                }
            }
        }
        let polled = spin_poll(self.spin, || match self.mailbox.try_recv() {
            Look::Took(envelope) => Some(Some(envelope)),
            Look::Gone => Some(None),
            Look::Empty => None,
        });
        let next = match polled {
            Some(next) => next,
            None => self.mailbox.recv(),
        };
        next.map(|envelope| (self.index, envelope))
    }

    /// Says that this worker's next step is to poll its mailbox, before the
    /// reply that lets a caller send it the next request: that caller's
    /// delivery then wakes nobody, and no other worker takes the request
    /// (see `steal.rs`).
    #[inline]
    fn polling_next(&self) {
        if let Some(stealing) = &self.steal {
            stealing.idle.polling(self.index);
        }
    }

    /// Runs the handler of a keyed request of key `id` (known to the
    /// thread meanwhile, so a call for that key from inside it is refused
    /// rather than queued behind itself), then gives its unit back: the
    /// steps every keyed job takes before its turn passes and its reply.
    fn handle_keyed<R>(
        &self,
        state: &mut Option<W>,
        id: u64,
        unit: Unit<'_>,
        handler: impl FnOnce(&mut W) -> R,
    ) -> Result<R, Error> {
        CURRENT_KEY.with(|key| key.set(Some(id)));
        let outcome = self.handle(state, handler);
        CURRENT_KEY.with(|key| key.set(None));
        unit.release(outcome.is_err());
        outcome
    }

    /// Runs one handler. On a panic the state is dropped, to be rebuilt by
    /// the factory, and the caller is told `WorkerPanicked`.
    fn handle<R>(
        &self,
        state: &mut Option<W>,
        handler: impl FnOnce(&mut W) -> R,
    ) -> Result<R, Error> {
        if state.is_none() {
            *state = self.build();
        }
        let Some(worker) = state.as_mut() else {
            // The factory itself panicked: this request cannot be served.
            // It is dropped here (inside the handler closure), and its
            // `Drop` may panic too.
            drop_quietly(handler);
            return Err(Error::WorkerPanicked);
        };
        let feed = self.feed.get();
        let started = feed.and_then(Feed::start);
        match catch_unwind(AssertUnwindSafe(|| handler(worker))) {
            Ok(result) => {
                if let (Some(feed), Some(started)) = (feed, started) {
                    if let Some(at) = feed.finish(started, Outcome::Success) {
                        self.due.set(Some(at));
                    }
                }
                Ok(result)
            }
            Err(payload) => {
                drop_payload(payload);
                // A restart: the half-updated state is dropped, not reused.
                // Dropping it may itself panic; that must not kill the loop.
                drop_quietly(state.take());
                *state = self.build();
                Err(Error::WorkerPanicked)
            }
        }
    }

    /// Ticks the attached controller at `at`: its algorithm (which may be
    /// a user's) runs here, under no lock, after the request that brought
    /// the tick was answered; a panic in it must not end the loop.
    #[cold]
    fn tick(&self, at: Duration) {
        if let Some(feed) = self.feed.get() {
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| feed.tick_at(at))) {
                drop_payload(payload);
            }
        }
    }

    /// Calls the factory; `None` if it panicked (retried on the next
    /// request).
    fn build(&self) -> Option<W> {
        match catch_unwind(AssertUnwindSafe(|| (self.factory)(self.index))) {
            Ok(worker) => Some(worker),
            Err(payload) => {
                drop_payload(payload);
                None
            }
        }
    }
}

/// The most finished casts' units a plain pool's worker keeps before it
/// gives them back.
const BATCH_MAX: usize = 32;

/// A key's turn, held while its request is handled: passed on to the key's
/// next request by [`pass`](Self::pass), or by `Drop` if processing
/// unwinds first, so a queued request is never stranded. Exactly once.
#[must_use = "dropping the turn passes it on at once"]
struct Turn<'a, W: Worker> {
    ordered: Option<&'a Ordered<W>>,
    id: u64,
}

impl<W: Worker> Turn<'_, W> {
    fn pass(self) {
        let turn = ManuallyDrop::new(self);
        if let Some(ordered) = turn.ordered {
            ordered.finish(turn.id);
        }
    }

    /// Whether a request waits on the key's stripe (a hint: see
    /// [`Job::CallPassing`]).
    fn anyone_queued(&self) -> bool {
        self.ordered
            .is_some_and(|ordered| ordered.anyone_queued(self.id))
    }

    /// Leaves the turn to the caller, which has it with its reply.
    fn leave(self) {
        let _ = ManuallyDrop::new(self);
    }
}

impl<W: Worker> Drop for Turn<'_, W> {
    fn drop(&mut self) {
        // Only reached when processing unwound before `pass`.
        CURRENT_KEY.with(|key| key.set(None));
        if let Some(ordered) = self.ordered {
            ordered.finish(self.id);
        }
    }
}

/// True once the worker may exit: its shard is closed, so nothing more can
/// be admitted to it, and every unit admitted before is back, so its mailbox
/// holds no request.
///
/// The closed bit and the counts live in the shard's own `taken` word: a
/// take that beat the close is already in the count this reads, and one that
/// did not was refused. `loom-tests/tests/loom_pool_shutdown.rs` checks it.
pub(crate) fn drained(shard: &crate::engine::table::Shard) -> bool {
    shard.is_closed() && shard.usage() == 0
}

/// True once a worker that serves every shard may exit (the async pool's
/// shared queue): the table is closed and every shard [`drained`], so every
/// request admitted has been handled. `loom_async_steal` checks the wake-up
/// that lets the last sleeper see it.
#[cfg(any(feature = "tokio", loom))]
#[inline]
pub(crate) fn pool_drained(table: &crate::engine::table::Table) -> bool {
    // `is_closing` first: one load of a word that changes once, so an open
    // pool answers at once (the shards' words then decide).
    table.is_closing()
        && table.is_closed()
        && (0..table.shard_count()).all(|shard| drained(table.shard(shard)))
}
