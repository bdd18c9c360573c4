//! [`Supervisor`]: a bound on how many children (threads, tasks, anything
//! holding a [`ChildGuard`]) are alive at once, and a registry that says
//! which.
//!
//! One child is one unit of the shard table (`table.rs`). Around it sits the
//! registry of live children, sharded like the counters: shard `i` of the
//! registry is a small slab behind its own lock, on its own cache line, and
//! holds exactly the children admitted on table shard `i`. A caller touches
//! only the shard it was admitted on, so spawns on different cores never
//! meet on one lock, and a listing is a walk over short per-shard critical
//! sections.
//!
//! # Protocol
//!
//! * **Enter**: take a unit from the table (fail fast with `Overload`), read
//!   the coarse clock, then lock the shard's slab and insert. The slab
//!   hands out the [`ChildId`]: the shard index and a per-shard sequence
//!   kept under that lock, so no shared counter is touched.
//! * **Leave**: lock the slab, remove, release the unit *while still holding
//!   the lock*, read the waiter count, unlock, and wake
//!   [`wait_idle`](Supervisor::wait_idle) callers if the shard became empty
//!   and anyone waits.
//!
//! Because a child is registered after its unit is taken and unregistered
//! before it is given back, each shard's slab never holds more entries than
//! the shard's limit, so a listing never shows more than `capacity`
//! children; and a child whose guard has been dropped is gone from every
//! listing that starts afterwards.
//!
//! Releasing under the lock is what lets `wait_idle` sleep without a fence
//! on the hot path: a waiter bumps the waiter count, then checks each shard
//! under its lock. For each shard, either the waiter's check comes after
//! the last leave (and sees it empty, units included), or that leave's
//! critical section comes after the check and reads the waiter count the
//! waiter bumped before it: then the leaver wakes it.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::error::{ConfigError, Error};
use crate::probe::Probe;
use crate::stats::Stats;
use crate::sync::{
    now, os_thread, Arc, AtomicUsize, CoarseClock, Condvar, Mutex, Ordering::Relaxed,
};
use crate::table::Table;

/// A fail-fast bound on live children, with a registry of which are alive:
/// Erlang's `sidejob_supervisor`, for threads and tasks.
///
/// At most `capacity` children are alive at once. [`spawn`](Self::spawn)
/// starts an OS thread, [`spawn_task`](Self::spawn_task) (feature `tokio`) a
/// tokio task, and [`reserve`](Self::reserve) hands out a [`ChildGuard`] for
/// a child you start yourself (a rayon job, a task on another executor);
/// dropping the guard is that child's exit. When every unit is taken, the
/// next child is refused with [`Error::Overload`] at once: nothing waits,
/// nothing queues.
///
/// Admission is exact: where Erlang's sidejob checks, then increments (so
/// concurrent spawns can overshoot its limit), here one CAS on the shard
/// counter decides, and the shard limits add up to exactly `capacity`. The
/// child is started by the caller, not by a supervisor process, so a slow
/// start never holds up other spawns.
///
/// `Supervisor` is a handle: clones share the same children, and it is
/// `Send + Sync`. Children keep the state they need alive, so dropping every
/// handle does not stop them.
///
/// # Memory ordering
///
/// A child's exit (its thread or task finishing, or its guard dropping)
/// *synchronizes with* a later admission on the same shard, and with any
/// listing ([`which_children`](Self::which_children),
/// [`children`](Self::children), [`wait_idle`](Self::wait_idle)) that no
/// longer shows it. Children on different shards are not ordered with each
/// other.
///
/// # Examples
///
/// ## Bound the number of connection handlers
///
/// Each accepted connection gets a handler thread, at most two at once;
/// the third connection is told "busy" instead of piling up:
///
/// ```
/// use std::sync::mpsc;
/// use sidejob::{Error, Supervisor};
///
/// let sup = Supervisor::builder().name("conn").capacity(2).build()?;
/// let (done_tx, done_rx) = mpsc::channel::<()>();
/// let done_rx = std::sync::Arc::new(std::sync::Mutex::new(done_rx));
///
/// let mut handlers = Vec::new();
/// let mut answers = Vec::new();
/// for connection in 0..3 {
///     let done_rx = done_rx.clone();
///     match sup.spawn(move || {
///         // Serve the connection until told it closed.
///         done_rx.lock().unwrap().recv().unwrap();
///         connection
///     }) {
///         Ok(child) => handlers.push(child),
///         Err(Error::Overload) => answers.push(format!("{connection}: busy")),
///         Err(other) => panic!("{other}"),
///     }
/// }
/// assert_eq!(answers, ["2: busy"]);
/// assert_eq!(sup.count(), 2);
///
/// for _ in &handlers {
///     done_tx.send(()).unwrap();
/// }
/// let served: Vec<usize> = handlers.into_iter().map(|h| h.join().unwrap()).collect();
/// assert_eq!(served, [0, 1]);
/// assert_eq!(sup.count(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// ## Bound children started elsewhere
///
/// ```
/// use sidejob::Supervisor;
///
/// let sup = Supervisor::new(8)?;
/// let guard = sup.reserve()?;
/// let id = guard.id();
/// let job = std::thread::spawn(move || {
///     let _guard = guard; // this child's exit is the end of this scope
/// });
/// job.join().unwrap();
/// assert!(!sup.which_children().contains(&id));
/// assert_eq!(sup.stats().completed, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

