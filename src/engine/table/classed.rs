//! Admission by priority class: a take of a gated class stops at its
//! line on each shard, not at the shard's limit (`engine/class.rs` says
//! the rule and what it guarantees in total); and the per-class figures.
//!
//! Nothing here is on the hot path. An ask of one unit of the default
//! class never comes here (`admission.rs` sends it to `admit_one`), and
//! the lines live on each shard's own line of cache, beside its limit, so
//! a classed take reads nothing the hot path does not. A take of a gated
//! class is the take of many units (`many.rs`) with the class's line for
//! a limit: one shard with room under its line, else several under the
//! control lock, all or nothing; and, waiting, the room's scheduler
//! (`room.rs`), which takes for a gated waiter only from the table,
//! under that waiter's line.
//!
//! **Exact under a resize.** A resize stores every shard's lines with
//! its limit while the shards are gated (`resize.rs`), and a take re-reads
//! its bound after its CAS (`Shard::try_take_n`): a take that raced the
//! resize with the old line is undone above the new one, as it is above a
//! new limit. `loom_classes.rs` checks it.

use super::{Bound, Grant, Table};
use crate::engine::ask::{Ask, How};
use crate::engine::class::{Class, Headroom};
use crate::engine::waiters::Tenant;
use crate::error::Error;
use crate::sync::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use crossbeam_utils::CachePadded;

/// The per-class figures the table keeps itself: units taken by a
/// request of each class straight from the table, and its refusals. The
/// default class's come from the totals (its hot path counts nothing of
/// its own); units handed to waiters are the room's (`QueueCounts`).
#[derive(Debug, Default)]
pub(super) struct ClassTally {
    counts: [CachePadded<ClassCount>; Class::COUNT],
}

#[derive(Debug, Default)]
struct ClassCount {
    accepted: AtomicU64,
    rejected: AtomicU64,
    /// Units its requests hold now: kept for the gated classes alone,
    /// whose grants carry their class to the give-back (`Grant::class`).
    /// What a min share is checked against.
    held: AtomicUsize,
}

impl ClassTally {
    /// `(accepted units, refusals)` counted for `class`.
    pub(super) fn read(&self, class: Class) -> (u64, u64) {
        let count = &self.counts[class.rank()];
        // Relaxed: counts for a snapshot, ordered with nothing.
        (count.accepted.load(Relaxed), count.rejected.load(Relaxed))
    }

    /// Units `class` holds now, if it is a gated class (the others are
    /// not counted) and `counted` (the table has a min share).
    pub(super) fn held(&self, class: Class, counted: bool) -> Option<usize> {
        // Relaxed: a reading for a snapshot.
        class
            .gate()
            .filter(|_| counted)
            .map(|_| self.counts[class.rank()].held.load(Relaxed))
    }
}

impl Table {
    /// The units a take against `bound` may hold in all: the capacity in
    /// force, or the gated class's share of it.
    pub(super) fn units_within(&self, bound: Bound) -> usize {
        match bound {
            Bound::Limit => self.capacity(),
            Bound::Line(g) => self.headroom.units(g, self.capacity()),
        }
    }

    /// Sets the headroom of the gated classes (a builder's, checked) and
    /// the shards' lines with it. At build, before the table is shared.
    pub(crate) fn set_headroom(&mut self, headroom: Headroom) {
        self.headroom = headroom;
        let limits: Vec<usize> = self.shards.iter().map(|s| s.limit()).collect();
        let held: Vec<usize> = self.shards.iter().map(|s| s.usage()).collect();
        self.store_lines(&limits, &held, self.capacity());
    }

    /// The headroom of gated class `g`, as a fraction of the capacity.
    pub(crate) fn headroom_fraction(&self, class: Class) -> f64 {
        class.gate().map_or(1.0, |g| self.headroom.fraction(g))
    }

    /// The min share of `class`, as a fraction of the capacity (0: none).
    pub(crate) fn min_share_fraction(&self, class: Class) -> f64 {
        class.gate().map_or(0.0, |g| self.headroom.min_fraction(g))
    }

    /// Stores each shard's lines for `limits` over `capacity`, each shard
    /// holding `held`: at build, and by a resize while the shards are
    /// gated, with the limits.
    pub(super) fn store_lines(&self, limits: &[usize], held: &[usize], capacity: usize) {
        let lines = self.headroom.lines(capacity, limits, held);
        for (g, lines) in lines.iter().enumerate() {
            for (shard, &line) in self.shards.iter().zip(lines) {
                // Relaxed: published as the limit is, by the resize's
                // Release un-gating RMW (or the table's publication).
                shard.lines[g].store(line, Relaxed);
            }
        }
    }

