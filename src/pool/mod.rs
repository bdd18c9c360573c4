//! [`Pool`]: gen_server-like workers, one per shard, behind the admission
//! table: `call`, `call_timeout`, `call_async`, `cast`, their `try_` forms
//! that hand a refused value back, the keyed forms (`call_keyed` and
//! siblings, in a [`KeyedMode`]), shutdown, and [`WeakPool`] handles.

#[cfg(feature = "tokio")]
pub(crate) mod asynchronous;
// Not under `asynchronous/`, so loom builds it without tokio.
#[cfg(any(feature = "tokio", loom))]
pub(crate) mod async_idle;
pub(crate) mod jump;
pub(crate) mod key_queue;
pub(crate) mod mailbox;
pub(crate) mod ordered;
pub(crate) mod steal;
pub(crate) mod worker;

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::time::{Duration, Instant};

use crate::engine::probe::Probe;
use crate::engine::table::Table;
use crate::engine::threads;
use crate::engine::waiters::{Policy, QueueOrder};
use crate::error::{ConfigError, Error, Refused, TryCallError};
use crate::pool::jump::jump_hash;
use crate::pool::worker::{
    calling_key, calling_worker, Envelope, Factory, Job, Stealing, Worker, WorkerLoop,
};
use crate::stats::Stats;
use crate::sync::{now, os_thread, spin_poll, Arc, Mutex, Weak};
use key_queue::KeyQueues;
use mailbox::Outbox;
use ordered::Ordered;
use steal::Idle;

/// A capacity-limited pool of workers: requests beyond `capacity` are
/// refused with [`Error::Overload`] at once instead of queueing.
///
/// The pool runs one worker thread per shard, each owning a [`Worker`]
/// value and a mailbox. A request takes one unit of its shard's capacity
/// when it is admitted and holds it until the worker has *finished*
/// handling it, so `capacity` bounds every request that is queued or
/// running, and no mailbox can grow past its shard's limit. A caller
/// starts at its own shard (by thread or CPU, see [`Probe`]) and moves to
/// the next only if that one is full.
///
/// `Pool` is a handle: clone it freely, send it to other threads. Dropping
/// the last handle shuts the pool down (see [`Pool::shutdown`]). A handle
/// kept *inside* the pool (in a worker's state, or in a request or message
/// still queued) keeps the pool alive: workers that hold a `Pool` to their
/// own pool form a cycle, and dropping every outside handle then shuts
/// nothing down. Give workers a [`WeakPool`] ([`Pool::downgrade`]) instead,
/// and upgrade it for each use.
///
/// # Semantics
///
/// * **Exact capacity.** At no instant are more than `capacity` requests
///   admitted and unfinished (the `*_unbounded` calls excepted).
/// * **Released before the reply.** A worker gives the unit back before it
///   delivers the reply, so a caller that gets its answer and calls again
///   never meets its own stale unit.
/// * **Casts' units come back in runs.** On a pool that does not steal
///   (one worker, or [`steal(false)`](PoolBuilder::steal)) and has no
///   ordered keyed mode, a worker keeps the units of the casts it has
///   finished and gives them back in one atomic step: when the run
///   reaches an eighth of its shard's limit (at most 32), when it finds
///   its mailbox empty, and with the unit of its next call, before that
///   call's reply. A cast's unit is therefore held longer, never shorter
///   (the bound stays exact): at most while the worker handles 31 more
///   casts (a run's length less one), fewer if its mailbox runs empty or a
///   call comes first; and a run holds at most an eighth of the shard's
///   limit as the worker last read it (again whenever its mailbox runs
///   empty, so a resize is followed). A stream of
///   casts then moves the shard's cache line between the producer and the
///   worker once a run instead of once a message.
/// * **One order per sender.** A worker takes one thread's requests in the
///   order that thread sent them, including `*_unbounded` ones and those
///   a grown capacity admits past the mailbox's ring (its overflow keeps
///   the order; `pool/mailbox.rs`).
/// * **Nothing lost.** Every request admitted is handled exactly once, even
///   across a shutdown; a caller never waits for a reply that cannot come.
/// * **Panics.** A panicking handler gives its caller
///   [`Error::WorkerPanicked`]; the worker is rebuilt with the factory and
///   the requests queued behind it are still handled. No other panic on a
///   worker (a request's, reply's or panic payload's `Drop`) ends it
///   either, and every unit is released.
/// * **Calling your own pool.** A call that waits for its reply, made from
///   worker `k` of this pool, is never queued on worker `k`: it goes to
///   another worker, or is refused with [`Error::CallingSelf`] if the pool
///   has only one. Cycles the pool cannot see stay your job: a worker of
///   pool A calling pool B whose workers call pool A, or two workers of one
///   pool calling each other while both are busy; use
///   [`call_timeout`](Pool::call_timeout) there.
///
/// # Memory ordering
///
/// Everything a caller did before `call` or `cast` happens-before the
/// handler runs (the mailbox is made of channels); everything the handler did
/// happens-before `call` returns its reply.
///
/// # Examples
///
/// Guard a hot path: answer "busy" instead of letting a queue grow.
///
/// ```
/// use std::sync::mpsc;
/// use sidejob::{Error, Pool, Worker};
///
/// /// Handles one request at a time; blocks until told to go on, so the
/// /// example can fill the pool deterministically.
/// struct Gate(mpsc::Receiver<()>);
///
/// impl Worker for Gate {
///     type Request = u32;
///     type Reply = u32;
///     type Message = ();
///     fn handle_call(&mut self, n: u32) -> u32 {
///         n * 2
///     }
///     fn handle_cast(&mut self, _: ()) {
///         let _ = self.0.recv();
///     }
/// }
///
/// let (go, gate) = mpsc::channel();
/// let gate = std::sync::Mutex::new(Some(gate));
/// let pool = Pool::builder()
///     .name("doubler")
///     .capacity(2)
///     .workers(1)
///     .build(move |_| Gate(gate.lock().unwrap().take().expect("built once")))?;
///
/// assert_eq!(pool.call(21)?, 42);
///
/// pool.cast(())?; // the worker now waits at the gate, holding one unit
/// pool.cast(())?; // queued behind it: the second unit
/// assert_eq!(pool.call(1), Err(Error::Overload)); // full: refused at once
/// assert_eq!(pool.usage(), 2);
///
/// go.send(()).unwrap();
/// go.send(()).unwrap();
/// pool.shutdown(); // drains both casts, then joins the worker
/// assert_eq!(pool.call(1), Err(Error::Shutdown));
/// assert_eq!(pool.stats().rejected, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Pool<W: Worker> {
    inner: Arc<Inner<W>>,
}

struct Inner<W: Worker> {
    table: Arc<Table>,
    mailboxes: Box<[Outbox<Envelope<W>>]>,
    /// Taken (and joined) by the first shutdown; later ones find it empty.
    threads: Mutex<Vec<os_thread::JoinHandle<()>>>,
    worker_ids: Box<[os_thread::ThreadId]>,
    name: Arc<str>,
    /// How long a waiting caller polls for its reply before it parks.
    spin: Duration,
    /// Where free workers sleep, if the pool steals (`PoolBuilder::steal`)
    /// or its keyed mode is ordered.
    idle: Option<Arc<Idle>>,
    /// True if a worker's own mailbox is private (only it takes from it)
    /// although the workers sleep in `idle`: an ordered pool that does not
    /// steal. A delivery there must wake that very worker.
    own_private: bool,
    /// Pinned keyed requests' private mailboxes, in a stealing pool with
    /// the pinned keyed mode (otherwise they go to the worker's own
    /// mailbox, which nobody else takes from).
    pinned: Option<Box<[Outbox<Envelope<W>>]>>,
    /// The key queues, in the ordered keyed mode.
    ordered: Option<Arc<Ordered<W>>>,
    /// Hashes keys (seeded per pool).
    hasher: hashbrown::DefaultHashBuilder,
}

/// Where a request takes its unit.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Admission {
    /// Probe from the caller's own shard (the normal path).
    Home,
    /// Probe from this shard (tests model a caller on a chosen shard).
    #[cfg_attr(not(test), allow(dead_code))]
    At(usize),
    /// The caller's own shard, whatever its limit.
    Unbounded,
    /// As `Home`, then wait under the pool's waiting policy (if any) until
    /// the deadline (if any).
    Wait(Option<Instant>),
    /// As `Home`, but an `Overload` is not counted: the caller waits next.
    Probe,
}

