//! A state-machine model of keyed admission on the [`Supervisor`]: the
//! global capacity (sharded) plus `per_key` live children per key, with
//! waiting futures queued per key and for capacity.
//!
//! Properties checked after every action:
//!
//! * **Admission is predicted exactly.** A fail-fast keyed child
//!   (`try_reserve_keyed_at`, start shard from the action) gets `KeyBusy`
//!   exactly when its key has `per_key` live children or slots held by
//!   waiters, else `Overload` exactly when every shard is full (and its key
//!   is not left held), else lands on the shard the walk from `start`
//!   predicts.
//! * **Waiting is predicted exactly.** A waiting future
//!   (`reserve_keyed_async`, polled by hand after every action in creation
//!   order) takes its key if it has room, else queues behind the key's
//!   other waiters; holding its key, it takes a unit or queues for one.
//!   A child's exit hands its unit to the oldest future waiting for
//!   capacity, and its key's slot to the key's oldest waiter; a dropped
//!   future passes on whatever it was handed. So each future resolves at
//!   the poll the model says, on a shard with room.
//! * **The per-key limit holds**: the model's live count per key (children
//!   plus slots held by waiters) never exceeds `per_key`, and
//!   `busy_keys()` is the number of keys the model holds.
//! * **The counters match**: usage per shard, accepted, rejected,
//!   completed, panicked, the waiters, and the listing.
//!
//! No real threads (concurrency is loom's job): the start shard comes
//! with each fail-fast action, and futures are polled with a no-op waker.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use proptest::prelude::*;

use super::harness::{drop_unwinding, even_split, shard_usage, walk, Counts};
use crate::{ChildGuard, Error, Supervisor};

/// Enough keys that some share a resident slot (16 per shard here) in
/// many cases: the hasher's seed differs from case to case.
const KEYS: u8 = 6;

#[derive(Debug, Clone)]
enum Action {
    /// A fail-fast keyed child of `key`, starting the probe at `start`.
    Reserve { key: u8, start: usize },
    /// A waiting keyed child of `key` (a future, polled after each action).
    Wait { key: u8 },
    /// End the live child at this position (mod the live count).
    Finish { k: usize, panic: bool },
    /// Drop the pending future at this position (mod the pending count).
    Cancel { k: usize },
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (0..KEYS, 0..8usize).prop_map(|(key, start)| Action::Reserve { key, start }),
        3 => (0..KEYS).prop_map(|key| Action::Wait { key }),
        4 => (0..64usize, any::<bool>()).prop_map(|(k, panic)| Action::Finish { k, panic }),
        1 => (0..64usize).prop_map(|k| Action::Cancel { k }),
    ]
}

type Waiting<'a> = Pin<Box<dyn Future<Output = Result<ChildGuard, Error>> + Send + 'a>>;

/// Where a pending future stands in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Queued for its key.
    ForKey,
    /// Handed its key's slot by a release; takes it at its next poll.
    KeyGranted,
    /// Holds its key, queued for a unit.
    ForUnit,
    /// Handed a unit of this shard; resolves at its next poll.
    UnitGranted(usize),
}

struct Pending<'a> {
    id: u64,
    key: u8,
    stage: Stage,
    future: Waiting<'a>,
}

struct Model {
    limits: Vec<usize>,
    usage: Vec<usize>,
    per_key: usize,
    /// Slots held per key: live children plus waiters holding the key.
    held: HashMap<u8, usize>,
    /// Per key, the ids of the futures queued for it, oldest first.
    key_queue: HashMap<u8, VecDeque<u64>>,
    /// Ids of the futures queued for a unit, oldest first.
    unit_queue: VecDeque<u64>,
    counts: Counts,
}

impl Model {
    fn predict(&self, start: usize) -> Option<usize> {
        walk(start, self.limits.len(), |i| self.usage[i] < self.limits[i])
    }

    fn has_room(&self) -> bool {
        self.predict(0).is_some()
    }

    fn key_free(&self, key: u8) -> bool {
        self.held.get(&key).copied().unwrap_or(0) < self.per_key
    }

    fn take_key(&mut self, key: u8) {
        *self.held.entry(key).or_default() += 1;
    }

