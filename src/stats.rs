//! Exact counters, kept where they cost nothing on the hot path, and the
//! [`Stats`] snapshot that reads them.
//!
//! Most figures fall out of the shard words themselves: a shard counts the
//! units it has ever handed out and ever taken back (`engine/table.rs`), so
//! *accepted*, *completed* and *usage* need no counter of their own. The two
//! that remain live apart from the admission word:
//!
//! * **rejected**: under overload the rejection is the hot path. It is kept
//!   per thread ([`RejectCounter`]): each live thread owns one padded slot
//!   and bumps it with a plain load and store (no locked instruction, no
//!   shared line). Threads beyond the slot count share one atomic counter.
//!   A thread refused on the fast path by the shard its index names (with
//!   `Probe::Thread` and at most 64 shards) counts on that shard's second
//!   line instead, by the same rule: it is that word's only writer, and
//!   the shard was already bounded and read to refuse it.
//! * **panicked**: rare; an RMW on the shard's own line.
//!
//! Erlang's sidejob publishes rates computed from once-a-second reports;
//! here the counters are exact and [`Stats::rates_since`] turns two
//! snapshots into rates.

use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicUsize, Ordering::Relaxed};

/// A point-in-time reading of a [`Limiter`](crate::Limiter),
/// [`Pool`](crate::Pool) or [`Supervisor`](crate::Supervisor).
///
/// Counters are read shard by shard without stopping the world, so a
/// snapshot taken under load is a close reading, not an atomic one; each
/// counter on its own only ever grows. Counts are of units: permits, pool
/// requests, or children.
///
/// # Examples
///
/// ```
/// use sidejob::Limiter;
///
/// let limiter = Limiter::new(1)?;
/// let permit = limiter.try_acquire()?;
/// assert!(limiter.try_acquire().is_err());
/// drop(permit);
///
/// let stats = limiter.stats();
/// assert_eq!((stats.accepted, stats.rejected, stats.completed), (1, 1, 1));
/// assert_eq!(stats.usage, 0);
/// assert_eq!(stats.peak_usage, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// The capacity in force: the builder's, or the last `set_capacity`.
    pub capacity: usize,
    /// Units admitted and not yet released.
    pub usage: usize,
    /// The sum of each shard's highest usage since the front-end was built.
    /// Exact with one shard. With several it is an upper bound on the
    /// highest total usage, and it may be a total that no instant reached:
    /// shards may have peaked at different times.
    ///
    /// It is a record of the past, so it can read above the `capacity` in
    /// force: after a shrink it keeps the highs reached under the larger
    /// capacity (fill 8, shrink to 2: `peak_usage` 8); a resize that moves
    /// room from one shard to another lets each keep its own high; and the
    /// units of the pool's `*_unbounded` calls count too (as in `usage`).
    /// Without resizes or unbounded calls it never passes `capacity`.
    pub peak_usage: usize,
    /// Units ever admitted.
    pub accepted: u64,
    /// Attempts refused with [`Error::Overload`](crate::Error::Overload).
    pub rejected: u64,
    /// Units released normally: permits dropped, requests handled, children
    /// ended.
    pub completed: u64,
    /// Units released by a panic: a handler or child that panicked, or a
    /// permit dropped while its thread unwound.
    pub panicked: u64,
    /// Units given up for good with [`Permit::forget`](crate::Permit::forget)
    /// or [`OwnedPermit::forget`](crate::OwnedPermit::forget). They stay
    /// counted in `usage`: the capacity they held is lost until the
    /// limiter is rebuilt.
    ///
    /// A guard leaked with [`std::mem::forget`] instead (a permit, a
    /// tower response future or a `HeldBody` response holding a unit, a
    /// child guard) keeps its unit the same way, but no code of the
    /// front-end runs then, so it is not counted here: only in `usage`.
    /// Give units up with the `forget` methods to have them counted.
    pub forgotten: u64,
    /// Callers waiting for a unit now (always 0 without a waiting room:
    /// see `max_waiters` on the builders).
    pub waiting: usize,
    /// The most callers that ever waited for a unit at once.
    pub peak_waiting: usize,
    /// Callers waiting for a busy key now, on a
    /// [`Supervisor`](crate::Supervisor) with keyed waits
    /// ([`reserve_keyed`](crate::Supervisor::reserve_keyed)); they are not
    /// in `waiting`, which counts waits for a unit. 0 elsewhere.
    pub waiting_for_keys: usize,
    /// The most callers that ever waited for keys at once (0 but on a
    /// supervisor with keyed waits).
    pub peak_waiting_for_keys: usize,
    /// Callers that waited and gave up: their `max_wait` or deadline ran
    /// out ([`Error::Timeout`](crate::Error::Timeout)), or the adaptive
    /// queue order timed them out. On a [`Supervisor`](crate::Supervisor),
    /// waits for a busy key that ran out count here too (a caller times
    /// out once, waiting for its key or for capacity).
    pub timed_out: u64,
    /// Callers that waited and were admitted. A waiter's admission is
    /// counted before its wait returns, so its own `stats()` includes it.
    pub waited: u64,
    /// Their waits added up: `waited_time / waited` is the mean wait of an
    /// admitted waiter, over many waits.
    ///
    /// Waits are timed on the coarse monotonic clock (Linux's
    /// `CLOCK_MONOTONIC_COARSE`, whose tick is 1 to 4 ms; elsewhere the
    /// precise clock), read at both ends: each wait adds a whole number of
    /// ticks, 0 or 1 for a short one, which is its true length on average.
    /// So the sum over many waits is right and the mean converges, while a
    /// single short wait is not measured. The precise clock costs 20 to
    /// 50 ns a read on a VM, on the release path that a woken task waits
    /// behind. A wait that a release ended is added by that release right
    /// after it wakes the waiter, before the release returns: a reading the
    /// waiter takes at that very instant may miss its own wait's time.
    pub waited_time: Duration,
    /// The same figures for each shard (for a pool, each worker), in order.
    pub shards: Vec<ShardStats>,
    /// The figures of each priority class, the most important first
    /// ([`Class::ALL`](crate::Class::ALL)'s order): see [`ClassStats`].
    pub classes: Vec<ClassStats>,
}

