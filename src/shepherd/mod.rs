//! [`Shepherd`]: retried and delayed operations on a fixed set of workers,
//! each owning one limited resource, with a completion handle per
//! operation: the fourth front-end on the admission table.
//!
//! The pattern is "pooled workers and a shepherd": a queue of
//! independent, idempotent operations; one worker per resource instance (a
//! database connection, a CPU); and a shepherd that hands each due
//! operation to whichever worker is free, retries a failed one after a
//! delay until too many attempts were made, completes the caller's handle
//! with the final result, and recovers failed workers. Compared with a
//! classic pool that lends out resources (HikariCP), callers never hold a
//! resource while doing something else, cannot deadlock across pools, and
//! do not each re-implement error handling. Compared with dispatching work
//! to a worker at request time, an operation waits in one queue and goes to
//! the first worker free, so a slow worker delays nothing queued behind it.
//!
//! Files: `handler.rs` (the [`Handler`] trait), `policy.rs` (retries,
//! backoff, jitter, budget), `queue.rs` (the due-time-ordered store behind
//! a seam), `state.rs` (the shared state and the retry decision),
//! `worker.rs` (the worker and timer loops, and what a late attempt does),
//! `handle.rs` ([`Completion`], [`Failure`]), `clock.rs` ([`ManualClock`]),
//! `stats.rs` ([`ShepherdStats`]).

use self::queue::Store;
use self::state::{OpBox, Record, Shared};
use crate::error::{ConfigError, Error, Refused};
use crate::sync::{now, os_thread, Arc, Mutex, Ordering::Relaxed, Ordering::SeqCst};
pub use clock::ManualClock;
pub use handle::{Completion, Failure, LastAttempt, Reason, UnitRelease};
pub use handler::{Handler, Recovery};
pub use policy::{Jitter, RetryBudget, RetryPolicy};
pub use stats::ShepherdStats;
use std::fmt;
use std::time::{Duration, Instant};

mod builder;

pub use builder::ShepherdBuilder;

mod clock;

mod handle;

mod handler;

pub(crate) mod line;

mod policy;

mod queue;

mod state;

mod stats;

mod unit;

mod worker;

/// What `submit` returns: the operation's completion, or the operation
/// back with the reason it was refused.
type Submitted<H> =
    Result<Completion<<H as Handler>::Output, <H as Handler>::Error>, Refused<<H as Handler>::Op>>;

