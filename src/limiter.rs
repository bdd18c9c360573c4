//! [`Limiter`]: the bare admission table, handing out permits for work done
//! on the caller's own thread.

use std::fmt;
use std::hash::Hash;

use crate::engine::ask::How;
use crate::engine::keys::{self, KeySettings};
use crate::engine::probe::Probe;
use crate::engine::table::{Grant, Shard, Table};
use crate::engine::waiters::{Policy, QueueOrder};
use crate::error::{ConfigError, Error};
use crate::stats::Stats;
use crate::sync::Arc;
use crate::units::{sealed::Sealed, Ask, Many, One, Units};

/// A fail-fast, sharded concurrency limit: at most `capacity` permits are
/// out at once, and the next [`try_acquire`](Limiter::try_acquire) is
/// refused with [`Error::Overload`] at once.
///
/// There is no waiting: a `Limiter` answers "yes, go" or "no, shed this",
/// in a few nanoseconds, from any number of threads. Capacity is split
/// across shards (by default one per CPU), each a counter on its own cache
/// line; a caller starts at its own shard and moves on only if that one is
/// full, so callers on different cores do not contend. The split is exact:
/// the shard limits add up to `capacity`, so no more than `capacity`
/// permits are ever out. A refusal means every shard was *seen* at its
/// limit during the call, not that all were full at one instant: a permit
/// freed on a shard the caller had already passed does not save the call,
/// so callers near the capacity are, rarely, refused while a unit is free
/// ([`Error::Overload`] says exactly what a refusal promises).
///
/// # Where the permit goes
///
/// A `Limiter` bounds only the code that runs while a permit is held. Take
/// the permit first thing in the handler, before any work (parsing,
/// reading the body, a database call): work done before `try_acquire` is
/// never limited, and work that blocks an async runtime's threads before
/// it reaches `try_acquire` keeps the other requests from reaching it too.
/// A CPU-bound handler on an async runtime is already bounded by the
/// runtime's worker threads, whatever the limit (an axum handler spinning
/// the CPU never had more than 2 permits out against a limit of 32, on a
/// runtime with 2 threads): the limit only means something for work that
/// awaits. Run CPU-bound work on `tokio::task::spawn_blocking` or a thread
/// [`Pool`](crate::Pool), with the permit moved into it
/// ([`try_acquire_owned`](Self::try_acquire_owned)), so the permit covers
/// the work and the runtime's threads stay free to answer `Overload`.
///
/// # Memory ordering
///
/// Dropping a permit *synchronizes with* a later `try_acquire` that is
/// admitted on the same shard: everything the holder did before the drop
/// happens-before everything the next holder does. Permits on different
/// shards are not ordered with each other; use your own synchronization if
/// you need that.
///
/// # Examples
///
/// Limit the number of requests being handled at the same time, shedding
/// the rest:
///
/// ```
/// use std::sync::Arc;
/// use std::thread;
/// use sidejob::{Error, Limiter};
///
/// let limiter = Arc::new(Limiter::new(4)?);
/// let handles: Vec<_> = (0..8)
///     .map(|_| {
///         let limiter = Arc::clone(&limiter);
///         thread::spawn(move || match limiter.try_acquire() {
///             Ok(_permit) => true,               // handle the request here
///             Err(Error::Overload) => false,     // shed it: answer "busy"
///             Err(other) => panic!("{other}"),
///         })
///     })
///     .collect();
/// let served = handles.into_iter().map(|h| h.join().unwrap()).filter(|&ok| ok).count();
/// // At least one thread always gets in; never more than 4 at once.
/// assert!(served >= 1);
/// assert_eq!(limiter.usage(), 0);
/// let stats = limiter.stats();
/// assert_eq!(stats.accepted + stats.rejected, 8);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Limiter {
    table: Table,
    /// Its metric series' `name` label (`observe::Reporter`).
    name: Box<str>,
    /// True if its builder was given a name, even the default one: a
    /// reporter refuses a name taken by another live front-end only then.
    named: bool,
}

impl Limiter {
    /// A limiter of `capacity` permits over one shard per CPU.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `capacity` if it is 0 or absurdly large.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = sidejob::Limiter::new(100)?;
    /// assert_eq!(limiter.capacity(), 100);
    /// assert!(sidejob::Limiter::new(0).is_err());
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    pub fn new(capacity: usize) -> Result<Limiter, ConfigError> {
        Limiter::builder().capacity(capacity).build()
    }

