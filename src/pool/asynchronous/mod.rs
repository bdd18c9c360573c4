//! [`AsyncPool`]: the pool with async workers, each a tokio task running
//! an [`AsyncWorker`]'s handlers one request at a time, behind the same
//! admission table as the thread [`Pool`](crate::Pool): `call_async`,
//! `call_timeout`, `cast`, their `try_` forms, shutdown, and
//! [`WeakAsyncPool`] handles.
//!
//! One idea per file: the mailbox seam (`mailbox.rs`), the worker loop
//! (`worker.rs`), which worker the running task is (`current.rs`), a panic
//! catch for futures (`unwind.rs`). The default dispatch's queues and
//! their wake-up protocol are `pool/async_idle.rs` (there so loom builds
//! them without tokio).

use self::mailbox::Mailboxes;
use self::worker::{AsyncEnvelope, AsyncWorker};
use super::{deadline_after, PoolBuilder, DEFAULT_STEAL};
use crate::engine::ask::How;
use crate::engine::table::Table;
use crate::error::{ConfigError, Error};
use crate::stats::Stats;
use crate::sync::{Arc, Weak};
use std::fmt;
use std::future::Future;
use tokio::sync::watch;

mod build;
mod calls;
mod delivery;

use calls::Unsent;

mod current;

mod mailbox;

mod unwind;

pub(crate) mod worker;

/// How many workers an async pool runs unless told: one per unit of
/// capacity, up to this many.
///
/// An async worker handles one request at a time, so the worker count is
/// how many requests can be *running* (awaiting their I/O) at once; the
/// rest of the capacity waits in the queue. By Little's law a pool whose
/// handlers each wait `L` for I/O serves at most `workers / L` requests a
/// second: 2 workers (the thread pool's default on a 2-core machine) with a
/// 1 ms database round trip serve 2,000 a second however fast the database
/// is. An idle async worker costs a parked task (no thread, no CPU), so the
/// default gives every unit of capacity a worker of its own, so no
/// admitted request waits for a worker. Past 256 the
/// cost that matters is the state each worker builds (often a connection
/// to a server, which has its own limit): name the count with
/// [`PoolBuilder::workers`].
pub(crate) const MAX_DEFAULT_ASYNC_WORKERS: usize = 256;

