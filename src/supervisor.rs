//! [`Supervisor`]: a bound on how many children (threads, tasks, anything
//! holding a [`ChildGuard`]) are alive at once, and a registry that says
//! which.
//!
//! One child is one unit of the shard table (`engine/table.rs`). Around it sits the
//! registry of live children, sharded like the counters and lock-free:
//! registry shard `i` holds exactly the children admitted on table shard
//! `i`, in an array of exactly `limit_i` slots, one atomic word each. A
//! caller touches only the shard it was admitted on, so spawns on different
//! cores never meet, and a listing is one load per slot.
//!
//! # The slot word
//!
//! | bits   | field | meaning |
//! |--------|-------|---------|
//! | 0      | `OCCUPIED` | 1 while a child holds the slot |
//! | 1–2    | kind  | [`ChildKind`] of the occupant (0 when free) |
//! | 3–23   | generation | occupancies of this slot so far, mod 2^21; kept while free |
//! | 24–63  | start | admission time in units of 2^20 ns (≈1 ms), 0 when free |
//!
//! A free word is `generation << 3` and nothing else; the first occupancy
//! finds 0. Everything a listing reports is in the one word, so a lister
//! reads it with one load and never sees half a child: no second word for
//! the start time, no intermediate "claimed, not yet published" state. The
//! price is the width of the fields: a start time to about a millisecond
//! (the coarse clock only ticks every 1–4 ms anyway) for 36 years, and a
//! generation that wraps after 2^21 occupancies of one slot (see
//! [`ChildId`]). A child's id is `(shard, generation × limit_i + slot + 1)`:
//! one number per (slot, generation) pair, so ids of live children, which
//! hold different slots, are always distinct.
//!
//! # Protocol
//!
//! * **Enter**: take a unit from the table (fail fast with `Overload`), read
//!   the coarse clock, then *claim* a free slot of the shard: one CAS from
//!   the free word to the occupied word. Where to look comes from the
//!   shard's hint (the slot freed last, or the one after the slot claimed
//!   last), so a claim is one CAS unless threads on the same shard race for
//!   the same slot; only then does it walk the slots.
//! * **Leave**: store the next generation's free word (Release), point the
//!   hint at the slot, give the unit back to the table, then read the waiter
//!   count and, only if someone waits in
//!   [`wait_idle`](Supervisor::wait_idle) and the shard is now empty, lock,
//!   bump the idle epoch, unlock and notify.
//!
//! **Bound.** A slot is held from after its unit is taken to before it is
//! given back, so at every instant the occupied slots of a shard are at most
//! the units its table shard holds, which the table keeps at its limit. A
//! caller holding a unit but no slot yet therefore always has a free slot
//! to find (it keeps walking until it does; each failed CAS means another
//! claimer won), and a listing can never show more than `capacity`
//! children.
//!
//! **Listing.** One Acquire load per slot. A slot appears once per listing,
//! so no child is listed twice; a guard whose drop returned before the
//! listing began has stored its free word, which the load sees or a later
//! claim that carries a new generation, so a released child is never
//! listed; a reserve that returned before it began is seen.
//!
//! **Waking `wait_idle`** is a store→load (Dekker) race: the waiter writes
//! the waiter count and reads the shards, a leaver writes its shard and
//! reads the waiter count, and neither may miss the other. Instead of a
//! `fence(SeqCst)` on both sides, which would put a fence on every drop,
//! both sides go through the one word they already share, the table shard's
//! `given` counter, as `Table::mark_full` does: the leaver's release is an
//! AcqRel RMW on it (it was one already), and the waiter reads each shard
//! through an AcqRel RMW on it (`Shard::usage_synced`). The two RMWs are
//! ordered in `given`'s modification order. If the waiter's comes later, it
//! reads the release and sees the shard as the leaver left it. If the
//! leaver's comes later, it synchronizes with the waiter's, so the waiter
//! count the waiter bumped before its check is visible to the leaver's
//! plain load, and the leaver wakes it. The drop path pays one extra plain
//! load of a line only waiters write.
//!
//! **No scan under the lock.** The scan reads every shard (65,536 RMWs at
//! the largest shard count), so it runs *outside* the idle lock: a leaver
//! that must wake someone takes the lock only to bump the idle *epoch* (a
//! counter under the lock) and to take the registered async wakers, and
//! never waits behind a scan. The waiter, after bumping the waiter count:
//!
//! 1. reads the epoch under the lock (a short hold), as `seen`;
//! 2. scans the shards, lock released; idle means done;
//! 3. locks again and, only while the epoch is still `seen`, sleeps on the
//!    condition variable ([`wait_idle`](Supervisor::wait_idle)) or
//!    registers its task's waker and returns `Pending`
//!    ([`wait_idle_async`](Supervisor::wait_idle_async)); otherwise goes
//!    back to 1.
//!
//! A leaver that wakes bumps the epoch, takes every registered waker, lets
//! go of the lock, then notifies the condition variable and wakes the
//! wakers. A future polled again while the epoch is still the one it
//! registered under has not been woken yet and stays `Pending` without a
//! scan; a dropped future takes its waker out of the list and its count
//! out of the waiter count, so nothing stays registered.
//!
//! Why no wake-up is lost: take the leaver whose RMW on some shard's
//! `given` the waiter's scan missed (it came later in `given`'s order than
//! the waiter's RMW). That leaver sees the waiter count and, finding its
//! shard empty, bumps the epoch under the lock. Its lock hold comes after
//! the waiter's step 1 hold: were it earlier, the leaver's RMW would
//! happen-before the waiter's step 1, hence before the waiter's RMW, and
//! would come first in `given`'s order. So the bump lands after step 1,
//! and either before step 3 (the waiter sees a new epoch and scans again)
//! or after the waiter went to sleep or registered under the lock in
//! step 3 (the bump's notify, or the wake of the waker it takes, reaches
//! it). A leaver that finds its shard
//! not empty leaves the waking to the child that holds the shard now; that
//! child's own leave is, again, either seen by the scan or wakes.

use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::engine::keys::{KeySet, KeySlot};
use crate::engine::probe::Probe;
use crate::engine::table::Table;
use crate::engine::waiters::{Policy, QueueOrder};
use crate::error::{ConfigError, Error};
use crate::stats::Stats;
use crate::sync::{
    now, os_thread, yield_now, Arc, AtomicU64, AtomicUsize, CoarseClock, Condvar, Mutex,
    Ordering::{Acquire, Relaxed, Release},
};