    /// A builder, to choose the shard count or the [`Probe`].
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// Takes a permit if any shard has room; never waits.
    ///
    /// The permit is given back when it is dropped, on every path
    /// (unwinding included; a permit dropped while its thread panics is
    /// counted in [`Stats::panicked`]).
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`] when every shard was seen at its limit during
    ///   the call (see [`Error::Overload`] for what that promises); the
    ///   refusal is counted in [`Stats::rejected`].
    /// * [`Error::Shutdown`] once [`close`](Self::close) has been called.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Limiter};
    ///
    /// let limiter = Limiter::new(1)?;
    /// let permit = limiter.try_acquire()?;
    /// assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    /// drop(permit);
    /// assert!(limiter.try_acquire().is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire(&self) -> Result<Permit<'_>, Error> {
        let shard = self.table.acquire_shard()?;
        Ok(Permit {
            limiter: self,
            shard,
            units: One,
        })
    }

    /// Like [`try_acquire`](Self::try_acquire), but the permit owns a clone
    /// of the `Arc`, so it can move into another thread or task.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`] when every shard was seen at its limit during
    ///   the call.
    /// * [`Error::Shutdown`] once [`close`](Self::close) has been called.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::Limiter;
    ///
    /// let limiter = Arc::new(Limiter::new(2)?);
    /// let permit = limiter.try_acquire_owned()?;
    /// let worker = std::thread::spawn(move || {
    ///     let _permit = permit; // released when this thread is done
    /// });
    /// worker.join().unwrap();
    /// assert_eq!(limiter.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_owned(self: &Arc<Self>) -> Result<OwnedPermit, Error> {
        let shard = self.table.acquire()?;
        Ok(OwnedPermit {
            limiter: Arc::clone(self),
            shard,
            units: One,
        })
    }

    /// Takes `n` units at once, all or nothing, if the limiter has `n` free;
    /// never waits. tokio's `Semaphore::try_acquire_many`.
    ///
    /// The units come from one shard when one has room for all of them (a
    /// single CAS, as for one unit), else from several, taken together
    /// under the limiter's control lock once exact reads show all `n`
    /// free: a refused request takes no unit it might give back (only a
    /// take a racing resize cancels is undone, as for one unit), so it
    /// never makes a one-unit caller that would fit see `Overload`. The
    /// permit gives every unit back when it is dropped;
    /// [`split`](Permit::split) and [`merge`](Permit::merge) move units
    /// between permits. `try_acquire_many(0)` is a permit of no units (it
    /// gives nothing back).
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`] when the shards, read one after another during
    ///   the call, showed fewer than `n` free; counted in
    ///   [`Stats::rejected`].
    /// * [`Error::TooLarge`] at once when `n` (more than one) is above the
    ///   [capacity](Self::capacity) in force: it could never be admitted
    ///   as the capacity stands. Not counted as a rejection.
    ///   `try_acquire_many(1)` answers as [`try_acquire`](Self::try_acquire)
    ///   does, `Overload` at a capacity of 0.
    /// * [`Error::Shutdown`] once [`close`](Self::close) has been called.
    ///
    /// # Examples
    ///
    /// A query that holds 8 of 64 connections:
    ///
    /// ```
    /// use sidejob::{Error, Limiter};
    ///
    /// let limiter = Limiter::builder().capacity(64).shards(4).build()?;
    /// let query = limiter.try_acquire_many(8)?;
    /// assert_eq!((query.units(), limiter.usage()), (8, 8));
    /// // Wider than any one shard (16 each): taken from several.
    /// let batch = limiter.try_acquire_many(40)?;
    /// assert_eq!(limiter.available(), 16);
    /// assert_eq!(limiter.try_acquire_many(17).unwrap_err(), Error::Overload);
    /// assert_eq!(limiter.try_acquire_many(65).unwrap_err(), Error::TooLarge);
    /// drop((query, batch));
    /// assert_eq!(limiter.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_many(&self, n: usize) -> Result<Permit<'_, Many>, Error> {
        // The common case built in place: no grant to take apart.
        if let Some(shard) = self.table.take_home_n(n) {
            return Ok(Permit {
                limiter: self,
                shard,
                units: Many {
                    here: n,
                    rest: Vec::new(),
                    class: crate::Class::Critical,
                    key: 0,
                },
            });
        }
        let (shard, units) = Many::from_grant(self.table.acquire_many_cold(n)?);
        Ok(Permit {
            limiter: self,
            shard: self.table.shard(shard),
            units,
        })
    }

    /// [`try_acquire_many`](Self::try_acquire_many) for an `Arc<Limiter>`:
    /// the permit owns a clone of the `Arc`, so it can move into another
    /// thread or task. tokio's `Semaphore::try_acquire_many_owned`.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_many`](Self::try_acquire_many).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::Limiter;
    ///
    /// let cores = Arc::new(Limiter::new(16)?);
    /// let job = cores.try_acquire_many_owned(4)?; // a job that needs 4 of 16 cores
    /// std::thread::spawn(move || {
    ///     assert_eq!(job.units(), 4); // held while the job runs
    /// })
    /// .join()
    /// .unwrap();
    /// assert_eq!(cores.usage(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_acquire_many_owned(self: &Arc<Self>, n: usize) -> Result<OwnedPermit<Many>, Error> {
        let (shard, units) = Many::from_grant(self.table.acquire_many(n)?);
        Ok(OwnedPermit {
            limiter: Arc::clone(self),
            shard,
            units,
        })
    }

    /// Takes a permit, waiting for one if every shard is full and the
    /// limiter has a waiting room; blocks the thread while it waits.
    ///
    /// A permit at once if one is free. Otherwise, if fewer than
    /// [`max_waiters`](LimiterBuilder::max_waiters) callers wait, wait in
    /// the [`queue_order`](LimiterBuilder::queue_order) for up to
    /// [`max_wait`](LimiterBuilder::max_wait): a dropped permit is handed
    /// straight to a waiter, never to a newcomer. Without a waiting room
    /// (the default), this is [`try_acquire`](Self::try_acquire).
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`] at once when the waiting room is full (or
    ///   there is none); counted in [`Stats::rejected`].
    /// * [`Error::Timeout`] when `max_wait` passed without a permit;
    ///   counted in [`Stats::timed_out`].
    /// * [`Error::Shutdown`] once the limiter is [closed](Self::close),
    ///   including for callers waiting then.
    ///
    /// # Examples
    ///
    /// An HTTP worker runs 2 requests at once and lets up to 4 more wait:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use sidejob::{Error, Limiter};
    ///
    /// let limiter = Arc::new(
    ///     Limiter::builder()
    ///         .capacity(2)
    ///         .max_waiters(4)
    ///         .max_wait(Duration::from_secs(30))
    ///         .build()?,
    /// );
    /// let held = (limiter.try_acquire_owned()?, limiter.try_acquire_owned()?);
    /// let waiter = {
    ///     let limiter = Arc::clone(&limiter);
    ///     std::thread::spawn(move || limiter.acquire().map(|permit| permit.shard()))
    /// };
    /// while limiter.waiting() == 0 {
    ///     std::thread::yield_now(); // until the waiter is queued
    /// }
    /// drop(held.0); // handed straight to the waiter
    /// assert!(waiter.join().unwrap().is_ok());
    /// assert_eq!(limiter.stats().waited, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire(&self) -> Result<Permit<'_>, Error> {
        let shard = self.table.shard(self.table.acquire_waiting(None)?);
        Ok(Permit {
            limiter: self,
            shard,
            units: One,
        })
    }

    /// [`acquire`](Self::acquire) as a future: waits without blocking the
    /// executor's thread. The future is `Send` and borrows the limiter.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the wait: it leaves the queue, and a
    /// permit handed to it meanwhile goes to the next waiter (or back to
    /// the limiter). No permit is ever lost.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    /// # rt.block_on(async {
    /// use std::time::Duration;
    /// use sidejob::{Error, Limiter};
    ///
    /// let limiter = Limiter::builder().capacity(1).max_waiters(1).build()?;
    /// let held = limiter.acquire_async().await?;
    /// // The room holds one waiter: it gives up after 10 ms here.
    /// let waited = tokio::time::timeout(Duration::from_millis(10), limiter.acquire_async()).await;
    /// assert!(waited.is_err());
    /// assert_eq!(limiter.waiting(), 0); // the dropped waiter left the queue
    /// drop(held);
    /// assert!(limiter.acquire_async().await.is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn acquire_async(&self) -> Result<Permit<'_>, Error> {
        let shard = self.table.shard(self.table.acquire_async(None).await?);
        Ok(Permit {
            limiter: self,
            shard,
            units: One,
        })
    }

    /// [`acquire_async`](Self::acquire_async) for an `Arc<Limiter>`: the
    /// future and its permit own a clone of the `Arc`, so both are
    /// `Send + 'static` (spawn the future, move the permit into a task).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_async`](Self::acquire_async).
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use std::sync::Arc;
    /// use sidejob::Limiter;
    ///
    /// let limiter = Arc::new(Limiter::builder().capacity(1).max_waiters(8).build()?);
    /// let first = Arc::clone(&limiter).acquire_owned_async().await?;
    /// let second = tokio::spawn(Arc::clone(&limiter).acquire_owned_async());
    /// tokio::task::yield_now().await; // the second waits
    /// drop(first);
    /// let second = second.await??;
    /// assert_eq!(limiter.usage(), 1);
    /// drop(second);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    // Not `async fn`: the signature states `Send + 'static`, which is the
    // point of this form, and the compiler then holds us to it.
    #[allow(clippy::manual_async_fn)]
    pub fn acquire_owned_async(
        self: Arc<Self>,
    ) -> impl std::future::Future<Output = Result<OwnedPermit, Error>> + Send + 'static {
        async move {
            let shard = self.table.acquire_async(None).await?;
            Ok(OwnedPermit {
                limiter: self,
                shard,
                units: One,
            })
        }
    }

    /// Takes `n` units at once, waiting for them if they are not free and
    /// the limiter has a waiting room; blocks the thread while it waits.
    ///
    /// Where tokio's `acquire_many` is strict FIFO (a waiting request of
    /// half the capacity holds every small one behind it) and a first-fit
    /// semaphore lets large requests starve under small load, the waiting
    /// room here takes the bounded middle:
    ///
    /// * the request first in the room's [order](LimiterBuilder::queue_order)
    ///   is served as soon as its `n` units are free, all at once;
    /// * while they are not, later requests that fit may pass it, until
    ///   they have taken the [pass budget](LimiterBuilder::pass_budget)
    ///   (by default the capacity in force: one turnover of the whole
    ///   limiter, about one mean service time under load) past it;
    /// * from then on every freed unit is kept for it until it has all
    ///   `n`. If it gives up first (its `max_wait`, a dropped future), what
    ///   it had collected goes to the next waiters at once.
    ///
    /// Without a waiting room, this is [`try_acquire_many`](Self::try_acquire_many).
    /// The guide (`docs/guide/weighted.md`) compares the three rules.
    ///
    /// # Errors
    ///
    /// * [`Error::TooLarge`] at once when `n` is above the capacity in
    ///   force.
    /// * [`Error::Overload`] at once when the waiting room is full (or
    ///   there is none); counted in [`Stats::rejected`].
    /// * [`Error::Timeout`] when `max_wait` passed before all `n` came;
    ///   counted in [`Stats::timed_out`]. Units collected meanwhile go to
    ///   the next waiters (or back to the limiter).
    /// * [`Error::Shutdown`] once the limiter is [closed](Self::close).
    ///
    /// # Examples
    ///
    /// A batch of 3 waits behind a full limiter of 4; one-unit requests may
    /// pass it while it waits, within its pass budget:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use sidejob::Limiter;
    ///
    /// let limiter = Arc::new(
    ///     Limiter::builder()
    ///         .capacity(4)
    ///         .max_waiters(8)
    ///         .max_wait(Duration::from_secs(30))
    ///         .build()?,
    /// );
    /// let held: Vec<_> = (0..4).map(|_| limiter.try_acquire_owned()).collect::<Result<_, _>>()?;
    /// let batch = {
    ///     let limiter = Arc::clone(&limiter);
    ///     std::thread::spawn(move || limiter.acquire_many(3).map(|p| p.units()))
    /// };
    /// while limiter.waiting() == 0 {
    ///     std::thread::yield_now(); // until the batch is queued
    /// }
    /// drop(held); // four free: the batch takes three
    /// assert_eq!(batch.join().unwrap()?, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_many(&self, n: usize) -> Result<Permit<'_, Many>, Error> {
        self.acquire_with(Ask::new().units(n))
    }

    /// Takes what `ask` describes: its units, all or nothing, failing fast
    /// or waiting as it says (blocking the thread while it waits). Every
    /// other way to take units is this one with a fixed ask:
    /// [`acquire_many(n)`](Self::acquire_many) is
    /// `acquire_with(Ask::new().units(n))`,
    /// [`try_acquire_many(n)`](Self::try_acquire_many) the same ask
    /// `.fail_fast()` (on a faster path).
    ///
    /// A waiting ask waits only if the limiter has a waiting room
    /// ([`max_waiters`](LimiterBuilder::max_waiters)); it is served as
    /// [`acquire_many`](Self::acquire_many) says, and gives up at its
    /// [deadline](Ask::wait_until) or the room's `max_wait`, whichever
    /// comes first.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many); [`Error::Timeout`] also
    /// when the ask's own deadline passed first.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use sidejob::{units::Ask, Error, Limiter};
    ///
    /// let limiter = Limiter::builder().capacity(8).max_waiters(4).build()?;
    /// let big = limiter.acquire_with(Ask::new().units(6))?;
    /// // Three more are not free: wait for them 10 ms at most.
    /// let deadline = Instant::now() + Duration::from_millis(10);
    /// let late = limiter.acquire_with(Ask::new().units(3).wait_until(deadline));
    /// assert_eq!(late.unwrap_err(), Error::Timeout);
    /// drop(big);
    /// assert_eq!(limiter.acquire_with(Ask::new().units(3))?.units(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_with(&self, ask: Ask) -> Result<Permit<'_, Many>, Error> {
        let (shard, units) = Many::from_grant(self.table.admit(&ask)?);
        Ok(Permit {
            limiter: self,
            shard: self.table.shard(shard),
            units,
        })
    }

    /// [`acquire_with`](Self::acquire_with) as a future: a waiting ask
    /// waits without blocking the executor's thread; any other is answered
    /// at once.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many_async`](Self::acquire_many_async): dropping the
    /// future gives up the wait, and every unit handed to it or collected
    /// for it goes to the next waiters (or back to the limiter).
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use sidejob::{units::Ask, Limiter};
    ///
    /// let limiter = Limiter::builder().capacity(8).max_waiters(4).build()?;
    /// let query = limiter.acquire_with_async(Ask::new().units(2)).await?;
    /// assert_eq!((query.units(), limiter.available()), (2, 6));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn acquire_with_async(&self, ask: Ask) -> Result<Permit<'_, Many>, Error> {
        let (shard, units) = Many::from_grant(self.table.admit_async(ask).await?);
        Ok(Permit {
            limiter: self,
            shard: self.table.shard(shard),
            units,
        })
    }

    /// [`acquire_many`](Self::acquire_many) as a future: waits without
    /// blocking the executor's thread. tokio's `Semaphore::acquire_many`,
    /// with the bounded passing of [`acquire_many`](Self::acquire_many)
    /// instead of strict FIFO.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the wait: it leaves the queue, and
    /// every unit handed to it or collected for it meanwhile goes to the
    /// next waiters (or back to the limiter). No unit is ever lost.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use sidejob::Limiter;
    ///
    /// let limiter = Limiter::builder().capacity(8).max_waiters(4).build()?;
    /// let upload = limiter.acquire_many_async(5).await?; // weighed by its size
    /// assert_eq!(limiter.available(), 3);
    /// drop(upload);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn acquire_many_async(&self, n: usize) -> Result<Permit<'_, Many>, Error> {
        self.acquire_with_async(Ask::new().units(n)).await
    }

    /// [`acquire_many_async`](Self::acquire_many_async) for an
    /// `Arc<Limiter>`: the future and its permit are `Send + 'static`.
    /// tokio's `Semaphore::acquire_many_owned`.
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many_async`](Self::acquire_many_async).
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use std::sync::Arc;
    /// use sidejob::Limiter;
    ///
    /// let cores = Arc::new(Limiter::builder().capacity(16).max_waiters(64).build()?);
    /// let job = tokio::spawn(Arc::clone(&cores).acquire_many_owned_async(4));
    /// let permit = job.await??;
    /// assert_eq!((permit.units(), cores.usage()), (4, 4));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    // Not `async fn`: the signature states `Send + 'static`.
    #[allow(clippy::manual_async_fn)]
    pub fn acquire_many_owned_async(
        self: Arc<Self>,
        n: usize,
    ) -> impl std::future::Future<Output = Result<OwnedPermit<Many>, Error>> + Send + 'static {
        self.wait_ask_owned(Ask::new().units(n))
    }

    /// [`acquire_with`](Self::acquire_with) for an `Arc<Limiter>`: the
    /// permit owns a clone of the `Arc`, so it can move into another
    /// thread or task.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::{units::Ask, Limiter};
    ///
    /// let limiter = Arc::new(Limiter::new(8)?);
    /// let permit = limiter.acquire_with_owned(Ask::new().key("tenant-a").units(2))?;
    /// std::thread::spawn(move || drop(permit)).join().unwrap();
    /// assert_eq!((limiter.usage(), limiter.key_usage("tenant-a")), (0, 0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_with_owned(self: &Arc<Self>, ask: Ask) -> Result<OwnedPermit<Many>, Error> {
        let (shard, units) = Many::from_grant(self.table.admit(&ask)?);
        Ok(OwnedPermit {
            limiter: Arc::clone(self),
            shard,
            units,
        })
    }

    /// [`acquire_with_async`](Self::acquire_with_async) for an
    /// `Arc<Limiter>`: the future and its permit are `Send + 'static`.
    ///
    /// # Errors
    ///
    /// As [`acquire_with`](Self::acquire_with).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_with_async`](Self::acquire_with_async).
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use std::sync::Arc;
    /// use sidejob::{units::Ask, Limiter};
    ///
    /// let limiter = Arc::new(Limiter::builder().capacity(4).max_waiters(8).build()?);
    /// let ask = Ask::new().key("tenant-a");
    /// let job = tokio::spawn(Arc::clone(&limiter).acquire_with_owned_async(ask));
    /// let permit = job.await??;
    /// assert_eq!(limiter.key_usage("tenant-a"), permit.units());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    // Not `async fn`: the signature states `Send + 'static`.
    #[allow(clippy::manual_async_fn)]
    pub fn acquire_with_owned_async(
        self: Arc<Self>,
        ask: Ask,
    ) -> impl std::future::Future<Output = Result<OwnedPermit<Many>, Error>> + Send + 'static {
        async move {
            let grant = self.table.admit_async(ask).await?;
            let (shard, units) = Many::from_grant(grant);
            Ok(OwnedPermit {
                limiter: self,
                shard,
                units,
            })
        }
    }

    /// How many callers wait for a permit now (0 without a waiting room).
    pub fn waiting(&self) -> usize {
        self.table.waiting()
    }

    /// Refuses every later permit with [`Error::Shutdown`]; the permits out
    /// now stay valid and are given back as usual.
    ///
    /// Like tokio's `Semaphore::close`, but the permits already taken are
    /// not affected: [`usage`](Self::usage) falls to 0 as they drop. A
    /// refusal after `close` is not an overload: it is not counted in
    /// [`Stats::rejected`]. Closing twice is harmless; there is no reopening.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Limiter};
    ///
    /// let limiter = Limiter::new(4)?;
    /// let held = limiter.try_acquire()?;
    /// limiter.close();
    /// assert!(limiter.is_closed());
    /// assert_eq!(limiter.try_acquire().unwrap_err(), Error::Shutdown);
    /// assert_eq!(limiter.usage(), 1);
    /// drop(held);
    /// assert_eq!(limiter.usage(), 0);
    /// assert_eq!(limiter.stats().rejected, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn close(&self) {
        self.table.close();
    }

    /// True once [`close`](Self::close) has closed the limiter: every
    /// acquire made after this answers true is refused with
    /// [`Error::Shutdown`].
    pub fn is_closed(&self) -> bool {
        self.table.is_closed()
    }

    /// Permits out now.
    pub fn usage(&self) -> usize {
        self.table.usage()
    }

    /// The fraction of the capacity in force that requests of `class` may
    /// fill (see [`LimiterBuilder::headroom`]): 1 for the two top classes.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Class, Limiter};
    ///
    /// let limiter = Limiter::new(10)?;
    /// assert_eq!(limiter.headroom(Class::Critical), 1.0);
    /// assert_eq!(limiter.headroom(Class::Sheddable), 0.8);
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    pub fn headroom(&self, class: crate::Class) -> f64 {
        self.table.headroom_fraction(class)
    }

    /// The min share of the capacity in force that `class` may hold
    /// whatever its headroom (see [`LimiterBuilder::min_share`]): 0 if it
    /// has none, as the two top classes never do.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Class, Limiter};
    ///
    /// let limiter = Limiter::builder()
    ///     .capacity(100)
    ///     .min_share(Class::Sheddable, 0.05)
    ///     .build()?;
    /// assert_eq!(limiter.min_share(Class::Sheddable), 0.05);
    /// assert_eq!(limiter.min_share(Class::SheddablePlus), 0.0);
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    pub fn min_share(&self, class: crate::Class) -> f64 {
        self.table.min_share_fraction(class)
    }

    /// Sets the cap of every key without one of its own (see
    /// [`LimiterBuilder::per_key_cap`]); `None`: no cap but the capacity.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `per_key_cap` for `Some(0)`.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = sidejob::Limiter::new(10)?;
    /// limiter.set_per_key_cap(Some(4))?;
    /// assert_eq!(limiter.per_key_cap(), Some(4));
    /// limiter.set_per_key_cap(None)?;
    /// assert_eq!(limiter.per_key_cap(), None);
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    pub fn set_per_key_cap(&self, units: Option<usize>) -> Result<(), ConfigError> {
        if units == Some(0) {
            return Err(ConfigError::zero("per_key_cap"));
        }
        self.table
            .keys()
            .set_per_key_cap(units.unwrap_or(usize::MAX));
        Ok(())
    }

    /// The cap of a key without one of its own, if there is one.
    pub fn per_key_cap(&self) -> Option<usize> {
        Some(self.table.keys().per_key_cap()).filter(|&cap| cap != usize::MAX)
    }

    /// Forgets key `key`'s rule: its weight is 1 again and its cap the
    /// default. What it holds stays held.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = sidejob::Limiter::builder().capacity(10).key_weight("gold", 4).build()?;
    /// limiter.clear_key("gold");
    /// assert_eq!(limiter.key_weight("gold"), 1);
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    pub fn clear_key<K: Hash + ?Sized>(&self, key: &K) {
        self.table.keys().set_rule(keys::id_of(key), None, None);
    }

    crate::engine::keys::key_readings!(
        table;
        setup: "",
        make: "let front = sidejob::Limiter::new(4)?;",
        end: "# Ok::<(), Box<dyn std::error::Error>>(())\n"
    );

    /// How many keys hold units now (the active keys, whose weights share
    /// the capacity).
    pub fn active_keys(&self) -> usize {
        self.table.keys().active_keys()
    }

    /// How many keys the limiter keeps state for now: those that hold
    /// units, and those with a rule of their own. Its memory for keys, in
    /// entries: a key that has given back every unit and has no rule is
    /// forgotten, however many distinct keys have come and gone.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Limiter};
    ///
    /// let limiter = Limiter::new(4)?;
    /// for tenant in 0..10_000_u32 {
    ///     drop(limiter.acquire_with(Ask::new().key(&tenant))?);
    /// }
    /// assert_eq!(limiter.tracked_keys(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tracked_keys(&self) -> usize {
        self.table.keys().entries()
    }

    /// The fair line (see [`LimiterBuilder::fair_line`]), as a fraction
    /// of the capacity.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Error, Limiter};
    ///
    /// let limiter = Limiter::builder().capacity(10).fair_line(0.5).build()?;
    /// assert_eq!(limiter.fair_line(), 0.5);
    /// let a = Ask::new().key("a").fail_fast();
    /// // Alone, tenant a's share is everything: the line does not stop it.
    /// let first = limiter.acquire_with(a.units(4))?;
    /// let light = limiter.acquire_with(Ask::new().key("b").fail_fast())?;
    /// // Now its share is 5 of 10: over it, it may fill only to the line.
    /// assert_eq!(limiter.acquire_with(a.units(2)).unwrap_err(), Error::Overload);
    /// # drop((first, light));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fair_line(&self) -> f64 {
        self.table.fair_line()
    }

    /// The most permits that can be out at once: the capacity in force
    /// (the last [`set_capacity`](Self::set_capacity), or the built one).
    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }

    /// Permits free now: [`capacity`](Self::capacity) less
    /// [`usage`](Self::usage), or 0 while permits above a shrunk capacity
    /// are still out. A reading, not a reservation: size a batch of claims
    /// with it, then acquire each.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = sidejob::Limiter::new(10)?;
    /// let _held: Vec<_> = (0..3).map(|_| limiter.try_acquire()).collect::<Result<_, _>>()?;
    /// assert_eq!(limiter.available(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available(&self) -> usize {
        self.table.available()
    }

    /// Changes the capacity while the limiter is in use; `0` refuses
    /// everything.
    ///
    /// Exact under races: once this returns, no permit is handed out while
    /// `capacity` or more are out. Shrinking never blocks and never revokes
    /// a held permit: if more are out than the new capacity, nothing is
    /// handed out until enough have been dropped (a debt the drops repay),
    /// then admission resumes at the new capacity. Growing is available to
    /// the next `try_acquire`.
    ///
    /// It is not on the hot path: it takes a lock that only resizes and
    /// admissions during a debt share, and makes a few atomic operations
    /// per shard, while admissions that meet it wait for it (for
    /// microseconds). The shard count stays what it was built with: a
    /// shard's share of the capacity may be 0, which makes it full.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `capacity` if it is above the largest
    /// capacity a limiter can count.
    ///
    /// # Examples
    ///
    /// A fleet-wide lease or an adaptive limit moves the capacity at run
    /// time:
    ///
    /// ```
    /// use sidejob::{Error, Limiter};
    ///
    /// let limiter = Limiter::builder().capacity(4).shards(2).build()?;
    /// let held: Vec<_> = (0..3).map(|_| limiter.try_acquire()).collect::<Result<_, _>>()?;
    ///
    /// limiter.set_capacity(2)?; // three are out: a debt of one
    /// assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    /// drop(held); // repaid
    /// let two = (limiter.try_acquire()?, limiter.try_acquire()?);
    /// assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    ///
    /// limiter.set_capacity(0)?; // refuse everything
    /// drop(two);
    /// assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    /// limiter.set_capacity(100)?;
    /// assert_eq!(limiter.available(), 100);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        self.table.set_capacity(capacity)
    }

    /// Raises the capacity by `units`; the capacity after it.
    ///
    /// Relative, so it races nothing: two calls made at once both land,
    /// where a [`capacity`](Self::capacity) read then a
    /// [`set_capacity`](Self::set_capacity) could lose one. tokio's
    /// `Semaphore::add_permits`. The new room is available to the next
    /// acquire (and handed to waiters first, if any wait).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming `capacity` if the sum is above the largest
    /// capacity a limiter can count; nothing changes then.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::Limiter;
    ///
    /// let limiter = Arc::new(Limiter::new(10)?);
    /// let adders: Vec<_> = (0..4)
    ///     .map(|_| {
    ///         let limiter = Arc::clone(&limiter);
    ///         std::thread::spawn(move || limiter.add_capacity(5))
    ///     })
    ///     .collect();
    /// for adder in adders {
    ///     adder.join().unwrap()?;
    /// }
    /// assert_eq!(limiter.capacity(), 30, "every add landed");
    /// assert!(limiter.add_capacity(usize::MAX).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add_capacity(&self, units: usize) -> Result<usize, ConfigError> {
        self.table.add_capacity(units)
    }

    /// Lowers the capacity by `units` (to 0 at the least); the capacity
    /// after it.
    ///
    /// Relative, as [`add_capacity`](Self::add_capacity). It never revokes
    /// a held permit: if more units are out than the new capacity, nothing
    /// is handed out until enough permits have been dropped (a debt the
    /// drops repay), as with [`set_capacity`](Self::set_capacity). tokio's
    /// `Semaphore::forget_permits`, except that units out now count
    /// against it too.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Limiter};
    ///
    /// let limiter = Limiter::new(4)?;
    /// let held = limiter.try_acquire_many(3)?;
    /// assert_eq!(limiter.remove_capacity(2), 2); // 3 out against 2: a debt
    /// assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    /// drop(held);
    /// assert_eq!(limiter.try_acquire_many(2)?.units(), 2);
    /// assert_eq!(limiter.remove_capacity(100), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remove_capacity(&self, units: usize) -> usize {
        self.table.remove_capacity(units)
    }

    /// How many shards the capacity is split over: the count it was built
    /// with, whatever the capacity (a shard's share may be 0).
    pub fn shards(&self) -> usize {
        self.table.shard_count()
    }

    /// Its name, for its metric series: the builder's
    /// [`name`](LimiterBuilder::name), `sidejob` by default.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True if its builder was given a name (see `Reporter`'s claims).
    pub(crate) fn is_named(&self) -> bool {
        self.named
    }

    /// A snapshot of the counters; see [`Stats`].
    pub fn stats(&self) -> Stats {
        self.table.stats()
    }

    /// Takes a unit and returns its shard, for a guard kept elsewhere (the
    /// tower layer's), which must give it back with [`release`](Self::release).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[inline]
    pub(crate) fn take_unit(&self) -> Result<usize, Error> {
        self.table.acquire()
    }

    /// [`take_unit`](Self::take_unit) without counting an `Overload`: for
    /// the waiting tower layer, which counts a refusal only once its
    /// request is refused for good (by the waiting room).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[inline]
    pub(crate) fn take_unit_uncounted(&self) -> Result<usize, Error> {
        self.table.probe()
    }

    /// Takes what `ask` describes (a weighed or classed request's units),
    /// fail-fast and counted as [`take_unit`](Self::take_unit) (a class's
    /// refusal in its own figures too), and returns where they are, for a
    /// guard kept elsewhere (the tower layer's), which gives them back with
    /// [`release_held`](Self::release_held). The ask's own waiting mode is
    /// ignored: this never waits.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[inline]
    pub(crate) fn take_ask(&self, ask: Ask) -> Result<(usize, Many), Error> {
        let grant = if ask.class_of() == crate::Class::Critical && !ask.is_keyed() {
            // The default class, unkeyed: the take of `n` with its fast
            // path on the home shard, as `try_acquire_many`.
            self.table.acquire_many(ask.unit_count())
        } else {
            self.table.admit(&ask.fail_fast())
        };
        grant.map(Many::from_grant)
    }

    /// [`take_ask`](Self::take_ask) without counting an `Overload`, as
    /// [`take_unit_uncounted`](Self::take_unit_uncounted): for the waiting
    /// tower layer, which waits next.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn probe_ask(&self, ask: Ask) -> Result<(usize, Many), Error> {
        let probe = Ask {
            how: How::Probe,
            ..ask
        };
        self.table.admit(&probe).map(Many::from_grant)
    }

    /// Waits for what `ask` describes (its units, in its class's place in
    /// the waiting room), as [`acquire_many_owned_async`](Self::acquire_many_owned_async)
    /// does for `n` units of the default class: the waiting tower layer's
    /// wait for a weighed or classed request. The ask's deadline is kept;
    /// a fail-fast ask waits too. `acquire_many_owned_async` is this with
    /// a fixed ask.
    pub(crate) fn wait_ask_owned(
        self: Arc<Self>,
        ask: Ask,
    ) -> impl std::future::Future<Output = Result<OwnedPermit<Many>, Error>> + Send + 'static {
        self.acquire_with_owned_async(Ask {
            how: How::Wait(ask.deadline()),
            ..ask
        })
    }

    /// True if the limiter has a waiting room (`max_waiters > 0`).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn has_room(&self) -> bool {
        self.table.has_room()
    }

    /// Counts an `Overload` answered without going through the table (a
    /// refusal decided after an uncounted probe).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn count_refusal(&self) {
        self.table.count_refusal()
    }

    /// Gives back `units`, the first of them on shard `shard`, taken with
    /// [`take_unit`](Self::take_unit) ([`One`]) or
    /// [`take_units`](Self::take_units) ([`Many`]), leaving `units`
    /// holding none: the tower layer's release. For [`One`] it is the
    /// one-unit release of a shard, inlined as a permit's.
    // Inline: called from the user's crate, where it would otherwise be a
    // call through the GOT.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    #[inline]
    pub(crate) fn release_held<U: Units>(&self, shard: usize, units: &mut U) {
        units.release(&self.table, self.table.shard(shard));
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("name", &self.name)
            .field("capacity", &self.capacity())
            .field("shards", &self.shards())
            .field("usage", &self.usage())
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Configures a [`Limiter`]; made by [`Limiter::builder`].
///
/// # Examples
///
/// ```
/// use sidejob::Limiter;
///
/// let limiter = Limiter::builder().capacity(10).shards(4).build()?;
/// assert_eq!((limiter.capacity(), limiter.shards()), (10, 4));
///
/// // More shards than capacity: every shard is kept, six with a share of
/// // 0, so the limiter can grow into them with `set_capacity`.
/// let small = Limiter::builder().capacity(2).shards(8).build()?;
/// assert_eq!(small.shards(), 8);
/// assert_eq!(small.stats().shards.iter().filter(|s| s.limit == 0).count(), 6);
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct LimiterBuilder {
    name: Option<String>,
    capacity: Option<usize>,
    shards: Option<usize>,
    probe: Probe,
    policy: Policy,
    keys: KeySettings,
}

/// The builder's limits and defaults.
impl LimiterBuilder {
    crate::engine::waiters::waiting_limits!();
}

impl LimiterBuilder {
    /// The `name` label of its metric series, when a
    /// [`Reporter`](crate::observe::Reporter) exports them; defaults to
    /// `sidejob`. Must not contain a NUL byte.
    pub fn name(&mut self, name: impl Into<String>) -> &mut Self {
        self.name = Some(name.into());
        self
    }

    /// How many permits may be out at once. Required; at least 1.
    pub fn capacity(&mut self, capacity: usize) -> &mut Self {
        self.capacity = Some(capacity);
        self
    }

    /// How many shards to split the capacity over. Defaults to the number
    /// of CPUs. Every shard is kept even with less capacity than shards
    /// (the extra shards' share is 0 until the capacity grows).
    pub fn shards(&mut self, shards: usize) -> &mut Self {
        self.shards = Some(shards);
        self
    }

    /// Where a caller starts probing; see [`Probe`].
    pub fn probe(&mut self, probe: Probe) -> &mut Self {
        self.probe = probe;
        self
    }

    /// How many callers of [`Limiter::acquire`] (and its async forms) may
    /// wait for a permit when every shard is full; past that they get
    /// `Overload` at once. Defaults to 0: no waiting, fail fast.
    /// [`try_acquire`](Limiter::try_acquire) never waits. At most
    /// [`MAX_WAITERS`](crate::LimiterBuilder::MAX_WAITERS).
    pub fn max_waiters(&mut self, waiters: usize) -> &mut Self {
        self.policy.max_waiters = waiters;
        self
    }

    /// How long one caller may wait for a permit before it gets
    /// [`Error::Timeout`]. Defaults to
    /// [`DEFAULT_MAX_WAIT`](crate::LimiterBuilder::DEFAULT_MAX_WAIT) (1 s);
    /// `Duration::MAX` waits as long as it takes.
    pub fn max_wait(&mut self, wait: std::time::Duration) -> &mut Self {
        self.policy.max_wait = wait;
        self
    }

    /// Which waiter a freed permit goes to; see [`QueueOrder`]. Defaults
    /// to FIFO.
    pub fn queue_order(&mut self, order: QueueOrder) -> &mut Self {
        self.policy.order = order;
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
    /// use sidejob::{units::Ask, Class, Error, Limiter};
    ///
    /// let limiter = Limiter::builder()
    ///     .capacity(100)
    ///     .headroom(Class::Sheddable, 0.5) // prefetch: half at most
    ///     .build()?;
    /// let prefetch = Ask::new().class(Class::Sheddable).fail_fast();
    /// let held = limiter.acquire_with(prefetch.units(50))?;
    /// assert_eq!(limiter.acquire_with(prefetch).unwrap_err(), Error::Overload);
    /// assert!(limiter.try_acquire().is_ok()); // the default class has the rest
    /// # drop(held);
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
    /// use sidejob::{units::Ask, Class, Limiter};
    ///
    /// let limiter = Limiter::builder()
    ///     .capacity(10)
    ///     .headroom(Class::Sheddable, 0.5)
    ///     .min_share(Class::Sheddable, 0.2)
    ///     .build()?;
    /// let users: Vec<_> = (0..8).map(|_| limiter.try_acquire()).collect::<Result<_, _>>()?;
    /// // 8 of 10 held: above the line of 5, but within its min share of 2.
    /// let prefetch = Ask::new().class(Class::Sheddable).fail_fast();
    /// let both = limiter.acquire_with(prefetch.units(2))?;
    /// assert_eq!(limiter.stats().classes[Class::Sheddable.rank()].held, Some(2));
    /// # drop((users, both));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn min_share(&mut self, class: crate::Class, fraction: f64) -> &mut Self {
        self.policy.headroom.set_min_share(class, fraction);
        self
    }

    crate::engine::keys::key_settings!(
        setup: "",
        make: "sidejob::Limiter::builder().capacity(8)",
        build: ".build()"
    );

    /// How many units later requests may take past a waiting request of
    /// many units ([`Limiter::acquire_many`]) before every freed unit is
    /// kept for it. Defaults to the capacity in force (one turnover of the
    /// whole limiter: about one mean service time under load, whatever
    /// that time is). `0` is strict FIFO, as tokio's `acquire_many`;
    /// `usize::MAX` is first fit, where a large request may wait for its
    /// whole `max_wait` under steady small load. Counted in units the
    /// limiter admitted since the request came in, not in time: no clock
    /// to calibrate, and it scales with the load.
    pub fn pass_budget(&mut self, units: usize) -> &mut Self {
        self.policy.pass_budget = Some(units);
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field when `capacity` is unset, 0 or too
    /// large, `shards` is 0 or too large, `max_waiters` is above
    /// [`MAX_WAITERS`](crate::LimiterBuilder::MAX_WAITERS), or an adaptive `queue_order`
    /// has a zero target.
    pub fn build(&self) -> Result<Limiter, ConfigError> {
        let name = ConfigError::check_name(self.name.as_deref())?.into();
        let capacity = self.capacity.ok_or(ConfigError::missing("capacity"))?;
        let shards = self.shards.unwrap_or_else(num_cpus::get);
        Ok(Limiter {
            table: Table::new(capacity, shards, self.probe)?
                .with_policy(&self.policy)?
                .with_keys(&self.keys)?,
            name,
            named: self.name.is_some(),
        })
    }
}

/// Units of a [`Limiter`]'s capacity, given back on drop: one unit
/// ([`One`], the default), or any number ([`Many`]).
///
/// Made by [`Limiter::try_acquire`] and its siblings (one unit), and by
/// [`Limiter::try_acquire_many`] (`n` units). Hold it for as long as the
/// guarded work runs. A one-unit permit is two references: what was
/// measured on the hot path before permits had units, unchanged (see
/// [`units`](crate::units) for why the count is in the type).
#[must_use = "the permit is released as soon as it is dropped"]
#[clippy::has_significant_drop]
pub struct Permit<'a, U: Units = One> {
    /// The shard the unit was taken from (the first, for units from
    /// several), kept by reference: the release tests the full set with
    /// the shard's own bit and writes its line, with no index to bound
    /// and scale.
    // First: a `Result<Permit, Error>` then marks `Err` by this word's
    // null and keeps the error's byte in the limiter's word, which a
    // caller's loop of `try_acquire().is_err()` compiles one instruction
    // shorter (33 -> 32, every other count equal; PERFORMANCE.md, item 12).
    shard: &'a Shard,
    limiter: &'a Limiter,
    units: U,
}

impl<'a, U: Units> Permit<'a, U> {
    /// The shard this permit was taken from (the first, for a permit of
    /// units from several).
    pub fn shard(&self) -> usize {
        self.shard.index()
    }

    /// How many units it holds. tokio's `SemaphorePermit::num_permits`.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = sidejob::Limiter::new(8)?;
    /// assert_eq!(limiter.try_acquire()?.units(), 1);
    /// assert_eq!(limiter.try_acquire_many(5)?.units(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn units(&self) -> usize {
        self.units.count()
    }

    /// Gives every unit up for good: none is ever given back, so the
    /// limiter's capacity shrinks by that many for the rest of its life.
    ///
    /// tokio's `SemaphorePermit::forget`. The units stay counted in
    /// [`Limiter::usage`] (and [`Stats::usage`]), and the limiter counts
    /// them in [`Stats::forgotten`]; they do not count as completed. Use it
    /// to lower a limit at run time, or for units whose work outlives any
    /// scope you can hold a permit in.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Limiter};
    ///
    /// let limiter = Limiter::new(4)?;
    /// limiter.try_acquire()?.forget();
    /// limiter.try_acquire_many(2)?.forget();
    /// assert_eq!(limiter.usage(), 3, "the forgotten units stay taken");
    /// let last = limiter.try_acquire()?;
    /// assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    /// drop(last);
    /// let stats = limiter.stats();
    /// assert_eq!((stats.forgotten, stats.completed, stats.usage), (3, 1, 3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn forget(self) {
        let limiter = self.limiter;
        let grant = self.into_grant();
        limiter.table.forget_grant(grant);
    }

    /// Its units as a grant; the permit is gone, with nothing given back.
    fn into_grant(mut self) -> Grant {
        let grant = self.units.take(self.shard.index());
        if U::ONE {
            // Two references and a marker of no size: nothing leaks, and
            // the unit now belongs to the grant.
            std::mem::forget(self);
        }
        // A `Many` holds none after `take`: its drop gives nothing back.
        grant
    }
}

