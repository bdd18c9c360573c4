//! Requests of many units: `n` units taken at once, all or nothing, from
//! one shard when one has room for all of them, else from several under
//! the control lock; and the [`Grant`] that says where they were taken.
//!
//! The one-unit hot path (`admit.rs`) is left as it is: a take of one unit
//! never comes here.
//!
//! # The take of `n`
//!
//! 1. **One shard.** The caller's home shard, then every shard whose full
//!    bit is clear, each through one CAS of `n` units
//!    ([`Shard::try_take_n`]): the common case when `n` is small against a
//!    shard's limit.
//! 2. **A look at the sum.** If no single shard has room for `n`, the free
//!    units of every shard are added up from plain reads. Fewer than `n`:
//!    `Overload`, without a lock. The shards are not read at one instant,
//!    so this promises what a one-unit refusal promises: the shards, read
//!    one after another during the call, showed fewer than `n` free.
//! 3. **Across shards, under the control lock** (`Table::take_across`):
//!    the shards are *gated* one at a time (the gate of a resize,
//!    `resize.rs`), and each one's usage is read exactly (no bounded take
//!    can land on a gated shard, so from then on its free units only grow).
//!    Once the gated shards have `n` free between them, the planned units
//!    are taken from each and the gates lifted; if all of them together
//!    have fewer, nothing is taken, the gates are lifted, and the answer is
//!    `Overload`.
//!
//! **Why a one-unit caller never sees `Overload` because of it.** A take
//! across shards never takes a unit it might give back: it takes only once
//! the exact reads say all `n` are there, on shards nobody else can take
//! from meanwhile. A one-unit caller that meets a gated shard waits for the
//! control lock and tries again after (`acquire_gated`); the gated take
//! sets no full bit until its units are taken for good. So every unit a
//! one-unit caller finds missing is held by someone, at the moment it looks.
//!
//! Under the lock with no debt, no shard is gated: the take across shards
//! lifts its gates before it lets the lock go (as a resize does), and
//! refuses at once while the table is in debt (every shard gated until
//! enough units are back).

use super::{Shard, Table, Take, CLOSED, FLAGS, GATED, UNIT};
use crate::engine::grant::{Grant, More, Part};
use crate::engine::waiters::Woken;
use crate::error::Error;
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};

/// What a planned take across shards found on one shard: its free units
/// (exact, the shard being gated), or that it is closed.
enum Gated {
    Free(usize),
    Closed,
}

impl Table {
    /// Takes `n` units at once, all or nothing, starting at the caller's
    /// home shard; see the module docs. `Overload` (counted) when fewer
    /// than `n` were seen free, [`Error::TooLarge`] at once when `n` is
    /// above the capacity in force, `Shutdown` once closed. A take of one
    /// unit is the hot path's; of 0 units, a grant of nothing.
    pub(crate) fn acquire_many(&self, n: usize) -> Result<Grant, Error> {
        match n {
            1 => return self.acquire().map(Grant::one),
            0 => return self.empty_grant(),
            _ => {}
        }
        let result = self.take_many(self.home_shard(), n);
        if result == Err(Error::Overload) {
            self.count_refusal();
        }
        result
    }

    /// [`acquire_many`](Self::acquire_many) starting at shard `start`
    /// (modulo the shard count): the models' seam for a caller on a chosen
    /// shard.
    #[cfg(loom)]
    pub(crate) fn acquire_many_at(&self, start: usize, n: usize) -> Result<Grant, Error> {
        let start = self.reduce(start);
        if n == 1 {
            return self.acquire_at(start).map(Grant::one);
        }
        let result = self.take_many(start, n);
        if result == Err(Error::Overload) {
            self.count_refusal();
        }
        result
    }

    /// A grant of 0 units on the home shard, or `Shutdown` once closed.
    fn empty_grant(&self) -> Result<Grant, Error> {
        if self.is_closed() {
            return Err(Error::Shutdown);
        }
        Ok(Grant {
            shard: self.home_shard(),
            more: Some(Box::default()),
        })
    }

    /// The take of `n > 1` units from the home shard, uncounted: the first
    /// step of a wait for them.
    pub(super) fn take_many_uncounted(&self, n: usize) -> Result<Grant, Error> {
        self.take_many(self.home_shard(), n)
    }

    /// The take of `n > 1` units from `start`, uncounted.
    fn take_many(&self, start: usize, n: usize) -> Result<Grant, Error> {
        if n > self.capacity() {
            // Relaxed reading of the capacity: a racing grow may make room
            // for it a moment later; the caller may retry once it has.
            return if self.is_closing() {
                Err(Error::Shutdown)
            } else {
                Err(Error::TooLarge)
            };
        }
        // 1. One shard with room for all `n`: the home shard, then the rest.
        let count = self.shards.len();
        let mut gated = false;
        for step in 0..count {
            let i = (start + step) % count;
            if step > 0 && self.full.contains(i) {
                continue;
            }
            match self.take_n_at(i, n) {
                Take::Taken { .. } => return Ok(self.grant_n(i, n)),
                Take::Closed => return Err(Error::Shutdown),
                Take::Gated => gated = true,
                Take::Full | Take::Over => {}
            }
        }
        // 2. The sum of what the shards show free, without a lock.
        if !gated && self.free_seen() < n {
            return self.refused().map(Grant::one);
        }
        // 3. Across shards, under the control lock.
        self.take_across(start, n)
    }