/// A fail-fast bound on live children, with a registry of which are alive:
/// Erlang's `sidejob_supervisor`, for threads and tasks.
///
/// At most `capacity` children are alive at once. [`spawn`](Self::spawn)
/// starts an OS thread, [`spawn_task`][spawn_task] (feature `tokio`) a
/// tokio task, and [`reserve`](Self::reserve) hands out a [`ChildGuard`] for
/// a child you start yourself (a rayon job, a task on another executor);
/// dropping the guard is that child's exit. When every unit is taken, the
/// next child is refused with [`Error::Overload`] at once: nothing waits,
/// nothing queues, unless the builder gave it a bounded waiting room
/// ([`max_waiters`](SupervisorBuilder::max_waiters)).
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
// Without the `tokio` feature `spawn_task` does not exist: link to the
// crate's feature list instead of leaving a broken link.
#[cfg_attr(feature = "tokio", doc = "\n[spawn_task]: Self::spawn_task")]
#[cfg_attr(not(feature = "tokio"), doc = "\n[spawn_task]: crate#feature-flags")]
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

    /// Starts `f` on a new OS thread, as a child. Waits for capacity only
    /// under the supervisor's waiting policy
    /// ([`max_waiters`](SupervisorBuilder::max_waiters); by default it
    /// never does).
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
    /// * [`Error::Shutdown`] once [`close`](Self::close) has been called;
    ///   `f` is dropped without running.
    /// * [`Error::Spawn`] when the OS refuses to start the thread (too many
    ///   threads, no memory for the stack). The unit was released: the
    ///   refusal is not an `Overload`. (A thread that starts but cannot
    ///   map its signal stack aborts the process inside std, which this
    ///   cannot catch: on Linux, at about 16,000 live threads; see
    ///   [`SupervisorBuilder::capacity`].)
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
        let mut guard = self.inner.enter(Admit::Wait, ChildKind::Thread)?;
        let id = guard.id();
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

    /// Admits a child that you start yourself, and returns its guard.
    /// Waits for capacity only under the supervisor's waiting policy (by
    /// default it never does; [`try_reserve`](Self::try_reserve) never
    /// does).
    ///
    /// Move the guard into the child (a tokio task, a rayon job, a thread
    /// from another pool); dropping it is the child's exit. A guard dropped
    /// while its thread panics is counted in [`Stats::panicked`]. The child
    /// is listed by [`which_children`](Self::which_children) with no name.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`] when `capacity` children are alive; counted in
    ///   [`Stats::rejected`].
    /// * [`Error::Shutdown`] once [`close`](Self::close) has been called.
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
        self.inner.enter(Admit::Wait, ChildKind::Reserved)
    }

    /// [`reserve`](Self::reserve) that never waits for capacity, whatever
    /// the supervisor's waiting policy.
    ///
    /// # Errors
    ///
    /// [`Error::Overload`] at once when `capacity` children are alive;
    /// [`Error::Shutdown`] once closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// let sup = Supervisor::builder().capacity(1).max_waiters(10).build()?;
    /// let _one = sup.try_reserve()?;
    /// assert_eq!(sup.try_reserve().unwrap_err(), Error::Overload); // no wait
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_reserve(&self) -> Result<ChildGuard, Error> {
        self.inner.enter(Admit::Try, ChildKind::Reserved)
    }

    /// [`reserve`](Self::reserve) as a future: waits for capacity (under
    /// the supervisor's waiting policy) without blocking the executor.
    /// The future is `Send`; it borrows the supervisor.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Self::reserve).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the wait; a unit handed to it meanwhile
    /// goes to the next waiter. Nothing is registered.
    ///
    /// # Examples
    ///
    /// A task worker claims work only when a slot frees, the next task
    /// starting the moment one ends:
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::builder().capacity(1).max_waiters(100).build()?;
    /// let first = sup.reserve_async().await?;
    /// let ended = tokio::spawn(async move { drop(first) });
    /// let second = sup.reserve_async().await?; // waits for the first
    /// ended.await?;
    /// assert_eq!(sup.which_children(), [second.id()]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn reserve_async(&self) -> Result<ChildGuard, Error> {
        let shard = self.inner.common.table.acquire_async(None).await?;
        Ok(self.inner.register(shard, ChildKind::Reserved))
    }

    /// How many callers wait for capacity now (0 without a waiting room).
    pub fn waiting(&self) -> usize {
        self.inner.common.table.waiting()
    }

    /// Admits a child of `key`: at most [`per_key`](SupervisorBuilder::per_key)
    /// live children per key (1 by default), on top of the capacity. Waits
    /// for the key, then for capacity, only under the supervisor's waiting
    /// policy ([`max_waiters`](SupervisorBuilder::max_waiters); by default
    /// it never does; [`try_reserve_keyed`](Self::try_reserve_keyed) never
    /// does).
    ///
    /// This is the task worker's "tasks of one workflow run one after
    /// another, different workflows in parallel": key the child by its
    /// workflow id. The key's slot is taken first and released last (after
    /// the unit of capacity), so a key never has more than `per_key` live
    /// children; a refusal of either leaves neither held. Keys are told
    /// apart by 43 bits of a per-process seeded hash: two keys that agree
    /// on them (a chance of about 2^-24 that any two of 1,000 live keys
    /// do) count as one key, which only serializes them.
    ///
    /// A key waits in first-come-first-served order, whatever the
    /// [`queue_order`](SupervisorBuilder::queue_order) (which orders the
    /// wait for capacity): when a child of the key ends, its slot goes to
    /// the key's oldest waiter at once. Waiting for the key counts against
    /// [`max_waiters`](SupervisorBuilder::max_waiters) separately from
    /// waiting for capacity, and the two waits together last at most
    /// [`max_wait`](SupervisorBuilder::max_wait).
    ///
    /// # Errors
    ///
    /// * [`Error::KeyBusy`] when the key has `per_key` live children (or
    ///   as many admissions of it in progress) and the caller may not wait
    ///   for it (no waiting room, or `max_waiters` already wait for keys).
    ///   No unit of capacity was taken; not counted in [`Stats::rejected`].
    /// * [`Error::Overload`] when `capacity` children are alive (counted);
    ///   the key's slot was given back.
    /// * [`Error::Timeout`] when the wait ran out.
    /// * [`Error::Shutdown`] once [`close`](Self::close) has been called.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// let sup = Supervisor::builder().capacity(100).per_key(1).build()?;
    /// let step1 = sup.reserve_keyed(&"order-17")?;
    /// assert_eq!(sup.reserve_keyed(&"order-17").unwrap_err(), Error::KeyBusy);
    /// let other = sup.reserve_keyed(&"order-18")?; // other keys run meanwhile
    /// drop(step1);
    /// let step2 = sup.reserve_keyed(&"order-17")?; // the next step, now
    /// assert_eq!(sup.busy_keys(), 2);
    /// drop((step2, other));
    /// assert_eq!(sup.busy_keys(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_keyed<K: Hash + ?Sized>(&self, key: &K) -> Result<ChildGuard, Error> {
        let keys = &self.inner.common.keys;
        let id = keys.id(key);
        match keys.try_enter(id) {
            Ok(key) => {
                // `key` is dropped (released) if the capacity refuses.
                let child = self.inner.enter(Admit::Wait, ChildKind::Reserved)?;
                Ok(child.with_key(key))
            }
            Err(Error::KeyBusy) if keys.can_wait() => self.reserve_keyed_slow(id),
            Err(err) => Err(self.keyed_refusal(err)),
        }
    }

    /// A refusal by the key set, as the caller sees it: the lock-free path
    /// does not look at `close`, so a busy key of a closed supervisor
    /// answers `Shutdown`, as everything else then does.
    #[cold]
    fn keyed_refusal(&self, err: Error) -> Error {
        if err == Error::KeyBusy && self.inner.common.table.is_closing() {
            Error::Shutdown
        } else {
            err
        }
    }

    /// The key was busy: wait for it, then for capacity, within one
    /// deadline.
    #[cold]
    fn reserve_keyed_slow(&self, id: u64) -> Result<ChildGuard, Error> {
        let keys = &self.inner.common.keys;
        let deadline = keys.deadline(None);
        let key = keys.wait_blocking(id, deadline)?;
        let shard = self.inner.common.table.acquire_waiting(deadline)?;
        Ok(self
            .inner
            .register(shard, ChildKind::Reserved)
            .with_key(key))
    }

    /// [`reserve_keyed`](Self::reserve_keyed) that never waits, for the key
    /// or for capacity, whatever the supervisor's waiting policy: the
    /// claim loop's "skip a task whose workflow is busy".
    ///
    /// # Errors
    ///
    /// [`Error::KeyBusy`] at once when the key has `per_key` live children;
    /// [`Error::Overload`] at once when `capacity` children are alive;
    /// [`Error::Shutdown`] once closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// let sup = Supervisor::builder().capacity(2).max_waiters(10).build()?;
    /// let claimed = ["wf-1", "wf-2", "wf-1", "wf-3"];
    /// let mut started = Vec::new();
    /// let mut skipped = Vec::new();
    /// for workflow in claimed {
    ///     match sup.try_reserve_keyed(&workflow) {
    ///         Ok(guard) => started.push((workflow, guard)),
    ///         Err(Error::KeyBusy) => skipped.push(workflow), // its previous task runs
    ///         Err(Error::Overload) => skipped.push(workflow), // no capacity left
    ///         Err(other) => return Err(other.into()),
    ///     }
    /// }
    /// assert_eq!(skipped, ["wf-1", "wf-3"]);
    /// assert_eq!(started.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_reserve_keyed<K: Hash + ?Sized>(&self, key: &K) -> Result<ChildGuard, Error> {
        let keys = &self.inner.common.keys;
        let key = keys
            .try_enter(keys.id(key))
            .map_err(|err| self.keyed_refusal(err))?;
        let child = self.inner.enter(Admit::Try, ChildKind::Reserved)?;
        Ok(child.with_key(key))
    }

    /// [`reserve_keyed`](Self::reserve_keyed) as a future: waits for the
    /// key, then for capacity (under the supervisor's waiting policy),
    /// without blocking the executor. The future is `Send`; it borrows the
    /// supervisor and the key is hashed at the call.
    ///
    /// # Errors
    ///
    /// As [`reserve_keyed`](Self::reserve_keyed).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the wait: it leaves the key's queue,
    /// and a slot or unit handed to it meanwhile goes to the next waiter.
    ///
    /// # Examples
    ///
    /// One workflow's steps, each started the moment the previous ends:
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::builder().capacity(10).max_waiters(100).build()?;
    /// let step1 = sup.reserve_keyed_async(&42u64).await?;
    /// let ended = tokio::spawn(async move { drop(step1) });
    /// let step2 = sup.reserve_keyed_async(&42u64).await?; // waits for step 1
    /// ended.await?;
    /// assert_eq!(sup.which_children(), [step2.id()]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_keyed_async<K: Hash + ?Sized>(
        &self,
        key: &K,
    ) -> impl Future<Output = Result<ChildGuard, Error>> + Send + '_ {
        let id = self.inner.common.keys.id(key);
        async move {
            let (key, shard) = self.keyed_unit_async(id).await?;
            Ok(self
                .inner
                .register(shard, ChildKind::Reserved)
                .with_key(key))
        }
    }

    /// The key's slot, then a unit of capacity, waiting for each under the
    /// policy within one deadline. A refusal of the unit drops the slot.
    async fn keyed_unit_async(&self, id: u64) -> Result<(KeySlot<'_>, usize), Error> {
        let keys = &self.inner.common.keys;
        let deadline = if keys.can_wait() {
            keys.deadline(None)
        } else {
            None
        };
        let key = keys
            .enter_async(id, deadline)
            .await
            .map_err(|err| self.keyed_refusal(err))?;
        let shard = self.inner.common.table.acquire_async(deadline).await?;
        Ok((key, shard))
    }

    /// How many keys have live children (or callers waiting for them) now:
    /// the workflows in flight. The key set forgets a key when its last
    /// child ends, so this is at most `capacity` plus the waiters, and 0
    /// once every keyed child has ended. Read shard by shard while keys
    /// come and go.
    pub fn busy_keys(&self) -> usize {
        self.inner.common.keys.busy_keys()
    }

    /// How many callers wait for a busy key now (they are not in
    /// [`waiting`](Self::waiting), which counts waits for capacity).
    pub fn waiting_for_keys(&self) -> usize {
        self.inner.common.keys.waiting()
    }

    /// [`reserve`](Self::reserve), trying table shard `start` first (taken
    /// modulo the shard count): the seam the model tests use in place of
    /// the caller's probe.
    #[cfg_attr(any(not(test), loom), allow(dead_code))]
    pub(crate) fn reserve_at(&self, start: usize) -> Result<ChildGuard, Error> {
        let start = start % self.inner.common.table.shard_count();
        self.inner.enter(Admit::At(start), ChildKind::Reserved)
    }

    /// [`try_reserve_keyed`](Self::try_reserve_keyed), trying table shard
    /// `start` first (modulo the shard count): the keyed model's seam.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn try_reserve_keyed_at<K: Hash + ?Sized>(
        &self,
        key: &K,
        start: usize,
    ) -> Result<ChildGuard, Error> {
        let keys = &self.inner.common.keys;
        let key = keys
            .try_enter(keys.id(key))
            .map_err(|err| self.keyed_refusal(err))?;
        let start = start % self.inner.common.table.shard_count();
        let child = self.inner.enter(Admit::At(start), ChildKind::Reserved)?;
        Ok(child.with_key(key))
    }

    /// Spawns `future` on the current tokio runtime as a child; never waits
    /// for capacity, whatever the waiting policy (it is called on a
    /// runtime thread, which must not block: `spawn_task_async` waits).
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
    /// * [`Error::Shutdown`] once [`close`](Self::close) has been called;
    ///   `future` is dropped without being polled.
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
    /// * [`Error::Overload`] when `capacity` children are alive; counted in
    ///   [`Stats::rejected`].
    /// * [`Error::Shutdown`] once [`close`](Self::close) has been called.
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
        // Never waits: this is a plain function called on a runtime's
        // thread, which must not block. `spawn_task_async` waits.
        let guard = self.inner.enter(Admit::Try, ChildKind::Task)?;
        Ok(self.spawn_guarded(handle, guard, future))
    }

    /// [`spawn_task`](Self::spawn_task) that waits for capacity under the
    /// supervisor's waiting policy, without blocking the executor, then
    /// spawns `future` on the current runtime.
    ///
    /// # Errors
    ///
    /// As [`reserve`](Self::reserve); [`Error::Spawn`] outside a tokio
    /// runtime.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves gives up the wait; `future`
    /// is dropped without running.
    ///
    /// # Examples
    ///
    /// Thousands of IO tasks, at most 2 at once, the rest waiting their
    /// turn:
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::builder().capacity(2).max_waiters(1000).build()?;
    /// let mut tasks = Vec::new();
    /// for n in 0..10u64 {
    ///     tasks.push(sup.spawn_task_async(async move { n * n }).await?);
    /// }
    /// let mut sum = 0;
    /// for task in tasks {
    ///     sum += task.await?;
    /// }
    /// assert_eq!(sum, 285);
    /// assert_eq!(sup.stats().peak_usage, 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn spawn_task_async<F>(&self, future: F) -> Result<Task<F::Output>, Error>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Spawn(std::io::ErrorKind::NotFound))?;
        let shard = self.inner.common.table.acquire_async(None).await?;
        let guard = self.inner.register(shard, ChildKind::Task);
        Ok(self.spawn_guarded(&handle, guard, future))
    }

    /// Spawns `future` on the current tokio runtime as a child of `key`
    /// (at most [`per_key`](SupervisorBuilder::per_key) live per key);
    /// never waits, for the key or for capacity, whatever the waiting
    /// policy. [`spawn_task_keyed_async`](Self::spawn_task_keyed_async)
    /// waits.
    ///
    /// The key's slot and the unit are released when the task completes,
    /// panics or is aborted, the unit first: the key's next task can start
    /// as soon as the key is free.
    ///
    /// # Errors
    ///
    /// As [`try_reserve_keyed`](Self::try_reserve_keyed) ([`Error::KeyBusy`],
    /// [`Error::Overload`], [`Error::Shutdown`]), and [`Error::Spawn`]
    /// outside a tokio runtime; `future` is dropped without being polled.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// let sup = Supervisor::new(100)?;
    /// let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    /// let first = sup.spawn_task_keyed(&"wf-1", async move { rx.await.unwrap() })?;
    /// let busy = sup.spawn_task_keyed(&"wf-1", async {}).unwrap_err();
    /// assert_eq!(busy, Error::KeyBusy); // skip it: wf-1's task runs
    /// let other = sup.spawn_task_keyed(&"wf-2", async {})?;
    /// tx.send(()).unwrap();
    /// first.await?;
    /// other.await?;
    /// assert!(sup.spawn_task_keyed(&"wf-1", async {}).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn spawn_task_keyed<K, F>(&self, key: &K, future: F) -> Result<Task<F::Output>, Error>
    where
        K: Hash + ?Sized,
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Spawn(std::io::ErrorKind::NotFound))?;
        let keys = &self.inner.common.keys;
        let key = keys
            .try_enter(keys.id(key))
            .map_err(|err| self.keyed_refusal(err))?;
        let guard = self.inner.enter(Admit::Try, ChildKind::Task)?;
        Ok(self.spawn_guarded(&handle, guard.with_key(key), future))
    }

    /// [`spawn_task_keyed`](Self::spawn_task_keyed) that waits for the key
    /// (first come first served per key), then for capacity, under the
    /// supervisor's waiting policy, without blocking the executor; then
    /// spawns `future` on the current runtime. The key is hashed at the
    /// call.
    ///
    /// # Errors
    ///
    /// As [`reserve_keyed`](Self::reserve_keyed); [`Error::Spawn`] outside
    /// a tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it resolves gives up the wait (a slot or
    /// unit handed to it goes to the next waiter); `future` is dropped
    /// without running.
    ///
    /// # Examples
    ///
    /// Three workflows of three steps each; a workflow's steps run in
    /// order, one at a time:
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use std::sync::{Arc, Mutex};
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::builder().capacity(8).max_waiters(100).build()?;
    /// let log = Arc::new(Mutex::new(Vec::new()));
    /// let mut tasks = Vec::new();
    /// for step in 0..3 {
    ///     for workflow in ["a", "b", "c"] {
    ///         let log = log.clone();
    ///         let task = sup
    ///             .spawn_task_keyed_async(&workflow, async move {
    ///                 tokio::task::yield_now().await;
    ///                 log.lock().unwrap().push((workflow, step));
    ///             })
    ///             .await?;
    ///         tasks.push(task);
    ///     }
    /// }
    /// for task in tasks {
    ///     task.await?;
    /// }
    /// let log = log.lock().unwrap();
    /// for workflow in ["a", "b", "c"] {
    ///     let steps: Vec<_> = log.iter().filter(|(w, _)| *w == workflow).map(|(_, s)| *s).collect();
    ///     assert_eq!(steps, [0, 1, 2]);
    /// }
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub async fn spawn_task_keyed_async<K, F>(
        &self,
        key: &K,
        future: F,
    ) -> Result<Task<F::Output>, Error>
    where
        K: Hash + ?Sized,
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::Spawn(std::io::ErrorKind::NotFound))?;
        let id = self.inner.common.keys.id(key);
        let (key, shard) = self.keyed_unit_async(id).await?;
        let guard = self.inner.register(shard, ChildKind::Task).with_key(key);
        Ok(self.spawn_guarded(&handle, guard, future))
    }

    /// Spawns `future` on `handle` as the child `guard` stands for.
    #[cfg(feature = "tokio")]
    fn spawn_guarded<F>(
        &self,
        handle: &tokio::runtime::Handle,
        mut guard: ChildGuard,
        future: F,
    ) -> Task<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        guard.task = true;
        let id = guard.id();
        let (registry, slot, free) = (id.shard(), guard.slot as usize, guard.free);
        let handle = handle.spawn(supervised(guard, future));
        self.inner.registry[registry].register_task(slot, free, handle.abort_handle());
        Task { id, handle }
    }

    /// Aborts every task started with [`spawn_task`](Self::spawn_task) or
    /// [`spawn_task_on`](Self::spawn_task_on) that is still running, and
    /// returns how many it aborted.
    ///
    /// Each is aborted as by [`Task::abort`]: its future is dropped at its
    /// next yield point (or at once if it is not running), which releases
    /// its unit (counted as completed), and awaiting its [`Task`] gives a
    /// cancelled `JoinError`. Children that are not tasks (threads from
    /// [`spawn`](Self::spawn), guards from [`reserve`](Self::reserve), even
    /// guards moved into tokio tasks) are not touched. New tasks are still
    /// admitted: call [`close`](Self::close) first to stop them, then
    /// [`wait_idle_async`](Self::wait_idle_async) to see the aborted ones
    /// gone. Every task whose `spawn_task` returned before this call began
    /// is aborted; one spawned while it runs may or may not be, and one
    /// spawned after it returns is not.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// let sup = sidejob::Supervisor::new(8)?;
    /// let guard = sup.reserve()?;
    /// let tasks: Vec<_> = (0..3)
    ///     .map(|_| sup.spawn_task(std::future::pending::<()>()))
    ///     .collect::<Result<_, _>>()?;
    /// sup.close();
    /// assert_eq!(sup.abort_all(), 3);
    /// for task in tasks {
    ///     assert!(task.await.unwrap_err().is_cancelled());
    /// }
    /// assert_eq!(sup.count(), 1, "the reserved guard is not a task");
    /// drop(guard);
    /// sup.wait_idle_async().await;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn abort_all(&self) -> usize {
        let mut aborted = 0;
        for registry in self.inner.registry.iter() {
            registry.for_each_child(|slot, word| {
                if kind_of(word) != ChildKind::Task {
                    return;
                }
                // Taken out, and the lock let go, before aborting: the exit
                // of an aborted task then finds the cell empty.
                let handle = registry.tasks[slot].lock().take();
                if let Some(handle) = handle {
                    handle.abort();
                    aborted += 1;
                }
            });
        }
        aborted
    }

    /// The ids of the live children, each exactly once, in no set order.
    ///
    /// Read slot by slot, one atomic load each, without stopping anyone: a
    /// child that leaves before the call starts is never listed,
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
        for registry in self.inner.registry.iter() {
            registry.for_each_child(|slot, word| ids.push(registry.id(slot, word)));
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
        for registry in self.inner.registry.iter() {
            registry.for_each_child(|slot, word| {
                let kind = kind_of(word);
                children.push(ChildInfo {
                    id: registry.id(slot, word),
                    // Every spawned thread has the same name, so the kind
                    // says it all: no name is stored per child.
                    name: match kind {
                        ChildKind::Thread => Some(self.inner.thread_name.clone()),
                        ChildKind::Task | ChildKind::Reserved => None,
                    },
                    started: self.inner.clock.instant(started_of(word), now),
                    kind,
                });
            });
        }
        children
    }

    /// Refuses every later child with [`Error::Shutdown`]; the children
    /// alive now keep running and leave as usual.
    ///
    /// Like tokio-util's `TaskTracker::close`: close, then
    /// [`wait_idle`](Self::wait_idle) (or
    /// [`wait_idle_async`](Self::wait_idle_async)) waits for the last
    /// child, and no new one can slip in after it. [`spawn`](Self::spawn),
    /// [`reserve`](Self::reserve) and `spawn_task` all refuse; a refusal
    /// after `close` is not an overload and is not counted in
    /// [`Stats::rejected`]. Every handle sees it. Closing twice is harmless;
    /// there is no reopening.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob::{Error, Supervisor};
    ///
    /// let sup = Supervisor::new(4)?;
    /// let (tx, rx) = std::sync::mpsc::channel::<()>();
    /// let child = sup.spawn(move || rx.recv().unwrap())?;
    /// sup.close();
    /// assert!(sup.is_closed());
    /// assert_eq!(sup.reserve().unwrap_err(), Error::Shutdown);
    /// assert!(matches!(sup.spawn(|| ()), Err(Error::Shutdown)));
    /// assert_eq!(sup.count(), 1, "the running child is not stopped");
    ///
    /// tx.send(()).unwrap();
    /// assert!(sup.wait_idle(Duration::from_secs(60)));
    /// child.join().unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(&self) {
        self.inner.common.table.close();
        // After the table: a key waiter woken here that was granted its
        // key finds the capacity closed.
        self.inner.common.keys.close();
    }

    /// True once [`close`](Self::close), called on any handle, has closed
    /// the supervisor: every reservation or spawn made after this answers
    /// true is refused with [`Error::Shutdown`].
    pub fn is_closed(&self) -> bool {
        self.inner.common.table.is_closed()
    }

    /// Children alive now: units of capacity held.
    ///
    /// Read shard by shard while children come and go, so it is off by at
    /// most the children entering or leaving during the call; it counts a
    /// child whose admission is not yet registered, so it can briefly
    /// exceed `which_children().len()`. Each shard's reading is a usage that
    /// shard really had (it is re-read while it changes under the read), so
    /// the count stays within `capacity`.
    pub fn count(&self) -> usize {
        // `Table::usage` reads each shard consistently (see
        // `Shard::usage`), so no reading exceeds its shard's limit.
        self.inner.common.table.usage()
    }

    /// The most children that can be alive at once.
    pub fn capacity(&self) -> usize {
        self.inner.common.table.capacity()
    }

    /// Children that could be admitted now: [`capacity`](Self::capacity)
    /// less [`count`](Self::count), or 0 while children above a shrunk
    /// capacity are still alive. A reading, not a reservation: a task
    /// worker sizes its next claim with it.
    pub fn available(&self) -> usize {
        self.inner.common.table.available()
    }

    /// Changes how many children may be alive at once, while children run;
    /// `0` refuses every new child.
    ///
    /// The same guarantees as [`Limiter::set_capacity`](crate::Limiter::set_capacity):
    /// once this returns, no child is admitted while `capacity` or more are
    /// alive; a shrink never blocks and never stops a child (those above
    /// the new capacity end in their own time, and nothing is admitted
    /// until they have); growing is available at once.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `capacity` if it is above the supervisor's
    /// [`max_capacity`](SupervisorBuilder::max_capacity), for which its
    /// registry was allocated.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// let sup = Supervisor::builder().capacity(2).max_capacity(100).build()?;
    /// let a = sup.reserve()?;
    /// let b = sup.reserve()?;
    /// assert_eq!(sup.reserve().unwrap_err(), Error::Overload);
    /// sup.set_capacity(3)?;
    /// let c = sup.reserve()?;
    /// assert_eq!(sup.available(), 0);
    /// sup.set_capacity(1)?; // three alive: nothing enters until two end
    /// drop((a, b));
    /// assert_eq!(sup.reserve().unwrap_err(), Error::Overload);
    /// drop(c);
    /// assert!(sup.reserve().is_ok());
    /// assert_eq!(sup.set_capacity(101).unwrap_err().field(), "capacity");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        self.inner.common.table.set_capacity(capacity)
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
        self.inner.common.stats()
    }

    /// Reads the stats while the supervisor or any of its children lives,
    /// without keeping it alive: for a [`Reporter`](crate::Reporter).
    pub(crate) fn weak_stats(&self) -> impl Fn() -> Option<Stats> + Send + 'static {
        let common = Arc::downgrade(&self.inner.common);
        move || common.upgrade().map(|common| common.stats())
    }

    /// Blocks until no child is left, or `timeout` has passed; `true` if
    /// none was left.
    ///
    /// Sleeps on a condition variable: the child whose exit empties a
    /// shard wakes the waiters (if there are any: a drop with nobody waiting
    /// pays only a plain load), who re-check every shard. With
    /// `Duration::ZERO` this is a plain check. Children may be admitted
    /// again right after it returns `true`; call [`close`](Self::close)
    /// first to wait for the last one. In async code, use
    /// [`wait_idle_async`](Self::wait_idle_async): this call blocks the
    /// thread.
    ///
    /// A child that calls `wait_idle` on its own supervisor waits for
    /// itself: it counts as alive until it ends, so the call returns `false`
    /// when `timeout` runs out (and never returns without one), whatever the
    /// other children do.
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
        let common = &*self.inner.common;
        if common.is_idle() {
            return true;
        }
        if timeout.is_zero() {
            return false;
        }
        let deadline = now().checked_add(timeout);
        // Relaxed: published to leavers by the AcqRel RMW on each shard's
        // `given` that the scan in `is_idle` makes after it (module docs),
        // not by this RMW.
        common.waiters.fetch_add(1, Relaxed);
        let result = loop {
            // Step 1 of the module docs: the epoch before the scan.
            let seen = common.idle.lock().epoch;
            // Step 2: the scan, with the lock released.
            if common.is_idle() {
                break true;
            }
            // Step 3: sleep while no leaver has bumped the epoch since `seen`.
            let mut idle = common.idle.lock();
            let mut expired = false;
            while idle.epoch == seen && !expired {
                // A timeout too large to represent: wait in long steps.
                let step = deadline.unwrap_or_else(|| now() + Duration::from_secs(3600));
                let timed_out;
                (idle, timed_out) = common.idle_cv.wait_until(idle, step);
                expired = timed_out && deadline.is_some_and(|d| now() >= d);
            }
            drop(idle);
            if expired {
                break common.is_idle();
            }
        };
        // Relaxed: a leaver that still reads the old count only wakes
        // nobody, or wakes a waiter that re-checks.
        common.waiters.fetch_sub(1, Relaxed);
        result
    }
    /// Resolves when no child is left: the async form of
    /// [`wait_idle`](Self::wait_idle), for any executor.
    ///
    /// The future registers its task's waker with the supervisor; the child
    /// whose exit empties a shard wakes it, as it wakes `wait_idle`, and it
    /// re-checks every shard. It does not need the `tokio` feature: any
    /// executor that polls it works. For a deadline, wrap it in your
    /// runtime's timeout (`tokio::time::timeout`). Children may be admitted
    /// again right after it resolves; call [`close`](Self::close) first to
    /// wait for the last one.
    ///
    /// A child that awaits this on its own supervisor waits for itself: it
    /// counts as alive until it ends, so the future never resolves (until
    /// the timeout around it, if any).
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future before it resolves removes its
    /// waker from the supervisor and leaves nothing behind.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Supervisor;
    ///
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// let sup = Supervisor::new(4)?;
    /// let guard = sup.reserve()?;
    /// let job = std::thread::spawn(move || drop(guard));
    /// sup.wait_idle_async().await;
    /// assert_eq!(sup.count(), 0);
    /// # job.join().unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_idle_async(&self) -> impl Future<Output = ()> + Send + '_ {
        WaitIdle {
            common: &self.inner.common,
            counted: false,
            registered: None,
        }
    }
}

