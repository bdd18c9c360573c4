//! [`AsyncPool`]: the pool with async workers, each a tokio task running
//! an [`AsyncWorker`]'s handlers one request at a time, behind the same
//! admission table as the thread [`Pool`](crate::Pool): `call_async`,
//! `call_timeout`, `cast`, their `try_` forms, shutdown, and
//! [`WeakAsyncPool`] handles.
//!
//! One idea per file: the mailbox seam (`mailbox.rs`), the worker loop
//! (`worker.rs`), which worker the running task is (`current.rs`), a panic
//! catch for futures (`unwind.rs`). Stealing's wake-up protocol is
//! `pool/async_idle.rs` (there so loom builds it without tokio).

mod current;
mod mailbox;
mod unwind;
pub(crate) mod worker;

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::{oneshot, watch};

use self::current::{as_worker, calling_worker};
use self::mailbox::{mailboxes, Envelope, Mailboxes};
use self::worker::{AsyncEnvelope, AsyncFactory, AsyncWorker, TaskLoop};
use super::{deadline_after, PoolBuilder, DEFAULT_STEAL};
use crate::engine::table::Table;
use crate::error::{ConfigError, Error, Refused, TryCallError};
use crate::stats::Stats;
use crate::sync::{now, Arc, Weak};

/// How many workers an async pool runs unless told: one per unit of
/// capacity, up to this many.
///
/// An async worker handles one request at a time, so the worker count is
/// how many requests can be *running* (awaiting their I/O) at once; the
/// rest of the capacity waits in mailboxes. By Little's law a pool whose
/// handlers each wait `L` for I/O serves at most `workers / L` requests a
/// second: 2 workers (the thread pool's default on a 2-core machine) with a
/// 1 ms database round trip serve 2,000 a second however fast the database
/// is. An idle async worker costs a parked task (no thread, no CPU), so the
/// default gives every unit of capacity a worker of its own, and requests
/// queue only behind requests of the same worker's own state. Past 256 the
/// cost that matters is the state each worker builds (often a connection
/// to a server, which has its own limit): name the count with
/// [`PoolBuilder::workers`].
pub const MAX_DEFAULT_ASYNC_WORKERS: usize = 256;

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
/// # Stealing
///
/// Built with [`PoolBuilder::steal(true)`](PoolBuilder::steal), a worker
/// whose own mailbox is empty takes the oldest request waiting at another
/// worker, so one slow request (a long await, a slow server) no longer
/// holds up the requests queued behind it while other workers are free.
/// The unit stays with the shard that admitted the request and goes back
/// there before the reply, so everything above holds as written; a panic
/// rebuilds the worker that *ran* the request and is counted on the
/// admitting shard. What changes is what a worker's state sees: it is no
/// longer "the requests sent to me", but any request of the pool, and the
/// casts of one producer may be handled by different workers, so out of
/// order. Keep it off (the default) for workers that keep per-caller state
/// or must see one producer's casts in order. A free worker costs no CPU:
/// it awaits a wake-up, and a delivery wakes one only when the mailbox's
/// own worker is not already about to take it.
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
///     let pool = Pool::builder().capacity(64).workers(4).steal(true).build_async(|_| Echo)?;
///     assert_eq!(pool.call_async(7).await?, 7);
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
/// handler runs (the mailbox is a channel); everything the handler did
/// happens-before the caller's future yields the reply.
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
    /// Every worker task holds a receiver; `closed()` answers once all are
    /// dropped, i.e. every worker has ended (or the runtime dropped it).
    done: watch::Sender<()>,
}

/// A pending reply.
type ReplyReceiver<W> = oneshot::Receiver<Result<<W as AsyncWorker>::Reply, Error>>;

/// Where a call stands when its future is returned.
enum Pending<W: AsyncWorker, T> {
    /// Admitted and sent: the reply (or nothing, for a cast) is awaited.
    Sent(T),
    /// Every shard was full and the pool has a waiting room: the future
    /// waits for a unit, then sends.
    Wait(Arc<Inner<W>>, Unsent<W>),
    /// Refused at once.
    Refused(Error),
}

/// A request or message waiting for a unit.
enum Unsent<W: AsyncWorker> {
    Call(W::Request),
    Cast(W::Message),
}

/// How a request takes its unit.
#[derive(Clone, Copy)]
enum Admission {
    /// Fail fast, counting an `Overload`.
    Try,
    /// Fail fast without counting an `Overload`: the caller waits next.
    Probe,
}