    /// The grant of `n` units all on shard `i`.
    fn grant_n(&self, i: usize, n: usize) -> Grant {
        Grant {
            shard: i,
            more: Some(Box::new(More {
                here: n,
                rest: Vec::new(),
            })),
        }
    }

    /// The free units the shards show, each read on its own (plain loads:
    /// a reading, which the take across shards makes exact).
    fn free_seen(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let (usage, _, _) = shard.counts();
                shard.limit().saturating_sub(usage)
            })
            .sum()
    }

    /// One take of `n` units on shard `i`, with the full-set steps: the
    /// shard is marked when this take filled it (or found it at its limit),
    /// and a take over a limit lowered meanwhile is undone.
    fn take_n_at(&self, i: usize, n: usize) -> Take {
        let take = self.shards[i].try_take_n(n, FLAGS);
        match take {
            Take::Taken { now_full: true } => self.mark_full(i),
            Take::Full if self.shards[i].looks_at_limit() => self.mark_full(i),
            Take::Over => self.undo_n(i, n),
            _ => {}
        }
        take
    }

    /// Gives back `n` units taken over a limit lowered meanwhile, as
    /// [`undo`](Self::undo) does for one: nobody held them, so they are
    /// left out of the stats, the shard is marked, and a waiter that came
    /// in meanwhile is served from the table.
    fn undo_n(&self, i: usize, n: usize) {
        self.give_back_many(i, n, 0);
        // Relaxed: a count, read by `stats` only.
        self.shards[i].phantom.fetch_add(n, Relaxed);
        self.mark_full(i);
        if self.waiting() > 0 {
            self.grant_from_table();
        }
    }

    /// Step 3 of the module docs: `n` units from several shards, under the
    /// control lock, all or nothing.
    #[cold]
    fn take_across(&self, start: usize, n: usize) -> Result<Grant, Error> {
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        let result = if control.debt && !self.settle(&mut control, &mut woken) {
            self.refused().map(Grant::one)
        } else {
            self.take_across_locked(start, n)
        };
        drop(control);
        // The waiters a settled debt served, after the lock.
        self.wake(woken);
        result
    }

    /// [`take_across`](Self::take_across) under the lock, no debt: so no
    /// shard is gated but by this call, or by a resize that holds the lock
    /// and serves the waiting room before it lifts its gates (then this
    /// call lifts only the gates it set itself).
    pub(super) fn take_across_locked(&self, start: usize, n: usize) -> Result<Grant, Error> {
        let count = self.shards.len();
        let mut gated = Vec::new();
        let mut plan = Vec::new();
        let mut planned = 0;
        let mut closed = false;
        for step in 0..count {
            if planned == n {
                break;
            }
            let i = (start + step) % count;
            let (set, read) = self.gate_and_read(i);
            if set {
                gated.push(i);
            }
            match read {
                Gated::Free(0) => {}
                Gated::Free(free) => {
                    let k = free.min(n - planned);
                    plan.push(Part { shard: i, units: k });
                    planned += k;
                }
                Gated::Closed => {
                    closed = true;
                    break;
                }
            }
        }
        let mut taken = Vec::with_capacity(plan.len());
        if planned == n && !closed {
            for part in &plan {
                // Under the gate no bounded take lands, so the planned
                // units are there; an unbounded take (a pool's
                // `*_unbounded`, past every limit) may have come since:
                // then give back what was taken and refuse.
                match self.shards[part.shard].try_take_n(part.units, CLOSED) {
                    Take::Taken { .. } => taken.push(*part),
                    _ => break,
                }
            }
            if taken.len() < plan.len() {
                for part in taken.drain(..) {
                    self.give_back_gated(part);
                }
            }
        }
        // Lift the gates (Release: pairs with the Acquire of a take's CAS
        // that reads this value, as a resize's un-gating does), then mark
        // the shards this take filled.
        for &i in &gated {
            self.shards[i].taken.fetch_and(!GATED, Release);
        }
        for part in &taken {
            if self.shards[part.shard].looks_at_limit() {
                self.mark_full(part.shard);
            }
        }
        if closed {
            return Err(Error::Shutdown);
        }
        if taken.is_empty() {
            return self.refused().map(Grant::one);
        }
        Ok(Grant::from_parts(start, taken))
    }

    /// Gates shard `i` (as a resize does) and reads its free units, exact
    /// from here until the gate is lifted (they can only grow).
    /// Whether this call set the gate (it was not set already).
    fn gate_and_read(&self, i: usize) -> (bool, Gated) {
        let shard = &self.shards[i];
        // AcqRel: the RMW puts the gate in the word's modification order,
        // so a take either came before it (and is in the usage read next)
        // or sees GATED and waits for the control lock, or fails its CAS.
        let word = shard.taken.fetch_or(GATED, AcqRel);
        let set = word & GATED == 0;
        if word & CLOSED != 0 {
            return (set, Gated::Closed);
        }
        (
            set,
            Gated::Free(shard.limit().saturating_sub(shard.usage_synced())),
        )
    }

    /// Units the table has admitted so far, read without stopping anyone
    /// (Relaxed loads of each shard's `taken`): a count that only grows,
    /// for the waiting room's pass budget.
    pub(super) fn admitted_total(&self) -> usize {
        self.shards
            .iter()
            // Relaxed: an estimate; nothing is published through it.
            .map(|shard| shard.taken.load(Relaxed) / UNIT)
            .fold(0, usize::wrapping_add)
    }

    /// Gives back units a take across shards took and could not keep,
    /// while their shard is still gated: nobody else saw them.
    fn give_back_gated(&self, part: Part) {
        let shard = &self.shards[part.shard];
        shard.give_back_many(part.units, 0);
        // Relaxed: counts for `stats` (taken and given once each, left out).
        shard.phantom.fetch_add(part.units, Relaxed);
    }

    /// Gives back every unit of `grant`, `panicked` if its holder was
    /// unwinding: each shard's units in one release.
    pub(crate) fn release_grant(&self, grant: Grant, panicked: bool) {
        match grant.more {
            None => self.release(grant.shard, panicked),
            Some(more) => {
                self.release_units(grant.shard, more.here, panicked);
                for part in &more.rest {
                    self.release_units(part.shard, part.units, panicked);
                }
            }
        }
    }

    /// Gives back `units` units of shard `i`, all by a panic if `panicked`.
    pub(crate) fn release_units(&self, i: usize, units: usize, panicked: bool) {
        let by_panic = if panicked { units } else { 0 };
        self.release_many(i, units, by_panic);
    }

    /// Records that every unit of `grant` will never be given back
    /// (`Permit::forget`): they stay counted in the usage for good.
    pub(crate) fn forget_grant(&self, grant: Grant) {
        for part in grant.parts() {
            // Relaxed: a count, read only by `stats`.
            self.shards[part.shard]
                .forgotten
                .fetch_add(part.units, Relaxed);
        }
    }
}

