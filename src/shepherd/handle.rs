//! The completion handle of a submitted operation ([`Completion`]: blocking
//! or a `Future`) and what it resolves to on a final failure
//! ([`Failure`]).

use std::fmt;
use std::future::Future;
use std::future::IntoFuture;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::unit::Unit;
use crate::error::Error;
use crate::sync::{now, spin_poll, Arc, Condvar, Mutex};

/// Why the shepherd stopped trying an operation; see [`Failure::reason`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// The last attempt failed and it was the
    /// [`max_attempts`](crate::shepherd::RetryPolicy::max_attempts)-th.
    Exhausted,
    /// The last attempt failed in a way that is not retried: the handler's
    /// [`is_retryable`](crate::shepherd::Handler::is_retryable) said no, or the policy
    /// does not retry panics or timeouts.
    NotRetryable,
    /// A retry was due but the [`RetryBudget`](crate::shepherd::RetryBudget) had no
    /// retry left: the resource is failing for many operations at once.
    BudgetExhausted,
    /// The shepherd shut down before the operation could succeed: it was
    /// waiting for its delay or a retry, or its last attempt failed after
    /// the shutdown began.
    Shutdown,
}

/// What the last attempt of a failed operation did; see [`Failure::last`].
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LastAttempt<E> {
    /// No attempt was made (a delayed operation cut short by shutdown).
    None,
    /// The handler returned this error.
    Error(E),
    /// The handler panicked.
    Panicked,
    /// It ran past the [`attempt_timeout`](crate::shepherd::ShepherdBuilder::attempt_timeout).
    TimedOut,
}

impl<E: fmt::Debug> fmt::Debug for LastAttempt<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LastAttempt::None => f.write_str("None"),
            LastAttempt::Error(error) => f.debug_tuple("Error").field(error).finish(),
            LastAttempt::Panicked => f.write_str("Panicked"),
            LastAttempt::TimedOut => f.write_str("TimedOut"),
        }
    }
}

/// The final failure of an operation: why the shepherd gave up, what the
/// last attempt did (with the handler's error, if it returned one), and how
/// many attempts were made.
///
/// Admission errors never get here: [`Shepherd::submit`](crate::shepherd::Shepherd::submit)
/// refuses with the crate's [`Error`](Error) (`Overload`, `Timeout`,
/// `Shutdown`) and hands the operation back. Once a [`Completion`] exists,
/// the operation is the shepherd's, and it resolves to its output or to a
/// `Failure`. [`error`](Self::error) maps a failure the shepherd caused to
/// the crate's `Error` for callers that want one error type.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sidejob::shepherd::{Handler, LastAttempt, Reason, RetryPolicy, Shepherd};
///
/// struct Flaky;
/// impl Handler for Flaky {
///     type Op = ();
///     type Output = ();
///     type Error = &'static str;
///     fn handle(&mut self, _: &(), _attempt: u32) -> Result<(), &'static str> {
///         Err("connection refused")
///     }
/// }
///
/// let shepherd = Shepherd::builder()
///     .capacity(4)
///     .workers(1)
///     .retry(RetryPolicy::new().max_attempts(2).backoff(Duration::ZERO, Duration::ZERO))
///     .build(|_| Flaky)?;
/// let failure = shepherd.submit(())?.wait().unwrap_err();
/// assert_eq!(failure.reason(), Reason::Exhausted);
/// assert_eq!(failure.attempts(), 2);
/// assert_eq!(failure.last(), &LastAttempt::Error("connection refused"));
/// assert_eq!(failure.to_string(), "gave up after 2 attempts: connection refused");
/// assert_eq!(failure.error(), None); // the handler's error, not the shepherd's
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Failure<E> {
    reason: Reason,
    last: LastAttempt<E>,
    attempts: u32,
}

impl<E> Failure<E> {
    pub(crate) fn new(reason: Reason, last: LastAttempt<E>, attempts: u32) -> Self {
        Failure {
            reason,
            last,
            attempts,
        }
    }

    /// Why the shepherd stopped.
    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// What the last attempt did.
    pub fn last(&self) -> &LastAttempt<E> {
        &self.last
    }

    /// Attempts made, the first included (0 if none was).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The handler's error from the last attempt, if it returned one.
    pub fn last_error(&self) -> Option<&E> {
        match &self.last {
            LastAttempt::Error(error) => Some(error),
            _ => None,
        }
    }

    /// The handler's error from the last attempt, if it returned one.
    pub fn into_last_error(self) -> Option<E> {
        match self.last {
            LastAttempt::Error(error) => Some(error),
            _ => None,
        }
    }

