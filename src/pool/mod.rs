//! [`Pool`]: gen_server-like workers, one per shard, behind the admission
//! table: `call`, `call_timeout`, `call_async`, `cast`, their `try_` forms
//! that hand a refused value back, the keyed forms (`call_keyed` and
//! siblings, in a [`KeyedMode`]), shutdown, and [`WeakPool`] handles.
//!
//! One idea a file: `calls.rs` (call and cast), `keyed.rs` (the keyed
//! forms), `delivery.rs` (a request's unit and its mailbox), `reply.rs`
//! (waiting for a reply), `builder.rs`; the worker's side in `worker.rs`
//! (its loop) with `mailbox.rs`, `steal.rs` (stealing, and where free
//! workers sleep), `ordered.rs` and `key_queue.rs` (per-key order),
//! `jump.rs` (a key to its worker); the async pool in `asynchronous/`
//! with `async_idle.rs`.

use crate::adaptive::{Feed, FeedSlot, Target};
use crate::engine::ask::How;
use crate::engine::table::Table;
use crate::error::{ConfigError, Error};
use crate::pool::worker::{Envelope, Worker};
use crate::stats::Stats;
use crate::sync::{os_thread, Arc, Mutex, Weak};
use mailbox::Outbox;
use ordered::Ordered;
use std::fmt;
use std::time::Duration;
use steal::Idle;

mod builder;
mod calls;
mod delivery;
mod keyed;
mod reply;

#[cfg(feature = "tokio")]
use builder::DEFAULT_STEAL;
pub use builder::{KeyedMode, PoolBuilder};
use delivery::post;
use reply::{deadline_after, wait_passing, wait_reply, wait_reply_until};

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
pub(crate) mod worker_loop;

/// A capacity-limited pool of workers: requests beyond `capacity` are
/// refused with [`Error::Overload`] at once instead of queueing.
///
/// The pool runs one worker thread per shard, each owning a [`Worker`]
/// value and a mailbox. A request takes one unit of its shard's capacity
/// when it is admitted and holds it until the worker has *finished*
/// handling it, so `capacity` bounds every request that is queued or
/// running, and no mailbox can grow past its shard's limit. A caller
/// starts at its own shard (by thread or CPU, see [`Probe`](crate::probe::Probe)) and moves to
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
///   the order; `pool/mailbox.rs`). With stealing (the default;
///   [`PoolBuilder::steal`]) a free worker may take a request queued
///   behind another, so one sender's requests may be handled by two
///   workers at once, in either order; `steal(false)` or one worker keeps
///   them in order.
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
    /// True if its builder was given a name, even the default one: a
    /// reporter refuses a name taken by another live front-end only then.
    named: bool,
    /// How long a waiting caller polls for its reply before it parks.
    spin: Duration,
    /// How requests reach workers.
    routing: Routing<W>,
    /// Hashes keys (seeded per pool).
    hasher: hashbrown::DefaultHashBuilder,
    /// The adaptive controller's feed, once one is attached: the workers
    /// time each handler into it.
    feed: std::sync::Arc<FeedSlot>,
}

/// How a pool routes requests to its workers, one value built once by the
/// builder from its `steal` setting and [`KeyedMode`].
struct Routing<W: Worker> {
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
}

/// A pending reply.
pub(crate) type ReplyReceiver<W> = oneshot::Receiver<Result<<W as Worker>::Reply, Error>>;

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

    crate::engine::keys::key_readings!(
        inner.table;
        setup: "use sidejob::{Pool, Worker};\nstruct Echo;\nimpl Worker for Echo {\n    type Request = u32; type Reply = u32; type Message = ();\n    fn handle_call(&mut self, n: u32) -> u32 { n }\n    fn handle_cast(&mut self, _: ()) {}\n}\n",
        make: "let front = Pool::builder().capacity(4).build(|_| Echo)?;",
        end: "# Ok::<(), Box<dyn std::error::Error>>(())\n"
    );

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

    /// True if its builder was given a name (see `Reporter`'s claims).
    pub(crate) fn is_named(&self) -> bool {
        self.inner.named
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
    /// pool alive: for a [`Reporter`](crate::observe::Reporter).
    pub(crate) fn weak_stats(&self) -> impl Fn() -> Option<Stats> + Send + 'static {
        let table = Arc::downgrade(&self.inner.table);
        move || table.upgrade().map(|table| table.stats())
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

/// The controller holds a handle: the pool lives (is not shut down by the
/// drop of its other handles) as long as the controller does.
impl<W: Worker> Target for Pool<W> {
    fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        Pool::set_capacity(self, capacity)
    }

    fn capacity(&self) -> usize {
        Pool::capacity(self)
    }

    fn stats(&self) -> Stats {
        Pool::stats(self)
    }

    /// Its workers time each handler.
    fn attach(&self, feed: Feed) -> bool {
        self.inner.feed.set(feed).is_ok()
    }
}