    /// A slot of `key` goes back: to the key's oldest waiter, or away.
    fn release_key(&mut self, key: u8, pending: &mut [Pending<'_>]) {
        if let Some(id) = self.key_queue.get_mut(&key).and_then(VecDeque::pop_front) {
            let waiter = pending.iter_mut().find(|p| p.id == id).unwrap();
            waiter.stage = Stage::KeyGranted;
            return;
        }
        let held = self.held.get_mut(&key).unwrap();
        *held -= 1;
        if *held == 0 {
            self.held.remove(&key);
        }
    }

    /// A unit of shard `shard` goes back: to the oldest future waiting for
    /// one, or to the table.
    fn release_unit(&mut self, shard: usize, pending: &mut [Pending<'_>]) {
        if let Some(id) = self.unit_queue.pop_front() {
            let waiter = pending.iter_mut().find(|p| p.id == id).unwrap();
            waiter.stage = Stage::UnitGranted(shard);
            self.counts.accepted += 1;
            return;
        }
        self.usage[shard] -= 1;
    }

    /// The future `gone` is dropped: it leaves the queue it was in, and
    /// passes on whatever it held or was handed.
    fn cancel(&mut self, gone: Pending<'_>, pending: &mut [Pending<'_>]) {
        let (key, id, stage) = (gone.key, gone.id, gone.stage);
        drop(gone.future);
        match stage {
            Stage::ForKey => {
                let queue = self.key_queue.get_mut(&key).unwrap();
                queue.retain(|&q| q != id);
            }
            Stage::KeyGranted => self.release_key(key, pending),
            Stage::ForUnit => {
                self.unit_queue.retain(|&q| q != id);
                self.release_key(key, pending);
            }
            Stage::UnitGranted(shard) => {
                // A unit handed and never used: released as usual, and its
                // admission taken back out of `accepted` (the table counts
                // it as a phantom).
                self.counts.accepted -= 1;
                self.release_unit(shard, pending);
                self.release_key(key, pending);
            }
        }
    }
}

struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}

fn check(sup: &Supervisor, model: &Model, live: usize) -> Result<(), TestCaseError> {
    prop_assert_eq!(sup.count(), model.usage.iter().sum::<usize>());
    prop_assert_eq!(sup.which_children().len(), live);
    // A key is in the set while it holds slots or has waiters.
    let busy = (0..KEYS)
        .filter(|key| {
            model.held.contains_key(key) || model.key_queue.get(key).is_some_and(|q| !q.is_empty())
        })
        .count();
    prop_assert_eq!(sup.busy_keys(), busy);
    for (&key, &held) in &model.held {
        prop_assert!(held <= model.per_key, "key {} holds {} slots", key, held);
    }
    let queued: usize = model.key_queue.values().map(VecDeque::len).sum();
    prop_assert_eq!(sup.waiting_for_keys(), queued);
    prop_assert_eq!(sup.waiting(), model.unit_queue.len());
    let stats = sup.stats();
    model.counts.check(&stats)?;
    prop_assert_eq!(shard_usage(&stats), model.usage.clone());
    Ok(())
}

