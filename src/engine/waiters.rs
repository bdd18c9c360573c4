//! The waiting room: callers that found every shard full wait here, in a
//! bounded queue, for a unit that a release hands over.
//!
//! Opt-in per limiter, pool and supervisor (`max_waiters`, default 0:
//! fail fast, as Erlang's sidejob does). With it, a caller refused by the
//! table waits if fewer than `max_waiters` wait already, for at most
//! `max_wait`; past that, `Overload` at once. Zero waiting room bounces
//! requests "just from the randomness of arrivals"; unbounded waiting lets
//! them time out upstream. Resilience4j's bulkhead (`maxWaitDuration`) and
//! Go's ants (`MaxBlockingTasks`) offer the same two knobs.
//!
//! # Protocol
//!
//! The queue lives under the table's control lock (`table.rs`), beside the
//! debt of a shrink, so that a hand-off and a resize never interleave. The
//! number waiting is mirrored in one atomic word, [`Room::count`], the only
//! thing a release reads when nobody waits:
//!
//! * **Hand-off.** A release that reads a non-zero count *before* giving
//!   its unit back takes the lock and hands the unit to the next waiter
//!   directly: the unit never returns to the table, so a newcomer probing
//!   at that moment finds the table full and queues behind (no barging).
//! * **Outcome.** Each waiter holds a [`Ticket`] beside its node. Whoever
//!   ends a wait (a grant, the deadline watcher, a close) does it under the
//!   lock: it publishes the new count, frees the node, then stores the
//!   outcome in the ticket (Release) and wakes the waiter after letting
//!   the lock go. The waiter reads its ticket without the lock (Acquire):
//!   a granted waiter runs on with no lock between the release and its
//!   work, and sees a count that no longer includes it. A waiter that
//!   gives up takes the lock and reads its ticket again: under the lock the
//!   outcome is settled, so either its node is still queued and it takes
//!   it out, or the wait has ended and it has that outcome.
//! * **Wake-up.** A waiter writes the count, then re-reads every shard
//!   through an RMW on its `given` word (`Shard::usage_synced`) before it
//!   sleeps; a release gives back through an RMW on `given`, then reads the
//!   count. The two RMWs on one `given` word are ordered: if the waiter's
//!   comes later it sees the unit and takes it; if the release's does, it
//!   synchronizes with the waiter's, sees the count, and takes a unit from
//!   the table for the next waiter (`Table::grant_from_table`). A waiter
//!   never sleeps through a release.
//! * **Deadline.** A blocked thread times its own park.
//!   An async waiter's node carries its deadline (the earlier of its
//!   caller's and `max_wait`), and the room keeps one instant *armed* with
//!   the process-wide deadline watcher (`alarm.rs`): the earliest deadline
//!   among its async waiters. A newcomer registers only if its deadline is
//!   earlier (`Queue::arm`); with FIFO and one `max_wait` that is only the
//!   first waiter after a ring. The watcher rings the room under the
//!   control lock (`Queue::expire`): every node past its deadline becomes
//!   `Expired` and is woken, and the room re-arms for the earliest left.
//!   A grant and an expiry of one node are both under the lock, so a
//!   waiter is either handed a unit or timed out, never both; either way
//!   it finishes in its own poll (`Table::finished`, which counts the
//!   `Timeout`). The count the releases read is republished under the same
//!   lock, so no atomic ordering beyond the lock's is involved.
//! * **Cancellation.** A waiter that gives up (a blocked thread's deadline,
//!   a dropped future) takes its node out under the lock if its ticket
//!   still says it waits, in O(1) wherever it stands (the waiting nodes
//!   are a doubly linked list through their keys); an async waiter expired
//!   by the watcher finds its node already gone. If a unit was handed to it first, it keeps it (a
//!   blocking waiter, or any waiter in its final poll) or releases it (a
//!   dropped future), and that release
//!   hands it to the next waiter or back to the table: a unit is never
//!   stranded on a waiter that is gone (the loss Netflix's
//!   concurrency-limits had, their PR #179). A dropped future leaves the
//!   room's armed instant as it is: the watcher's ring re-derives it.
//! * **Shutdown** (`close`) wakes every waiter with `Error::Shutdown`.
//! * **Foreign code.** A task's waker is code the crate does not own: its
//!   `wake`, `clone` and `drop` may re-enter the table (a waker that owns a
//!   permit of it releases that permit when dropped), take long, or panic.
//!   So under the control lock the engine only moves its own state: a
//!   waker is cloned before the lock is taken, and every waker the queue
//!   lets go of (woken, replaced, or of a waiter that left) is handed back
//!   to the caller ([`Woken`], or an `Option<Wake>`) and woken or dropped
//!   after the lock. A resize wakes the waiters it served after it has
//!   un-gated the shards and let the lock go. A waker that panics does not
//!   keep the others asleep: [`Woken::wake_all`] wakes every one, adds
//!   every figure, then lets the first panic go on up to its caller, whose
//!   table is consistent by then. Units come back to the table only
//!   outside the lock too, so a unit given back always serves the room
//!   (`Table::release`, and `Table::undo` for a take a racing shrink
//!   cancelled).
//!
//! # Order
//!
//! [`QueueOrder`]: first come first served by default; last come first
//! served; or adaptive LIFO (Maurer, "Fail at Scale", ACM Queue 2015):
//! FIFO while the queue drains, but once it has stood non-empty for an
//! `interval`, serve the newest waiter (whose caller has not given up yet)
//! and time out the waiters older than `target` (a CoDel-style deadline).

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::task::Waker;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::engine::foreign::each_then_resume;
use crate::error::ConfigError;
use crate::sync::{
    park, Arc, AtomicU64, AtomicUsize, CoarseClock,
    Ordering::{Acquire, Relaxed, Release},
};