/// Retries and delays idempotent operations on a fixed set of workers, one
/// per limited resource, and completes each caller's [`Completion`] with
/// the final result.
///
/// Each worker thread owns a [`Handler`] built by the factory (a database
/// connection, say) and takes one due operation at a time from a shared
/// queue: whichever worker is free runs the next one. A failed attempt (an
/// `Err`, a panic, or a run past the
/// [`attempt_timeout`](ShepherdBuilder::attempt_timeout)) is retried after
/// a backoff, as the [`RetryPolicy`] allows, until it succeeds or the
/// shepherd gives up; the caller's handle then gets the output or a
/// [`Failure`] carrying the last error and the attempt count. A retry with
/// no backoff is attempted at once by the worker that failed it, before
/// newer operations (a late attempt's, by whichever worker is free).
///
/// Admission goes through the same sharded table as the other front-ends:
/// an operation takes one unit of `capacity` when submitted and holds it
/// until its *final* outcome is handed to its caller (or, with
/// [`UnitRelease::OnCompletion`], until it completes), delays and retries
/// included. So `capacity` bounds everything the shepherd holds (due,
/// delayed, running, and outcomes not yet taken): nothing queues without
/// limit behind it, and a full shepherd answers
/// [`Error::Overload`] at once (or lets the caller wait, with a waiting
/// room: [`max_waiters`](ShepherdBuilder::max_waiters)).
///
/// `Shepherd` is a handle: clone it, send it to other threads. Dropping the
/// last handle shuts it down ([`shutdown`](Self::shutdown)).
///
/// # Semantics
///
/// * **Exact capacity.** Operations holding a unit (admitted, and not yet
///   handed over to their callers, or with [`UnitRelease::OnCompletion`]
///   not yet completed) never exceed the capacity in force.
/// * **A delayed operation occupies no worker.** Workers sleep until an
///   operation is due; one timer thread sleeps until the earliest due time
///   or attempt deadline. Nothing polls: an idle shepherd uses no CPU,
///   whatever it holds for later.
/// * **Every handle resolves, once.** With the output, or a [`Failure`]:
///   attempts exhausted, an error the handler calls final
///   ([`Handler::is_retryable`]), the retry budget spent, or shutdown.
/// * **The unit comes back with the outcome.** The handle gives the unit
///   back as it hands the final outcome over ([`Completion::wait`] and its
///   kin, or `.await`), before the caller has it, on the caller's own
///   thread: a caller that gets its result and submits again never meets
///   its own stale unit, and the shard's cache line stays with the caller
///   instead of crossing to the worker and back on every operation (as
///   tower's `ConcurrencyLimit` keeps its permit until the response is
///   taken). So an outcome nobody takes holds its unit: take or drop
///   handles promptly. A dropped handle gives its unit back at once if the
///   outcome is in, or else when the operation completes. A caller that
///   submits a batch before it reads any outcome chooses
///   [`UnitRelease::OnCompletion`] instead: the worker gives the unit back
///   as the operation completes, still before the handle resolves.
/// * **Panics** fail the attempt, rebuild the worker's handler with the
///   factory, and are retried like errors unless the policy says not to.
/// * **A late attempt** (past `attempt_timeout`) cannot be killed: its
///   caller is answered (retry or failure) at the deadline, its result is
///   dropped when it returns, and its worker is waited for (not replaced)
///   and then rebuilt, so a hanging resource never makes the shepherd hold
///   more resources than it has workers.
/// * **Shutdown** refuses new operations, still runs every operation that
///   is due, and completes every one that is not yet due (a delay or a
///   retry's backoff) with [`Reason::Shutdown`] at once rather than wait
///   for it or run it early: from then on, a failed attempt is final.
///
/// # Memory ordering
///
/// Everything a caller did before `submit` happens-before each attempt of
/// the operation (the due line's FIFO, or the delay heap's lock);
/// everything the attempt that completed it did happens-before the handle
/// resolves (the reply slot).
///
/// # Examples
///
/// Retry a flaky resource; the caller sees only the final result:
///
/// ```
/// use std::time::Duration;
/// use sidejob::shepherd::{Handler, RetryPolicy, Shepherd};
///
/// /// Fails the first two attempts of every operation, then succeeds.
/// struct Flaky;
///
/// impl Handler for Flaky {
///     type Op = String;
///     type Output = usize;
///     type Error = &'static str;
///     fn handle(&mut self, op: &String, attempt: u32) -> Result<usize, &'static str> {
///         if attempt < 3 { Err("busy, try later") } else { Ok(op.len()) }
///     }
/// }
///
/// let shepherd = Shepherd::builder()
///     .name("db")
///     .capacity(100) // operations held: due, delayed or running
///     .workers(2)    // two connections
///     .retry(RetryPolicy::new().max_attempts(5).backoff(Duration::from_millis(1), Duration::from_millis(10)))
///     .build(|_worker| Flaky)?;
///
/// let done = shepherd.submit("hello".to_string())?;
/// assert_eq!(done.wait(), Ok(5));
/// assert_eq!(shepherd.stats().attempts, 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Watch the health figure: alarm when the due count stays above the
/// worker count for too long.
///
/// ```
/// use std::time::Duration;
/// use sidejob::observe::Alarm;
/// use sidejob::shepherd::{Handler, Shepherd};
/// # struct Echo;
/// # impl Handler for Echo {
/// #     type Op = u8; type Output = u8; type Error = ();
/// #     fn handle(&mut self, n: &u8, _: u32) -> Result<u8, ()> { Ok(*n) }
/// # }
///
/// let shepherd = Shepherd::builder().capacity(64).workers(4).build(|_| Echo)?;
/// let behind = Alarm::builder()
///     .name("shepherd_behind")
///     .threshold(shepherd.workers())
///     .raise_after(Duration::from_secs(60))
///     .build()?;
/// // On your timer (a reporter's tick, a runtime interval):
/// assert_eq!(shepherd.observe_due(&behind), None);
/// assert!(!behind.is_raised());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Shepherd<H: Handler> {
    inner: Arc<Inner<H>>,
}