    /// The crate's [`Error`](Error) when the shepherd, not the
    /// handler's error, ended the operation: `Shutdown` (reason
    /// [`Reason::Shutdown`]), else `WorkerPanicked` or `Timeout` for a last
    /// attempt that panicked or timed out. `None` when the last attempt
    /// returned an error of the handler's.
    pub fn error(&self) -> Option<Error> {
        if self.reason == Reason::Shutdown {
            return Some(Error::Shutdown);
        }
        match self.last {
            LastAttempt::Panicked => Some(Error::WorkerPanicked),
            LastAttempt::TimedOut => Some(Error::Timeout),
            LastAttempt::Error(_) | LastAttempt::None => None,
        }
    }

    /// True if shutdown ended the operation.
    pub fn is_shutdown(&self) -> bool {
        self.reason == Reason::Shutdown
    }
}

impl<E: fmt::Debug> fmt::Debug for Failure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failure")
            .field("reason", &self.reason)
            .field("last", &self.last)
            .field("attempts", &self.attempts)
            .finish()
    }
}

impl<E: fmt::Display> fmt::Display for Failure<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let attempts = self.attempts;
        let plural = if attempts == 1 { "" } else { "s" };
        match self.reason {
            Reason::Exhausted => write!(f, "gave up after {attempts} attempt{plural}")?,
            Reason::NotRetryable => write!(f, "not retryable, after {attempts} attempt{plural}")?,
            Reason::BudgetExhausted => {
                write!(f, "retry budget exhausted after {attempts} attempt{plural}")?
            }
            Reason::Shutdown => write!(f, "shut down after {attempts} attempt{plural}")?,
        }
        match &self.last {
            LastAttempt::None => Ok(()),
            LastAttempt::Error(error) => write!(f, ": {error}"),
            LastAttempt::Panicked => f.write_str(": the handler panicked"),
            LastAttempt::TimedOut => f.write_str(": the attempt timed out"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for Failure<E> {}

/// What a [`Completion`] resolves to.
pub(crate) type Outcome<T, E> = Result<T, Failure<E>>;

/// When an operation's unit of capacity goes back; chosen with
/// [`ShepherdBuilder::unit_release`](crate::shepherd::ShepherdBuilder::unit_release).
///
/// Either way, the unit is back before the caller has the outcome, so a
/// caller that gets its result and submits again never meets its own
/// stale unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum UnitRelease {
    /// The unit travels with the outcome, and the [`Completion`] gives it
    /// back as it hands the outcome over (`wait` and its kin, `.await`),
    /// on the caller's thread, or when it is dropped. The default, and
    /// the faster: the shard's cache line stays with the caller instead of
    /// crossing to the worker and back on every operation. An outcome not
    /// yet taken holds its unit, so `capacity` bounds those too; a caller
    /// that holds unread handles while it waits for capacity waits for
    /// itself (until `max_wait`).
    #[default]
    OnHandOver,
    /// The worker gives the unit back as the operation completes, before
    /// the handle resolves: `capacity` bounds only what is due, delayed
    /// or running. For callers that submit many operations before they
    /// read any outcome, with a waiting room that lets them wait for the
    /// workers rather than for themselves.
    OnCompletion,
}

/// What travels to a [`Completion`]: the outcome and, with
/// [`UnitRelease::OnHandOver`], the operation's unit, which the handle
/// gives back as it hands the outcome over (state.rs, "Where a unit goes
/// back").
pub(crate) type Delivery<T, E> = (Outcome<T, E>, Option<Unit>);

/// The outcome out of its delivery, the unit (if it came along) given back
/// first (here, on the caller's thread: the shard's line stays with the
/// caller).
#[inline]
fn hand_over<T, E>((outcome, unit): Delivery<T, E>) -> Outcome<T, E> {
    drop(unit);
    outcome
}

/// The completion of one submitted operation: its output, or its final
/// [`Failure`] after every retry.
///
/// Wait for it on a thread ([`wait`](Self::wait),
/// [`wait_timeout`](Self::wait_timeout)) or `.await` it on any executor: it
/// is a `Future` that is `Send + 'static` when the output and error are
/// `Send`. It resolves exactly once: every path of the shepherd, shutdown
/// included, completes it (a handle whose operation could not be completed
/// at all, which would be a bug, resolves to [`Reason::Shutdown`] rather
/// than hang).
///
/// # Cancel safety
///
/// Dropping a `Completion` does not cancel the operation: it is still
/// attempted and retried, holding its unit of capacity until its final
/// outcome, which is then dropped and the unit given back.
///
/// # The unit comes back with the outcome
///
/// The operation's unit of capacity travels with its outcome, and the
/// handle gives it back as it hands the outcome over, before `wait` (and
/// its kin, and `.await`) returns, on the caller's thread. An outcome that
/// is in but not taken still holds its unit, so take or drop handles
/// promptly; dropping one whose outcome is in gives the unit back at once.
/// (That is the default, [`UnitRelease::OnHandOver`]; with
/// [`UnitRelease::OnCompletion`] the worker gives it back as the operation
/// completes.)
///
/// ```
/// use std::time::Duration;
/// # use sidejob::shepherd::{Handler, Shepherd};
/// # struct Echo;
/// # impl Handler for Echo {
/// #     type Op = u8; type Output = u8; type Error = ();
/// #     fn handle(&mut self, n: &u8, _: u32) -> Result<u8, ()> { Ok(*n) }
/// # }
/// let shepherd = Shepherd::builder().capacity(1).build(|_| Echo)?;
/// let done = shepherd.submit(7)?;
/// assert!(shepherd.wait_idle(Duration::from_secs(60))); // completed,
/// assert_eq!(shepherd.usage(), 1); // but not taken: it holds its unit
/// assert!(shepherd.try_submit(8).unwrap_err().is_overload());
/// assert_eq!(done.wait(), Ok(7)); // taken: the unit is back
/// assert_eq!(shepherd.usage(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Examples
///
/// ```
/// # use sidejob::shepherd::{Handler, Shepherd};
/// # struct Double;
/// # impl Handler for Double {
/// #     type Op = u32; type Output = u32; type Error = ();
/// #     fn handle(&mut self, n: &u32, _: u32) -> Result<u32, ()> { Ok(n * 2) }
/// # }
/// let shepherd = Shepherd::builder().capacity(8).build(|_| Double)?;
/// let runtime = tokio::runtime::Builder::new_current_thread().build()?;
/// let doubled = runtime.block_on(async {
///     let done = shepherd.submit(21).unwrap();
///     done.await
/// });
/// assert_eq!(doubled, Ok(42));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping a completion does not cancel the operation; its outcome is lost"]
pub struct Completion<T, E> {
    slot: Slot<Delivery<T, E>>,
    spin: Duration,
}

/// oneshot's receiver is blocking until it is turned into its future half
/// (`IntoFuture`), which only polls: a handle starts blocking and turns
/// async on its first poll, and a blocking wait on a polled handle parks on
/// a waker of its own ([`park_on`]).
enum Slot<T> {
    Blocking(oneshot::Receiver<T>),
    Async(oneshot::AsyncReceiver<T>),
    /// Only between the two, inside `poll`.
    Moving,
}

impl<T, E> Completion<T, E> {
    pub(crate) fn new(receiver: oneshot::Receiver<Delivery<T, E>>, spin: Duration) -> Self {
        Completion {
            slot: Slot::Blocking(receiver),
            spin,
        }
    }

    /// Blocks until the operation's final outcome: spins briefly (a fast
    /// operation completes sooner than a thread parks and wakes), then
    /// sleeps.
    ///
    /// # Errors
    ///
    /// The operation's [`Failure`] once the shepherd gave up on it.
    pub fn wait(self) -> Result<T, Failure<E>> {
        if let Some(outcome) = self.poll_for(self.spin) {
            return outcome;
        }
        match self.slot {
            Slot::Blocking(receiver) => receiver.recv().map_or_else(|_| Err(lost()), hand_over),
            Slot::Async(receiver) => match park_on(receiver, None) {
                Ok(outcome) => outcome,
                // Without a deadline `park_on` only returns the outcome.
                Err(_) => Err(lost()),
            },
            Slot::Moving => Err(lost()),
        }
    }

    /// As [`wait`](Self::wait) for at most `timeout`; the handle back if
    /// the operation is still going (it is not cancelled: wait again, or
    /// drop the handle).
    ///
    /// # Errors
    ///
    /// `Err(self)` when the timeout passed first.
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
    /// let shepherd = Shepherd::builder().capacity(2).build(|_| Echo)?;
    /// // Not run for an hour: the wait times out and hands the handle back.
    /// let later = shepherd.submit_after(1, Duration::from_secs(3600))?;
    /// let later = later.wait_timeout(Duration::from_millis(1)).unwrap_err();
    /// assert_eq!(shepherd.submit(2)?.wait_timeout(Duration::from_secs(60)).ok(), Some(Ok(2)));
    /// shepherd.shutdown(); // the delayed one is completed with `Shutdown`
    /// assert!(later.wait().unwrap_err().is_shutdown());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_timeout(self, timeout: Duration) -> Result<Outcome<T, E>, Self> {
        if let Some(outcome) = self.poll_for(self.spin.min(timeout)) {
            return Ok(outcome);
        }
        match now().checked_add(timeout) {
            Some(deadline) => self.wait_deadline(deadline),
            None => Ok(self.wait()),
        }
    }

    /// As [`wait_timeout`](Self::wait_timeout), until `deadline`.
    ///
    /// # Errors
    ///
    /// `Err(self)` when the deadline passed first.
    pub fn wait_deadline(self, deadline: Instant) -> Result<Outcome<T, E>, Self> {
        let spin = self.spin;
        match self.slot {
            Slot::Blocking(receiver) => match receiver.recv_deadline(deadline) {
                Ok(delivery) => Ok(hand_over(delivery)),
                Err(oneshot::RecvTimeoutError::Timeout) => Err(Completion {
                    slot: Slot::Blocking(receiver),
                    spin,
                }),
                Err(oneshot::RecvTimeoutError::Disconnected) => Ok(Err(lost())),
            },
            Slot::Async(receiver) => {
                park_on(receiver, Some(deadline)).map_err(|receiver| Completion {
                    slot: Slot::Async(receiver),
                    spin,
                })
            }
            Slot::Moving => Ok(Err(lost())),
        }
    }

    /// The outcome if it is there, without waiting; the handle back if not.
    ///
    /// # Errors
    ///
    /// `Err(self)` while the operation is still going.
    pub fn try_wait(self) -> Result<Outcome<T, E>, Self> {
        match self.poll_for(Duration::ZERO) {
            Some(outcome) => Ok(outcome),
            None => Err(self),
        }
    }

    /// Polls for the outcome for up to `spin`.
    fn poll_for(&self, spin: Duration) -> Option<Outcome<T, E>> {
        match &self.slot {
            Slot::Blocking(receiver) => spin_poll(spin, || match receiver.try_recv() {
                Ok(delivery) => Some(hand_over(delivery)),
                Err(oneshot::TryRecvError::Disconnected) => Some(Err(lost())),
                Err(oneshot::TryRecvError::Empty) => None,
            }),
            // A polled handle: `park_on` takes it from here.
            Slot::Async(_) | Slot::Moving => None,
        }
    }
}