/// Which waiter a freed unit goes to, when several wait.
///
/// Set with `queue_order` on the limiter, pool and supervisor builders.
///
/// Under a standing queue (arrivals faster than service for a while;
/// `benches/waiting.rs`), FIFO serves every admitted request after almost
/// its whole `max_wait` and, with the queue full, refuses newcomers at
/// once; LIFO serves fresh requests within about one service time and lets
/// the oldest time out; adaptive LIFO behaves as FIFO until the queue has
/// stood for its interval, then as LIFO with its short target. Pick FIFO
/// when every waiter's caller waits as long as `max_wait`; LIFO or adaptive
/// LIFO when callers give up sooner and a fresh request is worth more.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob::{Limiter, QueueOrder};
///
/// let limiter = Limiter::builder()
///     .capacity(10)
///     .max_waiters(20)
///     .max_wait(Duration::from_millis(500))
///     .queue_order(QueueOrder::adaptive_lifo())
///     .build()?;
/// assert_eq!(limiter.waiting(), 0);
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum QueueOrder {
    /// The oldest waiter first (the default): no waiter starves while
    /// newcomers keep arriving; every waiter's wait is bounded by the
    /// queue ahead of it.
    #[default]
    Fifo,
    /// The newest waiter first: under a standing queue the served requests
    /// are the fresh ones, whose callers are still there; the oldest wait
    /// until they time out.
    Lifo,
    /// FIFO until the queue has stood non-empty for `interval`; from then
    /// on LIFO, and when a unit is handed over, the *other* waiters that
    /// have waited longer than `target` are timed out, so a standing queue
    /// cannot hold requests that will only miss their callers' deadlines.
    /// The waiter the unit goes to is served whatever its wait: a unit is
    /// there for it, and its caller's own `max_wait` has not run out.
    AdaptiveLifo {
        /// How long the queue must stay non-empty before it counts as
        /// standing. Zero: it stands from its first waiter (LIFO, with the
        /// target's timeouts, from the start).
        interval: Duration,
        /// The longest a waiter may wait while the queue stands.
        target: Duration,
    },
}

impl QueueOrder {
    /// Adaptive LIFO with the figures of "Fail at Scale": a queue that
    /// stands for 100 ms switches to LIFO and a 5 ms wait target.
    pub const fn adaptive_lifo() -> QueueOrder {
        QueueOrder::AdaptiveLifo {
            interval: Duration::from_millis(100),
            target: Duration::from_millis(5),
        }
    }
}

/// How long one waiter may wait unless the builder says otherwise.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(1);

/// The most waiters a queue may hold: far beyond any sensible queue. Every
/// way of leaving the queue (a grant, a timeout, a dropped future) is O(1)
/// whatever the queue's length; only the deadline watcher's ring walks it,
/// once per ring, on its own thread.
pub const MAX_WAITERS: usize = 1 << 20;

/// How many tickets of ended waits a queue keeps for reuse.
const SPARE_TICKETS: usize = 64;

/// The waiting settings a builder collects; `max_waiters == 0` means no
/// waiting room at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    pub(crate) max_waiters: usize,
    pub(crate) max_wait: Duration,
    pub(crate) order: QueueOrder,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_waiters: 0,
            max_wait: DEFAULT_MAX_WAIT,
            order: QueueOrder::Fifo,
        }
    }
}

impl Policy {
    /// Checks the settings; the room to build, if any.
    pub(crate) fn room(&self) -> Result<Option<Arc<Room>>, ConfigError> {
        if self.max_waiters > MAX_WAITERS {
            return Err(ConfigError::too_large("max_waiters", MAX_WAITERS));
        }
        if let QueueOrder::AdaptiveLifo { target, .. } = self.order {
            // A zero target would time out every waiter but the one served.
            if target.is_zero() {
                return Err(ConfigError::zero_duration("queue_order"));
            }
        }
        Ok((self.max_waiters > 0).then(|| Arc::new(Room::new(*self))))
    }
}

/// A table's waiting room: the settings, the count releases read, and the
/// figures for [`Stats`](crate::Stats). The queue itself is in the table's
/// control lock.
#[derive(Debug)]
pub(crate) struct Room {
    /// How many wait now. Written under the control lock; read by every
    /// release (see the module docs for the ordering).
    pub(crate) count: CachePadded<AtomicUsize>,
    pub(crate) policy: Policy,
    /// Counted by each waiter that gives up, on its own path.
    timed_out: AtomicU64,
    /// Added after the wake-up (`Woken::wake_all`), off the lock. The
    /// counts that must be exact when a wait returns are in the [`Queue`],
    /// under the lock.
    waited_nanos: AtomicU64,
    /// The clock waits are timed on (see [`Room::ticks`]).
    clock: CoarseClock,
}

/// The waiting figures of a [`Stats`](crate::Stats) snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RoomStats {
    pub(crate) waiting: usize,
    pub(crate) peak_waiting: usize,
    pub(crate) timed_out: u64,
    pub(crate) waited: u64,
    pub(crate) waited_time: Duration,
}

/// The waiting figures kept under the control lock, where the grants that
/// change them already are: plain integers, no locked instruction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct QueueCounts {
    /// The most that ever waited at once.
    pub(crate) peak: usize,
    /// Waits that ended in an admission.
    pub(crate) waited: u64,
}