struct Inner<H: Handler> {
    shared: Arc<Shared<H>>,
    /// Taken (and joined) by the first shutdown.
    threads: Mutex<Vec<os_thread::JoinHandle<()>>>,
    /// The workers and the timer: none of them may wait for itself.
    thread_ids: Box<[os_thread::ThreadId]>,
    name: Arc<str>,
    /// True if its builder was given a name, even the default one: a
    /// reporter refuses a name taken by another live front-end only then.
    named: bool,
    workers: usize,
    /// Wakes the timer when a manual clock moves; the clock holds it
    /// weakly.
    _listener: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl Shepherd<Unbuilt> {
    /// A builder; the only way to make a shepherd. The handler type is
    /// fixed by the factory given to [`ShepherdBuilder::build`].
    pub fn builder() -> ShepherdBuilder {
        ShepherdBuilder::default()
    }
}

/// Names no handler: it only lets `Shepherd::builder()` be written without
/// a type argument. It has no values, so no `Shepherd<Unbuilt>` exists.
#[doc(hidden)]
#[derive(Debug)]
pub enum Unbuilt {}

impl Handler for Unbuilt {
    type Op = ();
    type Output = ();
    type Error = ();
    fn handle(&mut self, _: &(), _: u32) -> Result<(), ()> {
        match *self {}
    }
}

impl<H: Handler> Shepherd<H> {
    /// Submits an operation to be attempted as soon as a worker is free,
    /// and retried as the policy says; its [`Completion`].
    ///
    /// If the shepherd is full, the operation is refused at once, unless
    /// it has a waiting room ([`ShepherdBuilder::max_waiters`]): then the
    /// caller waits for a unit, for up to
    /// [`max_wait`](ShepherdBuilder::max_wait). Called from one of this
    /// shepherd's own handlers, it never waits.
    ///
    /// # Errors
    ///
    /// [`Refused`] holding the operation: [`Error::Overload`] when every
    /// unit is held (and the waiting room, if any, is full),
    /// [`Error::Timeout`] when it waited `max_wait` in vain,
    /// [`Error::Shutdown`] once shut down. `?` turns it into an [`Error`].
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Error;
    /// use sidejob::shepherd::{Handler, Shepherd};
    /// # struct Echo;
    /// # impl Handler for Echo {
    /// #     type Op = u8; type Output = u8; type Error = ();
    /// #     fn handle(&mut self, n: &u8, _: u32) -> Result<u8, ()> { Ok(*n) }
    /// # }
    /// let shepherd = Shepherd::builder().capacity(1).build(|_| Echo)?;
    /// let held = shepherd.submit_after(1, std::time::Duration::from_secs(60))?;
    /// let refused = shepherd.submit(2).unwrap_err(); // the delayed one holds the unit
    /// assert_eq!(refused.error(), Error::Overload);
    /// assert_eq!(refused.into_inner(), 2);
    /// shepherd.shutdown();
    /// assert!(held.wait().unwrap_err().is_shutdown());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit(&self, op: H::Op) -> Submitted<H> {
        self.admit(op, Duration::ZERO, true)
    }