/// A capacity-limited pool of async workers: requests beyond `capacity`
/// are refused with [`Error::Overload`] at once instead of queueing.
///
/// Made by [`PoolBuilder::build_async`] (feature `tokio`). Each worker is
/// a tokio task that owns an [`AsyncWorker`] value and a mailbox, and
/// handles one request at a time, so its handlers need no lock. Everything
/// else is the thread [`Pool`](crate::Pool)'s: the same admission table, the
/// same names, the same semantics.
///
/// | your handlers | use |
/// |---|---|
/// | block, or compute for long (sync drivers, parsing, compression) | [`Pool`](crate::Pool) |
/// | await I/O and keep state between requests (a connection, a cache) | `AsyncPool` |
/// | are independent async jobs with no shared state | [`Supervisor::spawn_task`](crate::Supervisor::spawn_task) |
/// | run on the caller's own task | [`Limiter`](crate::Limiter) |
///
/// `AsyncPool` is a handle: clone it freely. Dropping the last handle
/// begins the shutdown (the workers drain on their own). A handle kept in a
/// worker's state keeps the pool alive: give workers a [`WeakAsyncPool`].
///
/// # Semantics
///
/// * **Exact capacity.** At no instant are more than `capacity` requests
///   admitted and unfinished, queued or running.
/// * **Released before the reply.** A worker gives the unit back before it
///   delivers the reply.
/// * **Nothing lost.** Every request admitted is handled exactly once, even
///   across a shutdown; a caller never waits for a reply that cannot come.
///   If the runtime itself shuts down first, the pool shuts down with it:
///   the requests its workers had not finished are dropped, their units
///   given back, and their callers told [`Error::Shutdown`].
/// * **Panics.** A handler whose future panics gives its caller
///   [`Error::WorkerPanicked`]; the worker is rebuilt with the factory and
///   keeps its mailbox.
/// * **Calling your own pool.** A call made from worker `k`'s handler is
///   never queued on worker `k`: it goes to another worker, or is refused
///   with [`Error::CallingSelf`] if the pool has one worker. A task the
///   handler spawns is not the worker; awaiting its call from the handler
///   is the user's cycle.
///
/// # Dispatch: every worker works
///
/// By default each worker has a queue, fed from the runtime thread it
/// last ran on (caller and worker stay on one thread, as the tokio actor
/// idiom's do), and a free worker takes from any queue; a worker whose
/// handler awaits hands its queue to a common one at its first `Pending`,
/// and requests meant for it go there until it is done: no request waits
/// behind another while a worker is free, so with interchangeable
/// workers (a connection each to the same server) every worker works, and
/// one slow reply holds up nothing but its own caller. A free worker costs
/// no CPU: it awaits a wake-up, and a request queued while a worker sleeps
/// wakes one. The unit stays with the shard that admitted the request and
/// goes back there before the reply, so everything above holds as written;
/// a panic rebuilds the worker that *ran* the request and is counted on
/// the admitting shard.
///
/// What a worker's state sees is any request of the pool, and the casts of
/// one producer may be handled by different workers, so out of order.
/// For workers that keep per-caller state or must see one producer's
/// casts in order, build with [`PoolBuilder::steal(false)`](crate::PoolBuilder::steal):
/// each worker then has a mailbox of its own, and a request runs on the
/// worker whose shard admitted it (a caller's requests go to its thread's
/// home shard first), in the order its thread sent it.
///
/// ```
/// # use sidejob::{AsyncWorker, Pool};
/// # struct Echo;
/// # impl AsyncWorker for Echo {
/// #     type Request = u8; type Reply = u8; type Message = ();
/// #     async fn handle_call(&mut self, n: u8) -> u8 { n }
/// #     async fn handle_cast(&mut self, _: ()) {}
/// # }
/// let runtime = tokio::runtime::Runtime::new()?;
/// runtime.block_on(async {
///     // Interchangeable workers: the default.
///     let pool = Pool::builder().capacity(64).workers(4).build_async(|_| Echo)?;
///     assert_eq!(pool.call_async(7).await?, 7);
///     // Affinity: each request on the worker whose shard admitted it.
///     let affine = Pool::builder().capacity(64).workers(4).steal(false).build_async(|_| Echo)?;
///     assert_eq!(affine.call_async(7).await?, 7);
///     pool.shutdown_async().await;
///     assert_eq!(pool.usage(), 0);
///     Ok::<(), Box<dyn std::error::Error>>(())
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Memory ordering
///
/// Everything a caller did before `call_async` or `cast` happens-before the
/// handler runs (the queue's lock, or the mailbox's channel); everything
/// the handler did happens-before the caller's future yields the reply.
///
/// # Examples
///
/// A worker per database connection, in an async service:
///
/// ```
/// use std::time::Duration;
/// use sidejob::{AsyncWorker, Error, Pool};
///
/// /// Stands for a connection to a server: each query awaits a reply.
/// struct Conn;
///
/// impl AsyncWorker for Conn {
///     type Request = String;
///     type Reply = usize;
///     type Message = ();
///     async fn handle_call(&mut self, query: String) -> usize {
///         tokio::time::sleep(Duration::from_millis(1)).await; // the round trip
///         query.len()
///     }
///     async fn handle_cast(&mut self, _: ()) {}
/// }
///
/// let runtime = tokio::runtime::Runtime::new()?;
/// runtime.block_on(async {
///     let pool = Pool::builder().name("db").capacity(64).workers(8).build_async(|_| Conn)?;
///     match pool.call_async("SELECT 1".to_string()).await {
///         Ok(n) => assert_eq!(n, 8),
///         Err(Error::Overload) => { /* 64 in flight: shed this one */ }
///         Err(other) => return Err(other.into()),
///     }
///     pool.shutdown_async().await; // drained, every worker terminated
///     Ok::<(), Box<dyn std::error::Error>>(())
/// })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AsyncPool<W: AsyncWorker> {
    inner: Arc<Inner<W>>,
}

struct Inner<W: AsyncWorker> {
    table: Arc<Table>,
    mailboxes: Mailboxes<AsyncEnvelope<W>>,
    name: Arc<str>,
    /// True if its builder was given a name, even the default one: a
    /// reporter refuses a name taken by another live front-end only then.
    named: bool,
    /// Every worker task holds a receiver; `closed()` answers once all are
    /// dropped, i.e. every worker has ended (or the runtime dropped it).
    done: watch::Sender<()>,
    /// The adaptive controller's feed, once one is attached: the worker
    /// tasks time each handler into it.
    feed: std::sync::Arc<crate::adaptive::FeedSlot>,
}

/// A pending reply.
type ReplyReceiver<W> = oneshot::Receiver<Result<<W as AsyncWorker>::Reply, Error>>;