impl<'a> Permit<'a, One> {
    /// The same unit as a permit of [`Many`] units, to
    /// [`merge`](Permit::merge) others into or keep beside them.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = sidejob::Limiter::new(4)?;
    /// let mut held = limiter.try_acquire()?.into_many();
    /// held.merge(limiter.try_acquire()?).expect("one limiter");
    /// assert_eq!(held.units(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_many(self) -> Permit<'a, Many> {
        let limiter = self.limiter;
        let (shard, units) = Many::from_grant(self.into_grant());
        Permit {
            limiter,
            shard: limiter.table.shard(shard),
            units,
        }
    }
}

impl<'a> Permit<'a, Many> {
    /// Moves `units` of its units into a new permit, `None` (and nothing
    /// moves) if it holds fewer. tokio's `SemaphorePermit::split`:
    /// splitting off every unit leaves this permit holding none, and
    /// `split(0)` makes a permit of none.
    ///
    /// # Examples
    ///
    /// Release a batch's units as its items finish:
    ///
    /// ```
    /// let limiter = sidejob::Limiter::new(10)?;
    /// let mut batch = limiter.try_acquire_many(6)?;
    /// let first = batch.split(2).expect("6 held");
    /// assert_eq!((batch.units(), first.units()), (4, 2));
    /// assert!(batch.split(5).is_none(), "only 4 left");
    /// drop(first); // two items done
    /// assert_eq!(limiter.usage(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn split(&mut self, units: usize) -> Option<Permit<'a, Many>> {
        let mut grant = self.units.take(self.shard.index());
        let split = grant.split(units);
        self.put(grant);
        let (shard, units) = Many::from_grant(split?);
        Some(Permit {
            limiter: self.limiter,
            shard: self.limiter.table.shard(shard),
            units,
        })
    }

    /// Adds `other`'s units to this permit. tokio's
    /// `SemaphorePermit::merge`, without its panic: a permit of another
    /// limiter comes back as the error, untouched (dropping it releases
    /// its units as usual).
    ///
    /// # Errors
    ///
    /// `other` itself, if it belongs to another limiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::Limiter;
    ///
    /// let (limiter, other) = (Limiter::new(10)?, Limiter::new(1)?);
    /// let mut held = limiter.try_acquire_many(3)?;
    /// held.merge(limiter.try_acquire()?).expect("one limiter");
    /// held.merge(limiter.try_acquire_many(2)?).expect("one limiter");
    /// assert_eq!(held.units(), 6);
    ///
    /// let foreign = held.merge(other.try_acquire()?).unwrap_err(); // handed back
    /// assert_eq!((held.units(), foreign.units()), (6, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn merge<V: Units>(&mut self, other: Permit<'a, V>) -> Result<(), Permit<'a, V>> {
        if !std::ptr::eq(self.limiter, other.limiter) {
            return Err(other);
        }
        let theirs = other.into_grant();
        let mut grant = self.units.take(self.shard.index());
        // Its units become this permit's class's and key's.
        let table = &self.limiter.table;
        table.reclass(theirs.class, grant.class, theirs.units());
        table.keys().transfer(theirs.key, grant.key, theirs.units());
        grant.merge(theirs);
        self.put(grant);
        Ok(())
    }

    /// Makes it hold `grant`'s units (of this limiter; it holds none now).
    fn put(&mut self, grant: Grant) {
        let (shard, units) = Many::from_grant(grant);
        self.shard = self.limiter.table.shard(shard);
        self.units = units;
    }
}

