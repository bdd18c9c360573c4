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

use crate::engine::class::{Class, HeadroomSettings};
use crate::engine::grant::Grant;
use crate::error::ConfigError;
use crate::sync::{
    Arc, AtomicU64, AtomicUsize, CoarseClock, Mutex,
    Ordering::{Acquire, Relaxed, Release},
};
use crossbeam_utils::CachePadded;
use std::time::Duration;

mod fair;
mod queue;
#[cfg(all(test, not(loom)))]
mod tests;

pub(crate) use fair::Tenant;
pub(crate) use queue::{Queue, QueueCounts, Source, Wake, Woken};

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

/// How long one waiter may wait unless the builder says otherwise.
pub(crate) const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(1);

/// The most waiters a queue may hold: far beyond any sensible queue. Every
/// way of leaving the queue (a grant, a timeout, a dropped future) is O(1)
/// whatever the queue's length; only the deadline watcher's ring walks it,
/// once per ring, on its own thread.
pub(crate) const MAX_WAITERS: usize = 1 << 20;

/// How many tickets of ended waits a queue keeps for reuse.
const SPARE_TICKETS: usize = 64;

/// The waiting room's limits as associated constants of a builder that has
/// `max_waiters` and `max_wait`: one text for the four builders.
macro_rules! waiting_limits {
    () => {
        /// How long one waiter may wait unless [`max_wait`](Self::max_wait)
        /// says otherwise: 1 s.
        pub const DEFAULT_MAX_WAIT: std::time::Duration = crate::engine::waiters::DEFAULT_MAX_WAIT;

        /// The most [`max_waiters`](Self::max_waiters) accepted: far beyond
        /// any sensible queue. Every way of leaving the queue (a grant, a
        /// timeout, a dropped future) is O(1) whatever its length; only the
        /// deadline watcher's ring walks it, once per ring, on its own
        /// thread.
        pub const MAX_WAITERS: usize = crate::engine::waiters::MAX_WAITERS;
    };
}
pub(crate) use waiting_limits;

/// The waiting settings a builder collects; `max_waiters == 0` means no
/// waiting room at all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Policy {
    pub(crate) max_waiters: usize,
    pub(crate) max_wait: Duration,
    pub(crate) order: QueueOrder,
    /// How many units later requests may take past a waiting request of
    /// many units before freed units are kept for it; `None`: the
    /// capacity in force (see `Queue::serve`).
    pub(crate) pass_budget: Option<usize>,
    /// The fraction of the capacity each priority class may fill, as set
    /// (checked at build). Not a waiting setting, but every builder that
    /// has these has that too.
    pub(crate) headroom: HeadroomSettings,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_waiters: 0,
            max_wait: DEFAULT_MAX_WAIT,
            order: QueueOrder::Fifo,
            pass_budget: None,
            headroom: HeadroomSettings::default(),
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
    /// Counted by each waiter that gives up, on its own path, by the rank
    /// of its class.
    timed_out: [AtomicU64; Class::COUNT],
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

impl Room {
    fn new(policy: Policy) -> Room {
        Room {
            count: CachePadded::new(AtomicUsize::new(0)),
            policy,
            timed_out: Default::default(),
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

    /// Counts a waiter of `class` that timed out.
    pub(crate) fn record_timeout(&self, class: Class) {
        // Relaxed: a count.
        self.timed_out[class.rank()].fetch_add(1, Relaxed);
    }

    /// The waiters of `class` that timed out.
    pub(crate) fn timed_out(&self, class: Class) -> u64 {
        // Relaxed: a count for a snapshot.
        self.timed_out[class.rank()].load(Relaxed)
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
            timed_out: Class::ALL.iter().map(|&class| self.timed_out(class)).sum(),
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
    /// A shrink left the capacity below what it waits for: it could never
    /// be served.
    TooLarge,
    /// The room was full and a waiter of a more important class came: it
    /// gave up its place (`Queue::shed_for`), refused with `Overload`.
    Shed,
}

impl State {
    const WAITING: usize = 0;
    const EXPIRED: usize = 1;
    const CLOSED: usize = 2;
    const TOO_LARGE: usize = 3;
    const SHED: usize = 4;
    /// `Granted(shard)` is `GRANTED + shard`.
    const GRANTED: usize = 5;

    fn encode(self) -> usize {
        match self {
            State::Waiting => State::WAITING,
            State::Expired => State::EXPIRED,
            State::Closed => State::CLOSED,
            State::TooLarge => State::TOO_LARGE,
            State::Shed => State::SHED,
            State::Granted(shard) => State::GRANTED + shard,
        }
    }

    fn decode(word: usize) -> State {
        match word {
            State::WAITING => State::Waiting,
            State::EXPIRED => State::Expired,
            State::CLOSED => State::Closed,
            State::TOO_LARGE => State::TooLarge,
            State::SHED => State::Shed,
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
    /// The units of a wait of many units: written under the control lock
    /// before the state (a grant's, or what a waiter timed out or closed
    /// had collected, to give back), taken by the waiter after it reads
    /// the state. A lock of its own, never contended but by that one
    /// hand-over; a wait of one unit never touches it.
    grant: Mutex<Option<Grant>>,
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

    /// Leaves `grant` for the waiter, before [`end`](Self::end).
    fn put_grant(&self, grant: Grant) {
        let mut slot = self.grant.lock();
        match slot.as_mut() {
            Some(held) => held.merge(grant),
            None => *slot = Some(grant),
        }
    }

    /// The units left for the waiter, if any: after its state said the
    /// wait ended (and by then nobody else writes them).
    pub(crate) fn take_grant(&self) -> Option<Grant> {
        self.grant.lock().take()
    }
}
