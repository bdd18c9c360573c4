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

use super::{Bound, Shard, Table, Take, CLOSED, FLAGS, GATED, UNIT};
use crate::engine::grant::{Grant, Part};
use crate::engine::probe::raw_thread_index;
use crate::engine::waiters::Woken;
use crate::error::Error;
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed, Release};

/// What [`Shard::take_fast_n`] found.
enum FastN {
    /// Taken below the limit: nothing more to do.
    Taken,
    /// Taken, and the shard now holds `now` against `limit` read after the
    /// CAS: its last units, or over a limit a resize lowered.
    Edge { now: usize, limit: usize },
    /// Nothing taken.
    No,
}

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
    #[inline]
    pub(crate) fn acquire_many(&self, n: usize) -> Result<Grant, Error> {
        match self.take_home_n(n) {
            Some(shard) => Ok(Grant::on(shard.index, n)),
            None => self.acquire_many_cold(n),
        }
    }

    /// The fast path of a take of `n > 1` units: all of them below the
    /// limit of the home shard, one reading of its counters and one CAS,
    /// as for one unit (`Shard::take_fast_n`). `None` (nothing taken) for
    /// anything else, which [`acquire_many_cold`](Self::acquire_many_cold)
    /// settles; a front-end building its permit in place calls this
    /// first, so the fast path makes no grant to take apart.
    // inline(always): as `acquire_shard`, the caller's hot path.
    #[inline(always)]
    pub(crate) fn take_home_n(&self, n: usize) -> Option<&Shard> {
        if n < 2 {
            return None;
        }
        self.take_fast_at(self.home_start(), n, Bound::Limit)
    }

    /// The home shard as `acquire_shard` finds it: the thread's index as
    /// stored, when the table allows and it is in range (one load and a
    /// compare), else the probe's.
    #[inline(always)]
    pub(super) fn home_start(&self) -> usize {
        let raw = raw_thread_index();
        if self.thread_home && raw < self.shards.len() {
            raw
        } else {
            self.home_shard_cold()
        }
    }

    /// [`home_shard`](Self::home_shard), out of line: inlined into every
    /// fast take of many units (a CPU probe's call, the fast modulo), it
    /// made `try_acquire_many`'s caller too large for LLVM to inline the
    /// permit's drop into it (89 -> 104 instructions an admission and
    /// release, `scripts/hot-path-instructions.sh`).
    #[cold]
    #[inline(never)]
    fn home_shard_cold(&self) -> usize {
        self.home_shard()
    }

    /// The fast take of `n` units on shard `start` against `bound` (its
    /// limit, or a class's line): the shard, or `None` (nothing taken) for
    /// anything the cold path must settle.
    #[inline(always)]
    pub(super) fn take_fast_at(&self, start: usize, n: usize, bound: Bound) -> Option<&Shard> {
        let shard = &*self.shards[start];
        match shard.take_fast_n(n, bound) {
            FastN::Taken => Some(shard),
            FastN::Edge { now, limit } => self.took_edge_n(start, n, now, limit),
            FastN::No => None,
        }
    }

    /// The fast take of `n` landed at or over the shard's limit: it took
    /// the last units (mark the shard full, as `took_edge` does for one,
    /// and keep them), or a racing resize lowered the limit under it (undo
    /// it: `None`, and the cold path goes on).
    #[cold]
    #[inline(never)]
    fn took_edge_n(&self, start: usize, n: usize, now: usize, limit: usize) -> Option<&Shard> {
        if now > limit {
            self.undo_n(start, n);
            return None;
        }
        self.shards[start].raise_peak(now);
        self.mark_full(start);
        Some(&self.shards[start])
    }

    /// [`acquire_many`](Self::acquire_many) past its fast path.
    #[cold]
    #[inline(never)]
    pub(crate) fn acquire_many_cold(&self, n: usize) -> Result<Grant, Error> {
        match n {
            1 => return self.acquire().map(Grant::one),
            0 => return self.empty_grant(),
            _ => {}
        }
        let result = self.take_many(self.home_shard(), n, Bound::Limit);
        if result == Err(Error::Overload) {
            self.count_refusal();
        }
        result
    }

    /// [`acquire_many`](Self::acquire_many) starting at shard `start`
    /// (modulo the shard count): the models' seam for a caller on a chosen
    /// shard, and the ask of many units `How::At` describes.
    pub(crate) fn acquire_many_at(&self, start: usize, n: usize) -> Result<Grant, Error> {
        let start = self.reduce(start);
        if n == 1 {
            return self.acquire_at(start).map(Grant::one);
        }
        let result = self.take_many(start, n, Bound::Limit);
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
        Ok(Grant::on(self.home_shard(), 0))
    }

    /// The take of `n > 1` units from the home shard, uncounted: the first
    /// step of a wait for them.
    pub(super) fn take_many_uncounted(&self, n: usize) -> Result<Grant, Error> {
        self.take_many(self.home_shard(), n, Bound::Limit)
    }

    /// The take of `n` units from `start` against `bound`, uncounted: of
    /// `n > 1` units against the limits, or of any number of a gated
    /// class against its lines (`classed.rs`).
    pub(super) fn take_many(&self, start: usize, n: usize, bound: Bound) -> Result<Grant, Error> {
        if n > self.units_within(bound) {
            // Relaxed reading of the capacity: a racing grow may make room
            // for it a moment later; the caller may retry once it has.
            // Within the capacity but above a class's share, it is that
            // class being shed: `Overload`, as at an edge a 503, not a
            // 413 for a request that is not too large.
            return if self.is_closing() {
                Err(Error::Shutdown)
            } else if n > self.capacity() {
                Err(Error::TooLarge)
            } else {
                self.refused().map(Grant::one)
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
            match self.take_n_at(i, n, bound) {
                Take::Taken { .. } => return Ok(Grant::on(i, n)),
                Take::Closed => return Err(Error::Shutdown),
                Take::Gated => gated = true,
                Take::Full | Take::Over => {}
            }
        }
        // 2. The sum of what the shards show free, without a lock.
        if !gated && self.free_seen(bound) < n {
            return self.refused().map(Grant::one);
        }
        // 3. Across shards, under the control lock.
        self.take_across(start, n, bound)
    }

    /// The free units the shards show, each read on its own (plain loads:
    /// a reading, which the take across shards makes exact).
    fn free_seen(&self, bound: Bound) -> usize {
        self.shards
            .iter()
            .map(|shard| {
                let (usage, _, _) = shard.counts();
                shard.bound(bound).saturating_sub(usage)
            })
            .sum()
    }

    /// One take of `n` units on shard `i`, with the full-set steps: the
    /// shard is marked when this take filled it (or found it at its limit),
    /// and a take over a limit lowered meanwhile is undone.
    fn take_n_at(&self, i: usize, n: usize, bound: Bound) -> Take {
        let take = self.shards[i].try_take_n(n, FLAGS, bound);
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
    fn take_across(&self, start: usize, n: usize, bound: Bound) -> Result<Grant, Error> {
        let mut woken = Woken::default();
        let mut control = self.control.lock();
        let result = if control.debt && !self.settle(&mut control, &mut woken) {
            self.refused().map(Grant::one)
        } else {
            self.take_across_locked(start, n, bound)
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
    pub(super) fn take_across_locked(
        &self,
        start: usize,
        n: usize,
        bound: Bound,
    ) -> Result<Grant, Error> {
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
            let (set, read) = self.gate_and_read(i, bound);
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
                match self.shards[part.shard].try_take_n(part.units, CLOSED, bound) {
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
    fn gate_and_read(&self, i: usize, bound: Bound) -> (bool, Gated) {
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
            Gated::Free(shard.bound(bound).saturating_sub(shard.usage_synced())),
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

    /// Gives back `n` units of `shard` in one release, asking `panicked`
    /// (a front-end passes `thread::panicking`) once they are back: a
    /// permit of many units from one shard. Inline, the table without a
    /// waiting room alone (the full-set steps and one RMW); a room's
    /// hand-offs out of line.
    ///
    /// The shape of `release_shard`'s fast path, for a run: step 2's read
    /// with the shard's own bit, the RMW on `given`, step 3's read, then
    /// the panic question; a marked shard, a table of more than 64 shards
    /// or one with a waiting room go out of line.
    #[inline(always)]
    pub(crate) fn release_run<P: FnOnce() -> bool>(&self, shard: &Shard, n: usize, panicked: P) {
        if !self.one_word || self.full.first_word() & shard.bit != 0 || self.room.is_some() {
            return self.release_run_general(shard.index, n, panicked());
        }
        // AcqRel: as in `Shard::give_back_many`, which argues both halves.
        shard.given.fetch_add(n * UNIT, AcqRel);
        // Step 3's read, ordered after a racing marker's `insert` by the
        // RMW just made (see `Table::give_back_many`).
        if self.full.first_word() & shard.bit != 0 {
            self.unmark(shard.index);
        }
        if panicked() {
            // Release, and after `given`: as in `Shard::give_back_many`.
            shard.panicked.fetch_add(n, Release);
        }
    }

    /// [`release_run`](Self::release_run) through the whole protocol.
    #[cold]
    #[inline(never)]
    fn release_run_general(&self, i: usize, n: usize, panicked: bool) {
        self.release_units(i, n, panicked);
    }

    /// Gives back `units` units of shard `i`, all by a panic if `panicked`.
    pub(crate) fn release_units(&self, i: usize, units: usize, panicked: bool) {
        let by_panic = if panicked { units } else { 0 };
        self.release_many(i, units, by_panic);
    }

    /// Gives back every unit of `grant`, all by a panic if `panicked`:
    /// the end of a request of many units (a pool's weighed envelope).
    pub(crate) fn release_grant(&self, grant: &Grant, panicked: bool) {
        // Out of its class's and its key's holdings first
        // (`release_class`, `release_key`).
        self.release_class(grant.class, grant.units());
        self.release_key(grant.key, grant.units());
        for part in grant.parts() {
            self.release_units(part.shard, part.units, panicked);
        }
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
    /// The fast path's take of `n` units (`take_fast` for one): one reading
    /// of the counters and at most one CAS. Anything it cannot settle (a
    /// flag, too little room, a lost CAS) is [`FastN::No`], left to the
    /// cold path; the last units, or a take over a limit a resize lowered,
    /// are [`FastN::Edge`], handled out of line by the caller.
    #[inline(always)]
    fn take_fast_n(&self, n: usize, bound: Bound) -> FastN {
        // Acquire, both: as in `take_fast`.
        let taken = self.taken.load(Acquire);
        let given = self.given.load(Acquire);
        // As in `take_fast`: a flag or a negative gap lands far above any
        // limit, so one compare refuses them with too little room.
        let usage = taken
            .wrapping_sub(given)
            .rotate_right(UNIT.trailing_zeros());
        let line = self.bound(bound);
        if usage >= line || line - usage < n {
            return FastN::No;
        }
        // As `take_fast`'s CAS (and `try_take_masked`'s, argued there).
        if self
            .taken
            .compare_exchange(taken, taken + n * UNIT, AcqRel, Relaxed)
            .is_err()
        {
            return FastN::No;
        }
        let now = usage + n;
        // The bound again after the CAS, as `take_fast` reads the limit:
        // over it, the caller undoes the take (`took_edge_n`).
        let line = self.bound(bound);
        if now > line {
            return FastN::Edge { now, limit: line };
        }
        // At the limit: the caller marks the shard full. (Against the
        // limit itself, the two compares are one.)
        let limit = match bound {
            Bound::Limit => line,
            Bound::Line(_) => self.limit(),
        };
        if now >= limit {
            return FastN::Edge { now, limit };
        }
        self.raise_peak(now);
        FastN::Taken
    }

    /// Takes `n` units if the shard is open and has room for all of them;
    /// stops at the flags in `stop` (`FLAGS` normally, `CLOSED` alone for
    /// a take under the control lock past a gate it or a resize set).
    ///
    /// `Full` (fewer than `n` free) is only answered when it was so at one
    /// instant: the instant of an RMW on `given`, which reads its newest
    /// value. A plain load of `given` may lag (in the memory model, and
    /// across a preemption) behind releases that came before the `taken`
    /// we hold, and two such reads can add up to a usage the shard never
    /// had. For one unit this is [`try_take`](Self::try_take)'s body.
    #[inline(always)]
    pub(super) fn try_take_n(&self, n: usize, stop: usize, bound: Bound) -> Take {
        debug_assert!(n >= 1);
        // Relaxed: the CAS below re-checks this exact value, and the limit
        // is checked again after it (see there).
        let mut taken = self.taken.load(Relaxed);
        // Acquire: pairs with the AcqRel RMW in `give_back_many`, so work
        // done under a released unit happens-before work under the unit
        // that replaces it.
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
                // Units were taken *and* given back after our `taken` was
                // read, so `given` passed it. Every release we read was
                // preceded (happens-before) by its take, so a fresh read of
                // `taken` covers them. Relaxed, as above.
                taken = self.taken.load(Relaxed);
                continue;
            }
            let usage = gap / UNIT;
            if usage.saturating_add(n) > self.bound(bound) {
                // Too little room by these reads; confirm against the
                // newest `given`. AcqRel RMW (adds nothing): it reads the
                // last release in `given`'s modification order. Unchanged
                // means the shard had too little room at this RMW (`taken`
                // only grows).
                let newest = self.given.fetch_add(0, AcqRel);
                if newest == given {
                    return Take::Full;
                }
                given = newest;
                continue;
            }
            // Release on success: publishes the releases this taker read,
            // so a reader that reads `taken` and then `given` with Acquire
            // (`Shard::counts`) never computes a usage above the limit.
            // Acquire on success: pairs with the Release of a resize's
            // un-gating RMW on this word, for the limit read below.
            // Relaxed on failure: the loop re-reads. Against a fixed limit
            // the bound needs no ordering: this RMW succeeds only against
            // the value the check used, and `given` can only have grown.
            match self
                .taken
                .compare_exchange_weak(taken, taken + n * UNIT, AcqRel, Relaxed)
            {
                Ok(_) => {
                    let now = usage + n;
                    // The limit may have been lowered since it was checked:
                    // a resize gated this word, stored a new limit and
                    // un-gated it, leaving the very value this CAS expected.
                    // The CAS read that un-gating RMW (or a later one), so
                    // this read sees the new limit. Over it, the take is
                    // undone (`Table::undo`): nobody ever held it. One load
                    // of a line this CAS just wrote.
                    // A class's line is stored with the limit, under the
                    // same gate: the same argument holds for it.
                    if now > self.bound(bound) {
                        return Take::Over;
                    }
                    self.raise_peak(now);
                    return Take::Taken {
                        now_full: now >= self.limit(),
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