/// What the handles share.
struct Inner {
    common: Arc<Common>,
    /// Registry shard `i` holds the children admitted on table shard `i`.
    registry: Box<[Arc<RegistryShard>]>,
    clock: CoarseClock,
    name: String,
    /// `{name}-child`: the name of every spawned thread.
    thread_name: String,
    stack_size: Option<usize>,
}

impl Supervisor {
    /// A supervisor for at most `capacity` live children, over one shard
    /// per CPU, named `sidejob`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `capacity` if it is 0 or absurdly large.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::new(10_000)?;
    /// assert_eq!(sup.capacity(), 10_000);
    /// assert_eq!(Supervisor::new(0).unwrap_err().field(), "capacity");
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    pub fn new(capacity: usize) -> Result<Supervisor, ConfigError> {
        Supervisor::builder().capacity(capacity).build()
    }

    /// A builder, to set the name, shard count, [`Probe`] or child stack
    /// size.
    pub fn builder() -> SupervisorBuilder {
        SupervisorBuilder::default()
    }

    /// Starts `f` on a new OS thread, as a child; never waits for capacity.
    ///
    /// The thread is named `{name}-child`. The child's unit is given back
    /// when `f` returns or panics (a panic is counted in
    /// [`Stats::panicked`]), before [`Child::join`] returns, so a joined
    /// child is never counted as alive.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`] when `capacity` children are alive; counted in
    ///   [`Stats::rejected`]. `f` is dropped without running.
    /// * [`Error::Spawn`] when the OS refuses to start the thread (too many
    ///   threads, no memory for the stack). The unit was released: the
    ///   refusal is not an `Overload`.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::builder().name("fsm").capacity(4).build()?;
    /// let child = sup.spawn(|| std::thread::current().name().map(str::to_owned))?;
    /// assert_eq!(child.join().unwrap().as_deref(), Some("fsm-child"));
    ///
    /// // A panicking child releases its unit and is counted.
    /// let crashing = sup.spawn(|| panic!("boom"))?;
    /// assert!(crashing.join().is_err());
    /// assert_eq!(sup.count(), 0);
    /// assert_eq!(sup.stats().panicked, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spawn<F, T>(&self, f: F) -> Result<Child<T>, Error>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let mut guard = self.inner.enter(None, ChildKind::Thread)?;
        let id = guard.id;
        let mut builder = os_thread::Builder::new().name(self.inner.thread_name.clone());
        if let Some(size) = self.inner.stack_size {
            builder = builder.stack_size(size);
        }
        let spawned = builder.spawn(move || {
            let result = panic::catch_unwind(AssertUnwindSafe(f));
            // The unit goes back before the thread's result is published,
            // so `join` never sees a finished child still counted.
            guard.panicked = result.is_err();
            drop(guard);
            match result {
                Ok(value) => value,
                Err(payload) => panic::resume_unwind(payload),
            }
        });
        match spawned {
            Ok(handle) => Ok(Child { id, handle }),
            // The closure, and the guard in it, was dropped by the failed
            // spawn: the child is unregistered and its unit released.
            Err(err) => Err(Error::Spawn(err.kind())),
        }
    }

    /// Admits a child that you start yourself, and returns its guard; never
    /// waits for capacity.
    ///
    /// Move the guard into the child (a tokio task, a rayon job, a thread
    /// from another pool); dropping it is the child's exit. A guard dropped
    /// while its thread panics is counted in [`Stats::panicked`]. The child
    /// is listed by [`which_children`](Self::which_children) with no name.
    ///
    /// # Errors
    ///
    /// [`Error::Overload`] when `capacity` children are alive; counted in
    /// [`Stats::rejected`].
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// let sup = Supervisor::new(1)?;
    /// let guard = sup.reserve()?;
    /// assert_eq!(sup.reserve().unwrap_err(), Error::Overload);
    /// assert_eq!(sup.which_children(), [guard.id()]);
    /// drop(guard);
    /// assert!(sup.which_children().is_empty());
    /// assert!(sup.reserve().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn reserve(&self) -> Result<ChildGuard, Error> {
        self.inner.enter(None, ChildKind::Reserved)
    }

    /// [`reserve`](Self::reserve), trying table shard `start` first (taken
    /// modulo the shard count): the seam the model tests use in place of
    /// the caller's probe.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn reserve_at(&self, start: usize) -> Result<ChildGuard, Error> {
        let start = start % self.inner.common.table.shard_count();
        self.inner.enter(Some(start), ChildKind::Reserved)
    }

    /// Spawns `future` on the current tokio runtime as a child; never waits
    /// for capacity.
    ///
    /// The child's unit is given back when the task completes, panics
    /// (counted in [`Stats::panicked`]) or is aborted (counted as
    /// completed), whichever comes first. The returned [`Task`] is a
    /// `JoinHandle`: await it for the output; dropping it detaches the task.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`] when `capacity` children are alive; counted in
    ///   [`Stats::rejected`]. `future` is dropped without being polled.
    /// * [`Error::Spawn`] with [`io::ErrorKind::NotFound`](std::io::ErrorKind::NotFound)
    ///   when called outside a tokio runtime (where `tokio::spawn` would
    ///   panic); nothing was admitted. Use
    ///   [`spawn_task_on`](Self::spawn_task_on) to name a runtime.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// let sup = Supervisor::new(1)?;
    /// let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
    /// let task = sup.spawn_task(async move { rx.await.unwrap() * 2 })?;
    /// assert_eq!(sup.spawn_task(async {}).unwrap_err(), Error::Overload);
    ///
    /// tx.send(21).unwrap();
    /// assert_eq!(task.await?, 42);
    /// assert_eq!(sup.count(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// // Outside a runtime there is nowhere to spawn: an error, not a panic.
    /// # let sup = Supervisor::new(1)?;
    /// assert!(matches!(sup.spawn_task(async {}), Err(Error::Spawn(_))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn spawn_task<F>(&self, future: F) -> Result<Task<F::Output>, Error>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Spawn(std::io::ErrorKind::NotFound))?;
        self.spawn_task_on(&handle, future)
    }

    /// Like [`spawn_task`](Self::spawn_task), on the runtime `handle` names;
    /// callable from any thread.
    ///
    /// # Errors
    ///
    /// [`Error::Overload`] when `capacity` children are alive; counted in
    /// [`Stats::rejected`].
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Supervisor;
    ///
    /// let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// let sup = Supervisor::new(4)?;
    /// // From outside the runtime, naming it:
    /// let task = sup.spawn_task_on(rt.handle(), async { 7 })?;
    /// assert_eq!(rt.block_on(task)?, 7);
    /// assert_eq!(sup.count(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn spawn_task_on<F>(
        &self,
        handle: &tokio::runtime::Handle,
        future: F,
    ) -> Result<Task<F::Output>, Error>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let guard = self.inner.enter(None, ChildKind::Task)?;
        let id = guard.id;
        let handle = handle.spawn(supervised(guard, future));
        Ok(Task { id, handle })
    }

    /// The ids of the live children, each exactly once, in no set order.
    ///
    /// Read shard by shard under each shard's lock, without stopping the
    /// others: a child that leaves before the call starts is never listed,
    /// one that enters after it returns never is, and one entering or
    /// leaving meanwhile may or may not be.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::new(4)?;
    /// let (a, b) = (sup.reserve()?, sup.reserve()?);
    /// let mut live = sup.which_children();
    /// live.sort();
    /// let mut expected = vec![a.id(), b.id()];
    /// expected.sort();
    /// assert_eq!(live, expected);
    /// drop(a);
    /// assert_eq!(sup.which_children(), [b.id()]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn which_children(&self) -> Vec<ChildId> {
        let mut ids = Vec::new();
        for (shard, registry) in self.inner.registry.iter().enumerate() {
            let slab = registry.slab.lock();
            ids.reserve(slab.live);
            ids.extend(slab.occupied().map(|slot| ChildId::new(shard, slot.seq)));
        }
        ids
    }

    /// The live children with their details, each exactly once; see
    /// [`ChildInfo`]. The same snapshot rules as
    /// [`which_children`](Self::which_children).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Instant;
    /// use sidejob::{ChildKind, Supervisor};
    ///
    /// let sup = Supervisor::builder().name("fsm").capacity(4).build()?;
    /// let guard = sup.reserve()?;
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// let child = sup.spawn(move || rx.recv().unwrap())?;
    ///
    /// let mut children = sup.children();
    /// children.sort_by_key(|info| info.id != guard.id());
    /// assert_eq!(children.len(), 2);
    /// assert_eq!((children[0].kind, children[0].name.as_deref()), (ChildKind::Reserved, None));
    /// assert_eq!((children[1].kind, children[1].name.as_deref()), (ChildKind::Thread, Some("fsm-child")));
    /// assert_eq!(children[1].id, child.id());
    /// assert!(children.iter().all(|info| info.started <= Instant::now()));
    ///
    /// tx.send(()).unwrap();
    /// child.join().unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn children(&self) -> Vec<ChildInfo> {
        let now = now();
        let mut children = Vec::new();
        for (shard, registry) in self.inner.registry.iter().enumerate() {
            // Copy the slots out under the lock; build names outside it.
            let slots: Vec<Slot> = {
                let slab = registry.slab.lock();
                slab.occupied().copied().collect()
            };
            children.extend(slots.into_iter().map(|slot| ChildInfo {
                id: ChildId::new(shard, slot.seq),
                name: match slot.kind {
                    ChildKind::Thread => Some(self.inner.thread_name.clone()),
                    ChildKind::Task | ChildKind::Reserved => None,
                },
                started: self.inner.clock.instant(slot.started, now),
                kind: slot.kind,
            }));
        }
        children
    }

    /// Children alive now: units of capacity held.
    ///
    /// Read shard by shard while children come and go, so it is off by at
    /// most the children entering or leaving during the call; it counts a
    /// child whose admission is not yet registered, so it can briefly
    /// exceed `which_children().len()`. It never exceeds `capacity`.
    pub fn count(&self) -> usize {
        let table = &self.inner.common.table;
        (0..table.shard_count())
            .map(|i| {
                let shard = table.shard(i);
                // A shard's two counters are read one after the other, so
                // a release and a take between the reads make the raw gap
                // one too large (loom found it); the true usage never
                // exceeds the limit, so neither does the reading.
                shard.usage().min(shard.limit())
            })
            .sum()
    }

    /// The most children that can be alive at once.
    pub fn capacity(&self) -> usize {
        self.inner.common.table.capacity()
    }

    /// How many shards the capacity (and the registry) is split over.
    pub fn shards(&self) -> usize {
        self.inner.common.table.shard_count()
    }

    /// The name given to the builder (`sidejob` by default); spawned threads
    /// are named `{name}-child`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// A snapshot of the counters; see [`Stats`]. A unit is a child:
    /// `accepted` children admitted, `completed` ended normally (or aborted,
    /// or refused a thread by the OS), `panicked` ended by a panic.
    pub fn stats(&self) -> Stats {
        self.inner.common.table.stats()
    }

    /// Blocks until no child is left, or `timeout` has passed; `true` if
    /// none was left.
    ///
    /// Sleeps on a condition variable: the child whose exit empties a
    /// registry shard wakes the waiters, who re-check every shard. With
    /// `Duration::ZERO` this is a plain check. Children may be admitted
    /// again right after it returns `true`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::new(4)?;
    /// let guard = sup.reserve()?;
    /// assert!(!sup.wait_idle(Duration::ZERO));
    /// let job = std::thread::spawn(move || drop(guard));
    /// assert!(sup.wait_idle(Duration::from_secs(60)));
    /// assert_eq!(sup.count(), 0);
    /// # job.join().unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let inner = &*self.inner;
        let common = &*inner.common;
        if inner.is_idle() {
            return true;
        }
        let deadline = now().checked_add(timeout);
        let mut idle = common.idle.lock();
        // Relaxed: the count is published to leavers by the shard locks that
        // `is_idle` takes after this (see the module docs), not by this RMW.
        common.waiters.fetch_add(1, Relaxed);
        let result = loop {
            if inner.is_idle() {
                break true;
            }
            let timed_out = match deadline {
                Some(deadline) => common.idle_cv.wait_until(&mut idle, deadline),
                // A timeout too large to represent: wait in long steps.
                None => common
                    .idle_cv
                    .wait_until(&mut idle, now() + Duration::from_secs(3600)),
            };
            if timed_out && deadline.is_some_and(|d| now() >= d) {
                break inner.is_idle();
            }
        };
        // Relaxed: a leaver that still reads the old count only wakes
        // nobody, or wakes a waiter that re-checks.
        common.waiters.fetch_sub(1, Relaxed);
        result
    }
}