/// What every registry shard (and so every child) shares.
struct Common {
    table: Table,
    /// The busy keys of keyed children (`reserve_keyed` and friends). Here,
    /// where every guard reaches it through its registry shard, so a keyed
    /// guard holds no reference count of its own.
    keys: KeySet,
    /// How many `wait_idle` calls are waiting. Read (Relaxed) by every leave
    /// after its release; on a line of its own, written only by waiters, so
    /// the read is a hit in a shared line.
    waiters: CachePadded<AtomicUsize>,
    /// The idle epoch (module docs). Held only for a few instructions: the
    /// scan of the shards never runs under it.
    idle: Mutex<Idle>,
    /// `wait_idle` sleeps here until the epoch moves.
    idle_cv: Condvar,
}

/// What the idle lock guards.
#[derive(Debug, Default)]
struct Idle {
    /// Bumped by every leaver that empties its shard while someone waits.
    /// Wraps; a waiter only compares it for equality with the value it read
    /// before its scan, and 2^64 wake-ups do not fit in one scan.
    epoch: u64,
    /// The wakers of pending [`WaitIdle`] futures, each with the future's
    /// key. A bump of the epoch takes them all, so while the epoch is the
    /// one a future registered under, its waker is still here.
    wakers: Vec<(u64, Waker)>,
    /// The key of the next registration.
    next_key: u64,
}