/// One priority class's figures inside a [`Stats`].
///
/// The classes other than the default are counted on their own (cold)
/// paths; the default class's figures ([`Class::Critical`](crate::Class::Critical))
/// are the totals less the others', so its hot path counts nothing more.
/// A snapshot reads the counters one after another: under load, the
/// default class's figures may be off by the requests that landed while
/// it read.
///
/// # Examples
///
/// ```
/// use sidejob::{units::Ask, Class, Error, Limiter};
///
/// let limiter = Limiter::builder().capacity(2).headroom(Class::Sheddable, 0.5).build()?;
/// let prefetch = Ask::new().class(Class::Sheddable).fail_fast();
/// let held = limiter.acquire_with(prefetch)?;
/// assert_eq!(limiter.acquire_with(prefetch).unwrap_err(), Error::Overload);
/// let user = limiter.try_acquire()?;
/// let stats = limiter.stats();
/// let sheddable = &stats.classes[Class::Sheddable.rank()];
/// assert_eq!((sheddable.class, sheddable.accepted, sheddable.rejected), (Class::Sheddable, 1, 1));
/// assert_eq!(sheddable.held, None); // counted with a min share alone
/// let critical = &stats.classes[Class::Critical.rank()];
/// assert_eq!((critical.accepted, critical.rejected), (1, 0));
/// # drop((held, user));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClassStats {
    /// The class.
    pub class: crate::Class,
    /// Units admitted to its requests (from the table, or handed to its
    /// waiters).
    pub accepted: u64,
    /// Its requests refused with [`Error::Overload`](crate::Error::Overload).
    pub rejected: u64,
    /// Its requests that waited and timed out.
    pub timed_out: u64,
    /// Its requests waiting now.
    pub waiting: usize,
    /// Units its requests hold now, for the two sheddable classes of a
    /// front-end with a min share (whose units are then counted as theirs
    /// while held: what the min share is checked against); `None` for
    /// `CriticalPlus` and `Critical`, whose units are not counted apart
    /// from the others', and for every class of a front-end without a
    /// min share, which counts nothing.
    pub held: Option<usize>,
}