impl<W: AsyncWorker> AsyncPool<W> {
    /// Sends `request` now and returns a future of its reply.
    ///
    /// Admission happens here, when `call_async` is called, not when the
    /// future is first polled: a full pool refuses at once (the future then
    /// resolves to the error immediately), and an admitted request runs even
    /// if the future is never polled. With a waiting room
    /// ([`PoolBuilder::max_waiters`]) a refused caller's future waits for a
    /// unit, in the room's order, for up to
    /// [`max_wait`](PoolBuilder::max_wait). A worker of this pool never
    /// waits for its capacity.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`]: every shard was at its limit (and the waiting
    ///   room, if any, was full).
    /// * [`Error::Timeout`]: it waited `max_wait` for capacity in vain.
    /// * [`Error::Shutdown`]: the pool is shut down.
    /// * [`Error::WorkerPanicked`]: the handler panicked on this request.
    /// * [`Error::CallingSelf`]: called from a handler of this pool, which
    ///   has one worker: the call could only queue behind its caller.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not cancel a request that was sent: it will
    /// be handled, and its unit released when it is; only the reply is
    /// dropped. A request still waiting for capacity is not sent: dropping
    /// the future gives up the wait and drops the request, and a unit
    /// handed to it meanwhile goes to the next waiter.
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
    /// let replies = runtime.block_on(async {
    ///     let pool = Pool::builder().capacity(64).build_async(|_| Echo)?;
    ///     let calls: Vec<_> = (0..8).map(|n| pool.call_async(n)).collect();
    ///     let mut replies = Vec::new();
    ///     for call in calls {
    ///         replies.push(call.await?);
    ///     }
    ///     Ok::<_, Box<dyn std::error::Error>>(replies)
    /// })?;
    /// assert_eq!(replies, (0..8).collect::<Vec<u8>>());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_async(
        &self,
        request: W::Request,
    ) -> impl Future<Output = Result<W::Reply, Error>> + Send + 'static {
        let pending = self.start_call(request);
        async move {
            let reply = match pending {
                Pending::Sent(reply) => reply,
                Pending::Refused(error) => return Err(error),
                Pending::Wait(inner, job) => inner.wait_and_call(job, None).await?,
            };
            // A dropped reply slot means the worker is gone.
            reply.await.unwrap_or(Err(Error::Shutdown))
        }
    }

    /// Like [`call_async`](Self::call_async), but the future gives up after
    /// `timeout` with [`Error::Timeout`].
    ///
    /// The timeout covers both waits, for capacity (with a waiting room)
    /// and for the reply. As with Erlang's `gen_server:call`, a request
    /// that timed out may still run: it was admitted. Its unit is released
    /// when the worker finishes it, and its reply is dropped.
    ///
    /// # Errors
    ///
    /// As [`call_async`](Self::call_async), plus [`Error::Timeout`].
    ///
    /// # Panics
    ///
    /// The future panics when polled outside a tokio runtime with timers
    /// enabled (`enable_time`, or `enable_all`), as `tokio::time::timeout`
    /// does.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob::{AsyncWorker, Error, Pool};
    ///
    /// /// Never answers until told to.
    /// struct Stuck(std::sync::Arc<tokio::sync::Notify>);
    /// impl AsyncWorker for Stuck {
    ///     type Request = (); type Reply = (); type Message = ();
    ///     async fn handle_call(&mut self, _: ()) { self.0.notified().await }
    ///     async fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    /// runtime.block_on(async {
    ///     let go = std::sync::Arc::new(tokio::sync::Notify::new());
    ///     let pool = {
    ///         let go = go.clone();
    ///         Pool::builder().capacity(1).workers(1).build_async(move |_| Stuck(go.clone()))?
    ///     };
    ///     let answer = pool.call_timeout((), Duration::from_millis(10)).await;
    ///     assert_eq!(answer, Err(Error::Timeout));
    ///     assert_eq!(pool.usage(), 1); // still admitted: it ends when told
    ///     go.notify_one();
    ///     pool.shutdown_async().await;
    ///     assert_eq!(pool.usage(), 0);
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_timeout(
        &self,
        request: W::Request,
        timeout: Duration,
    ) -> impl Future<Output = Result<W::Reply, Error>> + Send + 'static {
        // One deadline for the wait for capacity and the wait for the reply.
        let deadline = deadline_after(now(), timeout);
        let pending = self.start_call(request);
        async move {
            let reply = match pending {
                Pending::Sent(reply) => reply,
                Pending::Refused(error) => return Err(error),
                Pending::Wait(inner, job) => inner.wait_and_call(job, deadline).await?,
            };
            let Some(deadline) = deadline else {
                return reply.await.unwrap_or(Err(Error::Shutdown));
            };
            match tokio::time::timeout_at(deadline.into(), reply).await {
                Ok(outcome) => outcome.unwrap_or(Err(Error::Shutdown)),
                Err(_elapsed) => Err(Error::Timeout),
            }
        }
    }

    /// Sends `message` to a worker, without waiting for it to be handled;
    /// the future answers once it is admitted.
    ///
    /// As with [`call_async`](Self::call_async), admission is tried when
    /// `cast` is called: without a waiting room the future is ready at
    /// once, and a message admitted is handled even if the future is never
    /// polled. With a waiting room, a refused message waits for a unit in
    /// the future (a worker of this pool never waits). `Ok` means admitted:
    /// the message will be handled exactly once, even if the pool shuts
    /// down first. A panic in its handler is counted in
    /// [`Stats::panicked`]; nobody else is told.
    ///
    /// # Errors
    ///
    /// [`Error::Overload`] when every shard is at its limit (and the room,
    /// if any, is full), [`Error::Timeout`] when it waited `max_wait` in
    /// vain, [`Error::Shutdown`] once the pool is shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Pool};
    /// # struct Sink;
    /// # impl AsyncWorker for Sink {
    /// #     type Request = (); type Reply = (); type Message = u64;
    /// #     async fn handle_call(&mut self, _: ()) {}
    /// #     async fn handle_cast(&mut self, _: u64) {}
    /// # }
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// runtime.block_on(async {
    ///     let pool = Pool::builder().capacity(100).build_async(|_| Sink)?;
    ///     for n in 0..10 {
    ///         pool.cast(n).await?;
    ///     }
    ///     pool.shutdown_async().await;
    ///     assert_eq!(pool.stats().completed, 10);
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cast(
        &self,
        message: W::Message,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'static {
        let can_wait = self.inner.table.has_room() && self.calling_worker().is_none();
        let admission = if can_wait {
            Admission::Probe
        } else {
            Admission::Try
        };
        let pending = match self.submit_cast(admission, message) {
            Ok(()) => Pending::Sent(()),
            Err(refused) if can_wait && refused.error() == Error::Overload => {
                let (_, message) = refused.into_parts();
                Pending::Wait(Arc::clone(&self.inner), Unsent::Cast(message))
            }
            Err(refused) => Pending::Refused(refused.error()),
        };
        async move {
            match pending {
                Pending::Sent(()) => Ok(()),
                Pending::Refused(error) => Err(error),
                Pending::Wait(inner, job) => inner.wait_and_send(job, None).await.map(drop),
            }
        }
    }

    /// Like [`call_async`](Self::call_async), but never waits for capacity,
    /// and a request that is not admitted is handed back in the error.
    ///
    /// # Errors
    ///
    /// * [`TryCallError::Refused`], holding the request: [`Error::Overload`],
    ///   [`Error::Shutdown`] or [`Error::CallingSelf`].
    /// * [`TryCallError::Failed`]: admitted, but no reply will come
    ///   ([`Error::WorkerPanicked`], or [`Error::Shutdown`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Error, Pool};
    /// # struct Len;
    /// # impl AsyncWorker for Len {
    /// #     type Request = Vec<u8>; type Reply = usize; type Message = ();
    /// #     async fn handle_call(&mut self, bytes: Vec<u8>) -> usize { bytes.len() }
    /// #     async fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// runtime.block_on(async {
    ///     let pool = Pool::builder().capacity(4).build_async(|_| Len)?;
    ///     assert_eq!(pool.try_call(vec![1, 2, 3]).await?, 3);
    ///     pool.shutdown();
    ///     let refused = pool.try_call(vec![4]).await.unwrap_err();
    ///     assert_eq!(refused.error(), Error::Shutdown);
    ///     assert_eq!(refused.into_request(), Some(vec![4])); // not lost
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_call(
        &self,
        request: W::Request,
    ) -> impl Future<Output = Result<W::Reply, TryCallError<W::Request>>> + Send + 'static {
        let submitted = self.submit_call(Admission::Try, request);
        async move {
            let reply = submitted?;
            reply
                .await
                .unwrap_or(Err(Error::Shutdown))
                .map_err(TryCallError::Failed)
        }
    }

    /// Like [`cast`](Self::cast), but never waits, and a message that is
    /// not admitted is handed back. Not async: it answers at once.
    ///
    /// # Errors
    ///
    /// [`Refused`] holding the message: [`Error::Overload`] when every
    /// shard is at its limit, [`Error::Shutdown`] once the pool is shut
    /// down.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{AsyncWorker, Pool};
    /// # struct Sink;
    /// # impl AsyncWorker for Sink {
    /// #     type Request = (); type Reply = (); type Message = String;
    /// #     async fn handle_call(&mut self, _: ()) {}
    /// #     async fn handle_cast(&mut self, _: String) {}
    /// # }
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// let _guard = runtime.enter();
    /// let pool = Pool::builder().capacity(4).build_async(|_| Sink)?;
    /// pool.try_cast("kept".to_string())?;
    /// pool.shutdown();
    /// let refused = pool.try_cast("returned".to_string()).unwrap_err();
    /// assert!(refused.is_shutdown());
    /// assert_eq!(refused.into_inner(), "returned");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_cast(&self, message: W::Message) -> Result<(), Refused<W::Message>> {
        self.submit_cast(Admission::Try, message)
    }

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
    /// before, run [`terminate`](AsyncWorker::terminate) and end.
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
    /// alive: for a [`Reporter`](crate::Reporter).
    pub(crate) fn weak_stats(&self) -> impl Fn() -> Option<Stats> + Send + 'static {
        let table = Arc::downgrade(&self.inner.table);
        move || table.upgrade().map(|table| table.stats())
    }

    #[inline]
    fn calling_worker(&self) -> Option<usize> {
        calling_worker(&self.inner.table)
    }

    /// Tries admission for a call and sends it; or says how its future
    /// waits.
    fn start_call(&self, request: W::Request) -> Pending<W, ReplyReceiver<W>> {
        // A worker of this pool never waits for its capacity (a unit handed
        // over could be its own shard's, which only it serves).
        let can_wait = self.inner.table.has_room() && self.calling_worker().is_none();
        let admission = if can_wait {
            Admission::Probe
        } else {
            Admission::Try
        };
        match self.submit_call(admission, request) {
            Ok(reply) => Pending::Sent(reply),
            Err(refused) if can_wait && refused.error() == Error::Overload => {
                let (_, request) = refused.into_parts();
                Pending::Wait(Arc::clone(&self.inner), Unsent::Call(request))
            }
            // A refused request is dropped now, not kept in the future.
            Err(refused) => Pending::Refused(refused.error()),
        }
    }

    /// Admits one unit and posts a call; the receiver of its reply, or the
    /// request back.
    #[inline]
    fn submit_call(
        &self,
        admission: Admission,
        request: W::Request,
    ) -> Result<ReplyReceiver<W>, Refused<W::Request>> {
        let admitted = match self.calling_worker() {
            None => self.inner.admit(admission),
            Some(worker) => self.inner.admit_from_worker(worker),
        };
        let shard = match admitted {
            Ok(shard) => shard,
            Err(error) => return Err(Refused::new(error, request)),
        };
        let (reply, receiver) = oneshot::channel();
        match self.inner.deliver(shard, Envelope::Call(request, reply)) {
            Ok(()) => Ok(receiver),
            Err(Envelope::Call(request, _)) => Err(Refused::new(Error::Shutdown, request)),
            Err(_) => unreachable!("a mailbox hands back the envelope it was given"),
        }
    }

    /// Admits one unit and posts a cast, or hands the message back. A
    /// worker's cast needs no reply, so it may go to any shard, its own
    /// included.
    #[inline]
    fn submit_cast(
        &self,
        admission: Admission,
        message: W::Message,
    ) -> Result<(), Refused<W::Message>> {
        let shard = match self.inner.admit(admission) {
            Ok(shard) => shard,
            Err(error) => return Err(Refused::new(error, message)),
        };
        match self.inner.deliver(shard, Envelope::Cast(message)) {
            Ok(()) => Ok(()),
            Err(Envelope::Cast(message)) => Err(Refused::new(Error::Shutdown, message)),
            Err(_) => unreachable!("a mailbox hands back the envelope it was given"),
        }
    }
}