impl Common {
    /// The table's figures with the key set's: its waiters, and its waits
    /// that ran out in `timed_out`.
    fn stats(&self) -> Stats {
        let mut stats = self.table.stats();
        stats.timed_out += self.keys.timed_out();
        stats.waiting_for_keys = self.keys.waiting();
        stats.peak_waiting_for_keys = self.keys.peak_waiting();
        stats
    }

    /// No unit held on any shard, read through the RMW that pairs with the
    /// leavers' releases (module docs). No unit means no occupied slot: a
    /// slot is freed before its unit is given back, and the RMW synchronizes
    /// with that give. Called without the idle lock.
    fn is_idle(&self) -> bool {
        #[cfg(all(test, not(loom)))]
        tests::on_scan(self);
        let table = &self.table;
        (0..table.shard_count()).all(|i| table.shard(i).usage_synced() == 0)
    }

    #[cold]
    fn wake_idle(&self) {
        // The bump is made under the lock: a waiter checks the epoch under
        // the same lock and sleeps without letting go of it in between, so
        // it either sees the bump or is already asleep when the notify
        // below runs.
        let mut idle = self.idle.lock();
        idle.epoch = idle.epoch.wrapping_add(1);
        let wakers = std::mem::take(&mut idle.wakers);
        drop(idle);
        // After unlocking, so the woken waiters do not wake into a held
        // lock, and no waker runs code of its executor under it.
        self.idle_cv.notify_all();
        // Every one woken even if one panics (`engine/foreign.rs`).
        crate::engine::foreign::each_then_resume(wakers, |(_, waker)| waker.wake());
    }
}