    /// Like [`submit`](Self::submit), but the operation becomes due only
    /// after `delay` (on the shepherd's clock): a delayed enqueue.
    /// Until then it holds its unit of capacity and no worker.
    ///
    /// # Errors
    ///
    /// As [`submit`](Self::submit).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob::shepherd::{Handler, ManualClock, Shepherd};
    /// # struct Echo;
    /// # impl Handler for Echo {
    /// #     type Op = u8; type Output = u8; type Error = ();
    /// #     fn handle(&mut self, n: &u8, _: u32) -> Result<u8, ()> { Ok(*n) }
    /// # }
    /// let clock = ManualClock::new();
    /// let shepherd = Shepherd::builder().capacity(8).clock(clock.clone()).build(|_| Echo)?;
    /// let done = shepherd.submit_after(9, Duration::from_secs(5))?;
    /// assert_eq!(shepherd.stats().delayed, 1);
    /// clock.advance(Duration::from_secs(5));
    /// assert_eq!(done.wait(), Ok(9));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn submit_after(&self, op: H::Op, delay: Duration) -> Submitted<H> {
        self.admit(op, delay, true)
    }

    /// Like [`submit`](Self::submit), but never waits for capacity,
    /// whatever the waiting policy.
    ///
    /// # Errors
    ///
    /// [`Refused`] holding the operation: [`Error::Overload`] or
    /// [`Error::Shutdown`].
    pub fn try_submit(&self, op: H::Op) -> Submitted<H> {
        self.admit(op, Duration::ZERO, false)
    }

    fn admit(&self, op: H::Op, delay: Duration, may_wait: bool) -> Submitted<H> {
        let shared = &*self.inner.shared;
        let table = &shared.table;
        // A handler waiting for its own shepherd's capacity could wait for
        // the very unit it holds; it is refused instead.
        let wait = may_wait && table.has_room() && !self.inner.on_own_thread();
        let admitted = if wait {
            table.acquire_waiting(None)
        } else {
            table.acquire()
        };
        let shard = match admitted {
            Ok(shard) => shard,
            Err(error) => return Err(Refused::new(error, op)),
        };
        let unit = shared.homes.unit(shard);
        // A coarse stamp (see `Stamps`): the budget's window and the
        // turnaround need no more, and a precise read is a good part of a
        // submit's cost. A delay is measured on the shepherd's clock.
        let stamp = shared.stamps.now();
        if delay.is_zero() {
            // Due at once: straight to the line, no lock (state.rs). The
            // record is made before the reservation, so a worker that sees
            // the reservation finds the record at once.
            let (reply, receiver) = oneshot::channel();
            let Some(open) = shared.reserve_due() else {
                // Admitted just before the table closed, but the line has
                // closed since: the unit goes back, the operation to the
                // caller.
                drop(unit);
                return Err(Refused::new(Error::Shutdown, op));
            };
            // Before the publish: once published, the first attempt may
            // fail and ask the budget for a retry, which this first
            // attempt's deposit must already be in (a deposit after the
            // publish made the budget refuse retries it owed).
            shared.deposit(stamp);
            shared.line.publish(Record {
                op: OpBox::Owned(op),
                attempts: 0,
                last: LastAttempt::None,
                reply,
                unit,
                submitted: stamp,
            });
            // Spin in `wait` only if a worker should take it at once (see
            // `ShepherdBuilder::spin_wait`), by the open count the
            // reservation made: at most `workers` ahead of it, beyond those
            // in workers' hands (at most one each, the workers' own
            // previous records included until they are counted out).
            let spin = if open <= 2 * self.inner.workers {
                shared.spin
            } else {
                Duration::ZERO
            };
            return Ok(Completion::new(receiver, spin));
        }
        let now = shared.clock.now();
        let due = now.checked_add(delay).unwrap_or_else(|| far_future(now));
        let mut core = shared.core.lock();
        if core.closing {
            // Admitted just before the table closed, but shutdown has
            // drained the delay heap: the unit goes back, the operation
            // to the caller.
            drop(core);
            drop(unit);
            return Err(Refused::new(Error::Shutdown, op));
        }
        shared.deposit(stamp);
        let (reply, receiver) = oneshot::channel();
        let record = Record {
            op: OpBox::Owned(op),
            attempts: 0,
            last: LastAttempt::None,
            reply,
            unit,
            submitted: stamp,
        };
        shared.delay(&mut core, record, due);
        drop(core);
        // Not due yet: nothing to spin for.
        Ok(Completion::new(receiver, Duration::ZERO))
    }

    /// Operations held now: due, delayed, running, or (with the default
    /// [`UnitRelease::OnHandOver`]) completed with an outcome its handle
    /// has not handed over yet.
    pub fn usage(&self) -> usize {
        self.inner.shared.table.usage()
    }

    /// The most operations it may hold at once.
    pub fn capacity(&self) -> usize {
        self.inner.shared.table.capacity()
    }

    /// Operations that could be admitted now; a reading, not a
    /// reservation.
    pub fn available(&self) -> usize {
        self.inner.shared.table.available()
    }

    /// Changes the capacity while it runs (see
    /// [`Limiter::set_capacity`](crate::Limiter::set_capacity)): a shrink
    /// drops nothing held, and admits nothing until the holdings fit.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `capacity` if it is too large to count.
    pub fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        self.inner.shared.table.set_capacity(capacity)
    }

    /// Callers waiting for capacity now (0 without a waiting room).
    pub fn waiting(&self) -> usize {
        self.inner.shared.table.waiting()
    }

    /// Worker threads (one handler, one resource each).
    pub fn workers(&self) -> usize {
        self.inner.workers
    }

    /// The shepherd's name; threads are `{name}-{index}` and
    /// `{name}-timer`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// True if its builder was given a name (see `Reporter`'s claims).
    pub(crate) fn is_named(&self) -> bool {
        self.inner.named
    }

    /// Operations due now and waiting for a worker: the health figure,
    /// which should routinely drop below [`workers`](Self::workers).
    pub fn due(&self) -> usize {
        let shared = &*self.inner.shared;
        let mut core = shared.core.lock();
        shared.promote(&mut core, shared.clock.now());
        shared.due()
    }

    /// The shepherd's clock's time (the real clock, or a
    /// [`ManualClock`]'s).
    pub(crate) fn now(&self) -> std::time::Instant {
        self.inner.shared.clock.now()
    }

    /// A snapshot of the figures; see [`ShepherdStats`].
    pub fn stats(&self) -> ShepherdStats {
        read_stats(&self.inner.shared, self.inner.workers)
    }

    /// Reads the figures while the shepherd's state lives, without keeping
    /// it alive: for a [`Reporter`](crate::observe::Reporter).
    pub(crate) fn weak_stats(&self) -> impl Fn() -> Option<ShepherdStats> + Send + 'static {
        let shared = Arc::downgrade(&self.inner.shared);
        let workers = self.inner.workers;
        move || shared.upgrade().map(|shared| read_stats(&shared, workers))
    }

    /// Waits up to `timeout` (real time) until nothing is due and no
    /// attempt runs: every operation is completed or delayed. True if it
    /// got there. For tests and graceful drains.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// # use sidejob::shepherd::{Handler, Shepherd};
    /// # struct Echo;
    /// # impl Handler for Echo {
    /// #     type Op = u8; type Output = u8; type Error = ();
    /// #     fn handle(&mut self, n: &u8, _: u32) -> Result<u8, ()> { Ok(*n) }
    /// # }
    /// let shepherd = Shepherd::builder().capacity(8).build(|_| Echo)?;
    /// let _ = shepherd.submit(1)?; // handle dropped: it still runs
    /// assert!(shepherd.wait_idle(Duration::from_secs(60)));
    /// assert_eq!(shepherd.stats().succeeded, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let shared = &*self.inner.shared;
        let deadline = now().checked_add(timeout);
        let mut core = shared.core.lock();
        // SeqCst: before the idle checks below; a worker that makes the
        // shepherd idle sees it and notifies (`Shared::notify_if_idle`).
        shared.idle_waiters.fetch_add(1, SeqCst);
        let idle = loop {
            // What became due (a clock move the timer has not acted on
            // yet) is not idle.
            shared.promote(&mut core, shared.clock.now());
            if shared.is_idle() {
                break true;
            }
            let at = now();
            if deadline.is_some_and(|deadline| at >= deadline) {
                break false;
            }
            let until = deadline.unwrap_or(at + Duration::from_secs(3600));
            (core, _) = shared.idle.wait_until(core, until);
        };
        // Relaxed: a count of waiters; a worker that reads it late only
        // takes `Core` for nothing.
        shared.idle_waiters.fetch_sub(1, Relaxed);
        idle
    }

    /// True once [`shutdown`](Self::shutdown) has closed the shepherd to
    /// new operations: every submit made after this answers true is
    /// refused with [`Error::Shutdown`]. What was admitted before may still
    /// be running.
    pub fn is_shutdown(&self) -> bool {
        self.inner.shared.table.is_closed()
    }

    /// Stops the shepherd: refuses new operations with
    /// [`Error::Shutdown`]; completes every operation not yet due (waiting
    /// for its delay or a retry) with a [`Failure`] of
    /// [`Reason::Shutdown`], carrying its last error and attempt count;
    /// runs every operation already due, whose failures are then final
    /// (no more delays); runs each handler's
    /// [`terminate`](Handler::terminate); and joins the threads. Every
    /// handle resolves.
    ///
    /// Idempotent. Called from a handler (a thread cannot join itself), it
    /// begins the shutdown and returns. A handler that never returns keeps
    /// it waiting, as it would a [`Pool`](crate::Pool)'s.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sidejob::Error;
    /// use sidejob::shepherd::{Handler, Reason, Shepherd};
    /// # struct Echo;
    /// # impl Handler for Echo {
    /// #     type Op = u8; type Output = u8; type Error = ();
    /// #     fn handle(&mut self, n: &u8, _: u32) -> Result<u8, ()> { Ok(*n) }
    /// # }
    /// let shepherd = Shepherd::builder().capacity(8).build(|_| Echo)?;
    /// let now = shepherd.submit(1)?;
    /// let later = shepherd.submit_after(2, Duration::from_secs(3600))?;
    /// shepherd.shutdown();
    /// assert_eq!(now.wait(), Ok(1));
    /// let failure = later.wait().unwrap_err();
    /// assert_eq!((failure.reason(), failure.attempts()), (Reason::Shutdown, 0));
    /// assert_eq!(shepherd.submit(3).unwrap_err().error(), Error::Shutdown);
    /// assert_eq!(shepherd.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