impl Room {
    fn new(policy: Policy) -> Room {
        Room {
            count: CachePadded::new(AtomicUsize::new(0)),
            policy,
            timed_out: AtomicU64::new(0),
            waited_nanos: AtomicU64::new(0),
            clock: CoarseClock::new(),
        }
    }

    /// Publishes the queue's length. Under the control lock.
    pub(crate) fn set_count(&self, waiting: usize) {
        // Relaxed: the store is ordered before the waiter's re-check RMWs
        // on `given` by program order, and those RMWs carry it to a
        // releaser (module docs); releasers that read a stale count either
        // hand off to nobody (they re-check under the lock) or go past a
        // waiter who re-checks the table after this store.
        self.count.store(waiting, Relaxed);
    }

    /// How many wait now.
    pub(crate) fn waiting(&self) -> usize {
        // Acquire: a reading for users; pairs with nothing in particular
        // but costs nothing and keeps `waiting()` after a `close()` at 0.
        self.count.load(Acquire)
    }

    pub(crate) fn record_timeout(&self) {
        // Relaxed: a count.
        self.timed_out.fetch_add(1, Relaxed);
    }

    /// A reading of the clock waits are timed on, for `waited_time`: the
    /// coarse clock (`CLOCK_MONOTONIC_COARSE`, a few nanoseconds where
    /// `Instant::now()` costs 20 to 50 on a VM), read at both ends of a
    /// wait. A wait then counts a whole number of ticks (1 to 4 ms each):
    /// 0 or 1 for a short one, whose expected value is its true length,
    /// since where the wait falls between two ticks is as good as random.
    /// So the sum over many waits is right, and a single short wait is
    /// not. The end is read on the release's path, which a granted task
    /// often waits behind on its runtime thread: a precise read there cost
    /// the hand-off a sixth of its latency.
    pub(crate) fn ticks(&self) -> u64 {
        self.clock.ticks()
    }

    /// Adds a wait's time, from two readings of [`ticks`](Self::ticks)
    /// (its count is the queue's, under the lock).
    pub(crate) fn add_waited_time(&self, since: u64, now: u64) {
        // Relaxed: a sum, read by `stats` only.
        self.waited_nanos
            .fetch_add(now.saturating_sub(since), Relaxed);
    }

    /// The figures, with the queue's `counts` (read under the lock).
    pub(crate) fn stats(&self, counts: QueueCounts) -> RoomStats {
        // Relaxed: a snapshot of counters, each exact on its own.
        RoomStats {
            waiting: self.waiting(),
            peak_waiting: counts.peak,
            timed_out: self.timed_out.load(Relaxed),
            waited: counts.waited,
            waited_time: Duration::from_nanos(self.waited_nanos.load(Relaxed)),
        }
    }
}

/// Where a waiter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Queued.
    Waiting,
    /// A unit of this shard was handed over: the waiter owns it.
    Granted(usize),
    /// Timed out: by its deadline (the watcher rang the room, see
    /// [`Queue::expire`]), or by the adaptive order's target.
    Expired,
    /// The table was closed.
    Closed,
}

impl State {
    const WAITING: usize = 0;
    const EXPIRED: usize = 1;
    const CLOSED: usize = 2;
    /// `Granted(shard)` is `GRANTED + shard`.
    const GRANTED: usize = 3;

    fn encode(self) -> usize {
        match self {
            State::Waiting => State::WAITING,
            State::Expired => State::EXPIRED,
            State::Closed => State::CLOSED,
            State::Granted(shard) => State::GRANTED + shard,
        }
    }

    fn decode(word: usize) -> State {
        match word {
            State::WAITING => State::Waiting,
            State::EXPIRED => State::Expired,
            State::CLOSED => State::Closed,
            shard => State::Granted(shard - State::GRANTED),
        }
    }
}

/// A waiter's outcome, shared by the waiter and its node: written once,
/// under the control lock, by whoever ends the wait (a grant, the deadline
/// watcher, a close); read by the waiter *without* the lock. So a granted
/// waiter runs on at once, with no lock between the release and its work,
/// which is what the hand-off latency is made of.
#[derive(Debug, Default)]
pub(crate) struct Ticket {
    state: AtomicUsize,
}

impl Ticket {
    /// The waiter's state. Acquire: pairs with the Release store in
    /// [`Ticket::end`], so a granted waiter sees everything the granter
    /// did before (the unit's take, the node's removal).
    pub(crate) fn state(&self) -> State {
        State::decode(self.state.load(Acquire))
    }

    /// Ends the wait with `state`. Under the control lock; Release: pairs
    /// with the Acquire load in [`Ticket::state`].
    fn end(&self, state: State) {
        self.state.store(state.encode(), Release);
    }
}

/// How to wake a waiter.
///
/// A task's [`Waker`] is code the crate does not own: its `wake`, `clone`
/// and `drop` may re-enter the table (a waker that owns a permit of it), be
/// slow, or panic. So a `Wake` is only *moved* under the control lock,
/// never woken, cloned or dropped there: the queue hands the ones it lets
/// go of back to the caller ([`Woken`], or an `Option<Wake>` to drop),
/// which lets them go after the lock.
#[derive(Debug)]
pub(crate) enum Wake {
    /// A blocked thread, parked until its ticket changes.
    Thread(park::Thread),
    /// A task.
    Task(Waker),
}