/// The future of [`Supervisor::wait_idle_async`]: the steps of the module
/// docs, with "register the waker" in place of "sleep".
struct WaitIdle<'a> {
    common: &'a Common,
    /// Counted in `Common::waiters`: from the first poll that found a child
    /// until the future resolves or is dropped.
    counted: bool,
    /// `(key, epoch)` while this future's waker is in `Idle::wakers`,
    /// registered under `epoch`.
    registered: Option<(u64, u64)>,
}

impl Future for WaitIdle<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let common = this.common;
        if let Some((key, seen)) = this.registered {
            let idle = common.idle.lock();
            if idle.epoch == seen {
                // No leaver has woken anyone since we registered: the wake
                // we wait for is still to come (module docs), and our
                // waker is still listed. Keep it current: compared under
                // the lock, cloned and dropped outside it (a waker is code
                // we do not own).
                match idle.wakers.iter().find(|(k, _)| *k == key) {
                    Some((_, waker)) if waker.will_wake(cx.waker()) => return Poll::Pending,
                    Some(_) => {
                        drop(idle);
                        let mut fresh = cx.waker().clone();
                        let mut idle = common.idle.lock();
                        if idle.epoch == seen {
                            if let Some((_, waker)) =
                                idle.wakers.iter_mut().find(|(k, _)| *k == key)
                            {
                                std::mem::swap(waker, &mut fresh);
                                drop(idle);
                                // The old waker, after the lock.
                                drop(fresh);
                                return Poll::Pending;
                            }
                        }
                        // Woken while the waker was cloned: scan again.
                        drop(idle);
                        drop(fresh);
                    }
                    None => {
                        // Not listed (cannot happen: only a bump or our own
                        // drop removes it): scan again rather than wait for
                        // nothing.
                        debug_assert!(false, "a registered waker went missing");
                    }
                }
            }
            // The epoch moved, and the bump took our waker: scan again.
            this.registered = None;
        }
        if !this.counted {
            if common.is_idle() {
                return Poll::Ready(());
            }
            // Relaxed: as in `wait_idle`, published to leavers by the RMWs
            // of the scan below.
            common.waiters.fetch_add(1, Relaxed);
            this.counted = true;
        }
        loop {
            // Step 1.
            let seen = common.idle.lock().epoch;
            // Step 2, without the lock.
            if common.is_idle() {
                this.finish();
                return Poll::Ready(());
            }
            // Step 3: register, unless a leaver bumped the epoch meanwhile.
            // The waker is cloned before the lock (and dropped after it if
            // unused): code we do not own.
            let waker = cx.waker().clone();
            let mut idle = common.idle.lock();
            if idle.epoch == seen {
                let key = idle.next_key;
                idle.next_key = key.wrapping_add(1);
                idle.wakers.push((key, waker));
                this.registered = Some((key, seen));
                return Poll::Pending;
            }
            drop(idle);
            drop(waker);
        }
    }
}

impl WaitIdle<'_> {
    /// Takes this future's waker out of the list (if a bump has not already
    /// taken it) and its count out of `waiters`.
    fn finish(&mut self) {
        if let Some((key, seen)) = self.registered.take() {
            let mut idle = self.common.idle.lock();
            let mut waker = None;
            if idle.epoch == seen {
                if let Some(at) = idle.wakers.iter().position(|(k, _)| *k == key) {
                    waker = Some(idle.wakers.swap_remove(at));
                }
            }
            drop(idle);
            // After the lock: a waker's drop is code we do not own (it may
            // end a child of this very supervisor).
            drop(waker);
        }
        if self.counted {
            self.counted = false;
            // Relaxed: as in `wait_idle`.
            self.common.waiters.fetch_sub(1, Relaxed);
        }
    }
}

