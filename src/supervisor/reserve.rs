//! Reserving a child's unit for a child the caller starts itself: `reserve`, `try_reserve`, `reserve_async`.

use super::{ChildGuard, ChildKind, How, Supervisor};
use crate::error::Error;
use crate::units::Ask;

impl Supervisor {
    /// Admits a child that you start yourself, and returns its guard.
    /// Waits for capacity only under the supervisor's waiting policy (by
    /// default it never does; [`try_reserve`](Self::try_reserve) never
    /// does).
    ///
    /// Move the guard into the child (a tokio task, a rayon job, a thread
    /// from another pool); dropping it is the child's exit. A guard dropped
    /// while its thread panics is counted in [`Stats::panicked`](crate::Stats::panicked). The child
    /// is listed by [`which_children`](Self::which_children) with no name.
    ///
    /// # Errors
    ///
    /// * [`Error::Overload`](crate::Error::Overload) when `capacity` children are alive; counted in
    ///   [`Stats::rejected`](crate::Stats::rejected).
    /// * [`Error::Shutdown`](crate::Error::Shutdown) once [`close`](Self::close) has been called.
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
        self.inner.enter(How::Wait(None), ChildKind::Reserved)
    }

    /// [`reserve`](Self::reserve) that never waits for capacity, whatever
    /// the supervisor's waiting policy.
    ///
    /// # Errors
    ///
    /// [`Error::Overload`](crate::Error::Overload) at once when `capacity` children are alive;
    /// [`Error::Shutdown`](crate::Error::Shutdown) once closed.
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
        self.inner.enter(How::Try, ChildKind::Reserved)
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

    /// Admits a child that holds `n` units of the capacity (a job that
    /// needs 4 of 16 cores, an import weighed by its rows), and returns its
    /// guard. Waits for them only under the supervisor's waiting policy,
    /// with the bounded passing of [`Limiter::acquire_many`](crate::Limiter::acquire_many)
    /// (small children pass a waiting large one until its pass budget is
    /// spent). The child is listed once by
    /// [`which_children`](Self::which_children); its units count in
    /// [`usage`](Self::usage); dropping the guard gives them all back.
    ///
    /// # Errors
    ///
    /// * [`Error::TooLarge`](crate::Error::TooLarge) at once for `n` above
    ///   the capacity in force, or for `n = 0` (a child holds at least one
    ///   unit).
    /// * [`Error::Overload`](crate::Error::Overload) when `n` units are not
    ///   free (and the room is full or there is none); counted in
    ///   [`Stats::rejected`](crate::Stats::rejected).
    /// * [`Error::Timeout`](crate::Error::Timeout) when its wait ran out.
    /// * [`Error::Shutdown`](crate::Error::Shutdown) once closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// let cores = Supervisor::builder().capacity(16).shards(4).build()?;
    /// let job = cores.reserve_many(6)?; // wider than a shard (4): from several
    /// let small = cores.reserve()?;
    /// assert_eq!((job.units(), small.units(), cores.usage()), (6, 1, 7));
    /// assert_eq!(cores.which_children().len(), 2);
    /// assert_eq!(cores.try_reserve_many(10).unwrap_err(), Error::Overload);
    /// drop(job);
    /// assert_eq!(cores.usage(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_many(&self, n: usize) -> Result<ChildGuard, Error> {
        self.reserve_with(Ask::new().units(n))
    }

    /// Admits a child of what `ask` describes (its units; failing fast or
    /// waiting, blocking the thread while it waits) and returns its guard.
    /// [`reserve`](Self::reserve) is `reserve_with(Ask::new())`,
    /// [`reserve_many(n)`](Self::reserve_many) the same ask of `n` units,
    /// [`try_reserve_many(n)`](Self::try_reserve_many) that ask
    /// `.fail_fast()`.
    ///
    /// # Errors
    ///
    /// As [`reserve_many`](Self::reserve_many) (an ask of 0 units is
    /// `TooLarge`: a child holds at least one); [`Error::Timeout`](crate::Error::Timeout)
    /// also when the ask's own deadline passed first.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{units::Ask, Error, Supervisor};
    ///
    /// let sup = Supervisor::builder().capacity(8).max_waiters(4).build()?;
    /// let import = sup.reserve_with(Ask::new().units(5))?;
    /// let refused = sup.reserve_with(Ask::new().units(4).fail_fast());
    /// assert_eq!(refused.unwrap_err(), Error::Overload);
    /// assert_eq!((import.units(), sup.usage()), (5, 5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_with(&self, ask: Ask) -> Result<ChildGuard, Error> {
        self.inner.enter_with(ask, ChildKind::Reserved)
    }

    /// [`reserve_with`](Self::reserve_with) as a future: a waiting ask
    /// waits without blocking the executor's thread.
    ///
    /// # Errors
    ///
    /// As [`reserve_with`](Self::reserve_with).
    ///
    /// # Cancel safety
    ///
    /// As [`reserve_many_async`](Self::reserve_many_async): nothing is
    /// registered, and what was handed to the wait goes on.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use sidejob::{units::Ask, Supervisor};
    ///
    /// let sup = Supervisor::builder().capacity(8).max_waiters(4).build()?;
    /// let guard = sup.reserve_with_async(Ask::new().units(3)).await?;
    /// assert_eq!(sup.usage(), 3);
    /// drop(guard);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn reserve_with_async(&self, ask: Ask) -> Result<ChildGuard, Error> {
        self.inner.enter_with_async(ask, ChildKind::Reserved).await
    }

    /// [`reserve_many`](Self::reserve_many) that never waits, whatever the
    /// supervisor's waiting policy.
    ///
    /// # Errors
    ///
    /// As [`reserve_many`](Self::reserve_many), but never `Timeout`.
    ///
    /// # Examples
    ///
    /// ```
    /// let sup = sidejob::Supervisor::new(8)?;
    /// let guard = sup.try_reserve_many(3)?;
    /// assert_eq!((guard.units(), sup.usage()), (3, 3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn try_reserve_many(&self, n: usize) -> Result<ChildGuard, Error> {
        self.reserve_with(Ask::new().units(n).fail_fast())
    }

    /// [`reserve_many`](Self::reserve_many) as a future: waits without
    /// blocking the executor's thread.
    ///
    /// # Errors
    ///
    /// As [`reserve_many`](Self::reserve_many).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the wait; units handed to it or
    /// collected for it meanwhile go to the next waiters. Nothing is
    /// registered.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// let sup = sidejob::Supervisor::builder().capacity(8).max_waiters(4).build()?;
    /// let guard = sup.reserve_many_async(5).await?;
    /// assert_eq!(sup.usage(), 5);
    /// drop(guard);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub async fn reserve_many_async(&self, n: usize) -> Result<ChildGuard, Error> {
        self.reserve_with_async(Ask::new().units(n)).await
    }

    /// How many callers wait for capacity now (0 without a waiting room).
    pub fn waiting(&self) -> usize {
        self.inner.common.table.waiting()
    }

    /// [`reserve`](Self::reserve), trying table shard `start` first (taken
    /// modulo the shard count): the seam the model tests use in place of
    /// the caller's probe.
    #[cfg_attr(any(not(test), loom), allow(dead_code))]
    pub(crate) fn reserve_at(&self, start: usize) -> Result<ChildGuard, Error> {
        let start = start % self.inner.common.table.shard_count();
        self.inner.enter(How::At(start), ChildKind::Reserved)
    }
}
