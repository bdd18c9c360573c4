//! The [`AsyncWorker`] trait and the loop each async worker task runs:
//! receive, handle under a panic catch, release the unit, reply; rebuild
//! after a panic, keeping the mailbox; drain and `terminate` on shutdown.
//! The thread pool's loop (`pool/worker.rs`), with `.await` where that one
//! blocks.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;

use super::current::{as_worker, worker_id};
use super::mailbox::{Envelope, Heavy, Inbox, Weighed};
use super::unwind::{guarded, guarded_noting};
use crate::adaptive::{Feed, FeedSlot, Outcome};
use crate::engine::foreign::{drop_payload, drop_quietly};
use crate::engine::table::{Held, Table, Unit};
use crate::error::Error;
use crate::pool::worker_loop::{drained, pool_drained};
use crate::sync::Arc;

/// The state and async handlers of one worker of an
/// [`AsyncPool`](crate::AsyncPool), like an Erlang `gen_server` whose
/// handlers may wait for I/O.
///
/// Each worker is a tokio task owning its `AsyncWorker` value and handling
/// one request at a time, to the end of its future, before it takes the
/// next: handlers take `&mut self` and never need a lock, and while one
/// awaits a database or an HTTP reply its worker holds no thread, only its
/// task. The request, reply and message types are those of
/// [`Worker`](crate::Worker).
///
/// If a handler panics (in any poll of its future), the panic is caught:
/// that request's caller gets [`Error::WorkerPanicked`], the worker is
/// rebuilt by the pool's factory (fresh state), and the requests queued
/// behind it are handled by the new value. `terminate` runs once when the
/// pool shuts down, after the last admitted request.
///
/// # Blocking
///
/// A handler shares its runtime's threads with every other task. A handler
/// that blocks (a synchronous database driver, `std::thread::sleep`, a long
/// computation) stalls those threads and every task on them; use the
/// thread [`Pool`](crate::Pool) for blocking or CPU-bound handlers. A
/// handler future that is never woken holds its worker, and its unit,
/// forever: that is a bug in the handler (give it a timeout of its own).
///
/// # Examples
///
/// ```
/// use sidejob::{AsyncWorker, Pool};
///
/// /// Keeps a running total; an async handler could await I/O here.
/// struct Counter(u64);
///
/// impl AsyncWorker for Counter {
///     type Request = u64;
///     type Reply = u64;
///     type Message = u64;
///
///     async fn handle_call(&mut self, add: u64) -> u64 {
///         tokio::task::yield_now().await; // stands for a database call
///         self.0 += add;
///         self.0
///     }
///
///     async fn handle_cast(&mut self, add: u64) {
///         self.0 += add;
///     }
/// }
///
/// let runtime = tokio::runtime::Runtime::new()?;
/// runtime.block_on(async {
///     let pool = Pool::builder().capacity(8).workers(1).build_async(|_index| Counter(0))?;
///     pool.cast(5).await?;
///     assert_eq!(pool.call_async(1).await?, 6); // one worker: the cast came first
///     pool.shutdown_async().await;
///     Ok::<(), Box<dyn std::error::Error>>(())
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait AsyncWorker: Send + 'static {
    /// What [`AsyncPool::call_async`](crate::AsyncPool::call_async) sends.
    type Request: Send + 'static;
    /// What `handle_call` answers.
    type Reply: Send + 'static;
    /// What [`AsyncPool::cast`](crate::AsyncPool::cast) sends (no answer).
    type Message: Send + 'static;

    /// Handles one call and returns its reply.
    fn handle_call(&mut self, request: Self::Request) -> impl Future<Output = Self::Reply> + Send;

    /// Handles one cast.
    fn handle_cast(&mut self, message: Self::Message) -> impl Future<Output = ()> + Send;

    /// Runs once when the pool shuts down, after the worker has handled
    /// every request admitted before the shutdown. A panic here is caught.
    fn terminate(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// The envelope of an async worker's mailbox.
pub(crate) type AsyncEnvelope<W> =
    Envelope<<W as AsyncWorker>::Request, <W as AsyncWorker>::Reply, <W as AsyncWorker>::Message>;

/// Builds a worker's state; shared by every worker of a pool.
pub(crate) type AsyncFactory<W> = dyn Fn(usize) -> W + Send + Sync;

/// A worker's async init with its error dropped (`None`): for a re-init
/// after a panic, whose error has nobody to go to.
pub(crate) type AsyncInit<W> =
    dyn Fn(usize) -> Pin<Box<dyn Future<Output = Option<W>> + Send>> + Send + Sync;

/// How a worker's state is made: at start (the factory) and after a panic.
pub(crate) enum Maker<W> {
    /// `PoolBuilder::build_async`'s factory, called on the worker's task.
    Sync(Arc<AsyncFactory<W>>),
    /// `PoolBuilder::build_async_init`'s init, awaited on the worker's task
    /// after a panic (at start, the build awaited it).
    Async(Arc<AsyncInit<W>>),
}

impl<W> Clone for Maker<W> {
    fn clone(&self) -> Self {
        match self {
            Maker::Sync(factory) => Maker::Sync(Arc::clone(factory)),
            Maker::Async(init) => Maker::Async(Arc::clone(init)),
        }
    }
}

/// One request in a worker's hands.
enum Job<W: AsyncWorker> {
    Call(W::Request),
    Cast(W::Message),
}

/// One async worker's loop and what it owns.
pub(crate) struct TaskLoop<W: AsyncWorker> {
    pub(crate) index: usize,
    pub(crate) table: Arc<Table>,
    pub(crate) inbox: Inbox<AsyncEnvelope<W>>,
    pub(crate) maker: Maker<W>,
    /// The state made before the loop started (by the build's init), or
    /// `None` to call the factory first thing.
    pub(crate) initial: Option<W>,
    /// Dropped when the loop ends (or the runtime drops the task): the
    /// pool's `shutdown_async` waits for every worker's.
    pub(crate) _alive: tokio::sync::watch::Receiver<()>,
    /// Set when the loop ends on its own; a loop dropped before (by its
    /// runtime) shuts the pool down.
    pub(crate) ended: bool,
    /// An adaptive controller's feed, once one is attached: read once per
    /// request, each handler timed into it.
    pub(crate) feed: std::sync::Arc<FeedSlot>,
    /// Every worker's sender, when each has a mailbox of its own (and
    /// there are several): a weighed request's units on another worker's
    /// shard may be what keeps that worker from leaving after a shutdown,
    /// so their release posts it a `Wake`.
    pub(crate) owners: Option<Box<[tokio::sync::mpsc::UnboundedSender<AsyncEnvelope<W>>]>>,
}

/// What a request in a worker's hands holds: one unit, or a weighed
/// request's grant. Given back by `release`, or by the guard's `Drop`.
enum Hold<'a> {
    One(Unit<'a>),
    Many(Held<'a>),
}

impl<W: AsyncWorker> TaskLoop<W> {
    pub(crate) async fn run(mut self) {
        let mut state = match self.initial.take() {
            Some(worker) => Some(worker),
            None => self.make().await,
        };
        let table = Arc::clone(&self.table);
        let shard = table.shard(self.index);
        // The exit rule: a worker of the shared queues serves every shard,
        // and leaves once all are drained; one with its own mailbox, once
        // its shard is.
        let shared = self.inbox.is_shared();
        let id = self.id();
        let done = || {
            if shared {
                pool_drained(&table)
            } else {
                drained(shard)
            }
        };
        // `from` is the shard whose unit the envelope holds: this worker's
        // own, or any with the shared queues.
        while let Some((from, envelope)) = self.inbox.recv(done).await {
            let (job, reply, grant) = match envelope {
                Envelope::Call(request, reply) => (Job::<W>::Call(request), Some(reply), None),
                Envelope::Cast(message) => (Job::Cast(message), None, None),
                Envelope::Weighed(weighed) => {
                    let Weighed { grant, job } = *weighed;
                    match job {
                        Heavy::Call(request, reply) => {
                            (Job::Call(request), Some(reply), Some(grant))
                        }
                        Heavy::Cast(message) => (Job::Cast(message), None, Some(grant)),
                    }
                }
                Envelope::Wake => {
                    if done() {
                        break;
                    }
                    continue;
                }
            };
            // Held until given back below, on the shard that admitted it;
            // released by its `Drop` if the runtime drops this task while
            // the handler runs.
            let unit = match grant {
                None => Hold::One(Unit::new(&self.table, from)),
                Some(grant) => Hold::Many(Held::new(&self.table, grant)),
            };
            let feed = self.feed.get();
            let started = feed.and_then(Feed::start);
            // The handler, under a panic catch (inline rather than an
            // `async fn` of its own: one state machine less to step through
            // per request).
            if state.is_none() {
                state = self.make().await;
            }
            // Set when the handler panicked and an async init is to make
            // the state again after the reply.
            let mut reinit = false;
            let inbox = &self.inbox;
            let outcome = match state.as_mut() {
                // The factory itself panicked (or the init failed): this
                // request cannot be served.
                None => {
                    drop_quietly(job);
                    Err(Error::WorkerPanicked)
                }
                // Creating the handler's future is user code too: inside
                // the guard.
                Some(worker) => match guarded_noting(
                    id,
                    async move {
                        match job {
                            Job::Call(request) => Some(worker.handle_call(request).await),
                            Job::Cast(message) => {
                                worker.handle_cast(message).await;
                                None
                            }
                        }
                    },
                    // At its first `Pending` the handler awaits: what
                    // waits at this worker goes where a free one takes it.
                    || inbox.away(),
                )
                .await
                {
                    Ok(reply) => Ok(reply),
                    Err(payload) => {
                        drop_payload(payload);
                        // A restart: the half-updated state is dropped, not
                        // reused; the mailbox stays, and the new state
                        // serves it. The factory runs now; an async init,
                        // after the reply (below): its caller need not
                        // wait for a reconnect.
                        drop_quietly(state.take());
                        match &self.maker {
                            Maker::Sync(factory) => state = build(&**factory, self.index, id),
                            Maker::Async(_) => reinit = true,
                        }
                        Err(Error::WorkerPanicked)
                    }
                },
            };
            let panicked = outcome.is_err();
            // A panic is no reading of the backend's speed: not recorded.
            let due = match (feed, started, panicked) {
                (Some(feed), Some(started), false) => feed.finish(started, Outcome::Success),
                _ => None,
            };
            // The unit goes back before the reply is delivered: a caller
            // that gets its answer and calls again at once never meets its
            // own stale unit.
            match unit {
                Hold::One(unit) => unit.release(panicked),
                Hold::Many(held) => self.release_weighed(held, panicked),
            }
            if let Some(reply) = reply {
                // A call's job always answers `Some`; `None` cannot come.
                let outcome = outcome.and_then(|reply| reply.ok_or(Error::WorkerPanicked));
                // A caller that timed out or dropped its future is gone;
                // the request still ran. An unsent reply is dropped here,
                // and its `Drop` may panic.
                if let Err(unsent) = reply.send(outcome) {
                    drop_quietly(unsent);
                }
            }
            if let (Some(feed), Some(at)) = (feed, due) {
                // The algorithm (maybe a user's) runs here, after the
                // answer, under no lock; its panic must not end the task.
                if let Err(payload) = catch_unwind(AssertUnwindSafe(|| feed.tick_at(at))) {
                    drop_payload(payload);
                }
            }
            if reinit {
                state = self.make().await;
            }
            // With its own mailbox, the worker leaves once its shard is
            // drained (its channel is not closed: the pool's handles still
            // hold the sender). The shared queue's `recv` checks on its own.
            if !shared && done() {
                break;
            }
        }
        if let Some(mut worker) = state {
            if let Err(payload) = guarded(id, worker.terminate()).await {
                drop_payload(payload);
            }
            drop_quietly(worker);
        }
        self.ended = true;
    }

    /// Gives back a weighed request's grant; with a mailbox per worker,
    /// every other worker whose shard got units back re-checks its exit
    /// rule, unconditionally (a check of "is that shard closed?" here
    /// would race the close, on another word: `steal::after_release`).
    /// The shared queues need nothing: this worker looks again next, and
    /// the pool's exit rule covers every shard.
    #[cold]
    #[inline(never)]
    fn release_weighed(&self, held: Held<'_>, panicked: bool) {
        let grant = held.release(panicked);
        if let Some(owners) = &self.owners {
            for part in grant.parts() {
                if part.shard != self.index {
                    // A worker already gone needs no wake-up.
                    let _ = owners[part.shard].send(Envelope::Wake);
                }
            }
        }
    }

    /// This worker's record for `calling_worker` (`current.rs`).
    fn id(&self) -> (usize, usize) {
        worker_id(&self.table, self.index)
    }

    /// Makes the worker's state (as this worker): the factory's, or the
    /// async init's. `None` if it panicked or the init failed (tried again
    /// on the next request). The future borrows nothing of the loop (which
    /// is not `Sync`).
    fn make(&self) -> impl Future<Output = Option<W>> + Send + 'static {
        let (maker, index, id) = (self.maker.clone(), self.index, self.id());
        async move {
            match maker {
                Maker::Sync(factory) => build(&*factory, index, id),
                Maker::Async(init) => {
                    // Calling the init is user code too: inside the guard.
                    match guarded(id, async { init(index).await }).await {
                        Ok(made) => made,
                        Err(payload) => {
                            drop_payload(payload);
                            None
                        }
                    }
                }
            }
        }
    }
}

/// Calls the factory as worker `id`; `None` if it panicked.
fn build<W>(factory: &AsyncFactory<W>, index: usize, id: (usize, usize)) -> Option<W> {
    let factory = std::panic::AssertUnwindSafe(|| factory(index));
    match as_worker(id, || std::panic::catch_unwind(factory)) {
        Ok(worker) => Some(worker),
        Err(payload) => {
            drop_payload(payload);
            None
        }
    }
}

impl<W: AsyncWorker> Drop for TaskLoop<W> {
    /// A loop that ends normally leaves nothing queued in its mailbox (its
    /// shard is drained, or every sender is gone). One dropped early, by a
    /// runtime shutting down, shuts the pool down and gives back the unit
    /// of every envelope still queued (with the shared queues, all of
    /// them, which then refuse later pushes under their locks): their
    /// callers see `Shutdown` (the reply slot is dropped), and the pool's
    /// count stays exact. (With its own mailbox, a send racing with this drain, one
    /// that passed the channel's closed check before `close` and pushes
    /// after the last `try_recv`, is dropped with the channel and keeps its
    /// unit: `usage` of a pool whose runtime is gone may read one high per
    /// such race.)
    fn drop(&mut self) {
        if !self.ended {
            // The runtime is dropping this worker (it is shutting down):
            // the pool cannot serve any more. Closing the table refuses
            // new requests with `Shutdown` at once and wakes every waiter.
            self.table.close();
        }
        let table = &self.table;
        self.inbox.close_and_drain(!self.ended, |shard, envelope| {
            envelope.give_back(table, shard);
            drop_quietly(envelope);
        });
    }
}