impl Drop for WaitIdle<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The largest supervisor capacity: the registry allocates one 8-byte slot
/// per unit up front (128 MiB at this size), and ids need
/// `2^21 generations × limit` to fit in 64 bits.
pub(crate) const MAX_CHILDREN: usize = 1 << 24;

/// Slots per [`Line`]: 16 words of 8 bytes fill the 128 bytes `CachePadded`
/// aligns to on x86-64.
const PER_LINE: usize = 16;

/// A run of slots on a padded line of its own. Different shards never
/// share a line (each shard's slots are whole lines), so threads working on
/// different shards do not false-share; slots of one shard are packed,
/// since threads sharing a shard already share its table counters.
type Line = CachePadded<[AtomicU64; PER_LINE]>;

/// Bit 0 of a slot word: a child holds the slot.
const OCCUPIED: u64 = 1;
const KIND_SHIFT: u32 = 1;
const GEN_SHIFT: u32 = 3;
const GEN_BITS: u32 = 21;
const GEN_MASK: u64 = (1 << GEN_BITS) - 1;
const START_SHIFT: u32 = GEN_SHIFT + GEN_BITS;
/// The start time is kept in units of 2^20 ns (≈1.05 ms).
const START_UNIT_SHIFT: u32 = 20;
const START_MAX: u64 = (1 << (64 - START_SHIFT)) - 1;

/// The bits an occupant adds to a free word (see the module docs' table).
#[inline]
fn occupant(started_ticks: u64, kind: ChildKind) -> u64 {
    let kind = match kind {
        ChildKind::Thread => 1,
        ChildKind::Task => 2,
        ChildKind::Reserved => 3,
    };
    let started = (started_ticks >> START_UNIT_SHIFT).min(START_MAX);
    started << START_SHIFT | kind << KIND_SHIFT | OCCUPIED
}

fn kind_of(word: u64) -> ChildKind {
    match word >> KIND_SHIFT & 0b11 {
        1 => ChildKind::Thread,
        2 => ChildKind::Task,
        _ => ChildKind::Reserved,
    }
}

/// The occupant's start, as `CoarseClock` ticks.
fn started_of(word: u64) -> u64 {
    (word >> START_SHIFT) << START_UNIT_SHIFT
}

fn generation_of(word: u64) -> u64 {
    word >> GEN_SHIFT & GEN_MASK
}

/// The free word that follows an occupancy of generation `generation`.
#[inline]
fn next_free(generation: u64) -> u64 {
    ((generation + 1) & GEN_MASK) << GEN_SHIFT
}

/// One shard of the registry: `limit` slots (see the module docs), with its
/// own reference count.
///
/// A guard holds an `Arc` of its registry shard, not of the whole
/// supervisor: cloning one shared `Arc` per child would make its count a
/// hot line that every core writes (measured: 2 threads reserving took
/// 3.5× the `Limiter`'s time, against 2.5× for one thread). With a count per
/// shard, callers on different shards write different lines. Aligned to 128
/// bytes so the count (the `Arc` header) and the hint each share a line only
/// with this shard's data, not with a neighbouring allocation.
#[repr(align(128))]
struct RegistryShard {
    /// Where the next claim looks first: the slot freed last, or the one
    /// after the slot claimed last. Always below `limit`.
    hint: AtomicUsize,
    lines: Box<[Line]>,
    /// The table shard's limit: how many slots there are.
    limit: usize,
    /// Slot `i`'s task, while a task from `spawn_task` holds the slot: what
    /// `abort_all` aborts. A lock per slot, only ever contended by
    /// `abort_all`; see `register_task` for why not one shared signal.
    #[cfg(feature = "tokio")]
    tasks: Box<[Mutex<Option<tokio::task::AbortHandle>>]>,
    index: usize,
    common: Arc<Common>,
}

