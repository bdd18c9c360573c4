//! Reserving a child's unit for a child the caller starts itself: `reserve`, `try_reserve`, `reserve_async`.

use super::{Admission, ChildGuard, ChildKind, Supervisor};
use crate::error::Error;

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
        self.inner.enter(Admission::Wait(None), ChildKind::Reserved)
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
        self.inner.enter(Admission::Try, ChildKind::Reserved)
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

    /// [`reserve`](Self::reserve), trying table shard `start` first (taken
    /// modulo the shard count): the seam the model tests use in place of
    /// the caller's probe.
    #[cfg_attr(any(not(test), loom), allow(dead_code))]
    pub(crate) fn reserve_at(&self, start: usize) -> Result<ChildGuard, Error> {
        let start = start % self.inner.common.table.shard_count();
        self.inner.enter(Admission::At(start), ChildKind::Reserved)
    }
}