fn run(
    capacity: usize,
    shards: usize,
    per_key: usize,
    actions: Vec<Action>,
) -> Result<(), TestCaseError> {
    let sup = Supervisor::builder()
        .capacity(capacity)
        .shards(shards)
        .per_key(per_key)
        .max_waiters(64)
        .max_wait(std::time::Duration::from_secs(3600))
        .build()
        .unwrap();
    let count = sup.shards();
    let mut model = Model {
        limits: even_split(capacity, count),
        usage: vec![0; count],
        per_key,
        held: HashMap::new(),
        key_queue: HashMap::new(),
        unit_queue: VecDeque::new(),
        counts: Counts::default(),
    };
    // Live children: the guard, its key and shard.
    let mut live: Vec<(ChildGuard, u8, usize)> = Vec::new();
    let mut pending: Vec<Pending<'_>> = Vec::new();
    let mut next_id = 0u64;
    let waker = Waker::from(Arc::new(Noop));

    for action in actions {
        match action {
            Action::Reserve { key, start } => {
                let got = sup.try_reserve_keyed_at(&key, start);
                if !model.key_free(key) {
                    prop_assert_eq!(got.map(drop), Err(Error::KeyBusy));
                } else if let Some(shard) = model.predict(start) {
                    let guard = got.map_err(|e| TestCaseError::fail(format!("{e}")))?;
                    prop_assert_eq!(guard.id().shard(), shard);
                    model.take_key(key);
                    model.usage[shard] += 1;
                    model.counts.accepted += 1;
                    live.push((guard, key, shard));
                } else {
                    prop_assert_eq!(got.map(drop), Err(Error::Overload));
                    model.counts.rejected += 1;
                }
            }
            Action::Wait { key } => {
                let id = next_id;
                next_id += 1;
                // Its first poll (below, with the others) decides; the
                // model's stage for a new future is decided there too.
                let stage = if model.key_free(key) {
                    Stage::KeyGranted
                } else {
                    model.key_queue.entry(key).or_default().push_back(id);
                    Stage::ForKey
                };
                // A new future that finds its key free takes the slot at
                // its first poll: count it now, as `KeyGranted` polls do.
                if stage == Stage::KeyGranted {
                    model.take_key(key);
                }
                pending.push(Pending {
                    id,
                    key,
                    stage,
                    future: Box::pin(sup.reserve_keyed_async(&key)),
                });
            }
            Action::Finish { k, panic } => {
                if live.is_empty() {
                    continue;
                }
                let (guard, key, shard) = live.remove(k % live.len());
                if panic {
                    prop_assert!(drop_unwinding(guard));
                    model.counts.panicked += 1;
                } else {
                    drop(guard);
                    model.counts.completed += 1;
                }
                // The unit first, then the key.
                model.release_unit(shard, &mut pending);
                model.release_key(key, &mut pending);
            }
            Action::Cancel { k } => {
                if pending.is_empty() {
                    continue;
                }
                let gone = pending.remove(k % pending.len());
                model.cancel(gone, &mut pending);
            }
        }

        // Poll every pending future once, in creation order.
        let mut i = 0;
        while i < pending.len() {
            let stage = pending[i].stage;
            let polled = pending[i]
                .future
                .as_mut()
                .poll(&mut Context::from_waker(&waker));
            match (stage, polled) {
                (Stage::ForKey | Stage::ForUnit, Poll::Pending) => i += 1,
                (Stage::KeyGranted, Poll::Pending) => {
                    prop_assert!(!model.has_room(), "a free unit was not taken");
                    pending[i].stage = Stage::ForUnit;
                    model.unit_queue.push_back(pending[i].id);
                    i += 1;
                }
                (Stage::KeyGranted, Poll::Ready(got)) => {
                    let guard = got.map_err(|e| TestCaseError::fail(format!("{e}")))?;
                    let shard = guard.id().shard();
                    prop_assert!(model.usage[shard] < model.limits[shard]);
                    model.usage[shard] += 1;
                    model.counts.accepted += 1;
                    let done = pending.remove(i);
                    live.push((guard, done.key, shard));
                }
                (Stage::UnitGranted(shard), Poll::Ready(got)) => {
                    let guard = got.map_err(|e| TestCaseError::fail(format!("{e}")))?;
                    prop_assert_eq!(guard.id().shard(), shard);
                    let done = pending.remove(i);
                    live.push((guard, done.key, shard));
                }
                (stage, polled) => {
                    prop_assert!(
                        false,
                        "future {} at {:?} polled {:?}",
                        pending[i].id,
                        stage,
                        polled.map(|r| r.map(drop))
                    );
                }
            }
        }
        check(&sup, &model, live.len())?;
    }

    // Drain: drop the futures, then end every child.
    while let Some(gone) = pending.pop() {
        model.cancel(gone, &mut pending);
    }
    for (guard, key, shard) in live.drain(..) {
        drop(guard);
        model.counts.completed += 1;
        model.release_unit(shard, &mut pending);
        model.release_key(key, &mut pending);
    }
    model.key_queue.clear();
    check(&sup, &model, 0)?;
    prop_assert_eq!(
        (sup.count(), sup.busy_keys(), sup.waiting_for_keys()),
        (0, 0, 0)
    );
    Ok(())
}

proptest! {
    #[test]
    fn keyed_admission_matches_the_model(
        capacity in 1..=6usize,
        shards in 1..=3usize,
        per_key in 1..=2usize,
        actions in proptest::collection::vec(action(), 1..80),
    ) {
        run(capacity, shards, per_key, actions)?;
    }
}

#[test]
fn a_key_waiter_then_waits_for_capacity_and_gets_the_first_unit_back() {
    use Action::*;
    let actions = vec![
        Reserve { key: 0, start: 0 },
        Reserve { key: 1, start: 0 },
        Wait { key: 0 },
        Wait { key: 2 },
        Finish { k: 0, panic: false },
        Finish { k: 0, panic: true },
    ];
    run(2, 2, 1, actions).unwrap();
}