/// What every registry shard (and so every child) shares.
struct Common {
    table: Table,
    /// How many `wait_idle` calls are waiting. Read (Relaxed) by every leave,
    /// under its shard lock; on a line of its own, written only by waiters,
    /// so the read is a hit in a shared line.
    waiters: CachePadded<AtomicUsize>,
    /// `wait_idle` sleeps here; leavers lock it to notify.
    idle: Mutex<()>,
    idle_cv: Condvar,
}

/// One shard of the registry, with its own reference count.
///
/// A guard holds an `Arc` of its registry shard, not of the whole
/// supervisor: cloning one shared `Arc` per child would make its count a
/// hot line that every core writes (measured: 2 threads reserving took
/// 3.5× the `Limiter`'s time, against 2.5× for one thread). With a count per
/// shard, callers on different shards write different lines. Aligned to 128
/// bytes so the count (the `Arc` header) and the lock each share a line only
/// with this shard's data, not with a neighbouring allocation.
#[repr(align(128))]
struct RegistryShard {
    slab: Mutex<Slab>,
    index: usize,
    common: Arc<Common>,
}

impl Inner {
    /// Admits and registers one child.
    #[inline]
    fn enter(&self, start: Option<usize>, kind: ChildKind) -> Result<ChildGuard, Error> {
        let table = &self.common.table;
        let shard = match start {
            None => table.acquire()?,
            Some(start) => table.acquire_at(start)?,
        };
        // Outside the lock: the clock read is the slowest step.
        let started = self.clock.ticks();
        let registry = &self.registry[shard];
        let (slot, seq) = registry.slab.lock().insert(started, kind);
        Ok(ChildGuard {
            shard: Arc::clone(registry),
            id: ChildId::new(shard, seq),
            slot,
            panicked: false,
        })
    }

