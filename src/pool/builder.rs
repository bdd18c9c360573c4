//! [`PoolBuilder`]: capacity, workers, keyed mode, stealing, waiting, spin; checked once, in `build`, which starts the workers.

use super::key_queue::KeyQueues;
use super::mailbox;
use super::ordered::Ordered;
use super::steal::Idle;
use super::{Inner, Pool, Routing};
use crate::adaptive::FeedSlot;
use crate::engine::keys::KeySettings;
use crate::engine::probe::Probe;
use crate::engine::table::Table;
use crate::engine::threads;
use crate::engine::waiters::{Policy, QueueOrder};
use crate::error::ConfigError;
use crate::pool::worker::{Envelope, Factory, Worker};
use crate::pool::worker_loop::{Stealing, WorkerLoop};
use crate::sync::{os_thread, Arc, Mutex};
use std::hash::Hash;
use std::time::Duration;

/// Whether a [`Pool`] steals unless [`PoolBuilder::steal`] says otherwise.
pub(crate) const DEFAULT_STEAL: bool = true;

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
    pub(super) name: Option<String>,
    pub(super) capacity: Option<usize>,
    pub(super) workers: Option<usize>,
    pin_workers: bool,
    pub(super) probe: Probe,
    spin_wait: Option<Duration>,
    pub(super) policy: Policy,
    pub(super) steal: Option<bool>,
    keyed: KeyedMode,
    max_queued_per_key: Option<usize>,
    pub(super) keys: KeySettings,
}

/// The builder's limits and defaults.
impl PoolBuilder {
    /// The most worker threads a thread pool ([`PoolBuilder::workers`](crate::PoolBuilder::workers)) or a
    /// [`Shepherd`](crate::shepherd::Shepherd) ([`ShepherdBuilder::workers`](crate::shepherd::ShepherdBuilder::workers))
    /// runs: 4096. Their builders refuse more with a [`ConfigError`] naming
    /// `workers`, before starting any thread. An async pool's workers are
    /// tasks, not threads: this does not limit them.
    ///
    /// Why a limit at all: past a number of threads the OS will not give, std
    /// does not always return an error, it can abort the process. Each thread
    /// costs four memory mappings (its stack and guard page, and the signal
    /// stack std sets up for it with its own guard page), and Linux allows a
    /// process 65,530 (`vm.max_map_count`). The signal stack is mapped by the
    /// new thread itself once it runs, after `spawn` returned `Ok`; when that
    /// fails, std panics where it cannot unwind, and the process aborts
    /// (measured: a program starting 20,000 threads aborts at about 16,370).
    ///
    /// Why 4096: that many threads take 16,384 mappings, a quarter of Linux's
    /// default, leaving the rest to the heap, the libraries and the program's
    /// other threads and pools; they also reserve 8 GiB of address space at
    /// std's 2 MiB stacks. And a pool of thousands of OS threads is not what
    /// this crate is for: a thread pool's workers run blocking or CPU-bound
    /// handlers and are sized to the cores (one per shard); for thousands of
    /// I/O-bound handlers, use an async pool, whose workers are tasks.
    pub const MAX_WORKERS: usize = crate::engine::threads::MAX_WORKERS;

    /// How long a waiting caller or an idle worker polls before parking, unless
    /// the builder's `spin_wait` ([`PoolBuilder::spin_wait`](crate::PoolBuilder::spin_wait),
    /// [`ShepherdBuilder::spin_wait`](crate::shepherd::ShepherdBuilder::spin_wait)) says
    /// otherwise.
    pub const DEFAULT_SPIN_WAIT: Duration = crate::engine::threads::DEFAULT_SPIN_WAIT;

    /// The longest `spin_wait` a pool or a shepherd accepts: 10 ms.
    ///
    /// Spinning only pays while it is shorter than parking and being woken (a
    /// futex round trip, 5–40 µs); past a millisecond or so it buys nothing.
    /// Every worker spins this long after each request before it parks, and so
    /// does every waiting caller: a budget much larger would keep an idle pool
    /// burning a core per worker (with `Duration::MAX`, forever). 10 ms leaves
    /// two orders of magnitude of room for experiments above the default and
    /// bounds the cost of a mistake to one tick's worth of CPU per request.
    pub const MAX_SPIN_WAIT: Duration = crate::engine::threads::MAX_SPIN_WAIT;

