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
use crate::error::Error;
use crate::sync::{AtomicU64, Ordering::Relaxed};
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
}

impl ClassTally {
    /// `(accepted units, refusals)` counted for `class`.
    pub(super) fn read(&self, class: Class) -> (u64, u64) {
        let count = &self.counts[class.rank()];
        // Relaxed: counts for a snapshot, ordered with nothing.
        (count.accepted.load(Relaxed), count.rejected.load(Relaxed))
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
                return Ok(Grant::on(shard.index(), n));
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
        let bound = Bound::of(class);
        let (start, counted) = match ask.how {
            How::Try | How::Unbounded => (self.home_start(), true),
            How::At(start) => (self.reduce(start), true),
            How::Probe => (self.home_shard(), false),
            How::Wait(deadline) => return self.admit_classed_waiting(n, class, deadline),
        };
        let result = self.take_classed(start, n, bound);
        self.count_class(class, &result, counted);
        result
    }

    /// A take of `n` units against `bound` from `start`: the fast take on
    /// that shard (one reading, one CAS), else the walk and the take
    /// across shards of `many.rs`.
    #[inline(always)]
    fn take_classed(&self, start: usize, n: usize, bound: Bound) -> Result<Grant, Error> {
        match self.take_fast_at(start, n, bound) {
            Some(shard) => Ok(Grant::on(shard.index(), n)),
            None => self.take_many(start, n, bound),
        }
    }

    /// A waiting ask of `class`: from the table if the units are there,
    /// else in the room (if any) until `deadline` at the latest.
    fn admit_classed_waiting(
        &self,
        n: usize,
        class: Class,
        deadline: Option<std::time::Instant>,
    ) -> Result<Grant, Error> {
        let first = self.take_classed(self.home_shard(), n, Bound::of(class));
        // More than the class's whole share (but within the capacity):
        // refused now, not left to wait for what no release brings.
        let never = n > self.units_within(Bound::of(class));
        if first != Err(Error::Overload) || never {
            self.count_class(class, &first, never);
            return first;
        }
        match self.room.as_deref() {
            Some(room) => self.wait_blocking(room, deadline, n, class),
            None => {
                self.count_class(class, &first, true);
                first
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
