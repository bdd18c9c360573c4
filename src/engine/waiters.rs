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
//! * **Wake-up.** A waiter writes the count, then re-reads every shard
//!   through an RMW on its `given` word (`Shard::usage_synced`) before it
//!   sleeps; a release gives back through an RMW on `given`, then reads the
//!   count. The two RMWs on one `given` word are ordered: if the waiter's
//!   comes later it sees the unit and takes it; if the release's does, it
//!   synchronizes with the waiter's, sees the count, and takes a unit from
//!   the table for the next waiter (`Table::grant_from_table`). A waiter
//!   never sleeps through a release.
//! * **Deadline.** A blocked thread times its own condition-variable wait.
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
//!   it finishes in its own poll (`Table::finish_wait`, which counts the
//!   `Timeout`). The count the releases read is republished under the same
//!   lock, so no atomic ordering beyond the lock's is involved.
//! * **Cancellation.** A waiter that gives up (a blocked thread's deadline,
//!   a dropped future) takes its node out under the lock; an async waiter
//!   expired by the watcher finds its node already out. If a unit was
//!   handed to it first, it keeps it (a blocking waiter, or any waiter in
//!   its final poll) or releases it (a dropped future), and that release
//!   hands it to the next waiter or back to the table: a unit is never
//!   stranded on a waiter that is gone (the loss Netflix's
//!   concurrency-limits had, their PR #179). A dropped future leaves the
//!   room's armed instant as it is: the watcher's ring re-derives it.
//! * **Shutdown** (`close`) wakes every waiter with `Error::Shutdown`.
//!
//! # Order
//!
//! [`QueueOrder`]: first come first served by default; last come first
//! served; or adaptive LIFO (Maurer, "Fail at Scale", ACM Queue 2015):
//! FIFO while the queue drains, but once it has stood non-empty for an
//! `interval`, serve the newest waiter (whose caller has not given up yet)
//! and time out the waiters older than `target` (a CoDel-style deadline).