    /// No child registered on any shard, and no unit held.
    fn is_idle(&self) -> bool {
        self.registry
            .iter()
            .all(|shard| shard.slab.lock().live == 0)
            && self.common.table.usage() == 0
    }
}

impl RegistryShard {
    /// Unregisters a child and gives its unit back (see the module docs for
    /// why the release happens under the lock).
    #[inline]
    fn leave(&self, slot: usize, seq: u64, panicked: bool) {
        let common = &*self.common;
        let mut slab = self.slab.lock();
        slab.remove(slot, seq);
        common.table.release(self.index, panicked);
        // Relaxed: ordered by the shard lock against the waiter's check
        // (module docs).
        let wake = slab.live == 0 && common.waiters.load(Relaxed) != 0;
        drop(slab);
        if wake {
            common.wake_idle();
        }
    }
}

impl Common {
    #[cold]
    fn wake_idle(&self) {
        // Taking the lock orders this notify after a waiter that checked and
        // went to sleep (it holds the lock until it sleeps).
        let _idle = self.idle.lock();
        self.idle_cv.notify_all();
    }
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("name", &self.inner.name)
            .field("capacity", &self.capacity())
            .field("shards", &self.shards())
            .field("count", &self.count())
            .finish()
    }
}

/// Configures a [`Supervisor`]; made by [`Supervisor::builder`].
///
/// # Examples
///
/// ```
/// use sidejob::{Probe, Supervisor};
///
/// let sup = Supervisor::builder()
///     .name("get_fsm")
///     .capacity(10_000)
///     .shards(4)
///     .probe(Probe::Thread)
///     .build()?;
/// assert_eq!((sup.name(), sup.capacity(), sup.shards()), ("get_fsm", 10_000, 4));
///
/// let err = Supervisor::builder().name("bad\0name").capacity(1).build().unwrap_err();
/// assert_eq!(err.field(), "name");
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct SupervisorBuilder {
    name: Option<String>,
    capacity: Option<usize>,
    shards: Option<usize>,
    probe: Probe,
    stack_size: Option<usize>,
}