/// Where a [`Pool::call_keyed_async`] stands when it returns its future.
enum KeyedPending<W: Worker> {
    /// Admitted: the reply is awaited.
    Reply(ReplyReceiver<W>),
    /// Every shard was full (ordered mode, with a waiting room): the
    /// future waits for a unit, then queues the request behind its key.
    Wait(Arc<Inner<W>>, W::Request),
    /// Refused at once.
    Refused(Error),
}

/// A pending reply.
pub(crate) type ReplyReceiver<W> = oneshot::Receiver<Result<<W as Worker>::Reply, Error>>;

/// Where a [`Pool::call_async`] stands when it returns its future.
enum Pending<W: Worker> {
    /// Admitted and sent: the reply is awaited.
    Reply(ReplyReceiver<W>),
    /// Every shard was full and the pool has a waiting room: the future
    /// waits for a unit, then sends the request.
    Wait(Arc<Inner<W>>, W::Request),
    /// Refused at once.
    Refused(Error),
}

impl Pool<Unbuilt> {
    /// A builder; the only way to make a pool. The worker type is fixed by
    /// the factory given to [`PoolBuilder::build`].
    pub fn builder() -> PoolBuilder {
        PoolBuilder::default()
    }
}

/// Names no worker: it only lets `Pool::builder()` be written without a
/// type argument (the real worker type comes from the factory). It has no
/// values, so no `Pool<Unbuilt>` can exist.
#[doc(hidden)]
#[derive(Debug)]
pub enum Unbuilt {}

impl Worker for Unbuilt {
    type Request = ();
    type Reply = ();
    type Message = ();
    fn handle_call(&mut self, _: ()) {
        match *self {}
    }
    fn handle_cast(&mut self, _: ()) {
        match *self {}
    }
}