impl<W: AsyncWorker> AsyncPool<W> {
    /// A [`WeakAsyncPool`]: a handle that does not keep the pool alive.
    /// Give one to the pool's own workers: a strong handle in a worker's
    /// state would keep the pool alive forever.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Pool};
    /// # struct Sink;
    /// # impl AsyncWorker for Sink {
    /// #     type Request = (); type Reply = (); type Message = ();
    /// #     async fn handle_call(&mut self, _: ()) {}
    /// #     async fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// let _guard = runtime.enter();
    /// let pool = Pool::builder().capacity(2).build_async(|_| Sink)?;
    /// let weak = pool.downgrade();
    /// let again = weak.upgrade().expect("a handle is alive");
    /// drop((pool, again)); // the last strong handle: shut down
    /// assert!(weak.upgrade().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn downgrade(&self) -> WeakAsyncPool<W> {
        WeakAsyncPool {
            inner: Arc::downgrade(&self.inner),
        }
    }

    crate::engine::keys::key_readings!(
        inner.table;
        setup: "# let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;\n# rt.block_on(async {\nuse sidejob::{AsyncWorker, Pool};\nstruct Echo;\nimpl AsyncWorker for Echo {\n    type Request = u32; type Reply = u32; type Message = ();\n    async fn handle_call(&mut self, n: u32) -> u32 { n }\n    async fn handle_cast(&mut self, _: ()) {}\n}\n",
        make: "let front = Pool::builder().capacity(4).build_async(|_| Echo)?;",
        end: "# Ok::<(), Box<dyn std::error::Error>>(())\n# })?;\n# Ok::<(), Box<dyn std::error::Error>>(())\n"
    );

    /// Requests admitted and not yet finished (queued or running).
    pub fn usage(&self) -> usize {
        self.inner.table.usage()
    }

    /// The most requests that may be admitted and unfinished at once.
    pub fn capacity(&self) -> usize {
        self.inner.table.capacity()
    }

    /// Requests that could be admitted now; a reading, not a reservation.
    pub fn available(&self) -> usize {
        self.inner.table.available()
    }

    /// Changes the capacity while the pool runs, as
    /// [`Pool::set_capacity`](crate::Pool::set_capacity) does; the worker
    /// count does not change.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `capacity` if it is above the largest
    /// capacity the pool can count.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Error, Pool};
    /// # struct Echo;
    /// # impl AsyncWorker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     async fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     async fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// runtime.block_on(async {
    ///     let pool = Pool::builder().capacity(4).workers(2).build_async(|_| Echo)?;
    ///     pool.set_capacity(0)?;
    ///     assert_eq!(pool.call_async(1).await, Err(Error::Overload));
    ///     pool.set_capacity(100)?;
    ///     assert_eq!(pool.call_async(1).await, Ok(1));
    ///     assert_eq!((pool.capacity(), pool.available(), pool.workers()), (100, 100, 2));
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        self.inner.table.set_capacity(capacity)
    }

    /// How many callers wait for capacity now (0 without a waiting room).
    pub fn waiting(&self) -> usize {
        self.inner.table.waiting()
    }

    /// How many workers (and shards) the pool runs.
    pub fn workers(&self) -> usize {
        self.inner.table.shard_count()
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// True if its builder was given a name (see `Reporter`'s claims).
    pub(crate) fn is_named(&self) -> bool {
        self.inner.named
    }

    /// A snapshot of the counters, one [`Stats::shards`] entry per worker.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Pool};
    /// # struct Echo;
    /// # impl AsyncWorker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     async fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     async fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// runtime.block_on(async {
    ///     let pool = Pool::builder().name("echo").capacity(4).workers(2).build_async(|_| Echo)?;
    ///     pool.call_async(1).await?;
    ///     let stats = pool.stats();
    ///     assert_eq!((stats.accepted, stats.completed, stats.shards.len()), (1, 1, 2));
    ///     assert_eq!((pool.name(), pool.usage(), pool.waiting()), ("echo", 0, 0));
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stats(&self) -> Stats {
        self.inner.table.stats()
    }

    /// True once [`shutdown`](Self::shutdown) has closed the pool: every
    /// request made after this answers true is refused with
    /// [`Error::Shutdown`]. The workers may still be finishing what was
    /// admitted before.
    pub fn is_shutdown(&self) -> bool {
        self.inner.table.is_closed()
    }

    /// Begins the shutdown and returns at once: new requests are refused
    /// with [`Error::Shutdown`]; the workers handle everything admitted
    /// before, run [`terminate`](crate::AsyncWorker::terminate) and end.
    /// Idempotent. [`shutdown_async`](Self::shutdown_async) also waits for
    /// them.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Error, Pool};
    /// # struct Echo;
    /// # impl AsyncWorker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     async fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     async fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// runtime.block_on(async {
    ///     let pool = Pool::builder().capacity(4).build_async(|_| Echo)?;
    ///     let other = pool.clone();
    ///     pool.shutdown();
    ///     assert!(other.is_shutdown());
    ///     assert_eq!(other.call_async(1).await, Err(Error::Shutdown));
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// [`shutdown`](Self::shutdown), then waits until every worker has
    /// drained its mailbox, run `terminate` and ended. Called from a
    /// handler of this pool (a worker cannot wait for itself), it only
    /// begins the shutdown.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Error, Pool};
    /// # struct Sink;
    /// # impl AsyncWorker for Sink {
    /// #     type Request = (); type Reply = (); type Message = ();
    /// #     async fn handle_call(&mut self, _: ()) {}
    /// #     async fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// runtime.block_on(async {
    ///     let pool = Pool::builder().capacity(8).build_async(|_| Sink)?;
    ///     pool.cast(()).await?;
    ///     pool.shutdown_async().await;
    ///     assert_eq!(pool.cast(()).await, Err(Error::Shutdown));
    ///     assert_eq!(pool.stats().completed, 1); // the earlier cast was handled
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown_async(&self) -> impl Future<Output = ()> + Send + 'static {
        self.inner.shutdown();
        let inner = (self.calling_worker().is_none()).then(|| Arc::clone(&self.inner));
        async move {
            if let Some(inner) = inner {
                inner.done.closed().await;
            }
        }
    }

    /// Reads the stats while the table lives, without keeping the pool
    /// alive: for a [`Reporter`](crate::observe::Reporter).
    pub(crate) fn weak_stats(&self) -> impl Fn() -> Option<Stats> + Send + 'static {
        let table = Arc::downgrade(&self.inner.table);
        move || table.upgrade().map(|table| table.stats())
    }
}