impl<U: Units> Drop for Permit<'_, U> {
    #[inline]
    fn drop(&mut self) {
        self.units.release(&self.limiter.table, self.shard);
    }
}

impl<U: Units> fmt::Debug for Permit<'_, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("shard", &self.shard())
            .field("units", &self.units())
            .finish()
    }
}

/// Units of a [`Limiter`]'s capacity that own an `Arc` of it, so they are
/// `'static` and can move to another thread or task: one unit ([`One`],
/// the default) or any number ([`Many`]). Given back on drop.
///
/// Made by [`Limiter::try_acquire_owned`] and its siblings, and by
/// [`Limiter::try_acquire_many_owned`].
#[must_use = "the permit is released as soon as it is dropped"]
#[clippy::has_significant_drop]
pub struct OwnedPermit<U: Units = One> {
    limiter: Arc<Limiter>,
    /// The shard of its (first) unit, or [`FORGOTTEN`].
    shard: usize,
    units: U,
}

impl<U: Units> OwnedPermit<U> {
    /// The shard this permit was taken from (the first, for a permit of
    /// units from several).
    pub fn shard(&self) -> usize {
        self.shard
    }

    /// How many units it holds. tokio's `OwnedSemaphorePermit::num_permits`.
    pub fn units(&self) -> usize {
        if self.shard == FORGOTTEN {
            return 0;
        }
        self.units.count()
    }