impl Wake {
    fn wake(self) {
        match self {
            Wake::Thread(thread) => thread.unpark(),
            Wake::Task(waker) => waker.wake(),
        }
    }

    /// True if waking `self` wakes the task of `waker`: a comparison of
    /// pointers (std's `will_wake`), no code of the waker's.
    fn will_wake(&self, waker: &Waker) -> bool {
        matches!(self, Wake::Task(stored) if stored.will_wake(waker))
    }
}

/// The waiters to wake once the control lock is let go. A FIFO hand-off
/// wakes exactly one, so the first is kept inline: a release allocates
/// nothing.
#[derive(Debug, Default)]
pub(crate) struct Woken {
    first: Option<Ended>,
    more: Vec<Ended>,
}

/// A wait that ended: how to wake its waiter, and when it arrived if it
/// was granted (its wait's time is added after the wake-up).
#[derive(Debug)]
struct Ended {
    wake: Option<Wake>,
    granted_since: Option<u64>,
}

impl Woken {
    fn push(&mut self, ended: Ended) {
        if self.first.is_none() {
            self.first = Some(ended);
        } else {
            self.more.push(ended);
        }
    }

    /// How many are to be woken.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.more.len()
    }

    /// Wakes them all, then adds the granted waits' time to `room`'s
    /// figures: the clock is read here, by the releaser, after the wake-up,
    /// so that a granted waiter runs on without reading it. Never under
    /// the control lock: a waker may take it (module docs, "Foreign code").
    ///
    /// A waker that panics does not stop the others: every one is woken
    /// and every figure added, then the first panic goes on up to the
    /// caller, whose table is consistent by then (nothing of it is left
    /// half-done: the lock is free, the shards un-gated).
    pub(crate) fn wake_all(mut self, room: &Room) {
        let wakes = self
            .first
            .iter_mut()
            .chain(self.more.iter_mut())
            .filter_map(|ended| ended.wake.take());
        // The figures are added before a panic goes on, so a panic in the
        // waking never leaves them short.
        let panicked = catch_unwind(AssertUnwindSafe(|| each_then_resume(wakes, Wake::wake)));
        let mut now = None;
        for ended in self.first.iter().chain(&self.more) {
            if let Some(since) = ended.granted_since {
                let now = *now.get_or_insert_with(|| room.ticks());
                room.add_waited_time(since, now);
            }
        }
        if let Err(payload) = panicked {
            resume_unwind(payload);
        }
    }
}

/// No node: the end of the waiting list.
const NIL: usize = usize::MAX;

#[derive(Debug)]
struct Node {
    ticket: Arc<Ticket>,
    wake: Option<Wake>,
    since: Instant,
    /// `since` on the room's clock, for `waited_time` (see [`Room::ticks`]).
    since_ticks: u64,
    /// When the deadline watcher expires it: set for async waiters only
    /// (a blocked thread times its own wait). The watcher does not run
    /// under loom (no clock there), hence the allow.
    #[cfg_attr(loom, allow(dead_code))]
    deadline: Option<Instant>,
    /// Its neighbours in the waiting list: the next older and the next
    /// newer waiter's key, or [`NIL`].
    older: usize,
    newer: usize,
}

/// The queue of waiters, in the table's control lock. A node lives while
/// its waiter waits: whoever ends the wait (a grant, an expiry, a close, or
/// the waiter giving up through [`Queue::cancel`]) frees it, and the
/// outcome lives on in the waiter's [`Ticket`].
///
/// The waiting nodes form a doubly linked list through their keys, oldest
/// to newest, so a grant at either end and a waiter leaving from anywhere
/// are O(1) under the lock: a room of [`MAX_WAITERS`] whose waiters give up
/// newest first holds the lock no longer per leave than one of ten.
#[derive(Debug)]
pub(crate) struct Queue {
    nodes: Vec<Option<Node>>,
    free: Vec<usize>,
    /// Tickets of ended waits, reused once their waiter has let go of
    /// them ([`Queue::ticket`]): a wait then allocates nothing, and neither
    /// its end nor its waiter frees anything. At most [`SPARE_TICKETS`].
    spare: Vec<Arc<Ticket>>,
    /// The ends of the waiting list, or [`NIL`] when nobody waits.
    oldest: usize,
    newest: usize,
    /// How many nodes the list holds.
    len: usize,
    /// Since when the queue has been non-empty without a break.
    standing_since: Option<Instant>,
    /// The instant the room is registered with the deadline watcher for
    /// (`alarm.rs`), if any. Invariant: every waiting node's deadline is at
    /// or after it, and a registration at it is pending (or ringing now),
    /// so no node outlives its deadline by more than the watcher's lag.
    armed: Option<Instant>,
    /// The figures kept here, under the lock.
    counts: QueueCounts,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            nodes: Vec::new(),
            free: Vec::new(),
            spare: Vec::new(),
            oldest: NIL,
            newest: NIL,
            len: 0,
            standing_since: None,
            armed: None,
            counts: QueueCounts::default(),
        }
    }
}

