//! A state-machine model of [`Supervisor`], in the spirit of Erlang
//! sidejob's QuickCheck supervisor model.
//!
//! Properties checked after every action:
//!
//! * **Admission is predicted exactly.** A child admitted from start shard
//!   `s` lands on the first shard, walking `s, s+1, …` and wrapping once,
//!   that is under its limit; if none is, the answer is `Overload`.
//! * **The listing is the live set.** `which_children` and `children` return
//!   the ids of exactly the children the model holds, each once.
//! * **Ids are unique** among live children and name the shard admitted on.
//! * **The counters match**: usage per shard, accepted, rejected, completed
//!   and panicked, and `count()`.
//!
//! No real threads: the start shard comes with each action through the
//! crate-private `reserve_at` seam (concurrency is loom's job), and a
//! "panicking" child drops its guard while unwinding (`resume_unwind`, which
//! skips the panic hook, so the test output stays quiet).

use std::collections::HashSet;

use proptest::prelude::*;

use super::harness::{drop_unwinding, even_split, shard_usage, walk, Counts};
use crate::{ChildGuard, ChildId, Error, Supervisor};

#[derive(Debug, Clone)]
enum Action {
    /// Admission a child, starting the probe at this shard (mod shard count).
    Spawn { start: usize },
    /// End the live child at this position (mod the live count), normally
    /// or by a panic.
    Finish { k: usize, panic: bool },
    /// Compare the listing with the model.
    WhichChildren,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        5 => (0..8usize).prop_map(|start| Action::Spawn { start }),
        3 => (0..64usize, any::<bool>()).prop_map(|(k, panic)| Action::Finish { k, panic }),
        1 => Just(Action::WhichChildren),
    ]
}

/// What the model knows.
struct Model {
    limits: Vec<usize>,
    usage: Vec<usize>,
    /// Live children: the real guard and the shard the model predicted.
    live: Vec<(ChildGuard, usize)>,
    counts: Counts,
}

impl Model {
    fn new(capacity: usize, shards: usize) -> Model {
        Model {
            limits: even_split(capacity, shards),
            usage: vec![0; shards],
            live: Vec::new(),
            counts: Counts::default(),
        }
    }

    /// The shard a child admitted from `start` lands on, if any.
    fn predict(&self, start: usize) -> Option<usize> {
        walk(start, self.limits.len(), |i| self.usage[i] < self.limits[i])
    }
}

fn check(sup: &Supervisor, model: &Model) -> Result<(), TestCaseError> {
    let expected: HashSet<ChildId> = model.live.iter().map(|(g, _)| g.id()).collect();
    prop_assert_eq!(
        expected.len(),
        model.live.len(),
        "ids unique among live children"
    );
    let listed = sup.which_children();
    prop_assert_eq!(listed.len(), model.live.len(), "each child listed once");
    prop_assert_eq!(
        listed.iter().copied().collect::<HashSet<_>>(),
        expected.clone()
    );
    let infos = sup.children();
    prop_assert_eq!(
        infos.iter().map(|info| info.id).collect::<HashSet<_>>(),
        expected
    );
    prop_assert_eq!(sup.count(), model.live.len());

    let stats = sup.stats();
    model.counts.check(&stats)?;
    prop_assert_eq!(shard_usage(&stats), model.usage.clone());
    Ok(())
}

fn run(capacity: usize, shards: usize, actions: Vec<Action>) -> Result<(), TestCaseError> {
    let sup = Supervisor::builder()
        .capacity(capacity)
        .shards(shards)
        .build()
        .unwrap();
    let mut model = Model::new(capacity, shards);
    prop_assert_eq!(sup.shards(), model.limits.len());

    for action in actions {
        match action {
            Action::Spawn { start } => {
                let predicted = model.predict(start);
                match (sup.reserve_at(start), predicted) {
                    (Ok(guard), Some(shard)) => {
                        prop_assert_eq!(
                            guard.id().shard(),
                            shard,
                            "admitted on the predicted shard"
                        );
                        model.usage[shard] += 1;
                        model.counts.accepted += 1;
                        model.live.push((guard, shard));
                    }
                    (Err(Error::Overload), None) => model.counts.rejected += 1,
                    (got, want) => {
                        prop_assert!(
                            false,
                            "reserve_at({}) gave {:?}, model said {:?}",
                            start,
                            got,
                            want
                        )
                    }
                }
            }
            Action::Finish { k, panic } => {
                if model.live.is_empty() {
                    continue;
                }
                let (guard, shard) = model.live.remove(k % model.live.len());
                if panic {
                    // The guard drops with `thread::panicking()` true.
                    prop_assert!(drop_unwinding(guard));
                    model.counts.panicked += 1;
                } else {
                    drop(guard);
                    model.counts.completed += 1;
                }
                model.usage[shard] -= 1;
            }
            Action::WhichChildren => {}
        }
        check(&sup, &model)?;
    }

    // Drain: every child leaves, the supervisor is idle.
    let left = model.live.len() as u64;
    for (guard, shard) in model.live.drain(..) {
        drop(guard);
        model.usage[shard] -= 1;
    }
    model.counts.completed += left;
    check(&sup, &model)?;
    prop_assert!(sup.wait_idle(std::time::Duration::ZERO));
    Ok(())
}

proptest! {
    #[test]
    fn supervisor_matches_the_model(
        capacity in 1..=8usize,
        shards in 1..=4usize,
        actions in proptest::collection::vec(action(), 1..80),
    ) {
        run(capacity, shards, actions)?;
    }
}

#[test]
fn overload_exactly_at_capacity_with_a_wrapping_walk() {
    // 5 over 3 shards: limits 2, 2, 1. From shard 2 the walk is 2, 0, 1.
    let actions = (0..6).map(|_| Action::Spawn { start: 2 }).collect();
    run(5, 3, actions).unwrap();
}