impl SupervisorBuilder {
    /// The supervisor's name; spawned threads are named `{name}-child`.
    /// Defaults to `sidejob`. Must not contain a NUL byte.
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// How many children may be alive at once. Required; at least 1.
    pub fn capacity(&mut self, capacity: usize) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// How many shards to split the capacity and the registry over.
    /// Defaults to the number of CPUs; more shards than `capacity` are
    /// trimmed to `capacity`.
    pub fn shards(&mut self, shards: usize) -> &mut Self {
        self.shards = Some(shards);
        self
    }

    /// Where a caller starts probing; see [`Probe`].
    pub fn probe(&mut self, probe: Probe) -> &mut Self {
        self.probe = probe;
        self
    }

    /// The stack size, in bytes, of threads started by
    /// [`Supervisor::spawn`]. Defaults to std's (2 MiB, or
    /// `RUST_MIN_STACK`). A size the OS cannot give makes `spawn` fail with
    /// [`Error::Spawn`].
    pub fn stack_size(&mut self, bytes: usize) -> &mut Self {
        self.stack_size = Some(bytes);
        self
    }

    /// Builds the supervisor.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field when `capacity` is unset, 0 or too
    /// large, `shards` is 0 or too large, or `name` contains a NUL byte
    /// (thread names cannot).
    pub fn build(&self) -> Result<Supervisor, ConfigError> {
        let name = self.name.clone().unwrap_or_else(|| "sidejob".to_owned());
        if name.contains('\0') {
            return Err(ConfigError::nul("name"));
        }
        let capacity = self.capacity.ok_or(ConfigError::missing("capacity"))?;
        let shards = self.shards.unwrap_or_else(num_cpus::get);
        let table = Table::new(capacity, shards, self.probe)?;
        let common = Arc::new(Common {
            table,
            waiters: CachePadded::new(AtomicUsize::new(0)),
            idle: Mutex::new(()),
            idle_cv: Condvar::new(),
        });
        let registry = (0..common.table.shard_count())
            .map(|index| {
                Arc::new(RegistryShard {
                    slab: Mutex::new(Slab::with_limit(common.table.shard(index).limit())),
                    index,
                    common: Arc::clone(&common),
                })
            })
            .collect();
        Ok(Supervisor {
            inner: Arc::new(Inner {
                common,
                registry,
                clock: CoarseClock::new(),
                thread_name: format!("{name}-child"),
                name,
                stack_size: self.stack_size,
            }),
        })
    }
}