    /// [`admit`](Self::admit) of an ask of a class other than the
    /// default, of any number of units: against the class's lines if it
    /// is gated, against the limits if not; waiting in the room, in the
    /// class's place, if the ask waits.
    ///
    /// Its fast path, a fail-fast ask that fits under its line on the
    /// caller's home shard, is the take of `many.rs`'s fast path with the
    /// line for a limit, and a count; everything else is out of line.
    #[inline(never)]
    pub(super) fn admit_classed(&self, ask: &Ask) -> Result<Grant, Error> {
        let (n, class) = (ask.units, ask.class);
        if matches!(ask.how, How::Try) && n > 0 {
            if let Some(shard) = self.take_fast_at(self.home_start(), n, Bound::of(class)) {
                self.count_class_units(class, n);
                return Ok(self.held_as(Grant::on(shard.index(), n), class));
            }
        }
        self.admit_classed_cold(ask)
    }

    /// [`admit_classed`](Self::admit_classed) past its fast path.
    #[cold]
    #[inline(never)]
    fn admit_classed_cold(&self, ask: &Ask) -> Result<Grant, Error> {
        let (n, class) = (ask.units, ask.class);
        if n == 0 {
            return self.acquire_many(0);
        }
        let (start, counted) = match ask.how {
            How::Try | How::Unbounded => (self.home_start(), true),
            How::At(start) => (self.reduce(start), true),
            How::Probe => (self.home_shard(), false),
            How::Wait(deadline) => {
                return self.admit_classed_waiting(n, class, deadline, Tenant::NONE)
            }
        };
        let result = self.take_class(start, n, class);
        self.count_class(class, &result, counted);
        result
    }

    /// A take of `n` units of `class` from `start`, uncounted: under its
    /// bound (the fast take on that shard, one reading and one CAS, else
    /// the walk and the take across shards of `many.rs`), counted in the
    /// class's holdings; else, for a gated class under its min share, on
    /// that share. The grant carries the class.
    #[inline(always)]
    pub(super) fn take_class(&self, start: usize, n: usize, class: Class) -> Result<Grant, Error> {
        let bound = Bound::of(class);
        let taken = match self.take_fast_at(start, n, bound) {
            Some(shard) => Ok(Grant::on(shard.index(), n)),
            None => self.take_many(start, n, bound),
        };
        match taken {
            Ok(grant) => Ok(self.held_as(grant, class)),
            Err(Error::Overload) if self.headroom.has_min_share() => {
                self.take_on_share(start, n, class)
            }
            refused => refused,
        }
    }

    /// A take of `n` units of gated class `c` on its min share (its line
    /// refused them): if the units `c` holds, these counted in, stay
    /// within its min share, they are claimed in its holdings first (one
    /// CAS, so two takes cannot both claim the last of it), then taken
    /// against the shards' limits, not its lines; the claim is undone if
    /// the take fails. So the units a class holds on its min share never
    /// exceed it, whatever races.
    #[cold]
    #[inline(never)]
    fn take_on_share(&self, start: usize, n: usize, class: Class) -> Result<Grant, Error> {
        if !self.claim_share(class, n) {
            return Err(Error::Overload);
        }
        let taken = match self.take_fast_at(start, n, Bound::Limit) {
            Some(shard) => Ok(Grant::on(shard.index(), n)),
            None => self.take_many(start, n, Bound::Limit),
        };
        match taken {
            Ok(grant) => Ok(grant.of_class(class)),
            Err(error) => {
                self.release_class(class, n);
                Err(error)
            }
        }
    }

    /// True if `n` more units of `class` would be within its min share,
    /// as its holdings read now (none for a class without one).
    pub(super) fn under_share(&self, class: Class, n: usize) -> bool {
        let Some(g) = class.gate() else {
            return false;
        };
        let min = self.headroom.min_units(g, self.capacity());
        // Relaxed: a hint for the room's order; `claim_share` decides.
        let held = self.classes.counts[class.rank()].held.load(Relaxed);
        n > 0 && held.checked_add(n).is_some_and(|after| after <= min)
    }

