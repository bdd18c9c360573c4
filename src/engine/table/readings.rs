//! Readings of the table while it runs: usage (exact at one instant, or a
//! lower bound under churn, never high) and the [`Stats`] snapshot.
//!
//! [`Stats`]: crate::Stats

use super::{Shard, Table, CONSISTENT_READ_TRIES, FLAGS, UNIT};
use crate::engine::class::Class;
use crate::engine::waiters::QueueCounts;
use crate::stats::{ClassStats, ShardStats, Stats};
use crate::sync::Ordering::{AcqRel, Acquire, Relaxed};

impl Table {
    /// Units held now, summed over the shards.
    ///
    /// Read as one snapshot: the shards' `given` words, their `taken`
    /// words, then `given` again, until no release landed in between (after
    /// a few tries, a lower bound: see the end of the function). A sum
    /// of per-shard readings taken one after the other could count a unit
    /// twice, on the shard it was released from and on the shard it was
    /// taken again at, and read one more than the capacity. With no release
    /// during the read, each shard's reading is exact when its `taken` is
    /// read and only grows after it: the sum is at most what is held at the
    /// end of the read, and at least what was held at its start.
    pub(crate) fn usage(&self) -> usize {
        for _ in 0..CONSISTENT_READ_TRIES {
            let before = self.given_total();
            let taken = self.taken_total();
            // Every `given` only grows (by a unit per release), so an equal
            // total means no shard's changed.
            if self.given_total() == before {
                return taken.wrapping_sub(before) / UNIT;
            }
        }
        // Releases kept landing: every `taken`, then every `given`. A unit
        // counted is held from its shard's `taken` read to its `given`
        // read, so at the instant between the last of the one and the
        // first of the other: the sum is at most what was held then (a
        // lower bound, never a double count), and 0 if releases overtook it.
        let taken = self.taken_total();
        let gap = taken.wrapping_sub(self.given_total());
        if (gap as isize) < 0 {
            0
        } else {
            gap / UNIT
        }
    }

    /// The sum of the shards' `taken` words, their flag bits masked off so
    /// that they cannot carry into the units.
    fn taken_total(&self) -> usize {
        self.shards.iter().fold(0usize, |sum, shard| {
            // Acquire: as in `Shard::counts`.
            sum.wrapping_add(shard.taken.load(Acquire) & !FLAGS)
        })
    }

    /// The sum of the shards' `given` words.
    fn given_total(&self) -> usize {
        self.shards.iter().fold(0usize, |sum, shard| {
            // Acquire: pairs with the AcqRel RMW in `give_back_many`, as in
            // `Shard::counts`.
            sum.wrapping_add(shard.given.load(Acquire))
        })
    }

    pub(crate) fn stats(&self) -> Stats {
        // The figures kept under the control lock, if there is a room (no
        // hand-off happens without one).
        let (handed, counts) = match &self.room {
            Some(_) => {
                let control = self.control.lock();
                (control.handed.clone(), Some(control.queue.counts()))
            }
            None => (Vec::new(), None),
        };
        let mut classes = self.class_stats(counts.as_ref());
        let shards: Vec<ShardStats> = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, shard)| shard.stats(handed.get(i).copied().unwrap_or(0)))
            .collect();
        let room = match (&self.room, counts) {
            (Some(room), Some(counts)) => room.stats(counts),
            _ => Default::default(),
        };
        let mut stats = Stats {
            capacity: self.capacity(),
            usage: shards.iter().map(|s| s.usage).sum(),
            peak_usage: shards.iter().map(|s| s.peak_usage).sum(),
            accepted: shards.iter().map(|s| s.accepted).sum(),
            rejected: self
                .shards
                .iter()
                .fold(self.rejected.total(), |sum, shard| {
                    sum.wrapping_add(shard.home_refusals() as u64)
                }),
            completed: shards.iter().map(|s| s.completed).sum(),
            panicked: shards.iter().map(|s| s.panicked).sum(),
            forgotten: shards.iter().map(|s| s.forgotten).sum(),
            waiting: room.waiting,
            peak_waiting: room.peak_waiting,
            waiting_for_keys: 0,
            peak_waiting_for_keys: 0,
            timed_out: room.timed_out,
            waited: room.waited,
            waited_time: room.waited_time,
            shards,
            classes: Vec::new(),
        };
        // The default class's figures: the totals less the other classes'.
        let critical = Class::Critical.rank();
        let others = |field: fn(&ClassStats) -> u64| -> u64 {
            classes
                .iter()
                .enumerate()
                .filter(|&(rank, _)| rank != critical)
                .map(|(_, class)| field(class))
                .fold(0, u64::wrapping_add)
        };
        let accepted = stats.accepted.saturating_sub(others(|c| c.accepted));
        let rejected = stats.rejected.saturating_sub(others(|c| c.rejected));
        classes[critical].accepted = accepted;
        classes[critical].rejected = rejected;
        stats.classes = classes;
        stats
    }

    /// Each class's figures as counted: the classed paths' tally, the
    /// room's grants, timeouts and waiters. The default class's accepted
    /// and rejected are filled in by `stats` from the totals.
    fn class_stats(&self, counts: Option<&QueueCounts>) -> Vec<ClassStats> {
        let tally = self.class_tally();
        Class::ALL
            .iter()
            .map(|&class| {
                let (accepted, rejected) = tally.read(class);
                let granted = counts.map_or(0, |c| c.granted[class.rank()]);
                let waiting = counts.map_or(0, |c| c.waiting[class.rank()]);
                let timed_out = self.room.as_deref().map_or(0, |room| room.timed_out(class));
                ClassStats {
                    class,
                    accepted: accepted.wrapping_add(granted),
                    rejected,
                    timed_out,
                    waiting,
                    held: tally.held(class, self.headroom.has_min_share()),
                }
            })
            .collect()
    }
}