impl<H: Handler> Inner<H> {
    fn on_own_thread(&self) -> bool {
        self.thread_ids.contains(&os_thread::current().id())
    }

    fn shutdown(&self) {
        let shared = &*self.shared;
        // 1. No new admission: a take either came before this (and finds
        //    `closing` below, or was queued before it) or is refused.
        shared.table.close();
        // 2. No more delays: what waits for its time is completed now.
        let drained = {
            let mut core = shared.core.lock();
            let drained = if core.closing {
                Vec::new()
            } else {
                core.closing = true;
                // Under `Core`, with `closing`: no retry or promotion
                // meets a closed line (state.rs). Wakes every sleeper.
                shared.line.close();
                core.queue.drain_delayed()
            };
            shared.timer.notify_all();
            shared.idle.notify_all();
            drained
        };
        let cell = shared.counters.shared_cell();
        for mut record in drained {
            let last = std::mem::replace(&mut record.last, LastAttempt::None);
            let failure = Failure::new(Reason::Shutdown, last, record.attempts);
            shared.finish(record, Err(failure), cell);
        }
        // 3. Join, unless this is one of the shepherd's own threads.
        if self.on_own_thread() {
            return;
        }
        let mut threads = self.threads.lock();
        for thread in threads.drain(..) {
            // The loops catch every user panic; a join error would be a
            // bug there, and shutdown must not panic on it.
            let _ = thread.join();
        }
    }
}