/// One shard's figures inside a [`Stats`]. For a [`Pool`](crate::Pool),
/// shard `i` is worker `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShardStats {
    /// How many units this shard may hold at once.
    pub limit: usize,
    /// Units it holds now.
    pub usage: usize,
    /// The most it ever held at once.
    pub peak_usage: usize,
    /// Units it ever admitted.
    pub accepted: u64,
    /// Units it released normally (for a pool: requests its worker handled).
    pub completed: u64,
    /// Units it released through a panic.
    pub panicked: u64,
    /// Units held on it that were forgotten (never given back).
    pub forgotten: u64,
}

/// Rates per second between two [`Stats`] snapshots; see
/// [`Stats::rates_since`].
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Rates {
    /// Units admitted per second.
    pub accepted: f64,
    /// Attempts refused with `Overload` per second.
    pub rejected: f64,
    /// Units released (normally or by panic) per second.
    pub completed: f64,
}

impl Stats {
    /// Rates between `earlier` and this snapshot, taken `elapsed` apart.
    ///
    /// The figures Erlang's sidejob reports as in/out rates, but computed
    /// from exact counts. A zero `elapsed` gives zero rates rather than
    /// infinities.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob::Limiter;
    ///
    /// let limiter = Limiter::new(4)?;
    /// let before = limiter.stats();
    /// for _ in 0..10 {
    ///     drop(limiter.try_acquire()?);
    /// }
    /// let rates = limiter.stats().rates_since(&before, Duration::from_secs(2));
    /// assert_eq!(rates.accepted, 5.0);
    /// assert_eq!(rates.completed, 5.0);
    /// assert_eq!(rates.rejected, 0.0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rates_since(&self, earlier: &Stats, elapsed: Duration) -> Rates {
        let secs = elapsed.as_secs_f64();
        let per_sec = |now: u64, then: u64| {
            if secs > 0.0 {
                now.saturating_sub(then) as f64 / secs
            } else {
                0.0
            }
        };
        Rates {
            accepted: per_sec(self.accepted, earlier.accepted),
            rejected: per_sec(self.rejected, earlier.rejected),
            completed: per_sec(
                self.completed + self.panicked,
                earlier.completed + earlier.panicked,
            ),
        }
    }
}

/// Counts rejections without a locked instruction or a shared line.
///
/// Slot `i` is written only by the live thread whose
/// [`thread_index`](crate::engine::probe::thread_index) is `i`, so a plain load and
/// store is an exact increment. Threads with larger indices share
/// `overflow` and pay an RMW.
#[derive(Debug)]
pub(crate) struct RejectCounter {
    slots: Box<[CachePadded<AtomicUsize>]>,
    overflow: CachePadded<AtomicUsize>,
}

impl RejectCounter {
    pub(crate) fn new(slots: usize) -> Self {
        RejectCounter {
            slots: (0..slots)
                .map(|_| CachePadded::new(AtomicUsize::new(0)))
                .collect(),
            overflow: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// How many threads have a slot of their own: those whose index is
    /// below this.
    #[inline]
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Counts one rejection by the thread holding `thread_index`.
    #[inline]
    pub(crate) fn record(&self, thread_index: usize) {
        match self.slots.get(thread_index) {
            // Relaxed load and store, not an RMW: this thread is the slot's
            // only writer while it holds the index, and the index registry's
            // lock orders a slot's previous owner before its next one. The
            // count publishes nothing; `total` only sums.
            Some(slot) => slot.store(slot.load(Relaxed).wrapping_add(1), Relaxed),
            // Relaxed: a count; the RMW keeps it exact among sharing threads.
            None => {
                self.overflow.fetch_add(1, Relaxed);
            }
        }
    }

    /// All rejections counted so far.
    pub(crate) fn total(&self) -> u64 {
        // Relaxed: a reading for a snapshot, ordered with nothing.
        let slots: usize = self.slots.iter().map(|slot| slot.load(Relaxed)).sum();
        slots.wrapping_add(self.overflow.load(Relaxed)) as u64
    }
}
