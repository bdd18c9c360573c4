//! A proptest model of the admission table, driven from one thread.
//!
//! Properties, for random capacity (1..20), shard count (1..8) and random
//! sequences of "acquire starting at shard s" and "release the k-th held
//! unit":
//!
//! * the table admits on exactly the shard a plain per-shard counter model
//!   predicts: the first shard with room walking up from the start,
//!   wrapping once (so the full-set bitmap never hides a shard with room
//!   and never sends a walk to a full one);
//! * `Overload` comes exactly when every shard of the model is at its
//!   limit, i.e. when model usage equals capacity;
//! * usage, per shard and in total, always equals the model's;
//! * the final stats (accepted, rejected, completed, per-shard peaks) equal
//!   the model's counts, and after releasing everything all units are
//!   available again;
//! * resizes (to 0..20) split the capacity over the holdings (each limit at
//!   or above what its shard holds, adding up to the new capacity); when
//!   more is held than that, nothing is admitted until the holdings are
//!   back within it, then the split is made over them.
//!
//! Concurrency is loom's job (`loom-tests/`); here the start shard is
//! passed in directly through `Table::acquire_at`, the seam that replaces
//! the caller's probe.

use proptest::prelude::*;

use super::harness::{even_split, shard_limits, shard_usage, walk, Counts};
use crate::engine::probe::Probe;
use crate::engine::split;
use crate::engine::table::Table;
use crate::error::Error;

#[derive(Debug, Clone)]
enum Action {
    /// Acquire one unit, trying this (raw) start position first.
    Acquire(usize),
    /// Release the held unit at this (raw) index into the held list.
    Release(usize),
    /// Set the capacity to this.
    Resize(usize),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => any::<u16>().prop_map(|s| Action::Acquire(s as usize)),
        2 => any::<u16>().prop_map(|k| Action::Release(k as usize)),
        1 => (0usize..20).prop_map(Action::Resize),
    ]
}

/// The plain model: one counter and one limit per shard.
struct Model {
    capacity: usize,
    /// More held than `capacity` after a shrink: nothing is admitted until
    /// the holdings are back within it.
    debt: bool,
    limits: Vec<usize>,
    usage: Vec<usize>,
    peak: Vec<usize>,
    counts: Counts,
}

impl Model {
    fn new(capacity: usize, shards: usize) -> Self {
        Model {
            capacity,
            debt: false,
            usage: vec![0; shards],
            peak: vec![0; shards],
            limits: even_split(capacity, shards),
            counts: Counts::default(),
        }
    }

    /// The shard that admits a caller starting at `start`, or `None` for
    /// `Overload`.
    fn acquire(&mut self, start: usize) -> Option<usize> {
        if self.debt {
            match split::split(self.capacity, &self.usage, None) {
                Some(limits) => {
                    self.limits = limits;
                    self.debt = false;
                }
                None => {
                    self.counts.rejected += 1;
                    return None;
                }
            }
        }
        let shard = walk(start, self.limits.len(), |i| self.usage[i] < self.limits[i]);
        match shard {
            Some(i) => {
                self.usage[i] += 1;
                self.peak[i] = self.peak[i].max(self.usage[i]);
                self.counts.accepted += 1;
            }
            None => self.counts.rejected += 1,
        }
        shard
    }

    fn release(&mut self, shard: usize) {
        self.usage[shard] -= 1;
        self.counts.completed += 1;
    }

    fn resize(&mut self, capacity: usize) {
        self.capacity = capacity;
        match split::split(capacity, &self.usage, None) {
            Some(limits) => {
                self.limits = limits;
                self.debt = false;
            }
            None => {
                self.limits = split::even(capacity, self.usage.len(), None);
                self.debt = true;
            }
        }
    }

    fn total(&self) -> usize {
        self.usage.iter().sum()
    }
}

fn check(capacity: usize, shards: usize, actions: Vec<Action>) -> Result<(), TestCaseError> {
    let table = Table::new(capacity, shards, Probe::Thread).unwrap();
    let mut model = Model::new(capacity, shards);
    prop_assert_eq!(table.shard_count(), model.limits.len());
    let n = model.limits.len();
    let mut held: Vec<usize> = Vec::new();

    for action in actions {
        match action {
            Action::Acquire(raw) => {
                let start = raw % n;
                let expected = model.acquire(start);
                let got = table.acquire_at(start);
                match expected {
                    Some(shard) => {
                        prop_assert_eq!(got, Ok(shard), "start {}", start);
                        held.push(shard);
                    }
                    None => {
                        prop_assert!(model.total() >= model.capacity);
                        prop_assert_eq!(got, Err(Error::Overload), "start {}", start);
                    }
                }
            }
            Action::Release(raw) => {
                if held.is_empty() {
                    continue;
                }
                let shard = held.swap_remove(raw % held.len());
                model.release(shard);
                table.release(shard, false);
            }
            Action::Resize(capacity) => {
                model.resize(capacity);
                table.set_capacity(capacity).unwrap();
                prop_assert_eq!(table.capacity(), capacity);
            }
        }
        prop_assert_eq!(table.usage(), model.total());
        prop_assert_eq!(shard_usage(&table.stats()), model.usage.clone());
    }

    let stats = table.stats();
    prop_assert_eq!(stats.capacity, model.capacity);
    // No panics here: the model's `panicked` stays 0.
    model.counts.check(&stats)?;
    let peaks: Vec<usize> = stats.shards.iter().map(|s| s.peak_usage).collect();
    prop_assert_eq!(&peaks, &model.peak);
    let limits = shard_limits(&stats);
    prop_assert_eq!(&limits, &model.limits);
    prop_assert_eq!(limits.iter().sum::<usize>(), model.capacity);

    // Drain, then every unit must be found again, from any start.
    for shard in held.drain(..) {
        table.release(shard, false);
    }
    prop_assert_eq!(table.usage(), 0);
    for i in 0..model.capacity {
        prop_assert!(table.acquire_at(i % n).is_ok(), "unit {} lost", i);
    }
    prop_assert_eq!(table.acquire_at(0), Err(Error::Overload));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn table_matches_the_per_shard_model(
        capacity in 1usize..20,
        shards in 1usize..8,
        actions in proptest::collection::vec(action(), 0..200),
    ) {
        check(capacity, shards, actions)?;
    }
}

/// A case proptest cannot miss: every shard filled from one start, then
/// released in an order that leaves holes behind the start.
#[test]
fn walk_wraps_to_holes_behind_the_start() {
    let actions = (0..6)
        .map(|_| Action::Acquire(4))
        .chain([Action::Release(0), Action::Release(0)])
        .chain((0..3).map(|_| Action::Acquire(4)))
        .collect();
    check(6, 6, actions).unwrap();
}
