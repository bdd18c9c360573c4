//! Keyed children: at most `per_key` live children of a key on top of the capacity (the key set is `keys.rs`).

use super::{ChildGuard, ChildKind, How, Supervisor};
use crate::engine::keys::children::KeySlot;
use crate::error::Error;
use std::future::Future;
use std::hash::Hash;

impl Supervisor {
    /// Admits a child of `key`: at most [`per_key`](crate::SupervisorBuilder::per_key)
    /// live children per key (1 by default), on top of the capacity. Waits
    /// for the key, then for capacity, only under the supervisor's waiting
    /// policy ([`max_waiters`](crate::SupervisorBuilder::max_waiters); by default
    /// it never does; [`try_reserve_keyed`](Self::try_reserve_keyed) never
    /// does).
    ///
    /// This is the task worker's "tasks of one workflow run one after
    /// another, different workflows in parallel": key the child by its
    /// workflow id. The key's slot is taken first and released last (after
    /// the unit of capacity), so a key never has more than `per_key` live
    /// children; a refusal of either leaves neither held. Keys are told
    /// apart by 43 bits of a per-process seeded hash: two keys that agree
    /// on them (a chance of about 2^-24 that any two of 1,000 live keys
    /// do) count as one key, which only serializes them.
    ///
    /// A key waits in first-come-first-served order, whatever the
    /// [`queue_order`](crate::SupervisorBuilder::queue_order) (which orders the
    /// wait for capacity): when a child of the key ends, its slot goes to
    /// the key's oldest waiter at once. Waiting for the key counts against
    /// [`max_waiters`](crate::SupervisorBuilder::max_waiters) separately from
    /// waiting for capacity, and the two waits together last at most
    /// [`max_wait`](crate::SupervisorBuilder::max_wait).
    ///
    /// # Errors
    ///
    /// * [`Error::KeyBusy`](crate::Error::KeyBusy) when the key has `per_key` live children (or
    ///   as many admissions of it in progress) and the caller may not wait
    ///   for it (no waiting room, or `max_waiters` already wait for keys).
    ///   No unit of capacity was taken; not counted in [`Stats::rejected`](crate::Stats::rejected).
    /// * [`Error::Overload`](crate::Error::Overload) when `capacity` children are alive (counted);
    ///   the key's slot was given back.
    /// * [`Error::Timeout`](crate::Error::Timeout) when the wait ran out.
    /// * [`Error::Shutdown`](crate::Error::Shutdown) once [`close`](Self::close) has been called.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// let sup = Supervisor::builder().capacity(100).per_key(1).build()?;
    /// let step1 = sup.reserve_keyed(&"order-17")?;
    /// assert_eq!(sup.reserve_keyed(&"order-17").unwrap_err(), Error::KeyBusy);
    /// let other = sup.reserve_keyed(&"order-18")?; // other keys run meanwhile
    /// drop(step1);
    /// let step2 = sup.reserve_keyed(&"order-17")?; // the next step, now
    /// assert_eq!(sup.busy_keys(), 2);
    /// drop((step2, other));
    /// assert_eq!(sup.busy_keys(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_keyed<K: Hash + ?Sized>(&self, key: &K) -> Result<ChildGuard, Error> {
        let keys = &self.inner.common.keys;
        let id = keys.id(key);
        match keys.try_enter(id) {
            Ok(key) => {
                // `key` is dropped (released) if the capacity refuses.
                let child = self.inner.enter(How::Wait(None), ChildKind::Reserved)?;
                Ok(child.with_key(key))
            }
            Err(Error::KeyBusy) if keys.can_wait() => self.reserve_keyed_slow(id),
            Err(err) => Err(self.keyed_refusal(err)),
        }
    }

    /// A refusal by the key set, as the caller sees it: the lock-free path
    /// does not look at `close`, so a busy key of a closed supervisor
    /// answers `Shutdown`, as everything else then does.
    #[cold]
    pub(super) fn keyed_refusal(&self, err: Error) -> Error {
        if err == Error::KeyBusy && self.inner.common.table.is_closing() {
            Error::Shutdown
        } else {
            err
        }
    }

    /// The key was busy: wait for it, then for capacity, within one
    /// deadline.
    #[cold]
    pub(super) fn reserve_keyed_slow(&self, id: u64) -> Result<ChildGuard, Error> {
        let keys = &self.inner.common.keys;
        let deadline = keys.deadline(None);
        let key = keys.wait_blocking(id, deadline)?;
        let shard = self.inner.common.table.acquire_waiting(deadline)?;
        Ok(self
            .inner
            .register(shard, ChildKind::Reserved)
            .with_key(key))
    }

    /// [`reserve_keyed`](Self::reserve_keyed) that never waits, for the key
    /// or for capacity, whatever the supervisor's waiting policy: the
    /// claim loop's "skip a task whose workflow is busy".
    ///
    /// # Errors
    ///
    /// [`Error::KeyBusy`](crate::Error::KeyBusy) at once when the key has `per_key` live children;
    /// [`Error::Overload`](crate::Error::Overload) at once when `capacity` children are alive;
    /// [`Error::Shutdown`](crate::Error::Shutdown) once closed.
    ///
    /// # Examples
    ///
    /// ```
    /// use sidejob::{Error, Supervisor};
    ///
    /// let sup = Supervisor::builder().capacity(2).max_waiters(10).build()?;
    /// let claimed = ["wf-1", "wf-2", "wf-1", "wf-3"];
    /// let mut started = Vec::new();
    /// let mut skipped = Vec::new();
    /// for workflow in claimed {
    ///     match sup.try_reserve_keyed(&workflow) {
    ///         Ok(guard) => started.push((workflow, guard)),
    ///         Err(Error::KeyBusy) => skipped.push(workflow), // its previous task runs
    ///         Err(Error::Overload) => skipped.push(workflow), // no capacity left
    ///         Err(other) => return Err(other.into()),
    ///     }
    /// }
    /// assert_eq!(skipped, ["wf-1", "wf-3"]);
    /// assert_eq!(started.len(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_reserve_keyed<K: Hash + ?Sized>(&self, key: &K) -> Result<ChildGuard, Error> {
        let keys = &self.inner.common.keys;
        let key = keys
            .try_enter(keys.id(key))
            .map_err(|err| self.keyed_refusal(err))?;
        let child = self.inner.enter(How::Try, ChildKind::Reserved)?;
        Ok(child.with_key(key))
    }

    /// [`reserve_keyed`](Self::reserve_keyed) as a future: waits for the
    /// key, then for capacity (under the supervisor's waiting policy),
    /// without blocking the executor. The future is `Send`; it borrows the
    /// supervisor and the key is hashed at the call.
    ///
    /// # Errors
    ///
    /// As [`reserve_keyed`](Self::reserve_keyed).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the wait: it leaves the key's queue,
    /// and a slot or unit handed to it meanwhile goes to the next waiter.
    ///
    /// # Examples
    ///
    /// One workflow's steps, each started the moment the previous ends:
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use sidejob::Supervisor;
    ///
    /// let sup = Supervisor::builder().capacity(10).max_waiters(100).build()?;
    /// let step1 = sup.reserve_keyed_async(&42u64).await?;
    /// let ended = tokio::spawn(async move { drop(step1) });
    /// let step2 = sup.reserve_keyed_async(&42u64).await?; // waits for step 1
    /// ended.await?;
    /// assert_eq!(sup.which_children(), [step2.id()]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_keyed_async<K: Hash + ?Sized>(
        &self,
        key: &K,
    ) -> impl Future<Output = Result<ChildGuard, Error>> + Send + '_ {
        let id = self.inner.common.keys.id(key);
        async move {
            let (key, shard) = self.keyed_unit_async(id).await?;
            Ok(self
                .inner
                .register(shard, ChildKind::Reserved)
                .with_key(key))
        }
    }

    /// The key's slot, then a unit of capacity, waiting for each under the
    /// policy within one deadline. A refusal of the unit drops the slot.
    pub(super) async fn keyed_unit_async(&self, id: u64) -> Result<(KeySlot<'_>, usize), Error> {
        let keys = &self.inner.common.keys;
        let deadline = if keys.can_wait() {
            keys.deadline(None)
        } else {
            None
        };
        let key = keys
            .enter_async(id, deadline)
            .await
            .map_err(|err| self.keyed_refusal(err))?;
        let shard = self.inner.common.table.acquire_async(deadline).await?;
        Ok((key, shard))
    }

    /// How many keys have live children (or callers waiting for them) now:
    /// the workflows in flight. The key set forgets a key when its last
    /// child ends, so this is at most `capacity` plus the waiters, and 0
    /// once every keyed child has ended. Read shard by shard while keys
    /// come and go.
    pub fn busy_keys(&self) -> usize {
        self.inner.common.keys.busy_keys()
    }

    /// How many callers wait for a busy key now (they are not in
    /// [`waiting`](Self::waiting), which counts waits for capacity).
    pub fn waiting_for_keys(&self) -> usize {
        self.inner.common.keys.waiting()
    }

    /// [`try_reserve_keyed`](Self::try_reserve_keyed), trying table shard
    /// `start` first (modulo the shard count): the keyed model's seam.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn try_reserve_keyed_at<K: Hash + ?Sized>(
        &self,
        key: &K,
        start: usize,
    ) -> Result<ChildGuard, Error> {
        let keys = &self.inner.common.keys;
        let key = keys
            .try_enter(keys.id(key))
            .map_err(|err| self.keyed_refusal(err))?;
        let start = start % self.inner.common.table.shard_count();
        let child = self.inner.enter(How::At(start), ChildKind::Reserved)?;
        Ok(child.with_key(key))
    }
}