    /// Gives every unit up for good: none is ever given back, so the
    /// limiter's capacity shrinks by that many for the rest of its life.
    ///
    /// As [`Permit::forget`]: the units stay counted in
    /// [`Limiter::usage`] and are counted in [`Stats::forgotten`]. The
    /// permit's `Arc` of the limiter is dropped as usual.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::{Error, Limiter};
    ///
    /// let limiter = Arc::new(Limiter::new(1)?);
    /// limiter.try_acquire_owned()?.forget();
    /// assert_eq!(limiter.try_acquire_owned().unwrap_err(), Error::Overload);
    /// assert_eq!(limiter.stats().forgotten, 1);
    /// assert_eq!(Arc::strong_count(&limiter), 1, "the permit's Arc was dropped");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn forget(mut self) {
        if let Some(grant) = self.take_grant() {
            self.limiter.table.forget_grant(grant);
        }
    }

    /// The limiter this permit belongs to.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// Its units as a grant, leaving it holding none (its drop then gives
    /// nothing back and drops the `Arc`); `None` once forgotten.
    fn take_grant(&mut self) -> Option<Grant> {
        if self.shard == FORGOTTEN {
            return None;
        }
        let grant = self.units.take(self.shard);
        // The sentinel makes `Drop` skip the release (a `Many` holds none
        // after `take` anyway); the `Arc` drops as usual. Not
        // `ManuallyDrop`: moving the `Arc` out of one takes `unsafe`.
        self.shard = FORGOTTEN;
        Some(grant)
    }
}

