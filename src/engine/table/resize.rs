//! Resize: `set_capacity` while admissions run, exact under every race,
//! and the debt of a shrink below what is held.
//!
//! Each shard's limit is an atomic word, changed only by
//! [`Table::set_capacity`] under the control lock, in three steps:
//!
//! 1. **Gate** every shard: set bit 1 of `taken` (GATED). A take either
//!    came before (it is in the holdings read next), or sees GATED and
//!    goes to [`Table::acquire_gated`], which waits for the control lock,
//!    or fails its CAS against the changed word and sees GATED next round.
//! 2. **Read** each shard's holdings: exact, since no take can land, and
//!    from here they only fall. Split the capacity over them
//!    (`split.rs`): every limit at least its shard's holdings, adding up to
//!    the capacity, so `sum(max(held, limit)) = capacity` and nothing is
//!    admitted while that many are held.
//! 3. **Store** the limits, hand new room to waiters while still gated (no
//!    newcomer can take it first), and **un-gate** (clear the bit, Release).
//!    A taker that read the word and the old limit before the gate finds
//!    the same value again and its CAS succeeds; so every take reads the
//!    limit again after its CAS (an Acquire that pairs with the un-gate,
//!    one load of the line it just wrote) and undoes itself above it
//!    (`Take::Over`, given back, counted nowhere). Without that second
//!    read, `loom_resize.rs` fails. (Changing the word instead, with a
//!    phantom unit added and given back, was tried: a reader then saw one
//!    unit fewer than is held, and an empty shard that is not, which a
//!    pool worker's drain rule or `wait_idle` would take at its word. An
//!    over-take errs the other way: for the moment before its undo, a
//!    reader sees one unit more than is held, and a `wait_idle` that reads
//!    it then waits for the next child to leave, or its timeout. After a
//!    close, no take lands, so a pool's drain rule is exact.)
//!
//! If more units are held than the new capacity, no split works: the table
//! is in *debt*. The shards stay gated, so every admission goes through the
//! control lock, where it is refused until a fresh reading finds the
//! holdings back within the capacity; that admission settles the debt
//! (split, un-gate) and goes on. Releases need nothing: they only lower the
//! holdings. A hand-off to a waiter is refused during a debt (it would
//! admit above the capacity).
//!

use super::{Control, Table, Take, GATED};
use crate::engine::split;
use crate::engine::waiters::Woken;
use crate::error::{ConfigError, Error};
use crate::sync::Ordering::{AcqRel, Relaxed, Release};

impl Table {
    /// Sets the capacity to `capacity`; see the module docs ("Resize").
    pub(crate) fn set_capacity(&self, capacity: usize) -> Result<(), ConfigError> {
        self.resize_with(|_| Some(capacity)).map(|_| ())
    }

    /// [`set_capacity`](Self::set_capacity), answering the units held when
    /// the resize read them (its shards gated): for the loom models, which
    /// learn from it on which side of the gate a racing take landed.
    #[cfg(loom)]
    pub(crate) fn set_capacity_reading(&self, capacity: usize) -> usize {
        let mut seen = 0;
        self.resize_reading(|_| Some(capacity), &mut seen)
            .expect("a valid capacity");
        seen
    }

    /// Raises the capacity by `units`, whatever it is when the resize runs:
    /// two calls that race both land (a read then a `set_capacity` could
    /// lose one). The capacity after it.
    pub(crate) fn add_capacity(&self, units: usize) -> Result<usize, ConfigError> {
        self.resize_with(|capacity| capacity.checked_add(units))
    }

    /// Lowers the capacity by `units` (to 0 at the least), whatever it is
    /// when the resize runs. Never revokes a held unit: if more are held
    /// than the new capacity, the difference is a debt that releases repay
    /// (see the module docs). The capacity after it.
    pub(crate) fn remove_capacity(&self, units: usize) -> usize {
        self.resize_with(|capacity| Some(capacity.saturating_sub(units)))
            .expect("a lower capacity is always within the maximum")
    }

    /// The resize of the module docs to `target(capacity in force)`, read
    /// and applied under the control lock, so that concurrent relative
    /// resizes compose. `None` from `target`, or a capacity above the
    /// maximum: a [`ConfigError`] naming `capacity`, and nothing changes.
    fn resize_with(
        &self,
        target: impl FnOnce(usize) -> Option<usize>,
    ) -> Result<usize, ConfigError> {
        self.resize_reading(target, &mut 0)
    }