/// The outcome of a completion whose sender was dropped unsent: no path of
/// the shepherd does that; if one ever did, the caller hears `Shutdown`
/// instead of hanging.
fn lost<E>() -> Failure<E> {
    Failure::new(Reason::Shutdown, LastAttempt::None, 0)
}

/// Wakes a thread blocked in [`park_on`].
struct Parker {
    woken: Mutex<bool>,
    wake: Condvar,
}

impl std::task::Wake for Parker {
    fn wake(self: Arc<Self>) {
        *self.woken.lock() = true;
        self.wake.notify_all();
    }
}

/// Blocks on the future half of a reply slot (a handle polled once, then
/// waited for): polls it with a waker that unparks this thread, until the
/// outcome or `deadline`; the receiver back at the deadline.
fn park_on<T, E>(
    mut receiver: oneshot::AsyncReceiver<Delivery<T, E>>,
    deadline: Option<Instant>,
) -> Result<Outcome<T, E>, oneshot::AsyncReceiver<Delivery<T, E>>> {
    let parker = Arc::new(Parker {
        woken: Mutex::new(false),
        wake: Condvar::new(),
    });
    let waker = Waker::from(Arc::clone(&parker));
    let mut cx = Context::from_waker(&waker);
    loop {
        match Pin::new(&mut receiver).poll(&mut cx) {
            Poll::Ready(Ok(delivery)) => return Ok(hand_over(delivery)),
            Poll::Ready(Err(_)) => return Ok(Err(lost())),
            Poll::Pending => {}
        }
        let mut woken = parker.woken.lock();
        while !*woken {
            let at = now();
            if deadline.is_some_and(|deadline| at >= deadline) {
                return Err(receiver);
            }
            // No deadline: sleep in long steps (a wake-up re-polls).
            let until = deadline.unwrap_or(at + Duration::from_secs(3600));
            (woken, _) = parker.wake.wait_until(woken, until);
        }
        *woken = false;
    }
}

impl<T, E> Future for Completion<T, E> {
    type Output = Outcome<T, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every field is `Unpin`, so is `Completion`.
        let this = self.get_mut();
        if let Slot::Blocking(_) = this.slot {
            if let Slot::Blocking(receiver) = std::mem::replace(&mut this.slot, Slot::Moving) {
                this.slot = Slot::Async(receiver.into_future());
            }
        }
        let Slot::Async(receiver) = &mut this.slot else {
            return Poll::Ready(Err(lost()));
        };
        match Pin::new(receiver).poll(cx) {
            Poll::Ready(Ok(delivery)) => Poll::Ready(hand_over(delivery)),
            Poll::Ready(Err(_)) => Poll::Ready(Err(lost())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T, E> fmt::Debug for Completion<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion").finish_non_exhaustive()
    }
}