impl RegistryShard {
    fn new(index: usize, common: Arc<Common>) -> RegistryShard {
        // One slot per unit the shard can ever hold: its cap, the even
        // share of the supervisor's `max_capacity`, which resizes respect.
        let limit = common.table.cap(index);
        let lines = (0..limit.div_ceil(PER_LINE))
            .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
            .collect();
        RegistryShard {
            hint: AtomicUsize::new(0),
            lines,
            limit,
            index,
            common,
            #[cfg(feature = "tokio")]
            tasks: (0..limit).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Records the abort handle of the task `spawn_task_on` just started in
    /// slot `slot` (claimed with the free word `free`), unless the task has
    /// already ended.
    ///
    /// Why a cell per slot: `abort_all` must reach tasks that are pending
    /// forever, so it needs either their wakers or their abort handles. A
    /// shared cancellation signal polled by the `supervised` wrapper would
    /// still need every task to register its waker somewhere `abort_all`
    /// can find (tokio's `Notify` is one lock for all tasks), and would end
    /// them with `Ok`, not with the cancelled `JoinError` of
    /// [`Task::abort`]. The slot the task already holds gives it a cell of
    /// its own: no allocation, and a lock nobody else takes except
    /// `abort_all`. It costs the spawn one uncontended lock and the task's
    /// exit another (`leave_task`); threads and reserved guards pay
    /// nothing.
    #[cfg(feature = "tokio")]
    fn register_task(&self, slot: usize, free: u64, handle: tokio::task::AbortHandle) {
        let mut cell = self.tasks[slot].lock();
        // Relaxed: `leave_task` frees the slot under this same lock, so the
        // lock orders its store before this load if that exit came first.
        let word = self.slot(slot).load(Relaxed);
        // Still this occupancy (the generation moves at every exit): else
        // the task has ended and its handle would only be kept alive here.
        if word & OCCUPIED != 0 && generation_of(word) == generation_of(free) {
            *cell = Some(handle);
        }
    }

    /// [`leave`](Self::leave) for a task's guard: empties the slot's task
    /// cell and frees the slot under its lock, so `register_task` either
    /// ran first (its handle is taken here) or sees the slot freed.
    #[cfg(feature = "tokio")]
    fn leave_task(&self, slot: usize, free: u64, panicked: bool) {
        let mut cell = self.tasks[slot].lock();
        let handle = cell.take();
        self.leave(slot, free, panicked);
        drop(cell);
        // Outside the lock: the last reference to a task frees it.
        drop(handle);
    }

    #[inline]
    fn slot(&self, i: usize) -> &AtomicU64 {
        &self.lines[i / PER_LINE][i % PER_LINE]
    }

    /// The id of the child whose occupied word `word` is in slot `slot`.
    fn id(&self, slot: usize, word: u64) -> ChildId {
        // Distinct for distinct (slot, generation) pairs: slot < limit, and
        // generation × limit stays below 2^64 (limit ≤ MAX_CHILDREN).
        let seq = generation_of(word) * self.limit as u64 + slot as u64 + 1;
        ChildId::new(self.index, seq)
    }

    /// Claims a free slot for an occupant whose unit on this shard is taken
    /// (so a free slot exists: module docs). Returns the slot and the free
    /// word it replaced.
    #[inline(always)]
    fn claim(&self, occupant: u64) -> (usize, u64) {
        // Relaxed: a hint; any start finds a free slot, and the CAS decides.
        let i = self.hint.load(Relaxed);
        match self.try_claim(i, occupant) {
            Some(free) => (i, free),
            None => self.claim_slow(i, occupant),
        }
    }

    /// One attempt on slot `i`: the free word it replaced, if it was free.
    #[inline(always)]
    fn try_claim(&self, i: usize, occupant: u64) -> Option<u64> {
        let slot = self.slot(i);
        // Relaxed: only a guess at the free word; the CAS re-checks it.
        let word = slot.load(Relaxed);
        if word & OCCUPIED != 0 {
            return None;
        }
        // Relaxed: mutual exclusion needs only that the one word's
        // modification order admits a single CAS from this free value. The
        // occupant publishes nothing beyond this word, which listers read
        // whole; and the previous occupant's exit is ordered before this
        // claim by the table (its release is read by our admission's
        // Acquire). A lister that reads this word still synchronizes with
        // the previous occupant's Release free: an RMW continues the release
        // sequence of the store it replaces.
        slot.compare_exchange(word, word | occupant, Relaxed, Relaxed)
            .ok()?;
        let next = if i + 1 == self.limit { 0 } else { i + 1 };
        // Relaxed: a hint.
        self.hint.store(next, Relaxed);
        Some(word)
    }

    /// The walk: every slot from `start`, round and round, until a claim
    /// succeeds. It ends: a free slot exists at every instant while the
    /// caller holds a unit but no slot, and a slot seen occupied or lost to
    /// a CAS was taken by a caller that made progress.
    #[cold]
    fn claim_slow(&self, start: usize, occupant: u64) -> (usize, u64) {
        let mut i = start;
        loop {
            for _ in 0..self.limit {
                i = if i + 1 == self.limit { 0 } else { i + 1 };
                if let Some(free) = self.try_claim(i, occupant) {
                    return (i, free);
                }
            }
            // Every slot was seen taken: their holders are leaving or other
            // claimers are in their window. Let them run (under loom, this
            // is the yield a wait loop must make).
            yield_now();
        }
    }

    /// Calls `f(slot, word)` for every occupied slot, one load each.
    fn for_each_child(&self, mut f: impl FnMut(usize, u64)) {
        for i in 0..self.limit {
            // Acquire: pairs with the Release free store in `leave`: a lister
            // that reads a free word (or a later claim, which continues that
            // store's release sequence) sees everything the departed child
            // did. Coherence alone makes a free that happened-before this
            // listing visible here, so a released child is never listed.
            let word = self.slot(i).load(Acquire);
            if word & OCCUPIED != 0 {
                f(i, word);
            }
        }
    }

    /// Frees slot `slot` (claimed with the free word `free`), gives the
    /// unit back, and wakes `wait_idle` if the shard became empty while
    /// someone waits (module docs).
    #[inline(always)]
    fn leave(&self, slot: usize, free: u64, panicked: bool) {
        // Release: pairs with the Acquire load in `for_each_child`. Also
        // sequenced before the table release below, whose Release RMW on
        // `given` the next admission on this shard reads with Acquire: so a
        // claimer admitted on our unit finds this slot free.
        self.slot(slot)
            .store(next_free(generation_of(free)), Release);
        // Relaxed: a hint.
        self.hint.store(slot, Relaxed);
        let common = &*self.common;
        common.table.release(self.index, panicked);
        // Relaxed: ordered after a waiter's bump by the RMWs on `given`
        // (the AcqRel RMW in `release` against the waiter's
        // `usage_synced`), not by this load: see the module docs.
        if common.waiters.load(Relaxed) != 0 {
            self.wake_if_empty();
        }
    }

    #[cold]
    fn wake_if_empty(&self) {
        // After our own release: every give up to ours is counted, and the
        // takes they paired with happened-before them, so an empty shard
        // reads 0. A concurrent take makes it non-zero; that child's own
        // leave will do the waking.
        if self.common.table.shard(self.index).usage() == 0 {
            self.common.wake_idle();
        }
    }
}

impl Inner {
    /// Admits and registers one child.
    // `inline(always)` here and on `claim`, `try_claim` and `leave`: with
    // plain `#[inline]` LLVM kept `enter` out of line in the bench binary
    // (though not in a small example), and reserve + drop cost ~40 ns
    // there against ~29 ns inlined (benches/results/supervisor.txt). The
    // callers are `reserve`, `reserve_at`, `spawn` and `spawn_task_on`.
    #[inline(always)]
    fn enter(&self, admit: Admit, kind: ChildKind) -> Result<ChildGuard, Error> {
        let table = &self.common.table;
        let shard = match admit {
            Admit::Wait => table.acquire_waiting(None)?,
            Admit::Try => table.acquire()?,
            Admit::At(start) => table.acquire_at(start)?,
        };
        Ok(self.register(shard, kind))
    }

    /// Registers a child on `shard`, whose unit the caller holds. Inlined
    /// always, as `enter` is (see there).
    #[inline(always)]
    fn register(&self, shard: usize, kind: ChildKind) -> ChildGuard {
        let occupant = occupant(self.clock.ticks(), kind);
        let registry = &self.registry[shard];
        let (slot, free) = registry.claim(occupant);
        ChildGuard {
            shard: Arc::clone(registry),
            free,
            slot: slot as u32,
            panicked: false,
            #[cfg(feature = "tokio")]
            task: false,
            keyed: false,
            key: 0,
        }
    }
}

/// How a child is admitted.
#[derive(Debug, Clone, Copy)]
enum Admit {
    /// From the caller's home shard, waiting under the supervisor's
    /// waiting policy (if any).
    Wait,
    /// From the caller's home shard, never waiting.
    Try,
    /// From this shard, never waiting (the model tests' seam).
    At(usize),
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("name", &self.inner.name)
            .field("capacity", &self.capacity())
            .field("shards", &self.shards())
            .field("count", &self.count())
            .field("closed", &self.is_closed())
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
    max_capacity: Option<usize>,
    probe: Probe,
    stack_size: Option<usize>,
    policy: Policy,
    per_key: Option<usize>,
}

impl SupervisorBuilder {
    /// The supervisor's name; spawned threads are named `{name}-child`.
    /// Defaults to `sidejob`. Must not contain a NUL byte.
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// How many children may be alive at once. Required; at least 1 and
    /// at most 2^24. The registry allocates an 8-byte slot per unit when
    /// the supervisor is built (80 KB for 10,000 children), so admission
    /// never allocates; with the `tokio` feature, also a 16-byte cell per
    /// unit for the abort handle of a task (see `Supervisor::abort_all`).
    ///
    /// The capacity also counts tasks and reserved children, so it is not
    /// limited to what the OS can run as threads; but children started by
    /// [`Supervisor::spawn`] are OS threads, and past some thousands of
    /// those std may abort the process instead of returning
    /// [`Error::Spawn`] (see [`MAX_WORKERS`](crate::MAX_WORKERS) for why).
    /// For thread children, keep the capacity in the low thousands.
    pub fn capacity(&mut self, capacity: usize) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// How many shards to split the capacity and the registry over.
    /// Defaults to the number of CPUs. Every shard is kept even with less
    /// capacity than shards (the extra shards' share is 0 until the
    /// capacity grows).
    pub fn shards(&mut self, shards: usize) -> &mut Self {
        self.shards = Some(shards);
        self
    }

    /// Where a caller starts probing; see [`Probe`].
    pub fn probe(&mut self, probe: Probe) -> &mut Self {
        self.probe = probe;
        self
    }

    /// How many callers of [`Supervisor::spawn`], [`reserve`](Supervisor::reserve),
    /// [`reserve_async`](Supervisor::reserve_async) and
    /// `spawn_task_async` (feature `tokio`) may wait for capacity when
    /// `capacity` children are alive; past that they get `Overload` at
    /// once. Defaults to 0: no waiting, fail fast.
    /// [`try_reserve`](Supervisor::try_reserve) and `spawn_task` never
    /// wait.
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

    /// How many children of one key may be alive at once, for the keyed
    /// forms ([`Supervisor::reserve_keyed`] and friends). Defaults to 1:
    /// a key's children run one after another. At least 1; children
    /// admitted without a key are not counted against any key.
    pub fn per_key(&mut self, children: usize) -> &mut Self {
        self.per_key = Some(children);
        self
    }

    /// The largest capacity [`Supervisor::set_capacity`] may set later.
    /// Defaults to `capacity`; at most 2^24. The registry's slots are
    /// allocated for it up front (8 bytes each), so a resize never
    /// allocates and admission never does.
    pub fn max_capacity(&mut self, max: usize) -> &mut Self {
        self.max_capacity = Some(max);
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
    /// [`ConfigError`] naming the field when `capacity` is unset, 0 or
    /// above 2^24 (the registry allocates a slot per unit up front),
    /// `shards` is 0 or too large, `per_key` is 0 or above 2^32 - 1, or
    /// `name` contains a NUL byte (thread names cannot).
    ///
    /// ```
    /// use sidejob::Supervisor;
    ///
    /// let err = Supervisor::builder().capacity(8).per_key(0).build().unwrap_err();
    /// assert_eq!(err.field(), "per_key");
    /// ```
    pub fn build(&self) -> Result<Supervisor, ConfigError> {
        let name = ConfigError::check_name(self.name.as_deref())?.to_owned();
        let capacity = self.capacity.ok_or(ConfigError::missing("capacity"))?;
        if capacity > MAX_CHILDREN {
            return Err(ConfigError::too_large("capacity", MAX_CHILDREN));
        }
        let max = self.max_capacity.unwrap_or(capacity);
        if max > MAX_CHILDREN {
            return Err(ConfigError::too_large("max_capacity", MAX_CHILDREN));
        }
        let per_key = match self.per_key.unwrap_or(1) {
            0 => return Err(ConfigError::zero("per_key")),
            n => u32::try_from(n)
                .map_err(|_| ConfigError::too_large("per_key", u32::MAX as usize))?,
        };
        let shards = self.shards.unwrap_or_else(num_cpus::get);
        let table =
            Table::with_max(capacity, max, shards, self.probe)?.with_policy(&self.policy)?;
        let keys = KeySet::new(
            table.shard_count(),
            max,
            per_key,
            self.policy.max_waiters,
            self.policy.max_wait,
        );
        let common = Arc::new(Common {
            keys,
            table,
            waiters: CachePadded::new(AtomicUsize::new(0)),
            idle: Mutex::new(Idle::default()),
            idle_cv: Condvar::new(),
        });
        let registry = (0..common.table.shard_count())
            .map(|index| Arc::new(RegistryShard::new(index, Arc::clone(&common))))
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
/// Unique among the supervisor's live children: the registry shard the
/// child was admitted on and a number that stands for its slot in that
/// shard and the slot's generation. A slot taken again gets a new id, so a
/// listing never shows a departed child under its old id; ids only come
/// back after one slot has been reused 2^21 times. Displayed like an Erlang
/// pid, `<shard.seq>`. Ids of different supervisors may be equal.
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
    /// would cost more than the rest of admission together), kept to about
    /// a millisecond.
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
/// Made by [`Supervisor::reserve`] (and [`reserve_keyed`](Supervisor::reserve_keyed),
/// whose guard also holds one slot of its key, given back right after the
/// unit). It is `Send + 'static`: move it into the
/// child. Dropped while its thread panics, the exit is counted in
/// [`Stats::panicked`].
#[must_use = "the child exits as soon as its guard is dropped"]
#[clippy::has_significant_drop]
pub struct ChildGuard {
    shard: Arc<RegistryShard>,
    /// The free word the claim replaced (it carries the generation).
    free: u64,
    /// The child's slot in its registry shard (below the shard's limit,
    /// which `MAX_CHILDREN` keeps within 32 bits).
    slot: u32,
    /// Set when the child is known to have panicked though the guard is not
    /// dropped by unwinding (a spawned thread or task catches the panic).
    panicked: bool,
    /// Set for the guard of a `spawn_task` task, whose exit also empties the
    /// slot's task cell. A byte of the guard itself: the drop of other
    /// guards reads nothing more.
    #[cfg(feature = "tokio")]
    task: bool,
    /// Set for a keyed child: its exit also releases one slot of the key
    /// whose id is `key`, after the unit.
    keyed: bool,
    key: u64,
}

impl ChildGuard {
    /// The child's id, as [`Supervisor::which_children`] lists it.
    pub fn id(&self) -> ChildId {
        // Computed, not stored: a smaller guard is a cheaper reserve + drop.
        self.shard.id(self.slot as usize, self.free)
    }

    /// This guard, now also holding the key's slot `key` (released on
    /// exit, after the unit).
    #[inline]
    fn with_key(mut self, key: KeySlot<'_>) -> ChildGuard {
        self.key = key.keep();
        self.keyed = true;
        self
    }
}

impl Drop for ChildGuard {
    #[inline]
    fn drop(&mut self) {
        let panicked = self.panicked || os_thread::panicking();
        #[cfg(feature = "tokio")]
        if self.task {
            self.shard
                .leave_task(self.slot as usize, self.free, panicked);
        } else {
            self.shard.leave(self.slot as usize, self.free, panicked);
        }
        #[cfg(not(feature = "tokio"))]
        self.shard.leave(self.slot as usize, self.free, panicked);
        // The unit went back first: a key never counts fewer live children
        // than it has. Our `Arc` of the registry shard keeps the key set
        // alive until here.
        if self.keyed {
            self.shard.common.keys.release(self.key);
        }
    }
}

impl fmt::Debug for ChildGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildGuard")
            .field("id", &self.id())
            .finish()
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn slot_words_round_trip() {
        for kind in [ChildKind::Thread, ChildKind::Task, ChildKind::Reserved] {
            for generation in [0, 1, GEN_MASK] {
                let free = generation << GEN_SHIFT;
                assert_eq!(free & OCCUPIED, 0);
                let ticks = 123_456_789_012;
                let word = free | occupant(ticks, kind);
                assert_ne!(word & OCCUPIED, 0);
                assert_eq!(kind_of(word), kind);
                assert_eq!(generation_of(word), generation);
                let started = started_of(word);
                assert!(started <= ticks && ticks - started < 1 << START_UNIT_SHIFT);
                assert_eq!(
                    next_free(generation),
                    ((generation + 1) & GEN_MASK) << GEN_SHIFT
                );
            }
        }
        // A start time past the field's range saturates instead of wrapping
        // into the generation.
        let word = occupant(u64::MAX, ChildKind::Reserved);
        assert_eq!(generation_of(word), 0);
        assert_eq!(started_of(word), START_MAX << START_UNIT_SHIFT);
    }

    #[test]
    fn slots_are_reused_with_a_new_id_and_the_hint_finds_them() {
        let sup = Supervisor::builder().capacity(3).shards(1).build().unwrap();
        let registry = &sup.inner.registry[0];
        let a = sup.reserve().unwrap();
        let b = sup.reserve().unwrap();
        assert_eq!((a.slot, b.slot), (0, 1));
        assert_eq!((a.id().seq, b.id().seq), (1, 2));
        let (a_id, a_slot) = (a.id(), a.slot as usize);
        drop(a);
        // The freed slot is where the next claim looks first.
        assert_eq!(registry.hint.load(Relaxed), a_slot);
        let c = sup.reserve().unwrap();
        assert_eq!(c.slot as usize, a_slot);
        assert_ne!(c.id(), a_id);
        assert_eq!(c.id().seq, 1 + 3, "generation 1 of slot 0, limit 3");
        // Hint on an occupied slot: the walk finds the last free one.
        registry.hint.store(0, Relaxed);
        let d = sup.reserve().unwrap();
        assert_eq!(d.slot, 2);
        assert_eq!(sup.reserve().unwrap_err(), Error::Overload);
        drop((b, c, d));
        assert!(sup.which_children().is_empty());
    }

    #[test]
    fn registry_shards_own_whole_lines() {
        let sup = Supervisor::builder()
            .capacity(40)
            .shards(2)
            .build()
            .unwrap();
        for registry in sup.inner.registry.iter() {
            assert_eq!(registry.limit, 20);
            assert_eq!(registry.lines.len(), 2);
        }
    }

    std::thread_local! {
        /// Scans seen on this thread while `CHECK_SCANS` is set.
        static SCANS: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
    }

    /// Called by every `Common::is_idle`: on a thread that asked for it,
    /// counts the scan and asserts that the idle lock is free (a scan under
    /// it would make every leaver that must wake someone wait for it).
    pub(super) fn on_scan(common: &Common) {
        if let Some(scans) = SCANS.with(|cell| cell.get()) {
            assert!(
                common.idle.try_lock().is_some(),
                "wait_idle scanned the shards under the idle lock"
            );
            SCANS.with(|cell| cell.set(Some(scans + 1)));
        }
    }

    /// Issue 7, item 1: a leaver that empties a shard must never wait behind
    /// a `wait_idle` scanning every shard, so the scan runs without the idle
    /// lock. Before the fix, the scans after the first ran under it.
    #[test]
    fn wait_idle_scans_without_the_idle_lock() {
        let sup = Supervisor::builder().capacity(4).shards(4).build().unwrap();
        let guard = sup.reserve().unwrap();
        SCANS.with(|cell| cell.set(Some(0)));
        // The child stays: every path through the wait scans and times out.
        assert!(!sup.wait_idle(Duration::from_millis(1)));
        let scans = SCANS.with(|cell| cell.replace(None)).unwrap();
        assert!(scans >= 2, "the wait scanned {scans} times");
        drop(guard);
        assert_eq!(sup.inner.common.waiters.load(Relaxed), 0);
    }

    /// A waker that counts its wakes.
    struct CountingWaker(AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Relaxed);
        }
    }

    /// Issue 7, item 3: a `wait_idle_async` future dropped while pending
    /// leaves no waker and no waiter count behind.
    #[test]
    fn a_dropped_wait_idle_async_leaves_nothing_registered() {
        let sup = Supervisor::builder().capacity(2).shards(2).build().unwrap();
        let common = &sup.inner.common;
        let guard = sup.reserve().unwrap();
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        let mut first = Box::pin(sup.wait_idle_async());
        let mut second = Box::pin(sup.wait_idle_async());
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        // A second poll while nothing changed keeps one registration.
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert_eq!(common.idle.lock().wakers.len(), 2);
        assert_eq!(common.waiters.load(Relaxed), 2);
        drop(first);
        assert_eq!(common.idle.lock().wakers.len(), 1);
        assert_eq!(common.waiters.load(Relaxed), 1);
        // The last leave wakes the one still registered, once.
        drop(guard);
        assert_eq!(counter.0.load(Relaxed), 1);
        assert!(common.idle.lock().wakers.is_empty());
        assert!(second.as_mut().poll(&mut cx).is_ready());
        assert_eq!(common.waiters.load(Relaxed), 0);
        // A future that finds the supervisor idle registers nothing.
        assert!(Box::pin(sup.wait_idle_async())
            .as_mut()
            .poll(&mut cx)
            .is_ready());
        assert_eq!(common.waiters.load(Relaxed), 0);
        assert!(common.idle.lock().wakers.is_empty());
    }

    #[test]
    fn capacity_above_the_registry_limit_is_refused() {
        let err = Supervisor::new(MAX_CHILDREN + 1).unwrap_err();
        assert_eq!(err.field(), "capacity");
    }
}