impl Shard {
    /// Units held now, as one reading that never exceeds the limit.
    ///
    /// `given` is read before and after `taken`; if it did not move, both
    /// values held at the moment `taken` was read, so the difference is an
    /// exact usage at that moment. Read once each in that order, the gap
    /// could count a unit taken after a release it missed. Under churn that
    /// moves `given` on every try, after a few tries the reading falls back
    /// to `taken` read *before* `given`: a lower bound of the usage at the
    /// `taken` read, and never above the limit (see [`Shard::lower_bound`]).
    /// So a reading is exact, or low under churn, never high.
    pub(crate) fn usage(&self) -> usize {
        self.counts().0
    }

    /// `(usage, taken, given)` in units, read as in [`usage`](Self::usage).
    pub(super) fn counts(&self) -> (usize, usize, usize) {
        // Acquire on all three: pairs with the AcqRel RMWs in `give_back_many`
        // and `close`, so a drainer that reads 0 has also seen every
        // release (and the work before it) and the CLOSED bit.
        let mut given = self.given.load(Acquire);
        for _ in 0..CONSISTENT_READ_TRIES {
            let taken = self.taken.load(Acquire);
            let again = self.given.load(Acquire);
            if again == given {
                return (taken.wrapping_sub(given) / UNIT, taken / UNIT, given / UNIT);
            }
            given = again;
        }
        self.lower_bound()
    }

    /// `taken`, then `given`: a usage that is never above the limit.
    ///
    /// The Acquire load of `taken` synchronizes with the Release CAS of the
    /// take that wrote it (or heads the release sequence it is in), and that
    /// taker had read some `given` value `g` with `taken - g` at most the
    /// limit. The `given` read here comes after, so it is `g` or newer, and
    /// the gap can only be smaller. It may be negative (units taken after
    /// our `taken` read were given back too): then the usage at the `taken`
    /// read was at least 0, and 0 is answered.
    #[cold]
    pub(super) fn lower_bound(&self) -> (usize, usize, usize) {
        // Acquire: as the comment above says, pairs with the take's Release.
        let taken = self.taken.load(Acquire);
        // Acquire: pairs with the AcqRel RMW in `give_back_many`, as in `counts`.
        let given = self.given.load(Acquire);
        let gap = taken.wrapping_sub(given);
        let usage = if (gap as isize) < 0 { 0 } else { gap / UNIT };
        (usage, taken / UNIT, given / UNIT)
    }

    /// Re-reads the shard for [`Table::mark_full`]: is it still full?
    pub(super) fn still_full(&self) -> bool {
        self.usage_synced() >= self.limit()
    }

    /// Units held now, with `given` read through an RMW: the read for a
    /// caller that wrote a flag first and must not miss a racing
    /// [`give_back_many`](Self::give_back_many) that would then miss the flag (the
    /// store→load pattern of [`Table::mark_full`] and of the supervisor's
    /// `wait_idle`).
    pub(crate) fn usage_synced(&self) -> usize {
        // AcqRel RMW (it adds nothing): `given`'s modification order puts it
        // either after a racing `give_back_many` (then it reads that release, and
        // Acquire makes the releaser's earlier writes visible) or before it
        // (then the release's AcqRel RMW reads this one or a later RMW in its
        // release sequence, so whatever the caller wrote before this call is
        // visible to the releaser after its RMW). A plain load could miss
        // both: see the module docs.
        let given = self.given.fetch_add(0, AcqRel);
        // Relaxed: `taken` only grows, and every take whose unit is counted
        // in `given` happened-before the give that counted it, which this
        // RMW synchronized with; so the gap cannot go negative. A stale
        // value can only leave out takes not ordered before this call.
        let taken = self.taken.load(Relaxed);
        taken.wrapping_sub(given) / UNIT
    }

    /// The shard's figures; `handed` is its count of units handed from a
    /// release straight to a waiter (kept under the control lock): each is
    /// one more admission and one more release than `taken` and `given`
    /// count.
    pub(super) fn stats(&self, handed: usize) -> ShardStats {
        // Acquire, and before `given`: pairs with the Release in `give_back_many`
        // (every panic counted here has its unit counted in `given`).
        let panicked = self.panicked.load(Acquire);
        // Relaxed: a phantom is counted after its unit is back; a snapshot
        // taken between the two counts one in `accepted` and `completed`.
        let phantom = self.phantom.load(Relaxed);
        let (usage, taken, given) = self.counts();
        ShardStats {
            limit: self.limit(),
            usage,
            peak_usage: self.peak.load(Relaxed),
            accepted: taken.wrapping_sub(phantom).wrapping_add(handed) as u64,
            completed: given
                .wrapping_sub(panicked)
                .wrapping_sub(phantom)
                .wrapping_add(handed) as u64,
            panicked: panicked as u64,
            // Relaxed: a count; a forgotten unit stays in `taken` for good.
            forgotten: self.forgotten.load(Relaxed) as u64,
        }
    }
}