impl<W: Worker> Pool<W> {
    /// Sends `request` to a worker and waits for its reply.
    ///
    /// If every shard is full, the request is refused at once, unless the
    /// pool has a waiting room ([`PoolBuilder::max_waiters`]): then the
    /// caller waits for a unit, in the room's order, for up to
    /// [`max_wait`](PoolBuilder::max_wait). Once admitted, the caller spins
    /// briefly, then sleeps until the reply comes. A worker of this pool
    /// calling it never waits for capacity.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`]: every shard was at its limit (and the waiting
    ///   room, if any, was full); the request was not sent. (Use
    ///   [`try_call`](Self::try_call) to get it back.)
    /// * [`Error::Timeout`]: it waited `max_wait` for capacity and got
    ///   none; the request was not sent.
    /// * [`Error::Shutdown`]: the pool is shut down.
    /// * [`Error::WorkerPanicked`]: the handler panicked on this request.
    /// * [`Error::CallingSelf`]: called from a handler of this very pool,
    ///   which has a single worker: the call could only be queued behind
    ///   the caller. (With more workers, a worker's call goes to another
    ///   one; a cycle through two pools, or two busy workers calling each
    ///   other, still deadlocks: use [`call_timeout`](Self::call_timeout)
    ///   there.)
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = String; type Reply = String; type Message = ();
    /// #     fn handle_call(&mut self, s: String) -> String { s }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(4).build(|_| Echo)?;
    /// assert_eq!(pool.call("hi".to_string())?, "hi");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call(&self, request: W::Request) -> Result<W::Reply, Error> {
        let reply = self.submit_call(Admission::Wait(None), request)?;
        wait_reply(reply, self.inner.spin)
    }

    /// Like [`call`](Self::call), but gives up waiting after `timeout`.
    ///
    /// As with Erlang's `gen_server:call`, a request that timed out may
    /// still run later: it was admitted and sits in (or is being handled
    /// by) its worker's queue. Its unit is released when the worker
    /// finishes it, and its reply is dropped.
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call), plus [`Error::Timeout`] when no reply came
    /// within `timeout`. The timeout covers both waits: for capacity (if the
    /// pool has a waiting room) and for the reply.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use std::sync::mpsc;
    /// use sidejob::{Error, Pool, Worker};
    ///
    /// struct Slow(mpsc::Receiver<()>);
    /// impl Worker for Slow {
    ///     type Request = (); type Reply = (); type Message = ();
    ///     fn handle_call(&mut self, _: ()) { let _ = self.0.recv(); }
    ///     fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// let (go, gate) = mpsc::channel();
    /// let gate = std::sync::Mutex::new(Some(gate));
    /// let pool = Pool::builder().capacity(1).workers(1)
    ///     .build(move |_| Slow(gate.lock().unwrap().take().unwrap()))?;
    ///
    /// let answer = pool.call_timeout((), Duration::from_millis(10));
    /// assert_eq!(answer, Err(Error::Timeout));
    /// assert_eq!(pool.usage(), 1); // still admitted: it runs when the gate opens
    /// go.send(()).unwrap();
    /// pool.shutdown();
    /// assert_eq!(pool.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_timeout(&self, request: W::Request, timeout: Duration) -> Result<W::Reply, Error> {
        // One deadline for the wait for capacity and the wait for the reply.
        let deadline = deadline_after(now(), timeout);
        let reply = self.submit_call(Admission::Wait(deadline), request)?;
        let spin = self.inner.spin.min(timeout);
        match deadline {
            Some(deadline) => wait_reply_until(reply, spin, deadline),
            None => wait_reply(reply, spin),
        }
    }

    /// Sends `request` now and returns a future of its reply, for async
    /// callers: awaiting it never blocks the executor's thread.
    ///
    /// Admission happens here, when `call_async` is called, not when the
    /// future is first polled: an overloaded pool refuses at once (the
    /// future then resolves to the error immediately), and an admitted
    /// request runs even if the future is never polled. The future is
    /// `Send + 'static` and works on any executor.
    ///
    /// Made from a handler of this pool, it is admitted as
    /// [`call`](Self::call) is (never on the caller's own worker, or
    /// [`Error::CallingSelf`]): a worker that blocks on the future would
    /// otherwise wait for itself.
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not cancel a request that was sent: it
    /// will be handled, and its unit is released when it is. Only the
    /// reply is dropped. A request still waiting for capacity (a pool with
    /// a waiting room) is not sent: dropping the future gives up the wait
    /// and drops the request, and a unit handed to it meanwhile goes to the
    /// next waiter. While it waits, the future holds a handle of the pool,
    /// so the pool does not shut down from its last handle's drop until
    /// the wait ends (`max_wait` at the latest).
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(64).build(|_| Echo)?;
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// let replies = runtime.block_on(async {
    ///     let calls: Vec<_> = (0..8).map(|n| pool.call_async(n)).collect();
    ///     let mut replies = Vec::new();
    ///     for call in calls {
    ///         replies.push(call.await?);
    ///     }
    ///     Ok::<_, sidejob::Error>(replies)
    /// })?;
    /// assert_eq!(replies, (0..8).collect::<Vec<u8>>());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_async(
        &self,
        request: W::Request,
    ) -> impl Future<Output = Result<W::Reply, Error>> + Send + 'static {
        // Admission is tried now; only a caller that may wait keeps the
        // request (and a handle of the pool) in the future.
        // A worker of this pool never waits for its capacity (see
        // `admit_from_worker`).
        let can_wait = self.inner.table.has_room() && calling_worker(&self.inner.table).is_none();
        let admission = if can_wait {
            Admission::Probe
        } else {
            Admission::Home
        };
        let pending = match self.submit_call(admission, request) {
            Ok(reply) => Pending::Reply(reply),
            Err(refused) if can_wait && refused.error() == Error::Overload => {
                let (_, request) = refused.into_parts();
                Pending::Wait(Arc::clone(&self.inner), request)
            }
            // A refused request is dropped now, not kept in the future.
            Err(refused) => Pending::Refused(refused.error()),
        };
        async move {
            let reply = match pending {
                Pending::Reply(reply) => reply,
                Pending::Refused(error) => return Err(error),
                Pending::Wait(inner, request) => {
                    let shard = inner.table.acquire_async(None).await?;
                    let (reply, receiver) = oneshot::channel();
                    if inner
                        .deliver(shard, Envelope::Call(request, reply))
                        .is_err()
                    {
                        return Err(Error::Shutdown);
                    }
                    receiver
                }
            };
            // A dropped reply slot means the worker is gone.
            reply.await.unwrap_or(Err(Error::Shutdown))
        }
    }

    /// Sends `message` to a worker without waiting for it to be handled.
    ///
    /// Waits for capacity only under the pool's waiting policy (by default
    /// it never does), as [`call`](Self::call) does. `Ok` means admitted:
    /// the message will be handled exactly once, even if the pool shuts
    /// down first. If its handler panics, the panic is counted in
    /// [`Stats::panicked`] and the worker is rebuilt; nobody else is told.
    ///
    /// # Errors
    ///
    /// [`Error::Overload`] when every shard is at its limit (and the
    /// waiting room, if any, is full), [`Error::Timeout`] when it waited
    /// `max_wait` in vain, [`Error::Shutdown`] once the pool is shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = u64;
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: u64) {}
    /// # }
    /// let pool = Pool::builder().capacity(100).build(|_| Sink)?;
    /// for n in 0..10 {
    ///     pool.cast(n)?;
    /// }
    /// pool.shutdown();
    /// assert_eq!(pool.stats().completed, 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cast(&self, message: W::Message) -> Result<(), Error> {
        Ok(self.submit_cast(Admission::Wait(None), message)?)
    }

    /// Like [`call`](Self::call), but a request that is not admitted is
    /// handed back instead of dropped.
    ///
    /// Never waits for capacity, whatever the pool's policy: if every
    /// shard is full the request comes back at once. Once admitted, it
    /// waits for the reply as `call` does.
    ///
    /// # Errors
    ///
    /// * [`TryCallError::Refused`], holding the request: [`Error::Overload`],
    ///   [`Error::Shutdown`] or [`Error::CallingSelf`], as for `call`.
    /// * [`TryCallError::Failed`]: admitted, but no reply will come
    ///   ([`Error::WorkerPanicked`], or [`Error::Shutdown`] if the reply
    ///   can no longer be delivered).
    ///
    /// `?` turns either into an [`Error`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use sidejob::{Error, Pool, Worker};
    ///
    /// /// Handles casts one by one, each when the test says so.
    /// struct Gate(mpsc::Receiver<()>);
    /// impl Worker for Gate {
    ///     type Request = Vec<u8>; type Reply = usize; type Message = ();
    ///     fn handle_call(&mut self, bytes: Vec<u8>) -> usize { bytes.len() }
    ///     fn handle_cast(&mut self, _: ()) { let _ = self.0.recv(); }
    /// }
    ///
    /// let (go, gate) = mpsc::channel();
    /// let gate = std::sync::Mutex::new(Some(gate));
    /// let pool = Pool::builder().capacity(1).workers(1)
    ///     .build(move |_| Gate(gate.lock().unwrap().take().unwrap()))?;
    ///
    /// pool.cast(())?; // holds the only unit until the gate opens
    /// let refused = pool.try_call(vec![1, 2, 3]).unwrap_err();
    /// assert_eq!(refused.error(), Error::Overload);
    /// let request = refused.into_request().unwrap(); // not lost
    ///
    /// go.send(()).unwrap();
    /// pool.shutdown();
    /// assert_eq!(pool.try_call(request).unwrap_err().into_request(), Some(vec![1, 2, 3]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_call(&self, request: W::Request) -> Result<W::Reply, TryCallError<W::Request>> {
        let reply = self.submit_call(Admission::Home, request)?;
        wait_reply(reply, self.inner.spin).map_err(TryCallError::Failed)
    }

    /// Like [`cast`](Self::cast), but a message that is not admitted is
    /// handed back instead of dropped.
    ///
    /// Never waits for capacity, whatever the pool's policy.
    ///
    /// # Errors
    ///
    /// [`Refused`] holding the message: [`Error::Overload`] when every
    /// shard is at its limit, [`Error::Shutdown`] once the pool is shut
    /// down. `?` turns it into an [`Error`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Error, Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = String;
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: String) {}
    /// # }
    /// let pool = Pool::builder().capacity(4).build(|_| Sink)?;
    /// pool.try_cast("kept".to_string())?;
    /// pool.shutdown();
    /// let refused = pool.try_cast("returned".to_string()).unwrap_err();
    /// assert!(refused.is_shutdown());
    /// assert_eq!(refused.into_inner(), "returned");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_cast(&self, message: W::Message) -> Result<(), Refused<W::Message>> {
        self.submit_cast(Admission::Home, message)
    }

    /// Like [`call`](Self::call), but never refused for capacity: the
    /// request goes to the caller's own worker even when every shard is
    /// full. It is still counted in [`usage`](Self::usage) and the stats,
    /// so the load stays visible.
    ///
    /// Erlang's sidejob offers the same escape hatch; Riak sends its
    /// statistics updates this way. Use it for small, essential requests
    /// that must not be shed: it bypasses the bound, so nothing limits how
    /// many of them queue.
    ///
    /// From a handler of this pool, the request goes to another worker's
    /// queue (never the caller's own); with a single worker it is refused
    /// with [`Error::CallingSelf`].
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`], [`Error::WorkerPanicked`] and
    /// [`Error::CallingSelf`], as for `call`.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(1).build(|_| Echo)?;
    /// assert_eq!(pool.call_unbounded(7)?, 7);
    /// assert_eq!(pool.stats().accepted, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_unbounded(&self, request: W::Request) -> Result<W::Reply, Error> {
        let reply = self.submit_call(Admission::Unbounded, request)?;
        wait_reply(reply, self.inner.spin)
    }

    /// Like [`cast`](Self::cast), but never refused for capacity; see
    /// [`call_unbounded`](Self::call_unbounded).
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`] once the pool is shut down.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = u8;
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: u8) {}
    /// # }
    /// let pool = Pool::builder().capacity(1).build(|_| Sink)?;
    /// for n in 0..5 {
    ///     pool.cast_unbounded(n)?; // beyond capacity, still accepted
    /// }
    /// pool.shutdown();
    /// assert_eq!(pool.stats().completed, 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cast_unbounded(&self, message: W::Message) -> Result<(), Error> {
        Ok(self.submit_cast(Admission::Unbounded, message)?)
    }

    /// Sends `request` for `key` and waits for its reply: requests with the
    /// same key are handled one at a time, in the order they were admitted;
    /// requests with different keys run in parallel.
    ///
    /// How the order is kept is the pool's [`KeyedMode`] (see there for
    /// which to choose):
    ///
    /// * [`KeyedMode::Pinned`] (the default): the request goes to the
    ///   key's worker, `jump_hash(hash(key), workers)`, and takes its unit
    ///   on that worker's shard only, never waiting for it: a full shard
    ///   is `Overload` at once, whatever room the others have. It is never
    ///   stolen, even with [`steal`](PoolBuilder::steal) on.
    /// * [`KeyedMode::Ordered`]: the request takes its unit as
    ///   [`call`](Self::call) does (any shard, waiting under the pool's
    ///   waiting policy), then queues behind the key's earlier requests;
    ///   whichever worker is free runs it when its turn comes.
    ///
    /// Everything [`call`](Self::call) promises holds: the exact bound
    /// (a queued request holds its unit), the unit given back before the
    /// reply, panics, shutdown (every admitted request is handled,
    /// including those queued behind their key). In the ordered mode the
    /// key's turn is passed on before `call_keyed` returns: by the worker
    /// before the reply when another request waits on the key's stripe,
    /// else by this caller once it has the reply (its stripe's cache line
    /// then stays on the caller's core: about 1.05× a plain `call`'s round
    /// trip instead of 1.26×, README). A key is known by its hash (64 bits,
    /// seeded per pool; the ordered mode's queues use 62 of them): two keys
    /// whose hashes agree are serialized together, which is safe and only
    /// costs parallelism.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`]: no unit (pinned: on the key's shard).
    /// * [`Error::KeyBusy`] (ordered): the key already has
    ///   [`max_queued_per_key`](PoolBuilder::max_queued_per_key) requests
    ///   admitted; the unit was given back and nothing was sent (not
    ///   counted in [`Stats::rejected`] or `accepted`).
    /// * [`Error::Timeout`], [`Error::Shutdown`], [`Error::WorkerPanicked`]:
    ///   as for `call`.
    /// * [`Error::CallingSelf`]: called from a handler of this pool that
    ///   would wait for itself: pinned, the key's worker is the caller;
    ///   ordered, the caller is handling a request of the same key, or the
    ///   pool has one worker.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use sidejob::{Pool, Worker};
    ///
    /// /// Appends to a per-account log: an account's entries must stay in order.
    /// #[derive(Default)]
    /// struct Ledger(HashMap<String, Vec<i64>>);
    ///
    /// impl Worker for Ledger {
    ///     type Request = (String, i64); // (account, amount): answers the balance
    ///     type Reply = i64;
    ///     type Message = ();
    ///     fn handle_call(&mut self, (account, amount): (String, i64)) -> i64 {
    ///         let log = self.0.entry(account).or_default();
    ///         log.push(amount);
    ///         log.iter().sum()
    ///     }
    ///     fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// // Pinned: an account always goes to the same worker, which keeps its log.
    /// let pool = Pool::builder().capacity(64).workers(4).build(|_| Ledger::default())?;
    /// for amount in [10, -3, 5] {
    ///     let account = "alice".to_string();
    ///     pool.call_keyed(&account, (account.clone(), amount))?;
    /// }
    /// assert_eq!(pool.call_keyed("alice", ("alice".to_string(), 0))?, 12);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_keyed<K: Hash + ?Sized>(
        &self,
        key: &K,
        request: W::Request,
    ) -> Result<W::Reply, Error> {
        let id = self.key_id(key);
        let Some(ordered) = &self.inner.ordered else {
            let reply = self.submit_keyed_call(Admission::Wait(None), id, request)?;
            return wait_reply(reply, self.inner.spin);
        };
        // Ordered: this caller reads its reply whatever happens, so the
        // worker may leave it the key's turn (`ordered.rs`, "Who passes
        // the turn").
        let (reply, receiver) = oneshot::channel();
        if let Err((error, _)) =
            self.submit_keyed(Admission::Wait(None), id, Job::CallPassing(request, reply))
        {
            return Err(error);
        }
        let (outcome, pass) = wait_passing(receiver, self.inner.spin);
        if pass {
            ordered.finish(id);
        }
        outcome
    }

    /// Like [`call_keyed`](Self::call_keyed), but gives up waiting after
    /// `timeout`, as [`call_timeout`](Self::call_timeout) does: a request
    /// that timed out may still run later, in its key's turn.
    ///
    /// # Errors
    ///
    /// As [`call_keyed`](Self::call_keyed), plus [`Error::Timeout`] when no
    /// reply came within `timeout` (which covers the wait for capacity,
    /// the wait behind the key's earlier requests and the handling).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # use sidejob::{KeyedMode, Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(8).keyed(KeyedMode::Ordered).build(|_| Echo)?;
    /// assert_eq!(pool.call_keyed_timeout(&7_u64, 3, Duration::from_secs(5))?, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_keyed_timeout<K: Hash + ?Sized>(
        &self,
        key: &K,
        request: W::Request,
        timeout: Duration,
    ) -> Result<W::Reply, Error> {
        let deadline = deadline_after(now(), timeout);
        let reply = self.submit_keyed_call(Admission::Wait(deadline), self.key_id(key), request)?;
        let spin = self.inner.spin.min(timeout);
        match deadline {
            Some(deadline) => wait_reply_until(reply, spin, deadline),
            None => wait_reply(reply, spin),
        }
    }

    /// Sends `request` for `key` now and returns a future of its reply:
    /// [`call_keyed`](Self::call_keyed) for async callers, as
    /// [`call_async`](Self::call_async) is [`call`](Self::call)'s.
    ///
    /// Admission happens here, as for `call_async`: the unit (and the
    /// key's place in line) is taken when `call_keyed_async` is called. In
    /// the ordered mode, a pool with a waiting room lets the future wait
    /// for a unit; the pinned mode never waits.
    ///
    /// # Errors
    ///
    /// As [`call_keyed`](Self::call_keyed).
    ///
    /// # Cancel safety
    ///
    /// As [`call_async`](Self::call_async): dropping the future does not
    /// cancel a request that was admitted; it runs in its key's turn and
    /// only the reply is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{KeyedMode, Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(64).keyed(KeyedMode::Ordered).build(|_| Echo)?;
    /// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
    /// let replies = runtime.block_on(async {
    ///     // Sent in this order for the one key, so handled in this order.
    ///     let calls: Vec<_> = (0..8).map(|n| pool.call_keyed_async("tenant-1", n)).collect();
    ///     let mut replies = Vec::new();
    ///     for call in calls {
    ///         replies.push(call.await?);
    ///     }
    ///     Ok::<_, sidejob::Error>(replies)
    /// })?;
    /// assert_eq!(replies, (0..8).collect::<Vec<u8>>());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn call_keyed_async<K: Hash + ?Sized>(
        &self,
        key: &K,
        request: W::Request,
    ) -> impl Future<Output = Result<W::Reply, Error>> + Send + 'static {
        let id = self.key_id(key);
        // Only the ordered mode waits for capacity, and never a worker of
        // this pool (see `admit_from_worker`).
        let can_wait = self.inner.ordered.is_some()
            && self.inner.table.has_room()
            && calling_worker(&self.inner.table).is_none();
        let admission = if can_wait {
            Admission::Probe
        } else {
            Admission::Home
        };
        let pending = match self.submit_keyed_call(admission, id, request) {
            Ok(reply) => KeyedPending::Reply(reply),
            Err(refused) if can_wait && refused.error() == Error::Overload => {
                let (_, request) = refused.into_parts();
                KeyedPending::Wait(Arc::clone(&self.inner), request)
            }
            Err(refused) => KeyedPending::Refused(refused.error()),
        };
        async move {
            let reply = match pending {
                KeyedPending::Reply(reply) => reply,
                KeyedPending::Refused(error) => return Err(error),
                KeyedPending::Wait(inner, request) => {
                    let shard = inner.table.acquire_async(None).await?;
                    let (reply, receiver) = oneshot::channel();
                    inner
                        .submit_keyed_on(shard, id, Job::Call(request, reply))
                        .map_err(|(error, _)| error)?;
                    receiver
                }
            };
            reply.await.unwrap_or(Err(Error::Shutdown))
        }
    }

    /// Sends `message` for `key` without waiting for it to be handled: as
    /// [`cast`](Self::cast), with [`call_keyed`](Self::call_keyed)'s order
    /// (messages and requests of one key are handled one at a time, in the
    /// order they were admitted).
    ///
    /// # Errors
    ///
    /// [`Error::Overload`], [`Error::KeyBusy`] (ordered), [`Error::Timeout`]
    /// and [`Error::Shutdown`], as for [`call_keyed`](Self::call_keyed).
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Error, KeyedMode, Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = u32;
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: u32) {}
    /// # }
    /// let pool = Pool::builder()
    ///     .capacity(64)
    ///     .keyed(KeyedMode::Ordered)
    ///     .max_queued_per_key(100)
    ///     .build(|_| Sink)?;
    /// for n in 0..10 {
    ///     pool.cast_keyed(&"session-9", n)?;
    /// }
    /// pool.shutdown(); // handles all ten, in order, first
    /// assert_eq!(pool.stats().completed, 10);
    /// assert_eq!(pool.busy_keys(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cast_keyed<K: Hash + ?Sized>(&self, key: &K, message: W::Message) -> Result<(), Error> {
        self.submit_keyed(Admission::Wait(None), self.key_id(key), Job::Cast(message))
            .map_err(|(error, _)| error)
    }

    /// How many keys have a request admitted and unfinished now, in the
    /// ordered keyed mode (0 in the pinned mode, which keeps no key set).
    /// A reading; it is 0 again once their requests are handled.
    pub fn busy_keys(&self) -> usize {
        self.inner.ordered.as_ref().map_or(0, |o| o.busy_keys())
    }

    /// The pool's keyed mode, from [`PoolBuilder::keyed`].
    pub fn keyed_mode(&self) -> KeyedMode {
        if self.inner.ordered.is_some() {
            KeyedMode::Ordered
        } else {
            KeyedMode::Pinned
        }
    }

    /// Requests of `key` admitted and unfinished in an ordered pool (the
    /// one out and those queued behind it): for the model tests.
    #[cfg(test)]
    pub(crate) fn key_load<K: Hash + ?Sized>(&self, key: &K) -> usize {
        let id = self.key_id(key);
        self.inner.ordered.as_ref().map_or(0, |o| o.key_load(id))
    }

    /// A key's 64-bit id.
    #[inline]
    pub(crate) fn key_id<K: Hash + ?Sized>(&self, key: &K) -> u64 {
        self.inner.hasher.hash_one(key)
    }

    /// Admits a keyed call; the receiver of its reply.
    pub(crate) fn submit_keyed_call(
        &self,
        admission: Admission,
        id: u64,
        request: W::Request,
    ) -> Result<ReplyReceiver<W>, Refused<W::Request>> {
        let (reply, receiver) = oneshot::channel();
        match self.submit_keyed(admission, id, Job::Call(request, reply)) {
            Ok(()) => Ok(receiver),
            Err((error, Job::Call(request, _))) => Err(Refused::new(error, request)),
            Err(_) => unreachable!("a keyed submit hands back the job it was given"),
        }
    }

    /// Admits a keyed request: its unit, then (ordered) its key's place in
    /// line; the job back if refused.
    pub(crate) fn submit_keyed(
        &self,
        admission: Admission,
        id: u64,
        job: Job<W>,
    ) -> Result<(), (Error, Job<W>)> {
        let inner = &*self.inner;
        let waits = matches!(job, Job::Call(..) | Job::CallPassing(..));
        let me = calling_worker(&inner.table);
        let shards = inner.table.shard_count();
        let refused_self = || {
            if inner.table.is_closing() {
                Error::Shutdown
            } else {
                Error::CallingSelf
            }
        };
        if inner.ordered.is_none() {
            // Pinned: the key's worker and shard, nothing else.
            let target = jump_hash(id, shards as u32) as usize;
            if waits && me == Some(target) {
                return Err((refused_self(), job));
            }
            let shard = match inner.table.acquire_only(target) {
                Ok(shard) => shard,
                Err(error) => return Err((error, job)),
            };
            let envelope = match job {
                Job::Call(request, reply) => Envelope::Call(request, reply),
                Job::Cast(message) => Envelope::Cast(message),
                Job::CallPassing(..) => unreachable!("only an ordered pool passes turns"),
            };
            return inner
                .deliver_pinned(shard, envelope)
                .map_err(|envelope| match envelope {
                    Envelope::Call(request, reply) => (Error::Shutdown, Job::Call(request, reply)),
                    Envelope::Cast(message) => (Error::Shutdown, Job::Cast(message)),
                    _ => unreachable!("a mailbox hands back the envelope it was given"),
                });
        }
        // Ordered. A worker handling this key would wait for itself.
        if waits && me.is_some() && calling_key() == Some(id) {
            return Err((refused_self(), job));
        }
        let admitted = match me {
            Some(worker) if waits => inner.admit_from_worker(admission, worker),
            _ => inner.admit(admission),
        };
        match admitted {
            Ok(shard) => inner.submit_keyed_on(shard, id, job),
            Err(error) => Err((error, job)),
        }
    }

    /// A [`WeakPool`]: a handle that does not keep the pool alive.
    ///
    /// Give one to the pool's own workers (or to anything the pool
    /// indirectly owns): a `Pool` held there would keep the pool alive
    /// forever, since dropping every other handle would never shut it
    /// down.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = ();
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(2).build(|_| Sink)?;
    /// let weak = pool.downgrade();
    /// assert!(weak.upgrade().is_some());
    /// drop(pool); // the last handle: the pool shuts down
    /// assert!(weak.upgrade().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn downgrade(&self) -> WeakPool<W> {
        WeakPool {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// Requests admitted and not yet finished (queued or running).
    pub fn usage(&self) -> usize {
        self.inner.table.usage()
    }

    /// The most requests that may be admitted and unfinished at once: the
    /// capacity in force (the last [`set_capacity`](Self::set_capacity), or
    /// the built one).
    pub fn capacity(&self) -> usize {
        self.inner.table.capacity()
    }

    /// Requests that could be admitted now: [`capacity`](Self::capacity)
    /// less [`usage`](Self::usage), or 0 while requests above a shrunk
    /// capacity drain. A reading, not a reservation.
    pub fn available(&self) -> usize {
        self.inner.table.available()
    }

    /// Changes the capacity while the pool runs; `0` refuses every request.
    ///
    /// The same guarantees as [`Limiter::set_capacity`](crate::Limiter::set_capacity):
    /// once this returns, nothing is admitted while `capacity` or more
    /// requests are queued or running; a shrink never blocks and never
    /// drops an admitted request (those above the new capacity drain, and
    /// nothing is admitted until they have); growing is available at once.
    /// The worker count does not change: every worker runs from the start,
    /// and a worker's share of the capacity may be 0.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `capacity` if it is above the largest
    /// capacity the pool can count.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Error, Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(1).workers(4).build(|_| Echo)?;
    /// assert_eq!(pool.workers(), 4); // all four run, three with a share of 0
    /// pool.set_capacity(0)?;
    /// assert_eq!(pool.call(1), Err(Error::Overload));
    /// pool.set_capacity(1000)?; // now every worker takes requests
    /// assert_eq!(pool.call(7)?, 7);
    /// assert_eq!(pool.stats().shards.iter().map(|s| s.limit).sum::<usize>(), 1000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        self.inner.table.set_capacity(capacity)
    }

    /// How many callers wait for capacity now (0 without a waiting room).
    pub fn waiting(&self) -> usize {
        self.inner.table.waiting()
    }

    /// How many workers (and shards) the pool runs: the `workers` setting,
    /// whatever the capacity.
    pub fn workers(&self) -> usize {
        self.inner.table.shard_count()
    }

    /// The pool's name; worker threads are named `{name}-{index}`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// A snapshot of the counters. [`Stats::shards`] has one entry per
    /// worker: its queued + running requests (`usage`) and how many it has
    /// handled (`completed`, `panicked`).
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

    /// Stops the pool: refuses new requests with [`Error::Shutdown`],
    /// lets the workers handle everything admitted before, runs each
    /// worker's [`terminate`](Worker::terminate), and joins the worker
    /// threads.
    ///
    /// Idempotent; every handle sees the pool shut down. Called from inside
    /// a handler (a worker cannot wait for itself), it begins the shutdown
    /// and returns without waiting; so does dropping the last handle on a
    /// worker thread (see [`WeakPool`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Error, Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = ();
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(8).build(|_| Sink)?;
    /// let other = pool.clone();
    /// pool.cast(())?;
    /// pool.shutdown();
    /// pool.shutdown(); // no-op
    /// assert_eq!(other.cast(()), Err(Error::Shutdown));
    /// assert_eq!(other.stats().completed, 1); // the earlier cast was handled
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// Reads the stats while the pool's table lives, without keeping the
    /// pool alive: for a [`Reporter`](crate::Reporter).
    pub(crate) fn weak_stats(&self) -> impl Fn() -> Option<Stats> + Send + 'static {
        let table = Arc::downgrade(&self.inner.table);
        move || table.upgrade().map(|table| table.stats())
    }

    /// Admits one unit and posts a call; the receiver of its reply, or the
    /// request back if it was not admitted.
    ///
    /// A call waits for its reply, so one made by a worker of this pool
    /// must not be queued behind that worker (see `admit_from_worker`).
    /// The check is one thread-local read.
    pub(crate) fn submit_call(
        &self,
        admission: Admission,
        request: W::Request,
    ) -> Result<ReplyReceiver<W>, Refused<W::Request>> {
        let admitted = match calling_worker(&self.inner.table) {
            None => self.inner.admit(admission),
            Some(worker) => self.inner.admit_from_worker(admission, worker),
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

    /// Admits one unit and posts a cast, or hands the message back.
    pub(crate) fn submit_cast(
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
    /// Queues an ordered keyed job whose unit of `shard` is taken.
    fn submit_keyed_on(&self, shard: usize, id: u64, job: Job<W>) -> Result<(), (Error, Job<W>)> {
        match &self.ordered {
            Some(ordered) => ordered.submit(shard, id, job),
            None => {
                // Only the ordered mode gets here.
                self.table.release(shard, false);
                Err((Error::Shutdown, job))
            }
        }
    }

    /// Posts a pinned keyed envelope holding a unit of `shard` to that
    /// shard's worker: its private mailbox in a stealing pool, else its
    /// own mailbox (which no other worker takes from).
    fn deliver_pinned(&self, shard: usize, envelope: Envelope<W>) -> Result<(), Envelope<W>> {
        let (Some(private), Some(idle)) = (&self.pinned, &self.idle) else {
            return self.deliver(shard, envelope);
        };
        post(&private[shard], &self.table, shard, envelope, || {
            idle.private_added(shard)
        })
    }

    #[inline]
    fn admit(&self, admission: Admission) -> Result<usize, Error> {
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
    fn admit_from_worker(&self, admission: Admission, me: usize) -> Result<usize, Error> {
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
    fn deliver(&self, shard: usize, envelope: Envelope<W>) -> Result<(), Envelope<W>> {
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

    fn shutdown(&self) {
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

impl<W: Worker> Drop for Inner<W> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl<W: Worker> Clone for Pool<W> {
    fn clone(&self) -> Self {
        Pool {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<W: Worker> fmt::Debug for Pool<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.name())
            .field("capacity", &self.capacity())
            .field("workers", &self.workers())
            .field("usage", &self.usage())
            .field("shutdown", &self.is_shutdown())
            .finish()
    }
}

/// A handle to a [`Pool`] that does not keep it alive; made by
/// [`Pool::downgrade`].
///
/// Dropping the last [`Pool`] handle shuts the pool down even while weak
/// handles remain; [`upgrade`](Self::upgrade) then answers `None`. This is
/// the handle a worker keeps to its own pool: a strong one would be a
/// reference cycle (the pool owns its workers), and the pool would never
/// shut down on drop.
///
/// If a worker upgrades and every other handle is dropped meanwhile, the
/// worker's handle is the last: dropping it (on the worker's thread) begins
/// the shutdown without waiting for the workers, the worker included; they
/// drain and run [`terminate`](Worker::terminate) on their own.
///
/// # Examples
///
/// A worker that passes work on through its own pool:
///
/// ```
/// use std::sync::{Arc, OnceLock};
/// use sidejob::{Pool, WeakPool, Worker};
///
/// struct Relay(Arc<OnceLock<WeakPool<Relay>>>);
///
/// impl Worker for Relay {
///     type Request = ();
///     type Reply = ();
///     type Message = u32; // hops left
///     fn handle_call(&mut self, _: ()) {}
///     fn handle_cast(&mut self, hops: u32) {
///         if hops > 0 {
///             if let Some(pool) = self.0.get().and_then(WeakPool::upgrade) {
///                 let _ = pool.cast(hops - 1); // refused once shut down
///             }
///         }
///     }
/// }
///
/// let slot = Arc::new(OnceLock::new());
/// let pool = {
///     let slot = slot.clone();
///     Pool::builder().capacity(8).workers(2).build(move |_| Relay(slot.clone()))?
/// };
/// slot.set(pool.downgrade()).unwrap();
/// pool.cast(10)?;
/// drop(pool); // no cycle: this shuts the pool down
/// assert!(slot.get().unwrap().upgrade().is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct WeakPool<W: Worker> {
    inner: Weak<Inner<W>>,
}

impl<W: Worker> WeakPool<W> {
    /// A [`Pool`] handle, or `None` once the last one was dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = ();
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(2).build(|_| Sink)?;
    /// let weak = pool.downgrade();
    /// let again = weak.upgrade().expect("a handle is alive");
    /// again.cast(())?;
    /// drop((pool, again));
    /// assert!(weak.upgrade().is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn upgrade(&self) -> Option<Pool<W>> {
        self.inner.upgrade().map(|inner| Pool { inner })
    }
}

impl<W: Worker> Clone for WeakPool<W> {
    fn clone(&self) -> Self {
        WeakPool {
            inner: Weak::clone(&self.inner),
        }
    }
}

impl<W: Worker> fmt::Debug for WeakPool<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not upgraded to print more: a handle upgraded here could turn out
        // to be the last, and `Debug` would then shut the pool down.
        f.debug_struct("WeakPool")
            .field("alive", &(self.inner.strong_count() > 0))
            .finish()
    }
}

/// `now + timeout`, or `None` if that is beyond what `Instant` can hold (a
/// wait so long it means "no deadline").
pub(crate) fn deadline_after(now: Instant, timeout: Duration) -> Option<Instant> {
    now.checked_add(timeout)
}

/// Waits for a reply: polls for up to `spin` (the reply to a short request
/// comes in well under the cost of parking), then sleeps.
fn wait_reply<T>(reply: oneshot::Receiver<Result<T, Error>>, spin: Duration) -> Result<T, Error> {
    // A dropped reply slot means the worker is gone.
    receive(reply, spin).unwrap_or(Err(Error::Shutdown))
}

/// [`wait_reply`] with a deadline.
fn wait_reply_until<T>(
    reply: oneshot::Receiver<Result<T, Error>>,
    spin: Duration,
    deadline: Instant,
) -> Result<T, Error> {
    if let Some(received) = poll_slot(&reply, spin) {
        return received.unwrap_or(Err(Error::Shutdown));
    }
    match reply.recv_deadline(deadline) {
        Ok(outcome) => outcome,
        Err(oneshot::RecvTimeoutError::Timeout) => Err(Error::Timeout),
        Err(oneshot::RecvTimeoutError::Disconnected) => Err(Error::Shutdown),
    }
}

/// [`wait_reply`] for a [`Job::CallPassing`]: the reply, and whether the
/// caller is to pass its key's turn on (never when the worker is gone: the
/// turn went with the request, passed on by `Turn`'s drop).
fn wait_passing<T>(
    reply: oneshot::Receiver<(Result<T, Error>, bool)>,
    spin: Duration,
) -> (Result<T, Error>, bool) {
    receive(reply, spin).unwrap_or((Err(Error::Shutdown), false))
}

/// A reply slot's message: polled for up to `spin`, then slept for;
/// `None` if the sender is gone.
fn receive<M>(slot: oneshot::Receiver<M>, spin: Duration) -> Option<M> {
    match poll_slot(&slot, spin) {
        Some(received) => received,
        None => slot.recv().ok(),
    }
}

/// Polls a reply slot for up to `spin`: `Some(Some(message))` once it
/// came, `Some(None)` if the sender is gone, `None` if still waiting.
fn poll_slot<M>(slot: &oneshot::Receiver<M>, spin: Duration) -> Option<Option<M>> {
    spin_poll(spin, || match slot.try_recv() {
        Ok(message) => Some(Some(message)),
        Err(oneshot::TryRecvError::Disconnected) => Some(None),
        Err(oneshot::TryRecvError::Empty) => None,
    })
}

/// Whether a [`Pool`] steals unless [`PoolBuilder::steal`] says otherwise.
pub(crate) const DEFAULT_STEAL: bool = false;

/// Configures a [`Pool`]; made by [`Pool::builder`].
///
/// # Examples
///
/// ```
/// # use sidejob::{Pool, Worker};
/// # struct Sink;
/// # impl Worker for Sink {
/// #     type Request = (); type Reply = (); type Message = ();
/// #     fn handle_call(&mut self, _: ()) {}
/// #     fn handle_cast(&mut self, _: ()) {}
/// # }
/// let pool = Pool::builder()
///     .name("get_fsm")
///     .capacity(3)
///     .workers(8) // more workers than capacity: all 8 run, 5 with a share of 0
///     .build(|_index| Sink)?;
/// assert_eq!((pool.capacity(), pool.workers()), (3, 8));
///
/// let err = Pool::builder().capacity(0).build(|_| Sink).unwrap_err();
/// assert_eq!(err.to_string(), "invalid `capacity`: must be at least 1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct PoolBuilder {
    name: Option<String>,
    capacity: Option<usize>,
    workers: Option<usize>,
    pin_workers: bool,
    probe: Probe,
    spin_wait: Option<Duration>,
    policy: Policy,
    steal: Option<bool>,
    keyed: KeyedMode,
    max_queued_per_key: Option<usize>,
}

/// How a [`Pool`] keeps the order of keyed requests
/// ([`call_keyed`](Pool::call_keyed), [`cast_keyed`](Pool::cast_keyed),
/// [`call_keyed_async`](Pool::call_keyed_async)); set with
/// [`PoolBuilder::keyed`].
///
/// Both promise the same order: requests with the same key are handled
/// one at a time, in the order they were admitted, and different keys run
/// in parallel. They differ in *where* a key's requests run.
///
/// # When to use which
///
/// * **`Pinned`** when workers keep state per key (a tenant's cache, a
///   session, a connection to the key's partition): every request of a key
///   runs on the same worker, `jump_hash(hash(key), workers)` (Lamping &
///   Veach's jump consistent hash), so that worker's state sees all of
///   them and no other worker's does. The price is affinity: a hot or slow
///   key holds up every key that hashes to its worker, even while other
///   workers idle, and a full worker refuses its keys (`Overload`) while
///   others have room. It costs nothing when unused (a pinned request goes
///   to its worker's own mailbox), so it is the default. Give every
///   worker a share of the capacity (`capacity >= workers`): a worker
///   whose share is 0 refuses its keys.
/// * **`Ordered`** when only the order matters: each key has a FIFO queue,
///   a key occupies at most one worker at a time, and whichever worker is
///   free takes the next key whose turn it is. A hot key then holds one
///   worker and delays only its own requests (cap its queue with
///   [`max_queued_per_key`](PoolBuilder::max_queued_per_key), so one
///   tenant cannot fill the pool). The workers of an ordered pool take
///   keyed requests from each other's shards, so a worker's state sees
///   any key; plain requests still run on their own worker unless the
///   pool also [steals](PoolBuilder::steal).
///
/// `benches/keyed_pool.rs` measures both against a hot key (README).
///
/// # Examples
///
/// ```
/// # use sidejob::{KeyedMode, Pool, Worker};
/// # struct Echo;
/// # impl Worker for Echo {
/// #     type Request = u8; type Reply = u8; type Message = ();
/// #     fn handle_call(&mut self, n: u8) -> u8 { n }
/// #     fn handle_cast(&mut self, _: ()) {}
/// # }
/// let pinned = Pool::builder().capacity(8).build(|_| Echo)?;
/// let ordered = Pool::builder().capacity(8).keyed(KeyedMode::Ordered).build(|_| Echo)?;
/// assert_eq!(pinned.keyed_mode(), KeyedMode::Pinned);
/// assert_eq!(ordered.call_keyed("k", 1)?, pinned.call_keyed("k", 1)?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KeyedMode {
    /// A key's requests all run on its own worker; see the type's docs.
    #[default]
    Pinned,
    /// Per-key FIFO queues served by whichever worker is free; see the
    /// type's docs.
    Ordered,
}

impl PoolBuilder {
    /// How many callers of [`Pool::call`], [`call_timeout`](Pool::call_timeout),
    /// [`cast`](Pool::cast) and [`call_async`](Pool::call_async) may wait
    /// for capacity when every shard is full; past that they get
    /// `Overload` at once. Defaults to 0: no waiting, fail fast (Erlang's
    /// sidejob). [`try_call`](Pool::try_call) and
    /// [`try_cast`](Pool::try_cast) never wait.
    ///
    /// # Examples
    ///
    /// An HTTP worker handles 10 requests at once and lets 20 more wait,
    /// each for at most 2 s; the 31st is refused at once:
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// use std::time::Duration;
    ///
    /// let pool = Pool::builder()
    ///     .capacity(10)
    ///     .max_waiters(20)
    ///     .max_wait(Duration::from_secs(2))
    ///     .build(|_| Echo)?;
    /// assert_eq!(pool.call(3)?, 3);
    /// assert_eq!(pool.waiting(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_waiters(&mut self, waiters: usize) -> &mut Self {
        self.policy.max_waiters = waiters;
        self
    }

    /// How long one caller may wait for capacity before it gets
    /// [`Error::Timeout`]. Defaults to
    /// [`DEFAULT_MAX_WAIT`](crate::DEFAULT_MAX_WAIT) (1 s).
    pub fn max_wait(&mut self, wait: Duration) -> &mut Self {
        self.policy.max_wait = wait;
        self
    }

    /// Which waiter a freed unit goes to; see [`QueueOrder`]. Defaults to
    /// FIFO.
    pub fn queue_order(&mut self, order: QueueOrder) -> &mut Self {
        self.policy.order = order;
        self
    }

    /// The pool's name, used for its worker threads (`{name}-{index}`).
    /// Defaults to `"sidejob"`; must not contain a NUL byte.
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// How many requests may be admitted and unfinished at once. Required;
    /// at least 1.
    pub fn capacity(&mut self, capacity: usize) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// How many workers (one per shard). For a thread pool it defaults to
    /// the number of CPUs: right for blocking or CPU-bound handlers, whose
    /// work needs a core. An async pool (`build_async`, feature `tokio`)
    /// defaults to one worker per unit of capacity, up to 256: its
    /// handlers mostly wait for I/O, and a worker count of the CPU count
    /// would cap it at `workers / latency` requests a second (2 workers
    /// and a 1 ms round trip: 2,000 a second).
    /// All of them run whatever the capacity: with less capacity than
    /// workers, some workers' share is 0 and they idle (parked, no CPU)
    /// until [`Pool::set_capacity`] grows it.
    ///
    /// A thread pool runs at most [`MAX_WORKERS`](crate::MAX_WORKERS) (4096) worker threads
    /// (the default is capped there too): [`build`](Self::build) refuses
    /// more, before starting any thread, since past some thousands of
    /// threads std aborts the process rather than return an error (see
    /// [`MAX_WORKERS`](crate::MAX_WORKERS) for why and why that number). An async pool's
    /// workers are tasks, limited only by the shard table (65,536).
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::Worker;
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u64;
    /// #     type Reply = u64;
    /// #     type Message = ();
    /// #     fn handle_call(&mut self, n: u64) -> u64 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// use sidejob::{Pool, MAX_WORKERS};
    ///
    /// let err = Pool::builder().capacity(64).workers(20_000).build(|_| Echo).unwrap_err();
    /// assert_eq!(err.field(), "workers");
    /// assert_eq!(err.to_string(), format!("invalid `workers`: must be at most {MAX_WORKERS}"));
    /// ```
    pub fn workers(&mut self, workers: usize) -> &mut Self {
        self.workers = Some(workers);
        self
    }

    /// Pins worker `i` to CPU core `i mod cores` (best effort, through
    /// `core_affinity`). Off by default.
    pub fn pin_workers(&mut self, pin: bool) -> &mut Self {
        self.pin_workers = pin;
        self
    }

    /// Where a caller starts probing; see [`Probe`].
    pub fn probe(&mut self, probe: Probe) -> &mut Self {
        self.probe = probe;
        self
    }

    /// How long a caller waiting for its reply, and a worker waiting for
    /// its next request, poll before they park. Defaults to
    /// [`DEFAULT_SPIN_WAIT`](crate::DEFAULT_SPIN_WAIT) (50 µs).
    ///
    /// Waking a parked thread costs a futex round trip (5–40 µs on small
    /// virtual machines) where a hand-off between two running threads costs
    /// well under a microsecond, so a short spin keeps a busy pool fast.
    /// Past the budget both sides park: an idle pool costs no CPU. Zero
    /// parks at once (lowest CPU use, highest latency); longer budgets help
    /// callers whose requests arrive a little further apart. At most
    /// [`MAX_SPIN_WAIT`](crate::MAX_SPIN_WAIT) (10 ms): [`build`](Self::build) refuses more.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # use sidejob::{Pool, Worker};
    /// # struct Sink;
    /// # impl Worker for Sink {
    /// #     type Request = (); type Reply = (); type Message = ();
    /// #     fn handle_call(&mut self, _: ()) {}
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(2).spin_wait(Duration::ZERO).build(|_| Sink)?;
    /// assert_eq!(pool.call(()), Ok(()));
    ///
    /// let err = Pool::builder().capacity(2).spin_wait(Duration::MAX).build(|_| Sink).unwrap_err();
    /// assert_eq!(err.to_string(), "invalid `spin_wait`: must be at most 10ms");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spin_wait(&mut self, spin: Duration) -> &mut Self {
        self.spin_wait = Some(spin);
        self
    }

    /// Whether a free worker takes requests queued at another worker
    /// (stealing). Defaults to off. A pool of one worker never steals
    /// (there is nobody to steal from).
    ///
    /// A request is admitted on one shard and queued at that shard's
    /// worker. Without stealing it runs there, so one slow request holds up
    /// every request queued behind it while the other workers may sit idle
    /// (head-of-line blocking). With stealing, a worker whose own mailbox is
    /// empty takes the oldest request waiting at another worker, so queued
    /// work runs as soon as any worker is free. The unit stays with the
    /// shard that admitted it and goes back there, so capacity,
    /// "released before the reply", panics (the worker that *ran* the
    /// request is rebuilt; the panic is counted on the admitting shard) and
    /// shutdown behave the same either way.
    ///
    /// The choice exists for workers whose state must only ever see the
    /// requests sent to *them*: state kept per worker that a request from
    /// another shard must not read or change, such as a connection or a
    /// cache meant for one caller's requests, or a writer that must receive
    /// one producer's casts in order (a stolen cast can be handled on
    /// another worker before or after the ones around it). That is why it
    /// is off by default: turning it on silently would change what
    /// existing workers see. It also costs a little on a plain `call`: one
    /// caller's round trip on 2 workers measured medians of 1.01× to 1.09×
    /// the round trip without it, by run (mostly the sleep protocol's two
    /// fences; see the README).
    ///
    /// It applies to an async pool (`build_async`, feature `tokio`) the
    /// same way, with the same default: a free worker
    /// task awaits a wake-up instead of spinning.
    ///
    /// Idle workers still cost no CPU: a free worker spins for
    /// [`spin_wait`](Self::spin_wait), then sleeps until a delivery it may
    /// take wakes it (a delivery wakes nobody while the mailbox's own
    /// worker is polling for it).
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let stealing = Pool::builder().capacity(64).workers(2).steal(true).build(|_| Echo)?;
    /// let pinned = Pool::builder().capacity(64).workers(2).steal(false).build(|_| Echo)?;
    /// assert_eq!(stealing.call(1)?, pinned.call(1)?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn steal(&mut self, steal: bool) -> &mut Self {
        self.steal = Some(steal);
        self
    }

    /// How keyed requests keep their order: [`KeyedMode::Pinned`] (the
    /// default) or [`KeyedMode::Ordered`]; see [`KeyedMode`] for which to
    /// use. Only the thread pool has keyed requests (`build_async` ignores
    /// it).
    ///
    /// # Examples
    ///
    /// ```
    /// # use sidejob::{KeyedMode, Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u8; type Reply = u8; type Message = ();
    /// #     fn handle_call(&mut self, n: u8) -> u8 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder().capacity(16).keyed(KeyedMode::Ordered).build(|_| Echo)?;
    /// assert_eq!(pool.call_keyed(&42_u64, 7)?, 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn keyed(&mut self, mode: KeyedMode) -> &mut Self {
        self.keyed = mode;
        self
    }

    /// In the ordered keyed mode, the most requests of one key that may be
    /// admitted and unfinished at once: the one running plus those queued
    /// behind it. One more gets [`Error::KeyBusy`] at once (its unit is
    /// given back), while other keys are still admitted. Defaults to no
    /// limit but the capacity; 1 means "skip a key that is busy". The
    /// pinned mode keeps no per-key queue and ignores it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::{mpsc, Mutex};
    /// use sidejob::{Error, KeyedMode, Pool, Worker};
    ///
    /// /// Handles each cast when the test says so.
    /// struct Gate(mpsc::Receiver<()>);
    /// impl Worker for Gate {
    ///     type Request = (); type Reply = (); type Message = ();
    ///     fn handle_call(&mut self, _: ()) {}
    ///     fn handle_cast(&mut self, _: ()) { let _ = self.0.recv(); }
    /// }
    ///
    /// let (go, gate) = mpsc::channel();
    /// let gate = Mutex::new(Some(gate));
    /// let pool = Pool::builder()
    ///     .capacity(16)
    ///     .workers(1)
    ///     .keyed(KeyedMode::Ordered)
    ///     .max_queued_per_key(2)
    ///     .build(move |_| Gate(gate.lock().unwrap().take().expect("built once")))?;
    /// pool.cast_keyed("hot", ())?; // out for its worker (held at the gate)
    /// pool.cast_keyed("hot", ())?; // queued behind it
    /// assert_eq!(pool.cast_keyed("hot", ()), Err(Error::KeyBusy));
    /// pool.cast_keyed("cold", ())?; // other keys are still admitted
    /// for _ in 0..3 {
    ///     go.send(()).unwrap();
    /// }
    /// pool.shutdown();
    /// assert_eq!(pool.stats().completed, 3);
    ///
    /// let err = Pool::builder()
    ///     .capacity(16)
    ///     .max_queued_per_key(0)
    ///     .build(|_| Gate(mpsc::channel().1))
    ///     .unwrap_err();
    /// assert_eq!(err.to_string(), "invalid `max_queued_per_key`: must be at least 1");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_queued_per_key(&mut self, requests: usize) -> &mut Self {
        self.max_queued_per_key = Some(requests);
        self
    }

    /// Starts the workers, each with the state `factory(index)` returns.
    ///
    /// The factory runs on the worker's own thread, at start and again
    /// after every panic (a restart).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field when `capacity` is unset, 0 or too
    /// large, `workers` is 0 or above [`MAX_WORKERS`](crate::MAX_WORKERS), `spin_wait` is longer than
    /// [`MAX_SPIN_WAIT`](crate::MAX_SPIN_WAIT), or `name` contains a NUL byte;
    /// naming `workers` if the OS refused to start a worker thread (the
    /// threads already started are shut down first).
    pub fn build<W, F>(&self, factory: F) -> Result<Pool<W>, ConfigError>
    where
        W: Worker,
        F: Fn(usize) -> W + Send + Sync + 'static,
    {
        let name: Arc<str> = Arc::from(ConfigError::check_name(self.name.as_deref())?);
        let capacity = self.capacity.ok_or(ConfigError::missing("capacity"))?;
        let spin = threads::spin_wait(self.spin_wait)?;
        if self.max_queued_per_key == Some(0) {
            return Err(ConfigError::zero("max_queued_per_key"));
        }
        let workers = threads::workers(self.workers)?;
        let table = Table::new(capacity, workers, self.probe)
            .map_err(|err| {
                // The table calls its shards "shards"; here they are workers.
                if err.field() == "shards" {
                    err.with_field("workers")
                } else {
                    err
                }
            })?
            .with_policy(&self.policy)?;
        let table = Arc::new(table);
        let factory: Arc<Factory<W>> = Arc::new(factory);
        let cores = if self.pin_workers {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };

        let count = table.shard_count();
        // The shard's counter is the bound. Every envelope but `Wake` holds
        // one of the shard's units, so a mailbox holds at most its shard's
        // limit, plus the `*_unbounded` requests the caller chose to push
        // past it and the room a resize adds: its ring is sized from the
        // limit, and its overflow takes the rest (`mailbox.rs`).
        let envelope = std::mem::size_of::<Envelope<W>>();
        let ring = |shard: usize| mailbox::ring_len(table.shard(shard).limit(), envelope);
        let (mailboxes, receivers): (Vec<_>, Vec<_>) = (0..count)
            .map(|shard| mailbox::mailbox(ring(shard)))
            .unzip();
        // With one worker there is nobody to steal from: the plain loop.
        let steal = self.steal.unwrap_or(DEFAULT_STEAL) && count > 1;
        let ordered = self.keyed == KeyedMode::Ordered;
        // Ordered keyed requests go to mailboxes every worker takes from,
        // so an ordered pool's workers sleep in the idle room as stealing
        // ones do (steal.rs), whether or not they steal plain requests.
        let idle = (steal || ordered).then(|| Arc::new(Idle::new(table.clone())));
        // A second mailbox per worker: a stealing pinned pool's private
        // ones (pinned requests, never stolen), or the keyed mailboxes of
        // an ordered pool that does not steal (a stealing one posts keyed
        // requests to the own mailboxes, which every worker takes from).
        let (extra, extra_receivers): (Vec<_>, Vec<_>) = if steal != ordered {
            (0..count)
                .map(|shard| mailbox::mailbox(ring(shard)))
                .unzip()
        } else {
            (Vec::new(), Vec::new())
        };
        let ordered = idle.as_ref().filter(|_| ordered).map(|idle| {
            let keyed_mailboxes = if steal {
                mailboxes.clone()
            } else {
                extra.clone()
            };
            let cap = self.max_queued_per_key.unwrap_or(usize::MAX);
            Arc::new(Ordered::new(
                KeyQueues::new(count, cap),
                keyed_mailboxes.into_boxed_slice(),
                Arc::clone(idle),
                Arc::clone(&table),
            ))
        });
        let mut threads = Vec::with_capacity(count);
        let mut spawn_error = None;
        for (index, receiver) in receivers.iter().enumerate() {
            let worker = WorkerLoop {
                index,
                table: Arc::clone(&table),
                mailbox: receiver.clone(),
                factory: Arc::clone(&factory),
                core: (!cores.is_empty()).then(|| cores[index % cores.len()]),
                spin,
                steal: idle.as_ref().map(|idle| {
                    if steal {
                        // Pinned: the private mailbox; ordered: none.
                        Stealing {
                            mailboxes: receivers.clone().into_boxed_slice(),
                            private: extra_receivers.get(index).cloned(),
                            idle: Arc::clone(idle),
                        }
                    } else {
                        // Ordered, not stealing: every keyed mailbox, and
                        // the own one private.
                        Stealing {
                            mailboxes: extra_receivers.clone().into_boxed_slice(),
                            private: Some(receiver.clone()),
                            idle: Arc::clone(idle),
                        }
                    }
                }),
                ordered: ordered.clone(),
            };
            let spawned = os_thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || worker.run());
            match spawned {
                Ok(thread) => threads.push(thread),
                Err(err) => {
                    spawn_error = Some(err.kind());
                    break;
                }
            }
        }
        let worker_ids = threads.iter().map(|t| t.thread().id()).collect();
        let inner = Inner {
            table,
            mailboxes: mailboxes.into_boxed_slice(),
            threads: Mutex::new(threads),
            worker_ids,
            name,
            spin,
            own_private: idle.is_some() && !steal,
            pinned: (steal && ordered.is_none()).then(|| extra.into_boxed_slice()),
            ordered,
            idle,
            hasher: Default::default(),
        };
        if let Some(kind) = spawn_error {
            // Dropping `inner` closes the table and joins what started.
            drop(inner);
            return Err(ConfigError::spawn("workers", kind));
        }
        Ok(Pool {
            inner: Arc::new(inner),
        })
    }
}