use std::collections::VecDeque;
use std::task::Waker;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use crate::error::ConfigError;
use crate::sync::{
    Arc, AtomicU64, AtomicUsize, Condvar,
    Ordering::{Acquire, Relaxed},
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
    /// on LIFO, and waiters that have waited longer than `target` are
    /// timed out when a unit is handed over, so a standing queue cannot
    /// hold requests that will only miss their callers' deadlines.
    AdaptiveLifo {
        /// How long the queue must stay non-empty before it counts as
        /// standing.
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

/// The most waiters a queue may hold: far beyond any sensible queue, and it
/// keeps a cancellation's linear search short.
pub const MAX_WAITERS: usize = 1 << 20;

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
    peak: AtomicUsize,
    timed_out: AtomicU64,
    waited_nanos: AtomicU64,
    waited: AtomicU64,
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
            peak: AtomicUsize::new(0),
            timed_out: AtomicU64::new(0),
            waited_nanos: AtomicU64::new(0),
            waited: AtomicU64::new(0),
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
        // Relaxed: a statistic.
        self.peak.fetch_max(waiting, Relaxed);
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

    pub(crate) fn record_wait(&self, since: Instant, now: Instant) {
        let nanos = now.saturating_duration_since(since).as_nanos();
        // Relaxed: counts, read together only by `stats`.
        self.waited_nanos
            .fetch_add(u64::try_from(nanos).unwrap_or(u64::MAX), Relaxed);
        self.waited.fetch_add(1, Relaxed);
    }

    pub(crate) fn stats(&self) -> RoomStats {
        // Relaxed: a snapshot of counters, each exact on its own.
        RoomStats {
            waiting: self.waiting(),
            peak_waiting: self.peak.load(Relaxed),
            timed_out: self.timed_out.load(Relaxed),
            waited: self.waited.load(Relaxed),
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

/// How to wake a waiter.
#[derive(Debug)]
pub(crate) enum Wake {
    /// A blocked thread, asleep on its own condition variable under the
    /// control lock.
    Thread(Arc<Condvar>),
    /// A task.
    Task(Waker),
}

impl Wake {
    fn wake(self) {
        match self {
            Wake::Thread(condvar) => condvar.notify_all(),
            Wake::Task(waker) => waker.wake(),
        }
    }
}

#[derive(Debug)]
struct Node {
    state: State,
    wake: Option<Wake>,
    since: Instant,
    /// When the deadline watcher expires it: set for async waiters only
    /// (a blocked thread times its own condition-variable wait). The
    /// watcher does not run under loom (no clock there), hence the allow.
    #[cfg_attr(loom, allow(dead_code))]
    deadline: Option<Instant>,
}

/// The queue of waiters, in the table's control lock. A waiter holds its
/// node's key from `push` until it calls `leave`; nobody else frees it.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    nodes: Vec<Option<Node>>,
    free: Vec<usize>,
    /// Keys of the nodes still waiting, oldest first.
    order: VecDeque<usize>,
    /// Since when the queue has been non-empty without a break.
    standing_since: Option<Instant>,
    /// The instant the room is registered with the deadline watcher for
    /// (`alarm.rs`), if any. Invariant: every waiting node's deadline is at
    /// or after it, and a registration at it is pending (or ringing now),
    /// so no node outlives its deadline by more than the watcher's lag.
    armed: Option<Instant>,
}

impl Queue {
    /// How many wait.
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }

    /// Queues a waiter, to be expired at `deadline` by the watcher (async
    /// waiters; `None` for a blocked thread, or no deadline); its key.
    /// Call [`arm`](Self::arm) with the deadline next.
    pub(crate) fn push(&mut self, wake: Wake, now: Instant, deadline: Option<Instant>) -> usize {
        let node = Node {
            state: State::Waiting,
            wake: Some(wake),
            since: now,
            deadline,
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
        if self.order.is_empty() {
            self.standing_since = Some(now);
        }
        self.order.push_back(key);
        key
    }

    /// The waiter's state.
    pub(crate) fn state(&self, key: usize) -> State {
        self.node(key).state
    }

    /// When the waiter arrived.
    pub(crate) fn since(&self, key: usize) -> Instant {
        self.node(key).since
    }

    /// Points a queued task at `waker`, cloning it only if it would wake
    /// another task than the one stored (a re-poll usually brings the same).
    pub(crate) fn set_waker(&mut self, key: usize, waker: &Waker) {
        let node = self.node_mut(key);
        if let Some(Wake::Task(stored)) = &node.wake {
            if stored.will_wake(waker) {
                return;
            }
        }
        node.wake = Some(Wake::Task(waker.clone()));
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
    /// `Timeout` through `Table::finish_wait`), and answers the instant the
    /// watcher must ring again, if it must.
    ///
    /// It must not if no node waits with a deadline, or if a registration
    /// later than `now` (so not the one ringing: the watcher took every
    /// entry up to `now`) is pending at or before the earliest deadline
    /// left: that one will ring in time. Linear in the queue: once per
    /// ring, on the watcher's thread.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn expire(&mut self, now: Instant, woken: &mut Vec<Wake>) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let nodes = &mut self.nodes;
        self.order.retain(|&key| {
            let Some(node) = nodes[key].as_mut() else {
                debug_assert!(false, "a queued key has a node");
                return false;
            };
            match node.deadline {
                Some(deadline) if deadline <= now => {
                    node.state = State::Expired;
                    woken.extend(node.wake.take());
                    false
                }
                Some(deadline) => {
                    next = Some(next.map_or(deadline, |next| next.min(deadline)));
                    true
                }
                None => true,
            }
        });
        self.settle_standing();
        match (self.armed, next) {
            (Some(armed), next) if armed > now && next.map_or(true, |next| armed <= next) => None,
            (_, next) => {
                self.armed = next;
                next
            }
        }
    }

    /// Takes a still-waiting node out of the queue (its waiter gives up);
    /// its state, whatever it is, stays for `leave`.
    pub(crate) fn cancel(&mut self, key: usize) {
        if let Some(pos) = self.order.iter().position(|&k| k == key) {
            self.order.remove(pos);
            self.settle_standing();
        }
    }

    /// Frees the node once its waiter has seen its final state.
    pub(crate) fn leave(&mut self, key: usize) {
        self.cancel(key);
        self.nodes[key] = None;
        self.free.push(key);
    }

    /// Hands a unit of `shard` to the next waiter by `order`, pushing what
    /// to wake once the lock is let go onto `woken` (with the waiters the
    /// adaptive order expired on the way). False if nobody waits.
    /// `now` is read only by the adaptive order (a clock read costs more
    /// than the rest of a FIFO grant).
    pub(crate) fn grant(
        &mut self,
        shard: usize,
        order: QueueOrder,
        now: impl FnOnce() -> Instant,
        woken: &mut Vec<Wake>,
    ) -> bool {
        let lifo = match order {
            QueueOrder::Fifo => false,
            QueueOrder::Lifo => true,
            QueueOrder::AdaptiveLifo { interval, target } => {
                let now = now();
                let standing = self
                    .standing_since
                    .is_some_and(|since| now.saturating_duration_since(since) >= interval);
                if standing {
                    // Time out everyone past the target, oldest first.
                    while let Some(&oldest) = self.order.front() {
                        if now.saturating_duration_since(self.node(oldest).since) < target {
                            break;
                        }
                        self.order.pop_front();
                        let node = self.node_mut(oldest);
                        node.state = State::Expired;
                        woken.extend(node.wake.take());
                    }
                }
                standing
            }
        };
        let key = if lifo {
            self.order.pop_back()
        } else {
            self.order.pop_front()
        };
        self.settle_standing();
        let Some(key) = key else {
            return false;
        };
        let node = self.node_mut(key);
        node.state = State::Granted(shard);
        woken.extend(node.wake.take());
        true
    }

    /// Wakes every waiter with `Closed`.
    pub(crate) fn close_all(&mut self, woken: &mut Vec<Wake>) {
        while let Some(key) = self.order.pop_front() {
            let node = self.node_mut(key);
            node.state = State::Closed;
            woken.extend(node.wake.take());
        }
        self.standing_since = None;
    }

    fn settle_standing(&mut self) {
        if self.order.is_empty() {
            self.standing_since = None;
        }
    }

    fn node(&self, key: usize) -> &Node {
        self.nodes[key]
            .as_ref()
            .expect("a waiter's node lives until it leaves")
    }

    fn node_mut(&mut self, key: usize) -> &mut Node {
        self.nodes[key]
            .as_mut()
            .expect("a waiter's node lives until it leaves")
    }
}

/// Wakes what a grant or a close collected, after the lock is let go.
pub(crate) fn wake_all(woken: Vec<Wake>) {
    for wake in woken {
        wake.wake();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn waker() -> Wake {
        Wake::Thread(Arc::new(Condvar::new()))
    }

    #[test]
    fn fifo_and_lifo_grant_in_their_order() {
        let now = Instant::now();
        for (order, expected) in [(QueueOrder::Fifo, [0, 1, 2]), (QueueOrder::Lifo, [2, 1, 0])] {
            let mut queue = Queue::default();
            let keys: Vec<usize> = (0..3).map(|_| queue.push(waker(), now, None)).collect();
            let mut woken = Vec::new();
            for (i, &want) in expected.iter().enumerate() {
                assert!(queue.grant(i, order, || now, &mut woken));
                assert_eq!(queue.state(keys[want]), State::Granted(i));
            }
            assert_eq!(woken.len(), 3);
            assert!(!queue.grant(9, order, || now, &mut woken));
        }
    }

    #[test]
    fn adaptive_lifo_is_fifo_until_the_queue_stands_then_expires_the_old() {
        let order = QueueOrder::AdaptiveLifo {
            interval: Duration::from_millis(100),
            target: Duration::from_millis(5),
        };
        let t0 = Instant::now();
        let mut queue = Queue::default();
        let a = queue.push(waker(), t0, None);
        let b = queue.push(waker(), t0 + Duration::from_millis(50), None);
        let mut woken = Vec::new();
        // Not standing yet: FIFO.
        assert!(queue.grant(0, order, || t0 + Duration::from_millis(60), &mut woken));
        assert_eq!(queue.state(a), State::Granted(0));
        // Standing since t0 (never empty): b is older than the target and
        // expires; the fresh c is served.
        let c = queue.push(waker(), t0 + Duration::from_millis(199), None);
        let d = queue.push(waker(), t0 + Duration::from_millis(200), None);
        assert!(queue.grant(1, order, || t0 + Duration::from_millis(201), &mut woken));
        assert_eq!(queue.state(b), State::Expired);
        assert_eq!(queue.state(d), State::Granted(1));
        assert_eq!(queue.state(c), State::Waiting);
        queue.leave(a);
        queue.leave(b);
        queue.leave(d);
        queue.leave(c);
        assert_eq!(queue.len(), 0);
        assert!(queue.standing_since.is_none());
    }

    #[test]
    fn arm_registers_only_earlier_deadlines_and_expire_rearms() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut queue = Queue::default();
        let blocked = queue.push(waker(), t0, None);
        let a = queue.push(waker(), t0, Some(ms(10)));
        assert!(queue.arm(ms(10)));
        // FIFO with one `max_wait`: later deadlines register nothing.
        let b = queue.push(waker(), t0, Some(ms(20)));
        assert!(!queue.arm(ms(20)));
        let c = queue.push(waker(), t0, Some(ms(30)));
        assert!(!queue.arm(ms(30)));
        // A caller's earlier deadline does.
        let d = queue.push(waker(), t0, Some(ms(5)));
        assert!(queue.arm(ms(5)));
        let mut woken = Vec::new();
        // The ring at 5 ms: d expires. `armed` is 5, the ring's own, so the
        // earliest left (10) is registered: a duplicate of a's entry, which
        // the queue no longer knows of (`alarm.rs`, "Duplicates").
        assert_eq!(queue.expire(ms(5), &mut woken), Some(ms(10)));
        assert_eq!((queue.state(d), woken.len()), (State::Expired, 1));
        // A stale ring (its node was served): nothing expires, and the
        // registration at 10 ms is still pending, so nothing new.
        queue.cancel(a);
        assert_eq!(queue.expire(ms(7), &mut woken), None);
        // The ring at 20 ms expires a and b, keeps the blocked thread
        // (it times itself), and asks for 30.
        queue.push(waker(), t0, None);
        assert_eq!(queue.expire(ms(20), &mut woken), Some(ms(30)));
        assert_eq!(queue.state(b), State::Expired);
        assert_eq!(queue.state(c), State::Waiting);
        assert_eq!(queue.state(blocked), State::Waiting);
        assert_eq!(queue.expire(ms(30), &mut woken), None);
        assert_eq!(queue.state(c), State::Expired);
        assert_eq!(queue.len(), 2);
        // Nothing armed any more: the next deadline registers.
        queue.push(waker(), t0, Some(ms(40)));
        assert!(queue.arm(ms(40)));
    }

    #[test]
    fn cancel_and_close() {
        let now = Instant::now();
        let mut queue = Queue::default();
        let a = queue.push(waker(), now, None);
        let b = queue.push(waker(), now, None);
        queue.cancel(a);
        assert_eq!(queue.len(), 1);
        let mut woken = Vec::new();
        queue.close_all(&mut woken);
        assert_eq!(queue.state(b), State::Closed);
        assert_eq!(woken.len(), 1);
        queue.leave(a);
        queue.leave(b);
        // Keys are reused.
        assert!([a, b].contains(&queue.push(waker(), now, None)));
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
}