impl Shard {
    /// Takes `n` units if the shard is open and has room for all of them;
    /// stops at the flags in `stop` (`FLAGS` normally, `CLOSED` alone for
    /// a take across shards, under the gate it set itself).
    ///
    /// `Full` here means fewer than `n` free: confirmed, as
    /// [`try_take`](Self::try_take) confirms, against the newest `given`
    /// read through an RMW. The orderings are `try_take_masked`'s, argued
    /// there.
    pub(super) fn try_take_n(&self, n: usize, stop: usize) -> Take {
        debug_assert!(n >= 1);
        // Relaxed: the CAS re-checks this exact value.
        let mut taken = self.taken.load(Relaxed);
        // Acquire: pairs with the AcqRel RMW in `give_back_many`.
        let mut given = self.given.load(Acquire);
        loop {
            if taken & stop != 0 {
                return if taken & CLOSED != 0 {
                    Take::Closed
                } else {
                    Take::Gated
                };
            }
            let gap = taken.wrapping_sub(given);
            if (gap as isize) < 0 {
                // `given` passed our `taken`: read `taken` again (Relaxed,
                // as above; see `try_take_masked`).
                taken = self.taken.load(Relaxed);
                continue;
            }
            let usage = gap / UNIT;
            let limit = self.limit();
            if usage.saturating_add(n) > limit {
                // AcqRel RMW adding nothing: the newest `given`, as in
                // `try_take_masked`.
                let newest = self.given.fetch_add(0, AcqRel);
                if newest == given {
                    return Take::Full;
                }
                given = newest;
                continue;
            }
            // AcqRel on success, Relaxed on failure: as in
            // `try_take_masked` (Release publishes the releases read,
            // Acquire pairs with a resize's un-gating for the limit below).
            match self
                .taken
                .compare_exchange_weak(taken, taken + n * UNIT, AcqRel, Relaxed)
            {
                Ok(_) => {
                    let now = usage + n;
                    // The limit again after the CAS, as in `try_take_masked`:
                    // over a limit a racing resize lowered, the caller undoes
                    // the take.
                    let limit = self.limit();
                    if now > limit {
                        return Take::Over;
                    }
                    self.raise_peak(now);
                    return Take::Taken {
                        now_full: now >= limit,
                    };
                }
                Err(actual) => {
                    taken = actual;
                    // Acquire: as above.
                    given = self.given.load(Acquire);
                }
            }
        }
    }

    /// True if one reading of the counters shows no unit free: the shard's
    /// full bit is then worth setting (`mark_full` re-checks it).
    fn looks_at_limit(&self) -> bool {
        let (usage, _, _) = self.counts();
        usage >= self.limit()
    }
}
