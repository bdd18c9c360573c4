//! [`Supervisor`]: a bound on how many children (threads, tasks, anything
//! holding a [`ChildGuard`]) are alive at once, and a registry that says
//! which.
//!
//! One idea a file: `spawn.rs` (threads and tasks), `reserve.rs` (a
//! child the caller starts itself), `keyed.rs` (at most `per_key`
//! children of a key; the key set that counts them is the engine's,
//! `engine/keys/children/`),
//! `registry.rs` (the slots of live children, and admission), `idle.rs`
//! (`wait_idle`), `child.rs` (ids, kinds, guards), `builder.rs`.
//!
//! One child is one unit of the shard table (`engine/table/`). Around it sits the
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
//!   [`wait_idle`](crate::Supervisor::wait_idle) and the shard is now empty, lock,
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
//!    condition variable ([`wait_idle`](crate::Supervisor::wait_idle)) or
//!    registers its task's waker and returns `Pending`
//!    ([`wait_idle_async`](crate::Supervisor::wait_idle_async)); otherwise goes
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

use crate::engine::keys::children::KeySet;
use crate::engine::table::Table;
use crate::error::ConfigError;
use crate::stats::Stats;
use crate::sync::{now, Arc, AtomicUsize, CoarseClock, Condvar, Mutex};
use crossbeam_utils::CachePadded;
use std::fmt;

mod builder;
mod child;
mod idle;
mod keyed;
mod registry;
mod reserve;
mod spawn;
#[cfg(all(test, not(loom)))]
mod tests;

use crate::engine::ask::How;
pub use builder::SupervisorBuilder;
pub use child::{Child, ChildGuard, ChildId, ChildInfo, ChildKind};
use idle::Idle;
use registry::{kind_of, started_of, RegistryShard, MAX_CHILDREN};
#[cfg(feature = "tokio")]
pub use spawn::Task;

/// A fail-fast bound on live children, with a registry of which are alive:
/// Erlang's `sidejob_supervisor`, for threads and tasks.
///
/// At most `capacity` children are alive at once. [`spawn`](Self::spawn)
/// starts an OS thread, [`spawn_task`][spawn_task] (feature `tokio`) a
/// tokio task, and [`reserve`](Self::reserve) hands out a [`ChildGuard`] for
/// a child you start yourself (a rayon job, a task on another executor);
/// dropping the guard is that child's exit. When every unit is taken, the
/// next child is refused with [`Error::Overload`](crate::Error::Overload) at once: nothing waits,
/// nothing queues, unless the builder gave it a bounded waiting room
/// ([`max_waiters`](crate::SupervisorBuilder::max_waiters)).
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
/// assert_eq!(sup.usage(), 2);
///
/// for _ in &handlers {
///     done_tx.send(()).unwrap();
/// }
/// let served: Vec<usize> = handlers.into_iter().map(|h| h.join().unwrap()).collect();
/// assert_eq!(served, [0, 1]);
/// assert_eq!(sup.usage(), 0);
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
    /// True if its builder was given a name, even the default one: a
    /// reporter refuses a name taken by another live front-end only then.
    named: bool,
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

    /// A builder, to set the name, shard count, [`Probe`](crate::probe::Probe) or child stack
    /// size.
    pub fn builder() -> SupervisorBuilder {
        SupervisorBuilder::default()
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

    /// Refuses every later child with [`Error::Shutdown`](crate::Error::Shutdown); the children
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
    /// assert_eq!(sup.usage(), 1, "the running child is not stopped");
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
    /// true is refused with [`Error::Shutdown`](crate::Error::Shutdown).
    pub fn is_closed(&self) -> bool {
        self.inner.common.table.is_closed()
    }

    crate::engine::keys::key_readings!(
        inner.common.table;
        setup: "",
        make: "let front = sidejob::Supervisor::new(4)?;",
        end: "# Ok::<(), Box<dyn std::error::Error>>(())\n"
    );

    /// Children alive now: units of capacity held (the name every
    /// front-end gives it: [`Limiter::usage`](crate::Limiter::usage),
    /// [`Pool::usage`](crate::Pool::usage), ...).
    ///
    /// Read shard by shard while children come and go, so it is off by at
    /// most the children entering or leaving during the call; it counts a
    /// child whose admission is not yet registered, so it can briefly
    /// exceed `which_children().len()`. Each shard's reading is a usage that
    /// shard really had (it is re-read while it changes under the read), so
    /// the count stays within `capacity`.
    pub fn usage(&self) -> usize {
        // `Table::usage` reads each shard consistently (see
        // `Shard::usage`), so no reading exceeds its shard's limit.
        self.inner.common.table.usage()
    }

    /// The same as [`usage`](Self::usage): its first name, a synonym kept
    /// so that code written against it reads on (not deprecated).
    pub fn count(&self) -> usize {
        self.usage()
    }

    /// The most children that can be alive at once.
    pub fn capacity(&self) -> usize {
        self.inner.common.table.capacity()
    }

    /// Children that could be admitted now: [`capacity`](Self::capacity)
    /// less [`usage`](Self::usage), or 0 while children above a shrunk
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
    /// [`max_capacity`](crate::SupervisorBuilder::max_capacity), for which its
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

    /// True if its builder was given a name (see `Reporter`'s claims).
    pub(crate) fn is_named(&self) -> bool {
        self.inner.named
    }

    /// A snapshot of the counters; see [`Stats`]. A unit is a child:
    /// `accepted` children admitted, `completed` ended normally (or aborted,
    /// or refused a thread by the OS), `panicked` ended by a panic.
    pub fn stats(&self) -> Stats {
        self.inner.common.stats()
    }

    /// Reads the stats while the supervisor or any of its children lives,
    /// without keeping it alive: for a [`Reporter`](crate::observe::Reporter).
    pub(crate) fn weak_stats(&self) -> impl Fn() -> Option<Stats> + Send + 'static {
        let common = Arc::downgrade(&self.inner.common);
        move || common.upgrade().map(|common| common.stats())
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
    /// An adaptive controller's feed, once one is attached
    /// (`adaptive::Target`): read by each spawned child at its start and
    /// end, on the child's own thread or task, never on admission.
    feed: crate::adaptive::FeedSlot,
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
}

impl fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Supervisor")
            .field("name", &self.inner.name)
            .field("capacity", &self.capacity())
            .field("shards", &self.shards())
            .field("usage", &self.usage())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl crate::adaptive::Target for Supervisor {
    fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        Supervisor::set_capacity(self, capacity)
    }

    fn capacity(&self) -> usize {
        Supervisor::capacity(self)
    }

    fn stats(&self) -> Stats {
        Supervisor::stats(self)
    }

    /// Its builder's [`max_capacity`](crate::SupervisorBuilder::max_capacity)
    /// (its capacity, unless set), for which its registry was allocated.
    fn max_capacity(&self) -> usize {
        self.inner.common.table.max_capacity()
    }

    /// Its children time themselves: a thread from
    /// [`spawn`](Supervisor::spawn) from the start of its closure to its
    /// return, a task from `spawn_task` and its kin (feature `tokio`) from
    /// its first poll to its output. A panicked or aborted child records
    /// nothing. (A thread child draws on its new thread, whose first draw
    /// is always a sample: every thread child is timed, two clock reads
    /// beside a thread's start; tasks are sampled one in `sample_every`.) Guards from [`reserve`](Supervisor::reserve) are not
    /// timed: wrap them in [`Controller::timed`](crate::adaptive::Controller::timed).
    fn attach(&self, feed: crate::adaptive::Feed) -> bool {
        self.inner.common.feed.set(feed).is_ok()
    }
}