impl OwnedPermit<One> {
    /// Disarms the permit and returns its shard: the unit stays taken, and
    /// the caller now owes its release (the tower layer's `Unit`).
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn into_shard(mut self) -> usize {
        let shard = self.shard;
        // The sentinel makes `Drop` skip the release; the `Arc` drops.
        self.shard = FORGOTTEN;
        shard
    }

    /// The same unit as a permit of [`Many`] units; as
    /// [`Permit::into_many`].
    pub fn into_many(mut self) -> OwnedPermit<Many> {
        let grant = self.take_grant().unwrap_or(Grant::on(FORGOTTEN, 0));
        let (shard, units) = Many::from_grant(grant);
        OwnedPermit {
            limiter: Arc::clone(&self.limiter),
            shard,
            units,
        }
    }
}

impl OwnedPermit<Many> {
    /// Moves `units` of its units into a new permit; as
    /// [`Permit::split`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// let limiter = Arc::new(sidejob::Limiter::new(10)?);
    /// let mut held = limiter.try_acquire_many_owned(5)?;
    /// let moved = held.split(3).expect("5 held");
    /// assert_eq!((held.units(), moved.units()), (2, 3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn split(&mut self, units: usize) -> Option<OwnedPermit<Many>> {
        let mut grant = self.take_grant()?;
        let split = grant.split(units);
        self.put(grant);
        let (shard, units) = Many::from_grant(split?);
        Some(OwnedPermit {
            limiter: Arc::clone(&self.limiter),
            shard,
            units,
        })
    }

    /// Adds `other`'s units to this permit; as [`Permit::merge`].
    ///
    /// # Errors
    ///
    /// `other` itself, if it belongs to another limiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    ///
    /// let limiter = Arc::new(sidejob::Limiter::new(10)?);
    /// let mut held = limiter.try_acquire_many_owned(2)?;
    /// held.merge(limiter.try_acquire_owned()?).expect("one limiter");
    /// assert_eq!(held.units(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn merge<V: Units>(&mut self, mut other: OwnedPermit<V>) -> Result<(), OwnedPermit<V>> {
        if !Arc::ptr_eq(&self.limiter, &other.limiter) {
            return Err(other);
        }
        let Some(theirs) = other.take_grant() else {
            return Ok(()); // a forgotten permit holds nothing
        };
        match self.take_grant() {
            Some(mut grant) => {
                // Its units become this permit's class's and key's.
                let table = &self.limiter.table;
                table.reclass(theirs.class, grant.class, theirs.units());
                table.keys().transfer(theirs.key, grant.key, theirs.units());
                grant.merge(theirs);
                self.put(grant);
            }
            None => self.put(theirs),
        }
        Ok(())
    }

    /// Disarms the permit and returns where its units are: they stay
    /// taken, and the caller now owes their release (the weighed tower
    /// layer's `Unit`, through [`Limiter::release_held`]). A forgotten
    /// permit's are none.
    #[cfg_attr(not(feature = "tower"), allow(dead_code))]
    pub(crate) fn into_parts(mut self) -> (usize, Many) {
        let grant = self.take_grant().unwrap_or(Grant::on(0, 0));
        Many::from_grant(grant)
    }

    /// Makes it hold `grant`'s units (of this limiter; it holds none now).
    fn put(&mut self, grant: Grant) {
        let (shard, units) = Many::from_grant(grant);
        self.shard = shard;
        self.units = units;
    }
}

/// `OwnedPermit::shard` after `forget`: above any shard index (shard counts
/// are capped at 2^16).
const FORGOTTEN: usize = usize::MAX;

impl<U: Units> Drop for OwnedPermit<U> {
    #[inline]
    fn drop(&mut self) {
        // One compare of a value the release loads anyway.
        if self.shard != FORGOTTEN {
            let shard = self.limiter.table.shard(self.shard);
            self.units.release(&self.limiter.table, shard);
        }
    }
}

impl<U: Units> fmt::Debug for OwnedPermit<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnedPermit")
            .field("shard", &self.shard)
            .field("units", &self.units())
            .finish()
    }
}

impl crate::adaptive::Target for Arc<Limiter> {
    fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        Limiter::set_capacity(self, capacity)
    }

    fn capacity(&self) -> usize {
        Limiter::capacity(self)
    }

    fn stats(&self) -> Stats {
        Limiter::stats(self)
    }
}