    /// [`resize_with`](Self::resize_with), storing in `seen` the units
    /// held as step 2 read them.
    fn resize_reading(
        &self,
        target: impl FnOnce(usize) -> Option<usize>,
        seen: &mut usize,
    ) -> Result<usize, ConfigError> {
        let max = self.max_capacity();
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        let capacity = match target(self.capacity()) {
            Some(capacity) if capacity <= max => capacity,
            _ => {
                drop(control);
                return Err(ConfigError::too_large("capacity", max));
            }
        };
        // 1. Gate: from here every take goes to `acquire_gated`, which waits
        //    for this lock. AcqRel: the RMW puts the gate in each word's
        //    modification order, so a take either came before it (and is
        //    in the holdings read below) or sees GATED, or fails its CAS.
        for shard in self.shards.iter() {
            shard.taken.fetch_or(GATED, AcqRel);
        }
        // 2. The holdings: exact, since no take can land, and from here they
        //    only fall (releases).
        let held: Vec<usize> = self.shards.iter().map(|s| s.usage_synced()).collect();
        *seen = held.iter().sum();
        // Relaxed: a reading for `capacity()`; the limits decide admission.
        self.capacity.store(capacity, Relaxed);
        // 3. New limits: at or above each shard's holdings and adding up to
        //    `capacity`; or, if more is held than that, a debt: the shards
        //    stay gated until `settle` finds the units back within it.
        match split::split(capacity, &held, self.caps.as_deref()) {
            Some(limits) => {
                control.debt = false;
                self.apply(&mut control, &limits, &held, true, &mut woken);
            }
            None => {
                control.debt = true;
                let limits = split::even(capacity, self.shards.len(), self.caps.as_deref());
                self.apply(&mut control, &limits, &held, false, &mut woken);
            }
        }
        // Waiters of more units than the new capacity can never be served:
        // they are told so now, not left to their deadline.
        if let Some(room) = self.room.as_deref() {
            let within = |class| self.units_within(super::Bound::of(class));
            control.queue.end_too_large(room, within, &mut woken);
        }
        drop(control);
        // 4. Wake the waiters a grow served: un-gated and unlocked, so a
        //    waker that calls back into the table finds it open, and one
        //    that panics leaves it consistent.
        self.wake(woken);
        Ok(capacity)
    }

    /// Stores `limits` (and the classes' lines over `held`, what each shard
    /// holds), hands new room to waiters (pushing them onto
    /// `woken`, for the caller to wake after the lock), un-gates every
    /// shard if `ungate`, and marks each shard full or not under its new
    /// limit. Under the control lock.
    fn apply(
        &self,
        control: &mut Control,
        limits: &[usize],
        held: &[usize],
        ungate: bool,
        woken: &mut Woken,
    ) {
        for (shard, &limit) in self.shards.iter().zip(limits) {
            // Relaxed: published by the Release un-gating RMW below (or, in
            // debt, by the control lock that `settle` takes before it
            // un-gates).
            shard.limit.store(limit, Relaxed);
        }
        // The classes' lines with the limits, published the same way, split
        // over what each shard holds where the shares allow it.
        self.store_lines(limits, held, self.capacity());
        if ungate {
            // Growing hands the new room to waiters first: while the shards
            // are still gated, no newcomer can take it. They are woken by
            // the caller, after the un-gate and the lock.
            self.grant_waiting(control, woken);
            for shard in self.shards.iter() {
                // Release: pairs with the AcqRel CAS in `take_fast` or
                // `try_take` that reads this value (or a later one in its
                // release sequence), so that take's second limit read sees
                // the store above. (This leaves the word as it was before the
                // gate, so a taker that read it then can still succeed with
                // a stale limit: that second read is what catches it. Making
                // the word change instead, with a phantom unit, would let a
                // reader see a unit fewer than is held, an empty shard that
                // is not: a pool worker could then think itself drained.)
                shard.taken.fetch_and(!GATED, Release);
            }
        }
        for i in 0..self.shards.len() {
            if self.shards[i].still_full() {
                self.mark_full(i);
            } else {
                self.unmark(i);
            }
        }
    }

    /// Admission through a gated shard: a resize is in progress, or the
    /// table is in debt. Waits for the control lock (a resize holds it for
    /// a few RMWs per shard), settles a debt if enough units came back,
    /// then probes again, still under the lock: while it is held and there
    /// is no debt, no shard is gated, so the probe cannot come back here.
    #[cold]
    pub(super) fn acquire_gated(&self, start: usize, except_start: bool) -> Result<usize, Error> {
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        let result = if control.debt && !self.settle(&mut control, &mut woken) {
            self.refused()
        } else if except_start {
            self.acquire_slow(start, true)
        } else {
            self.try_at::<false>(start)
        };
        drop(control);
        // The waiters a settled debt served, after the lock.
        self.wake_keeping(woken, result.ok());
        result
    }

    /// Ends a debt if the units held are back within the capacity: splits
    /// it over the holdings and un-gates, pushing the waiters it served
    /// onto `woken`. True if there is no debt now. Under the control lock.
    pub(super) fn settle(&self, control: &mut Control, woken: &mut Woken) -> bool {
        // While in debt every shard is gated, so no bounded take lands:
        // these readings only fall (unbounded takes aside, which the next
        // settle sees).
        let held: Vec<usize> = self.shards.iter().map(|s| s.usage_synced()).collect();
        match split::split(self.capacity(), &held, self.caps.as_deref()) {
            Some(limits) => {
                control.debt = false;
                self.apply(control, &limits, &held, true, woken);
                true
            }
            None => false,
        }
    }

    /// [`take_at`](Self::take_at) on shard `i`, through the control lock
    /// if the shard is gated (as `acquire_gated`: under the lock with no
    /// debt, no shard is gated).
    pub(super) fn take_only(&self, i: usize) -> Take {
        match self.take_at(i) {
            Take::Gated => {
                let mut woken = Woken::default();
                let mut control = self.control.lock();
                let take = if control.debt && !self.settle(&mut control, &mut woken) {
                    Take::Full
                } else {
                    self.take_at(i)
                };
                drop(control);
                let taken = matches!(take, Take::Taken { .. }).then_some(i);
                self.wake_keeping(woken, taken);
                take
            }
            take => take,
        }
    }

    /// True while more units are held than the capacity (after a shrink).
    #[cfg(any(loom, test))]
    pub(crate) fn in_debt(&self) -> bool {
        self.control.lock().debt
    }
}