/// Identifies a live child of a [`Supervisor`].
///
/// Unique among the supervisor's children (live or not, unless one shard
/// admits 2^64 of them): the registry shard the child was admitted on and
/// a sequence number kept by that shard. Displayed like an Erlang pid,
/// `<shard.seq>`. Ids of different supervisors may be equal.
///
/// # Examples
///
/// ```
/// use sidejob::Supervisor;
///
/// let sup = Supervisor::builder().capacity(2).shards(1).build()?;
/// let (a, b) = (sup.reserve()?, sup.reserve()?);
/// assert_ne!(a.id(), b.id());
/// assert_eq!(a.id().to_string(), "<0.1>");
/// assert_eq!(a.id().shard(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChildId {
    shard: u32,
    seq: u64,
}

impl ChildId {
    fn new(shard: usize, seq: u64) -> ChildId {
        // Shard counts are capped at `table::MAX_SHARDS` (2^16).
        ChildId {
            shard: shard as u32,
            seq,
        }
    }

    /// The shard the child was admitted on.
    pub fn shard(&self) -> usize {
        self.shard as usize
    }
}

impl fmt::Display for ChildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{}.{}>", self.shard, self.seq)
    }
}

/// What kind of child a [`ChildInfo`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChildKind {
    /// An OS thread from [`Supervisor::spawn`].
    Thread,
    /// A tokio task from `Supervisor::spawn_task` (feature `tokio`).
    Task,
    /// A [`ChildGuard`] from [`Supervisor::reserve`].
    Reserved,
}