impl<W: AsyncWorker> Drop for Inner<W> {
    fn drop(&mut self) {
        // Begins the shutdown; the workers end on their own (dropping the
        // senders also ends each worker once its mailbox is empty).
        self.shutdown();
    }
}

impl<W: AsyncWorker> Clone for AsyncPool<W> {
    fn clone(&self) -> Self {
        AsyncPool {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<W: AsyncWorker> fmt::Debug for AsyncPool<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncPool")
            .field("name", &self.name())
            .field("capacity", &self.capacity())
            .field("workers", &self.workers())
            .field("usage", &self.usage())
            .field("shutdown", &self.is_shutdown())
            .finish()
    }
}

/// A handle to an [`AsyncPool`] that does not keep it alive; made by
/// [`AsyncPool::downgrade`]. The handle a worker keeps to its own pool.
///
/// # Examples
///
/// ```
/// # use sidejob::{AsyncWorker, Pool};
/// # struct Sink;
/// # impl AsyncWorker for Sink {
/// #     type Request = (); type Reply = (); type Message = ();
/// #     async fn handle_call(&mut self, _: ()) {}
/// #     async fn handle_cast(&mut self, _: ()) {}
/// # }
/// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
/// let _guard = runtime.enter();
/// let pool = Pool::builder().capacity(2).build_async(|_| Sink)?;
/// let weak = pool.downgrade();
/// assert!(weak.upgrade().is_some());
/// drop(pool); // the last handle: the pool shuts down
/// assert!(weak.upgrade().is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct WeakAsyncPool<W: AsyncWorker> {
    inner: Weak<Inner<W>>,
}

impl<W: AsyncWorker> WeakAsyncPool<W> {
    /// An [`AsyncPool`] handle, or `None` once the last one was dropped.
    pub fn upgrade(&self) -> Option<AsyncPool<W>> {
        self.inner.upgrade().map(|inner| AsyncPool { inner })
    }
}

impl<W: AsyncWorker> Clone for WeakAsyncPool<W> {
    fn clone(&self) -> Self {
        WeakAsyncPool {
            inner: Weak::clone(&self.inner),
        }
    }
}

impl<W: AsyncWorker> fmt::Debug for WeakAsyncPool<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakAsyncPool")
            .field("alive", &(self.inner.strong_count() > 0))
            .finish()
    }
}

/// The controller holds a handle: the pool lives as long as the
/// controller does.
impl<W: AsyncWorker> crate::adaptive::Target for AsyncPool<W> {
    fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        AsyncPool::set_capacity(self, capacity)
    }

    fn capacity(&self) -> usize {
        AsyncPool::capacity(self)
    }

    fn stats(&self) -> Stats {
        AsyncPool::stats(self)
    }

    /// Its worker tasks time each handler (its future, from creation to
    /// its end, waits included).
    fn attach(&self, feed: crate::adaptive::Feed) -> bool {
        self.inner.feed.set(feed).is_ok()
    }
}