    /// Claims `n` units of `class`'s min share in its holdings, if they
    /// stay within it; false (nothing claimed) if not, or if the class has
    /// none.
    pub(super) fn claim_share(&self, class: Class, n: usize) -> bool {
        let Some(g) = class.gate() else {
            return false;
        };
        let min = self.headroom.min_units(g, self.capacity());
        // Relaxed: the count is its own only bound; the CAS (one total
        // order on this word) is what keeps two claims from both taking
        // the last of the share.
        n > 0
            && self.classes.counts[class.rank()]
                .held
                .fetch_update(Relaxed, Relaxed, |held| {
                    held.checked_add(n).filter(|&after| after <= min)
                })
                .is_ok()
    }

    /// `grant`, just taken under `class`'s line, as units of `class`:
    /// counted in its holdings and stamped with it, if the table counts
    /// (it has a min share); else as it is, and nothing is counted.
    #[inline(always)]
    pub(super) fn held_as(&self, grant: Grant, class: Class) -> Grant {
        if !self.headroom.has_min_share() {
            return grant;
        }
        self.hold_class(class, grant.units());
        grant.of_class(class)
    }

    /// `grant`, given by the room to a waiter of `class`, which the room
    /// counted in its holdings if it counts: stamped with it, if so.
    pub(super) fn stamped(&self, grant: Grant, class: Class) -> Grant {
        if self.headroom.has_min_share() {
            grant.of_class(class)
        } else {
            grant
        }
    }

    /// Counts `n` units admitted to `class` under its line in its
    /// holdings (nothing for a class that is not gated, or a table
    /// without a min share, which counts nothing).
    #[inline(always)]
    pub(super) fn hold_class(&self, class: Class, n: usize) {
        if self.headroom.has_min_share() && class.gate().is_some() {
            // Relaxed: see `claim_share`.
            self.classes.counts[class.rank()].held.fetch_add(n, Relaxed);
        }
    }

    /// Counts `n` units of `class` out of its holdings: a guard's units
    /// as its drop starts to give them back (a unit counts as held until
    /// then), or a claim undone.
    pub(crate) fn release_class(&self, class: Class, n: usize) {
        if class.gate().is_some() {
            // Relaxed: see `claim_share`.
            self.classes.counts[class.rank()].held.fetch_sub(n, Relaxed);
        }
    }

    /// Moves `n` held units from `from`'s holdings to `to`'s: a permit of
    /// one class merged into a permit of another.
    pub(crate) fn reclass(&self, from: Class, to: Class, n: usize) {
        if from != to {
            self.release_class(from, n);
            self.hold_class(to, n);
        }
    }

    /// A waiting ask of `class` (any class, the default included): from
    /// the table if the units are there, else in the room (if any), in
    /// `tenant`'s place, until `deadline` at the latest.
    pub(super) fn admit_classed_waiting(
        &self,
        n: usize,
        class: Class,
        deadline: Option<std::time::Instant>,
        tenant: Tenant,
    ) -> Result<Grant, Error> {
        if let Some(answer) = self.first_take(n, class) {
            return answer;
        }
        match self.room.as_deref() {
            Some(room) => self.wait_blocking(room, deadline, n, class, tenant),
            None => {
                let refused = Err(Error::Overload);
                self.count_class(class, &refused, true);
                refused
            }
        }
    }

    /// Counts a classed take's outcome: its units if admitted, an
    /// `Overload` if `counted` (in the table's total too).
    pub(super) fn count_class(&self, class: Class, result: &Result<Grant, Error>, counted: bool) {
        let count = &self.classes.counts[class.rank()];
        match result {
            // Relaxed: counts for `stats`.
            Ok(grant) => self.count_class_units(class, grant.units()),
            Err(Error::Overload) if counted => {
                self.count_refusal();
                count.rejected.fetch_add(1, Relaxed);
            }
            Err(_) => {}
        }
    }

    /// Counts `units` admitted to `class` straight from the table.
    #[inline(always)]
    fn count_class_units(&self, class: Class, units: usize) {
        // Relaxed: a count for `stats`.
        self.classes.counts[class.rank()]
            .accepted
            .fetch_add(units as u64, Relaxed);
    }

    /// Counts an `Overload` of `class` answered by the room (full), which
    /// the table's total counts already.
    pub(super) fn count_class_refusal(&self, class: Class) {
        // Relaxed: a count for `stats`.
        self.classes.counts[class.rank()]
            .rejected
            .fetch_add(1, Relaxed);
    }

    /// The per-class tally, for `stats`.
    pub(super) fn class_tally(&self) -> &ClassTally {
        &self.classes
    }
}