/// One live child, as listed by [`Supervisor::children`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChildInfo {
    /// The child's id.
    pub id: ChildId,
    /// The thread's name for a spawned thread (`{name}-child`); `None` for
    /// tasks and reserved guards.
    pub name: Option<String>,
    /// When the child was admitted, to the OS scheduler tick (1–4 ms on
    /// Linux, which reads the coarse monotonic clock: a precise reading
    /// would cost more than the rest of admission together).
    pub started: Instant,
    /// How the child was started.
    pub kind: ChildKind,
}

/// A child started by [`Supervisor::spawn`]: its OS thread's handle.
///
/// Dropping it detaches the thread, which stays counted until it ends.
pub struct Child<T> {
    id: ChildId,
    handle: os_thread::JoinHandle<T>,
}

impl<T> Child<T> {
    /// The child's id, as [`Supervisor::which_children`] lists it.
    pub fn id(&self) -> ChildId {
        self.id
    }

    /// Waits for the child to end and returns what it returned, or the
    /// payload it panicked with. Its unit was released before this returns.
    ///
    /// # Errors
    ///
    /// `Err(payload)` if the child panicked, as [`std::thread::JoinHandle::join`].
    ///
    /// # Examples
    ///
    /// ```
    /// let sup = sidejob::Supervisor::new(1)?;
    /// let child = sup.spawn(|| 6 * 7)?;
    /// assert_eq!(child.join().unwrap(), 42);
    /// assert_eq!(sup.count(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn join(self) -> os_thread::Result<T> {
        self.handle.join()
    }

    /// True once the child's function has returned or panicked (its unit
    /// may be released a moment before this turns true).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

impl<T> fmt::Debug for Child<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Child").field("id", &self.id).finish()
    }
}

/// A live child's unit of a [`Supervisor`]'s capacity and its registration;
/// dropping it is the child's exit.
///
/// Made by [`Supervisor::reserve`]. It is `Send + 'static`: move it into the
/// child. Dropped while its thread panics, the exit is counted in
/// [`Stats::panicked`].
#[must_use = "the child exits as soon as its guard is dropped"]
#[clippy::has_significant_drop]
pub struct ChildGuard {
    shard: Arc<RegistryShard>,
    id: ChildId,
    /// Index of the child's slot in its shard's slab.
    slot: usize,
    /// Set when the child is known to have panicked though the guard is not
    /// dropped by unwinding (a spawned thread or task catches the panic).
    panicked: bool,
}

impl ChildGuard {
    /// The child's id, as [`Supervisor::which_children`] lists it.
    pub fn id(&self) -> ChildId {
        self.id
    }
}

impl Drop for ChildGuard {
    #[inline]
    fn drop(&mut self) {
        let panicked = self.panicked || os_thread::panicking();
        self.shard.leave(self.slot, self.id.seq, panicked);
    }
}

impl fmt::Debug for ChildGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildGuard").field("id", &self.id).finish()
    }
}

/// A child started by `Supervisor::spawn_task`: a tokio task.
///
/// Await it for the task's output, as a `tokio::task::JoinHandle`; dropping
/// it detaches the task, which stays counted until it ends.
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub struct Task<T> {
    id: ChildId,
    handle: tokio::task::JoinHandle<T>,
}

#[cfg(feature = "tokio")]
impl<T> Task<T> {
    /// The child's id, as [`Supervisor::which_children`] lists it.
    pub fn id(&self) -> ChildId {
        self.id
    }