impl<W: AsyncWorker> Inner<W> {
    #[inline]
    fn admit(&self, admission: Admission) -> Result<usize, Error> {
        match admission {
            Admission::Try => self.table.acquire(),
            Admission::Probe => self.table.probe(),
        }
    }

    /// Admission for a call made by this pool's own worker `me`, which
    /// waits for its reply: never on `me`'s shard, whose queue only `me`
    /// serves, and never waiting.
    #[cold]
    fn admit_from_worker(&self, me: usize) -> Result<usize, Error> {
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
    async fn wait_and_send(
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
    async fn wait_and_call(
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
    fn deliver(&self, shard: usize, envelope: AsyncEnvelope<W>) -> Result<(), AsyncEnvelope<W>> {
        let delivered = self.mailboxes.deliver(shard, envelope);
        if delivered.is_err() {
            // The worker is gone: its shard closed and drained (this unit
            // was taken just before the close), or the runtime dropped it.
            // Nothing was queued.
            self.table.release(shard, false);
        }
        delivered
    }

    fn shutdown(&self) {
        // 1. Close every shard: a take either came before this (and its
        //    envelope will be handled) or is refused with `Shutdown`.
        self.table.close();
        // 2. Wake every worker so it checks whether its shard is drained.
        self.mailboxes.wake_all(|| Envelope::Wake);
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

impl PoolBuilder {
    /// Starts an [`AsyncPool`] on the current tokio runtime: one task per
    /// worker, each with the state `factory(index)` returns (built on the
    /// worker's task, at start and after every panic).
    ///
    /// The settings are the thread pool's, except two: `workers` defaults
    /// to the capacity, up to [`MAX_DEFAULT_ASYNC_WORKERS`] (see there why
    /// not the CPU count), and `spin_wait` and `pin_workers` do not apply
    /// (a task never spins; the runtime places it). [`steal`](Self::steal)
    /// applies (see [`AsyncPool`]'s "Stealing"); a free worker looks at
    /// every mailbox before it sleeps, so with stealing on, name a worker
    /// count nearer the concurrency you need than the default 256.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field when `capacity` is unset, 0 or too
    /// large, `workers` is 0 or too large, or `name` contains a NUL byte;
    /// naming `workers` when called outside a tokio runtime.
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
    /// let err = Pool::builder().capacity(8).build_async(|_| Sink).unwrap_err();
    /// assert_eq!(err.field(), "workers"); // no runtime here
    ///
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// let _guard = runtime.enter();
    /// let pool = Pool::builder().capacity(8).build_async(|_| Sink)?;
    /// assert_eq!(pool.workers(), 8); // one per unit, for I/O-bound handlers
    /// let err = Pool::builder().capacity(0).build_async(|_| Sink).unwrap_err();
    /// assert_eq!(err.to_string(), "invalid `capacity`: must be at least 1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn build_async<W, F>(&self, factory: F) -> Result<AsyncPool<W>, ConfigError>
    where
        W: AsyncWorker,
        F: Fn(usize) -> W + Send + Sync + 'static,
    {
        let handle = Handle::try_current().map_err(|_| ConfigError::no_runtime("workers"))?;
        self.build_async_on(&handle, factory)
    }

    /// Like [`build_async`](Self::build_async), with the workers on the
    /// runtime `handle` names; callable from any thread.
    ///
    /// # Errors
    ///
    /// As [`build_async`](Self::build_async), except that there is always
    /// a runtime.
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
    /// let runtime = tokio::runtime::Runtime::new()?;
    /// let pool = Pool::builder().capacity(4).build_async_on(runtime.handle(), |_| Echo)?;
    /// assert_eq!(runtime.block_on(pool.call_async(7))?, 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn build_async_on<W, F>(
        &self,
        handle: &Handle,
        factory: F,
    ) -> Result<AsyncPool<W>, ConfigError>
    where
        W: AsyncWorker,
        F: Fn(usize) -> W + Send + Sync + 'static,
    {
        let name: Arc<str> = Arc::from(ConfigError::check_name(self.name.as_deref())?);
        let capacity = self.capacity.ok_or(ConfigError::missing("capacity"))?;
        let workers = self
            .workers
            .unwrap_or_else(|| capacity.clamp(1, MAX_DEFAULT_ASYNC_WORKERS));
        let table = Table::new(capacity, workers, self.probe)
            .map_err(|err| {
                if err.field() == "shards" {
                    err.with_field("workers")
                } else {
                    err
                }
            })?
            .with_policy(&self.policy)?;
        let table = Arc::new(table);
        let factory: Arc<AsyncFactory<W>> = Arc::new(factory);
        let steal = self.steal.unwrap_or(DEFAULT_STEAL);
        let (mailboxes, inboxes) = mailboxes(table.shard_count(), steal);
        let (done, alive) = watch::channel(());
        for (index, inbox) in inboxes.into_iter().enumerate() {
            let worker = TaskLoop {
                index,
                table: Arc::clone(&table),
                inbox,
                factory: Arc::clone(&factory),
                _alive: alive.clone(),
                ended: false,
            };
            // Detached: `done` says when it ends.
            drop(handle.spawn(as_worker(&table, index, worker.run())));
        }
        drop(alive);
        Ok(AsyncPool {
            inner: Arc::new(Inner {
                table,
                mailboxes,
                name,
                done,
            }),
        })
    }
}