    crate::engine::waiters::waiting_limits!();

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
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub const MAX_DEFAULT_ASYNC_WORKERS: usize =
        crate::pool::asynchronous::MAX_DEFAULT_ASYNC_WORKERS;
}

/// How a [`Pool`] keeps the order of keyed requests
/// ([`call_keyed`](crate::Pool::call_keyed), [`cast_keyed`](crate::Pool::cast_keyed),
/// [`call_keyed_async`](crate::Pool::call_keyed_async)); set with
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
///   [`max_queued_per_key`](crate::PoolBuilder::max_queued_per_key), so one
///   tenant cannot fill the pool). The workers of an ordered pool take
///   keyed requests from each other's shards, so a worker's state sees
///   any key; plain requests are stolen too, as in every pool unless
///   built with [`steal(false)`](crate::PoolBuilder::steal).
///
/// `benches/keyed_pool.rs` measures both against a hot key (`PERFORMANCE.md`).
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
    /// How many callers of [`Pool::call`], [`call_timeout`](crate::Pool::call_timeout),
    /// [`cast`](crate::Pool::cast) and [`call_async`](crate::Pool::call_async) may wait
    /// for capacity when every shard is full; past that they get
    /// `Overload` at once. Defaults to 0: no waiting, fail fast (Erlang's
    /// sidejob). [`try_call`](crate::Pool::try_call) and
    /// [`try_cast`](crate::Pool::try_cast) never wait.
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
    /// [`Error::Timeout`](crate::Error::Timeout). Defaults to
    /// [`DEFAULT_MAX_WAIT`](crate::LimiterBuilder::DEFAULT_MAX_WAIT) (1 s).
    pub fn max_wait(&mut self, wait: Duration) -> &mut Self {
        self.policy.max_wait = wait;
        self
    }

    /// The fraction of the capacity in force that requests of `class` may
    /// fill: a request of the class is admitted only while the units held
    /// (of every class) leave it room under that fraction, so the rest is
    /// kept for the classes above it; see [`Class`](crate::Class).
    /// Defaults: `SheddablePlus` 0.9, `Sheddable` 0.8 (or the class
    /// above's, if set lower); `CriticalPlus` and `Critical` always 1, the
    /// whole capacity.
    ///
    /// Checked at build: a [`ConfigError`](crate::ConfigError) naming
    /// `headroom` for a fraction outside `[0, 1]` (or not a number), a top
    /// class set below 1, or a `Sheddable` fraction above
    /// `SheddablePlus`'s.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Class, Error, Pool, Worker};
    ///
    /// struct Echo;
    /// impl Worker for Echo {
    ///     type Request = u32; type Reply = u32; type Message = ();
    ///     fn handle_call(&mut self, n: u32) -> u32 { n }
    ///     fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// let pool = Pool::builder()
    ///     .capacity(8)
    ///     .headroom(Class::SheddablePlus, 0.75)
    ///     .build(|_| Echo)?;
    /// let report = Ask::new().class(Class::SheddablePlus);
    /// assert_eq!(pool.call_with(report, 7)?, 7);
    /// // More units than its share of the capacity (6 of 8) can ever hold:
    /// // the class is shed, `Overload` at once, never a wait.
    /// assert_eq!(pool.call_with(report.units(7), 7), Err(Error::Overload));
    /// // More than the whole capacity is too large for any class.
    /// assert_eq!(pool.call_with(report.units(9), 7), Err(Error::TooLarge));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn headroom(&mut self, class: crate::Class, fraction: f64) -> &mut Self {
        self.policy.headroom.set(class, fraction);
        self
    }

    /// A min share for a sheddable class: a fraction of the capacity in
    /// force that the class may hold whatever its headroom, and that a
    /// waiting room keeps for it under sustained load from the classes
    /// above. While the units the class holds, these counted in, stay
    /// within its min share, its requests are admitted up to the
    /// capacity (not its line), and its waiters are served ahead of every
    /// other class's (the most important sheddable class first). No unit
    /// is kept idle for it: a fail-fast request of it takes a unit only if
    /// one is free. Default: none (0) for every class. See
    /// [`guide::priority`](crate::guide::priority), "A min share".
    ///
    /// Checked at build: a [`ConfigError`](crate::ConfigError) naming
    /// `min_share` for a fraction outside `[0, 1]` (or not a number), one
    /// above the class's headroom, one set above 0 for `CriticalPlus` or
    /// `Critical` (no line holds them back), or shares that add up to more
    /// than 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Class, Pool, Worker};
    ///
    /// struct Echo;
    /// impl Worker for Echo {
    ///     type Request = u32; type Reply = u32; type Message = ();
    ///     fn handle_call(&mut self, n: u32) -> u32 { n }
    ///     fn handle_cast(&mut self, _: ()) {}
    /// }
    ///
    /// let pool = Pool::builder()
    ///     .capacity(20)
    ///     .max_waiters(64)
    ///     .min_share(Class::Sheddable, 0.05) // 1 of 20, whatever its line
    ///     .build(|_| Echo)?;
    /// let export = Ask::new().class(Class::Sheddable);
    /// assert_eq!(pool.call_with(export, 7)?, 7);
    /// // Counted as the class's while held, and counted out once handled.
    /// assert_eq!(pool.stats().classes[Class::Sheddable.rank()].held, Some(0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn min_share(&mut self, class: crate::Class, fraction: f64) -> &mut Self {
        self.policy.headroom.set_min_share(class, fraction);
        self
    }

    crate::engine::keys::key_settings!(
        setup: "use sidejob::{Pool, Worker};\nstruct Echo;\nimpl Worker for Echo {\n    type Request = u32; type Reply = u32; type Message = ();\n    fn handle_call(&mut self, n: u32) -> u32 { n }\n    fn handle_cast(&mut self, _: ()) {}\n}\n",
        make: "Pool::builder().capacity(8)",
        build: ".build(|_| Echo)"
    );

    /// Which waiter a freed unit goes to; see [`QueueOrder`]. Defaults to
    /// FIFO.
    pub fn queue_order(&mut self, order: QueueOrder) -> &mut Self {
        self.policy.order = order;
        self
    }

    /// How many units later requests may take past a waiting request of many units
    /// ([`Pool::call_with`](crate::Pool::call_with)) before every freed unit is kept for it. As
    /// [`LimiterBuilder::pass_budget`](crate::LimiterBuilder::pass_budget):
    /// defaults to the capacity in force; `0` is strict FIFO, `usize::MAX`
    /// first fit.
    ///
    /// # Examples
    ///
    /// Two turnovers of the pool before a waiting large request is served
    /// strictly:
    ///
    /// ```
    /// # use sidejob::{Pool, Worker};
    /// # struct Echo;
    /// # impl Worker for Echo {
    /// #     type Request = u32; type Reply = u32; type Message = ();
    /// #     fn handle_call(&mut self, n: u32) -> u32 { n }
    /// #     fn handle_cast(&mut self, _: ()) {}
    /// # }
    /// let pool = Pool::builder()
    ///     .capacity(64)
    ///     .max_waiters(32)
    ///     .pass_budget(128)
    ///     .build(|_| Echo)?;
    /// assert_eq!(pool.call(7)?, 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn pass_budget(&mut self, units: usize) -> &mut Self {
        self.policy.pass_budget = Some(units);
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
    /// A thread pool runs at most [`MAX_WORKERS`](crate::PoolBuilder::MAX_WORKERS) (4096) worker threads
    /// (the default is capped there too): [`build`](Self::build) refuses
    /// more, before starting any thread, since past some thousands of
    /// threads std aborts the process rather than return an error (see
    /// [`MAX_WORKERS`](crate::PoolBuilder::MAX_WORKERS) for why and why that number). An async pool's
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
    /// use sidejob::{Pool, PoolBuilder};
    ///
    /// let err = Pool::builder().capacity(64).workers(20_000).build(|_| Echo).unwrap_err();
    /// assert_eq!(err.field(), "workers");
    /// assert_eq!(err.to_string(), format!("invalid `workers`: must be at most {}", PoolBuilder::MAX_WORKERS));
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
    /// [`DEFAULT_SPIN_WAIT`](crate::PoolBuilder::DEFAULT_SPIN_WAIT) (50 µs).
    ///
    /// Waking a parked thread costs a futex round trip (5–40 µs on small
    /// virtual machines) where a hand-off between two running threads costs
    /// well under a microsecond, so a short spin keeps a busy pool fast.
    /// Past the budget both sides park: an idle pool costs no CPU. Zero
    /// parks at once (lowest CPU use, highest latency); longer budgets help
    /// callers whose requests arrive a little further apart. At most
    /// [`MAX_SPIN_WAIT`](crate::PoolBuilder::MAX_SPIN_WAIT) (10 ms): [`build`](Self::build) refuses more.
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
    /// (stealing). Defaults to on: no request waits behind another while a
    /// worker of the pool is free. A pool of one worker never steals
    /// (there is nobody to steal from).
    ///
    /// **Which to choose:** interchangeable workers (a connection each to
    /// the same server, a client, a buffer): the default. `steal(false)`
    /// only when a worker's state must see the requests sent to *it*.
    ///
    /// A request is admitted on one shard and queued at that shard's
    /// worker. With stealing, a worker whose own mailbox is empty takes the
    /// oldest request waiting at another worker, so queued work runs as
    /// soon as any worker is free. With `steal(false)` it runs where it was
    /// queued, so one slow request holds up every request queued behind it
    /// while the other workers may sit idle (head-of-line blocking); and
    /// since a caller's requests go to its thread's home shard first, a few
    /// callers can keep a few workers busy while the rest idle. The unit
    /// stays with the shard that admitted the request and goes back there
    /// either way, so capacity, "released before the reply", panics (the
    /// worker that *ran* the request is rebuilt; the panic is counted on
    /// the admitting shard) and shutdown behave the same.
    ///
    /// `steal(false)` is affinity: each request runs on the worker whose
    /// shard admitted it, and one thread's requests on one worker in the
    /// order it sent them. Choose it for state kept per worker that a
    /// request from another shard must not read or change (a cache meant
    /// for one caller's requests, a session), or for a writer that must
    /// receive one producer's casts in order (with stealing, a cast can be
    /// handled on another worker before or after the ones around it).
    /// Keyed requests keep their affinity either way: pinned keys are
    /// never stolen, ordered keys keep their order ([`KeyedMode`]).
    ///
    /// Costs: on the thread pool, one caller's `call` round trip on 2
    /// workers measured 0.96x (median of fresh processes) to 1.09x the
    /// round trip without stealing, by run, and a stream of casts loses
    /// the batched unit releases of a pool that does not steal (see
    /// [`Pool`]'s semantics). Idle workers still cost no CPU: a free worker
    /// spins for [`spin_wait`](Self::spin_wait), then sleeps until a
    /// delivery it may take wakes it (a delivery wakes nobody while the
    /// mailbox's own worker is polling for it).
    ///
    /// On an async pool (`build_async`, feature `tokio`) the default gives
    /// each worker task a queue fed from the threads it runs on, and any
    /// free worker takes from any queue; a worker whose handler awaits
    /// (a backend, a timer) hands its queue to a common one at once, so no
    /// request waits behind a handler that is waiting. A `call_async`
    /// round trip costs no more than the tokio actor idiom's (mpsc +
    /// oneshot), from one caller or many; `steal(false)` gives each worker
    /// a mailbox of its own, fed from its shard only.
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
    /// // Interchangeable workers: the default, any free worker serves.
    /// let shared = Pool::builder().capacity(64).workers(2).build(|_| Echo)?;
    /// // Per-worker state that must see only its own shard's requests.
    /// let affine = Pool::builder().capacity(64).workers(2).steal(false).build(|_| Echo)?;
    /// assert_eq!(shared.call(1)?, affine.call(1)?);
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
    /// behind it. One more gets [`Error::KeyBusy`](crate::Error::KeyBusy) at once (its unit is
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
    /// large, `workers` is 0 or above [`MAX_WORKERS`](crate::PoolBuilder::MAX_WORKERS), `spin_wait` is longer than
    /// [`MAX_SPIN_WAIT`](crate::PoolBuilder::MAX_SPIN_WAIT), or `name` contains a NUL byte;
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
            .with_policy(&self.policy)?
            .with_keys(&self.keys)?;
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
        let feed: std::sync::Arc<FeedSlot> = Default::default();
        let mut threads = Vec::with_capacity(count);
        let mut spawn_error = None;
        for (index, receiver) in receivers.iter().enumerate() {
            let worker = WorkerLoop {
                feed: std::sync::Arc::clone(&feed),
                due: std::cell::Cell::new(None),
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
                // Workers that wait on their own mailboxes (no idle
                // room): a weighed request's release wakes the others.
                owners: (idle.is_none() && count > 1).then(|| mailboxes.clone().into_boxed_slice()),
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
            named: self.name.is_some(),
            spin,
            routing: Routing {
                own_private: idle.is_some() && !steal,
                pinned: (steal && ordered.is_none()).then(|| extra.into_boxed_slice()),
                ordered,
                idle,
            },
            hasher: Default::default(),
            feed,
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