impl Queue {
    /// How many wait.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Queues a waiter, to be expired at `deadline` by the watcher (async
    /// waiters; `None` for a blocked thread, or no deadline); its key, its
    /// ticket and its arrival on the room's clock ([`Room::ticks`]). Call
    /// [`arm`](Self::arm) with the deadline next.
    pub(crate) fn push(
        &mut self,
        room: &Room,
        wake: Wake,
        now: Instant,
        deadline: Option<Instant>,
    ) -> (usize, Arc<Ticket>, u64) {
        let ticket = self.ticket();
        let since_ticks = room.ticks();
        let node = Node {
            ticket: Arc::clone(&ticket),
            wake: Some(wake),
            since: now,
            since_ticks,
            deadline,
            older: self.newest,
            newer: NIL,
        };
        let key = match self.free.pop() {
            Some(key) => {
                self.nodes[key] = Some(node);
                key
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        };
        match self.newest {
            NIL => {
                self.oldest = key;
                self.standing_since = Some(now);
            }
            newest => self.node_mut(newest).newer = key,
        }
        self.newest = key;
        self.len += 1;
        room.set_count(self.len);
        self.counts.peak = self.counts.peak.max(self.len);
        (key, ticket, since_ticks)
    }

    /// Takes the waiting node `key` out of the list (its node stays until
    /// freed).
    fn unlink(&mut self, key: usize) {
        let node = self.node(key);
        let (older, newer) = (node.older, node.newer);
        match older {
            NIL => self.oldest = newer,
            older => self.node_mut(older).newer = newer,
        }
        match newer {
            NIL => self.newest = older,
            newer => self.node_mut(newer).older = older,
        }
        self.len -= 1;
        if self.len == 0 {
            self.standing_since = None;
        }
    }

    /// Takes the oldest waiting node out of the list; its key.
    fn pop_oldest(&mut self) -> Option<usize> {
        let key = (self.oldest != NIL).then_some(self.oldest)?;
        self.unlink(key);
        Some(key)
    }

    /// Takes the newest waiting node out of the list; its key.
    fn pop_newest(&mut self) -> Option<usize> {
        let key = (self.newest != NIL).then_some(self.newest)?;
        self.unlink(key);
        Some(key)
    }

    /// A ticket for a new wait: a spare one whose waiter has let go of it,
    /// or a new one. The oldest spares are tried first (their waiters are
    /// the likeliest to be done), a few at most.
    fn ticket(&mut self) -> Arc<Ticket> {
        for i in 0..self.spare.len().min(4) {
            // `get_mut` answers only if nobody else holds the ticket, and
            // synchronizes with the waiter's drop of its handle (Release
            // there, Acquire here): the waiter's last read of the state
            // came before the reset below.
            if Arc::get_mut(&mut self.spare[i]).is_some() {
                let ticket = self.spare.swap_remove(i);
                // Relaxed: nobody else holds it; its next waiter gets it
                // through the control lock.
                ticket.state.store(State::WAITING, Relaxed);
                return ticket;
            }
        }
        Arc::new(Ticket::default())
    }

    /// True if the queued task of `key` would be woken through `waker`
    /// already: a re-poll usually brings the same waker, and then nothing
    /// is cloned or swapped. A comparison, no code of the waker's.
    pub(crate) fn will_wake(&self, key: usize, waker: &Waker) -> bool {
        self.node(key)
            .wake
            .as_ref()
            .is_some_and(|w| w.will_wake(waker))
    }

    /// Points the queued waiter of `key` at `wake`; the wake it replaces,
    /// for the caller to drop after letting the lock go (a waker's drop is
    /// code the crate does not own).
    #[must_use = "drop the old wake after the control lock"]
    pub(crate) fn replace_wake(&mut self, key: usize, wake: Wake) -> Option<Wake> {
        self.node_mut(key).wake.replace(wake)
    }

    /// Arms the room for a new waiter's `deadline`: true if the caller must
    /// register it with the deadline watcher (it is earlier than the
    /// instant armed, or none is), after letting the control lock go.
    /// With FIFO and a fixed `max_wait`, deadlines only grow: only the
    /// first waiter after a ring arms.
    pub(crate) fn arm(&mut self, deadline: Instant) -> bool {
        if self.armed.is_some_and(|armed| armed <= deadline) {
            return false;
        }
        self.armed = Some(deadline);
        true
    }

    /// The watcher rang at `now`: expires every waiting node whose deadline
    /// has passed (pushing what to wake onto `woken`; each finishes with
    /// `Timeout` in its own poll), and answers the instant the watcher must
    /// ring again, if it must.
    ///
    /// It must not if no node waits with a deadline, or if a registration
    /// later than `now` (so not the one ringing: the watcher took every
    /// entry up to `now`) is pending at or before the earliest deadline
    /// left: that one will ring in time. Linear in the queue: once per
    /// ring, on the watcher's thread.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn expire(
        &mut self,
        room: &Room,
        now: Instant,
        woken: &mut Woken,
    ) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut ended = Vec::new();
        let mut key = self.oldest;
        while key != NIL {
            let node = self.node(key);
            let (newer, deadline) = (node.newer, node.deadline);
            match deadline {
                Some(deadline) if deadline <= now => {
                    self.unlink(key);
                    ended.push(key);
                }
                Some(deadline) => {
                    next = Some(next.map_or(deadline, |next| next.min(deadline)));
                }
                None => {}
            }
            key = newer;
        }
        // The count before the tickets (see `end`).
        room.set_count(self.len);
        for key in ended {
            self.end(key, State::Expired, woken);
        }
        match (self.armed, next) {
            (Some(armed), next) if armed > now && next.map_or(true, |next| armed <= next) => None,
            (_, next) => {
                self.armed = next;
                next
            }
        }
    }

    /// The figures kept under the lock.
    pub(crate) fn counts(&self) -> QueueCounts {
        self.counts
    }

    /// A wait ended in an admission that no grant counted (the waiter took
    /// its own unit), or a granted one that admitted nobody after all (its
    /// future was dropped as the unit came): `waited` moves by one.
    pub(crate) fn count_waited(&mut self, admitted: bool) {
        if admitted {
            self.counts.waited += 1;
        } else {
            self.counts.waited -= 1;
        }
    }

    /// The waiter of `key` gives up (its deadline passed, its future was
    /// dropped, or it took a unit from the table itself) and found its
    /// ticket still `Waiting` under the lock: its node goes, in O(1). Its
    /// wake is handed back, to be dropped after the lock.
    #[must_use = "drop the wake after the control lock"]
    pub(crate) fn cancel(&mut self, room: &Room, key: usize) -> Option<Wake> {
        self.unlink(key);
        room.set_count(self.len);
        self.free_node(key).and_then(|node| node.wake)
    }

    /// Hands a unit of `shard` to the next waiter by the room's order,
    /// pushing what to wake once the lock is let go onto `woken` (with the
    /// waiters the adaptive order expired on the way). False if nobody
    /// waits. `now` is read only by the adaptive order (a clock read costs
    /// more than the rest of a FIFO grant). `counted` runs just before the
    /// waiter's ticket says it is granted, so what it counts is seen by the
    /// waiter (through the ticket's Release store) when its wait returns.
    pub(crate) fn grant(
        &mut self,
        room: &Room,
        shard: usize,
        now: impl FnOnce() -> Instant,
        counted: impl FnOnce(),
        woken: &mut Woken,
    ) -> bool {
        let mut expired = Vec::new();
        let key = match room.policy.order {
            QueueOrder::Fifo => self.pop_oldest(),
            QueueOrder::Lifo => self.pop_newest(),
            QueueOrder::AdaptiveLifo { interval, target } => {
                let now = now();
                let standing = self
                    .standing_since
                    .is_some_and(|since| now.saturating_duration_since(since) >= interval);
                if standing {
                    // The newest is served, whatever its wait: the unit is
                    // here for it (timing it out would hand the unit back
                    // to the table the instant it came). Of the others,
                    // those past the target time out, oldest first.
                    let newest = self.pop_newest();
                    while self.oldest != NIL
                        && now.saturating_duration_since(self.node(self.oldest).since) >= target
                    {
                        expired.extend(self.pop_oldest());
                    }
                    newest
                } else {
                    self.pop_oldest()
                }
            }
        };
        // The count before the tickets (see `end`).
        room.set_count(self.len);
        for oldest in expired {
            self.end(oldest, State::Expired, woken);
        }
        let Some(key) = key else {
            return false;
        };
        counted();
        self.end(key, State::Granted(shard), woken);
        true
    }

    /// Wakes every waiter with `Closed`.
    pub(crate) fn close_all(&mut self, room: &Room, woken: &mut Woken) {
        let mut closed = Vec::with_capacity(self.len);
        while let Some(key) = self.pop_oldest() {
            closed.push(key);
        }
        // The count before the tickets (see `end`).
        room.set_count(0);
        for key in closed {
            self.end(key, State::Closed, woken);
        }
    }

    /// Ends the wait of `key` (already out of the list, and the count the
    /// releases read already published without it) with `state`: the
    /// ticket says so, the node goes, and its waiter is to be woken.
    ///
    /// The count first: a waiter that reads its outcome (Acquire) then
    /// sees a count that no longer includes it, as `waiting()` after an
    /// admission should.
    fn end(&mut self, key: usize, state: State, woken: &mut Woken) {
        let Some(node) = self.free_node(key) else {
            debug_assert!(false, "an ended key has a node");
            return;
        };
        let granted = matches!(state, State::Granted(_));
        if granted {
            // Counted before the lock is let go, so that the waiter's
            // `stats()` (which takes the lock) includes its own wait; its
            // time follows the wake-up (`Woken::wake_all`).
            self.counts.waited += 1;
        }
        node.ticket.end(state);
        if self.spare.len() < SPARE_TICKETS {
            self.spare.push(node.ticket);
        }
        woken.push(Ended {
            wake: node.wake,
            granted_since: granted.then_some(node.since_ticks),
        });
    }

    fn free_node(&mut self, key: usize) -> Option<Node> {
        let node = self.nodes[key].take();
        if node.is_some() {
            self.free.push(key);
        }
        node
    }

    fn node(&self, key: usize) -> &Node {
        self.nodes[key].as_ref().expect("a waiting key has a node")
    }

    fn node_mut(&mut self, key: usize) -> &mut Node {
        self.nodes[key].as_mut().expect("a waiting key has a node")
    }

    /// The keys of the waiting nodes, oldest first (for the tests).
    #[cfg(test)]
    fn keys(&self) -> Vec<usize> {
        let mut keys = Vec::with_capacity(self.len);
        let mut key = self.oldest;
        while key != NIL {
            keys.push(key);
            key = self.node(key).newer;
        }
        keys
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn waker() -> Wake {
        Wake::Thread(park::current())
    }

    fn room(order: QueueOrder) -> Room {
        Room::new(Policy {
            max_waiters: 16,
            order,
            ..Policy::default()
        })
    }

    /// Queues a waiter; its key and ticket.
    fn push(
        queue: &mut Queue,
        room: &Room,
        now: Instant,
        deadline: Option<Instant>,
    ) -> (usize, Arc<Ticket>) {
        let (key, ticket, _) = queue.push(room, waker(), now, deadline);
        (key, ticket)
    }

    #[test]
    fn fifo_and_lifo_grant_in_their_order() {
        let now = Instant::now();
        for (order, expected) in [(QueueOrder::Fifo, [0, 1, 2]), (QueueOrder::Lifo, [2, 1, 0])] {
            let room = room(order);
            let mut queue = Queue::default();
            let tickets: Vec<_> = (0..3)
                .map(|_| push(&mut queue, &room, now, None).1)
                .collect();
            let mut woken = Woken::default();
            for (i, &want) in expected.iter().enumerate() {
                assert!(queue.grant(&room, i, || now, || {}, &mut woken));
                assert_eq!(tickets[want].state(), State::Granted(i));
            }
            assert_eq!(woken.len(), 3);
            assert!(!queue.grant(&room, 9, || now, || {}, &mut woken));
            // Every node was freed by its grant, for reuse.
            assert_eq!(queue.free.len(), 3);
        }
    }

    #[test]
    fn adaptive_lifo_is_fifo_until_the_queue_stands_then_expires_the_old() {
        let order = QueueOrder::AdaptiveLifo {
            interval: Duration::from_millis(100),
            target: Duration::from_millis(5),
        };
        let t0 = Instant::now();
        let room = room(order);
        let mut queue = Queue::default();
        let (_, a) = push(&mut queue, &room, t0, None);
        let (_, b) = push(&mut queue, &room, t0 + Duration::from_millis(50), None);
        let mut woken = Woken::default();
        // Not standing yet: FIFO.
        assert!(queue.grant(
            &room,
            0,
            || t0 + Duration::from_millis(60),
            || {},
            &mut woken
        ));
        assert_eq!(a.state(), State::Granted(0));
        // Standing since t0 (never empty): b is older than the target and
        // expires; the fresh d is served.
        let (c_key, c) = push(&mut queue, &room, t0 + Duration::from_millis(199), None);
        let (_, d) = push(&mut queue, &room, t0 + Duration::from_millis(200), None);
        assert!(queue.grant(
            &room,
            1,
            || t0 + Duration::from_millis(201),
            || {},
            &mut woken
        ));
        assert_eq!(b.state(), State::Expired);
        assert_eq!(d.state(), State::Granted(1));
        assert_eq!(c.state(), State::Waiting);
        assert_eq!(woken.len(), 3);
        assert!(queue.cancel(&room, c_key).is_some());
        assert_eq!((queue.len(), room.waiting()), (0, 0));
        assert!(queue.standing_since.is_none());
        // Every waiter past the target: the newest is still served (the
        // unit is there for it), the others time out.
        let (_, e) = push(&mut queue, &room, t0 + Duration::from_millis(300), None);
        let (_, f) = push(&mut queue, &room, t0 + Duration::from_millis(301), None);
        assert!(queue.grant(
            &room,
            2,
            || t0 + Duration::from_millis(900),
            || {},
            &mut woken
        ));
        assert_eq!((e.state(), f.state()), (State::Expired, State::Granted(2)));
        assert_eq!(queue.len(), 0);
    }

    #[test]
    fn arm_registers_only_earlier_deadlines_and_expire_rearms() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let room = room(QueueOrder::Fifo);
        let mut queue = Queue::default();
        let (_, blocked) = push(&mut queue, &room, t0, None);
        let (a_key, a) = push(&mut queue, &room, t0, Some(ms(10)));
        assert!(queue.arm(ms(10)));
        // FIFO with one `max_wait`: later deadlines register nothing.
        let (_, b) = push(&mut queue, &room, t0, Some(ms(20)));
        assert!(!queue.arm(ms(20)));
        let (_, c) = push(&mut queue, &room, t0, Some(ms(30)));
        assert!(!queue.arm(ms(30)));
        // A caller's earlier deadline does.
        let (_, d) = push(&mut queue, &room, t0, Some(ms(5)));
        assert!(queue.arm(ms(5)));
        let mut woken = Woken::default();
        // The ring at 5 ms: d expires. `armed` is 5, the ring's own, so the
        // earliest left (10) is registered: a duplicate of a's entry, which
        // the queue no longer knows of (`alarm.rs`, "Duplicates").
        assert_eq!(queue.expire(&room, ms(5), &mut woken), Some(ms(10)));
        assert_eq!((d.state(), woken.len()), (State::Expired, 1));
        // A stale ring (its node was served): nothing expires, and the
        // registration at 10 ms is still pending, so nothing new.
        drop(queue.cancel(&room, a_key));
        assert_eq!(a.state(), State::Waiting, "a cancel leaves the ticket");
        assert_eq!(queue.expire(&room, ms(7), &mut woken), None);
        // The ring at 20 ms expires b, keeps the blocked thread (it times
        // itself), and asks for 30.
        push(&mut queue, &room, t0, None);
        assert_eq!(queue.expire(&room, ms(20), &mut woken), Some(ms(30)));
        assert_eq!(b.state(), State::Expired);
        assert_eq!(c.state(), State::Waiting);
        assert_eq!(blocked.state(), State::Waiting);
        assert_eq!(queue.expire(&room, ms(30), &mut woken), None);
        assert_eq!(c.state(), State::Expired);
        assert_eq!(queue.len(), 2);
        // Nothing armed any more: the next deadline registers.
        push(&mut queue, &room, t0, Some(ms(40)));
        assert!(queue.arm(ms(40)));
    }

    #[test]
    fn cancel_and_close() {
        let now = Instant::now();
        let room = room(QueueOrder::Fifo);
        let mut queue = Queue::default();
        let (a_key, _) = push(&mut queue, &room, now, None);
        let (b_key, b) = push(&mut queue, &room, now, None);
        drop(queue.cancel(&room, a_key));
        assert_eq!(queue.len(), 1);
        let mut woken = Woken::default();
        queue.close_all(&room, &mut woken);
        assert_eq!(b.state(), State::Closed);
        assert_eq!((woken.len(), room.waiting()), (1, 0));
        // Keys are reused.
        assert!([a_key, b_key].contains(&push(&mut queue, &room, now, None).0));
    }

    #[test]
    fn states_round_trip_through_the_ticket_word() {
        for state in [
            State::Waiting,
            State::Expired,
            State::Closed,
            State::Granted(0),
            State::Granted(65_535),
        ] {
            assert_eq!(State::decode(state.encode()), state);
        }
    }

    #[test]
    fn policy_validation_names_the_field() {
        let too_many = Policy {
            max_waiters: MAX_WAITERS + 1,
            ..Policy::default()
        };
        assert_eq!(too_many.room().unwrap_err().field(), "max_waiters");
        let zero_target = Policy {
            max_waiters: 1,
            order: QueueOrder::AdaptiveLifo {
                interval: Duration::ZERO,
                target: Duration::ZERO,
            },
            ..Policy::default()
        };
        assert_eq!(zero_target.room().unwrap_err().field(), "queue_order");
        assert!(Policy::default().room().unwrap().is_none());
    }

    /// A task waker that does nothing: the list model compares wakers.
    struct NoopTask;

    impl std::task::Wake for NoopTask {
        fn wake(self: Arc<Self>) {}
    }

    /// One step of the list model.
    #[derive(Debug, Clone)]
    enum Step {
        Push,
        /// Cancel the waiter at this index of the model (modulo its length).
        Cancel(usize),
        GrantFifo,
        GrantLifo,
        /// A wake handed back by a re-poll with another waker.
        Repoll(usize),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            3 => Just(Step::Push),
            2 => any::<usize>().prop_map(Step::Cancel),
            1 => Just(Step::GrantFifo),
            1 => Just(Step::GrantLifo),
            1 => any::<usize>().prop_map(Step::Repoll),
        ]
    }

    proptest::proptest! {
        /// The linked list against a `VecDeque` of keys: after every step
        /// the waiting keys, oldest first, the length, the published count
        /// and the ends agree; a grant serves the model's end; a cancel
        /// from anywhere hands back the waiter's wake.
        #[test]
        fn the_waiting_list_keeps_its_order_through_any_sequence(
            steps in proptest::collection::vec(step(), 1..200)
        ) {
            let now = Instant::now();
            let fifo = room(QueueOrder::Fifo);
            let lifo = room(QueueOrder::Lifo);
            let mut queue = Queue::default();
            let mut model: std::collections::VecDeque<usize> = Default::default();
            let mut tickets = std::collections::HashMap::new();
            let task = Waker::from(Arc::new(NoopTask));
            for step in steps {
                let mut woken = Woken::default();
                // The room whose count this step published, if it did.
                let mut published = None;
                match step {
                    Step::Push => {
                        let (key, ticket) = push(&mut queue, &fifo, now, None);
                        proptest::prop_assert!(!model.contains(&key));
                        model.push_back(key);
                        tickets.insert(key, ticket);
                        published = Some(&fifo);
                    }
                    Step::Cancel(at) if !model.is_empty() => {
                        let key = model.remove(at % model.len()).unwrap();
                        proptest::prop_assert!(queue.cancel(&fifo, key).is_some());
                        proptest::prop_assert_eq!(tickets[&key].state(), State::Waiting);
                        published = Some(&fifo);
                    }
                    Step::GrantFifo => {
                        let granted = queue.grant(&fifo, 7, || now, || {}, &mut woken);
                        proptest::prop_assert_eq!(granted, !model.is_empty());
                        if let Some(key) = model.pop_front() {
                            proptest::prop_assert_eq!(tickets[&key].state(), State::Granted(7));
                        }
                        published = Some(&fifo);
                    }
                    Step::GrantLifo => {
                        let granted = queue.grant(&lifo, 3, || now, || {}, &mut woken);
                        proptest::prop_assert_eq!(granted, !model.is_empty());
                        if let Some(key) = model.pop_back() {
                            proptest::prop_assert_eq!(tickets[&key].state(), State::Granted(3));
                        }
                        published = Some(&lifo);
                    }
                    Step::Repoll(at) if !model.is_empty() => {
                        let key = model[at % model.len()];
                        // A thread's wake never stands for a task's waker.
                        let was_task = matches!(queue.node(key).wake, Some(Wake::Task(_)));
                        proptest::prop_assert_eq!(queue.will_wake(key, &task), was_task);
                        let old = queue.replace_wake(key, Wake::Task(task.clone()));
                        proptest::prop_assert!(old.is_some());
                        proptest::prop_assert!(queue.will_wake(key, &task));
                    }
                    Step::Cancel(_) | Step::Repoll(_) => {}
                }
                if let Some(room) = published {
                    proptest::prop_assert_eq!(room.waiting(), model.len());
                }
                let keys: Vec<usize> = model.iter().copied().collect();
                proptest::prop_assert_eq!(queue.keys(), keys);
                proptest::prop_assert_eq!(queue.len(), model.len());
                proptest::prop_assert_eq!(queue.oldest, model.front().copied().unwrap_or(NIL));
                proptest::prop_assert_eq!(queue.newest, model.back().copied().unwrap_or(NIL));
                proptest::prop_assert_eq!(queue.standing_since.is_some(), !model.is_empty());
            }
        }
    }
}