    /// Cancels the task. Its future is dropped at its next yield point (or
    /// at once if it is not running), which releases its unit; awaiting the
    /// `Task` then gives a cancelled `JoinError`.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// let sup = sidejob::Supervisor::new(1)?;
    /// let task = sup.spawn_task(std::future::pending::<()>())?;
    /// task.abort();
    /// assert!(task.await.unwrap_err().is_cancelled());
    /// assert_eq!(sup.count(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn abort(&self) {
        self.handle.abort();
    }

    /// True once the task has finished (completed, panicked or been
    /// cancelled).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }
}

#[cfg(feature = "tokio")]
impl<T> std::future::Future for Task<T> {
    type Output = Result<T, tokio::task::JoinError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.get_mut().handle).poll(cx)
    }
}

#[cfg(feature = "tokio")]
impl<T> fmt::Debug for Task<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task").field("id", &self.id).finish()
    }
}

/// `future`, holding `guard` until it completes or is dropped (aborted). A
/// panic in `poll` is caught so the guard can be dropped as panicked, then
/// resumed for tokio to report through the `JoinError`: tokio catches the
/// panic outside the future and drops the future later, when
/// `thread::panicking()` no longer says so.
#[cfg(feature = "tokio")]
async fn supervised<F: std::future::Future>(mut guard: ChildGuard, future: F) -> F::Output {
    use std::task::Poll;

    let mut future = std::pin::pin!(future);
    let polled = std::future::poll_fn(|cx| {
        match panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    })
    .await;
    match polled {
        Ok(output) => output,
        Err(payload) => {
            guard.panicked = true;
            drop(guard);
            panic::resume_unwind(payload)
        }
    }
}

/// One registry shard: a slab of live children with an intrusive free list.
///
/// Holds at most the table shard's limit of entries (see the module docs),
/// so it is allocated once, up to a cap, and never grows on the hot path
/// while the limit is small.
#[derive(Debug)]
struct Slab {
    slots: Vec<Slot>,
    /// Head of the free list through `Slot::next_free`; `NONE` if empty.
    free: usize,
    /// The last sequence number handed out; 0 marks a vacant slot.
    seq: u64,
    live: usize,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// The child's sequence number, 0 when vacant.
    seq: u64,
    /// `CoarseClock` ticks at admission.
    started: u64,
    kind: ChildKind,
    next_free: usize,
}

const NONE: usize = usize::MAX;
/// The most slots a slab allocates up front.
const PREALLOCATE: usize = 1024;

impl Slab {
    fn with_limit(limit: usize) -> Slab {
        Slab {
            slots: Vec::with_capacity(limit.min(PREALLOCATE)),
            free: NONE,
            seq: 0,
            live: 0,
        }
    }

    /// Stores a child; returns its slot and sequence number.
    #[inline]
    fn insert(&mut self, started: u64, kind: ChildKind) -> (usize, u64) {
        self.seq += 1;
        self.live += 1;
        let slot = Slot {
            seq: self.seq,
            started,
            kind,
            next_free: NONE,
        };
        let index = if self.free != NONE {
            let index = self.free;
            self.free = self.slots[index].next_free;
            self.slots[index] = slot;
            index
        } else {
            self.slots.push(slot);
            self.slots.len() - 1
        };
        (index, self.seq)
    }

    /// Frees the slot of child `seq`.
    #[inline]
    fn remove(&mut self, index: usize, seq: u64) {
        let slot = &mut self.slots[index];
        debug_assert_eq!(slot.seq, seq, "a guard frees only its own slot");
        let _ = seq;
        slot.seq = 0;
        slot.next_free = self.free;
        self.free = index;
        self.live -= 1;
    }

    fn occupied(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().filter(|slot| slot.seq != 0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn slab_reuses_slots_and_never_repeats_a_sequence() {
        let mut slab = Slab::with_limit(2);
        let (a, sa) = slab.insert(0, ChildKind::Reserved);
        let (b, sb) = slab.insert(0, ChildKind::Reserved);
        assert_ne!(a, b);
        slab.remove(a, sa);
        let (c, sc) = slab.insert(0, ChildKind::Reserved);
        assert_eq!(c, a);
        assert!(sc > sb);
        assert_eq!(slab.live, 2);
        assert_eq!(slab.slots.len(), 2);
    }
}