impl<H: Handler> Drop for Inner<H> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl<H: Handler> Clone for Shepherd<H> {
    fn clone(&self) -> Self {
        Shepherd {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<H: Handler> fmt::Debug for Shepherd<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shepherd")
            .field("name", &self.name())
            .field("capacity", &self.capacity())
            .field("workers", &self.workers())
            .field("usage", &self.usage())
            .field("shutdown", &self.is_shutdown())
            .finish()
    }
}

/// The figures of the shepherd whose state is `shared`, with `workers`
/// workers.
fn read_stats<H: Handler>(shared: &Shared<H>, workers: usize) -> ShepherdStats {
    let (due, delayed, next_due) = {
        let mut core = shared.core.lock();
        shared.promote(&mut core, shared.clock.now());
        (shared.due(), core.queue.delayed(), core.queue.next_due())
    };
    let (running, busy, _) = shared.counters.in_hand();
    let mut stats = ShepherdStats {
        due,
        delayed,
        running,
        busy,
        idle: workers.saturating_sub(busy),
        workers,
        next_due,
        attempts: 0,
        retries: 0,
        panicked: 0,
        timed_out: 0,
        budget_refused: 0,
        succeeded: 0,
        failed: 0,
        processed: 0,
        processing_time: Duration::ZERO,
        turnaround_time: Duration::ZERO,
        admission: shared.table.stats(),
    };
    shared.counters.read_into(&mut stats);
    stats
}

/// The latest representable instant not too far past `now`, for a delay
/// too long for an `Instant`: a century, or a year.
fn far_future(now: Instant) -> Instant {
    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);
    now.checked_add(YEAR * 100)
        .or_else(|| now.checked_add(YEAR))
        .unwrap_or(now)
}
