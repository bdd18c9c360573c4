//! A state-machine model of keyed admission on the thread [`Pool`] in the
//! ordered mode: the global capacity (sharded) plus `max_queued_per_key`
//! requests per key, each key's requests handled in admission order.
//!
//! Handlers block at their *key's* gate until the test lets the key's
//! oldest request finish (or crash). The pool has a worker per key, so a
//! key's request that is out always finds a worker, and "finish key k's
//! oldest request" is an action whose outcome is certain.
//!
//! Properties checked after every action:
//!
//! * **Admission is predicted exactly.** A keyed request from start shard
//!   `s` takes its unit on the first shard of the walk `s, s+1, …` with
//!   room, else `Overload` (counted in `rejected`); admitted, it gets
//!   `KeyBusy` exactly when its key has `max_queued_per_key` requests
//!   unfinished, and then its unit is back and it is counted nowhere.
//! * **The bound covers the key queues**: each shard's usage is the number
//!   of unfinished requests, queued behind their key or out, holding its
//!   units; each key's load is the model's.
//! * **Order and panics**: a key's requests are handled in admission
//!   order; a crash answers its call `WorkerPanicked` and the key's next
//!   request still runs.
//! * **The counters match** (accepted, rejected, completed, panicked), and
//!   after the final drain and shutdown every key is forgotten.
//!
//! No real concurrency between actions (that is loom's and the stress
//! test's job): the start shard comes with each action through the
//! crate-private `How::At` seam.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use crossbeam_channel::{unbounded, Receiver, Sender};
use proptest::prelude::*;

use super::harness::{shard_limits, shard_usage, wait_until, walk, Counts, GatedPool, Go};
use crate::engine::ask::How;
use crate::pool::worker::Job as PoolJob;
use crate::pool::ReplyReceiver;
use crate::{Error, KeyedMode, Pool, Worker};

const KEYS: usize = 3;

/// A request: its key and its number.
type Req = (usize, u64);

/// Waits at its key's gate, then logs the request.
struct Gated {
    gates: Arc<Vec<Receiver<Go>>>,
    log: Arc<Mutex<Vec<Req>>>,
}

impl Gated {
    fn pass(&mut self, (key, id): Req) -> u64 {
        let go = self.gates[key].recv();
        self.log.lock().unwrap().push((key, id));
        Go::obey(go);
        id
    }
}

impl Worker for Gated {
    type Request = Req;
    type Reply = u64;
    type Message = Req;
    fn handle_call(&mut self, req: Req) -> u64 {
        self.pass(req)
    }
    fn handle_cast(&mut self, req: Req) {
        self.pass(req);
    }
}

#[derive(Debug, Clone)]
enum Action {
    Send {
        key: usize,
        start: usize,
        call: bool,
    },
    Release {
        key: usize,
        crash: bool,
    },
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (0..KEYS, 0..8usize, any::<bool>())
            .prop_map(|(key, start, call)| Action::Send { key, start, call }),
        4 => (0..KEYS, proptest::bool::weighted(0.2))
            .prop_map(|(key, crash)| Action::Release { key, crash }),
    ]
}

/// One admitted request, as the model sees it.
struct Admitted {
    id: u64,
    shard: usize,
    reply: Option<ReplyReceiver<Gated>>,
}

#[derive(Default)]
struct Model {
    limits: Vec<usize>,
    usage: Vec<usize>,
    keys: Vec<VecDeque<Admitted>>,
    /// Per key, the admission order.
    order: HashMap<usize, Vec<u64>>,
    counts: Counts,
}

impl Model {
    fn unit(&self, start: usize) -> Option<usize> {
        walk(start, self.limits.len(), |shard| {
            self.usage[shard] < self.limits[shard]
        })
    }
}

fn check(pool: &Pool<Gated>, model: &Model) -> Result<(), TestCaseError> {
    let stats = pool.stats();
    prop_assert_eq!(&shard_usage(&stats), &model.usage, "per-shard usage");
    model.counts.check(&stats)?;
    for key in 0..KEYS {
        prop_assert_eq!(
            pool.key_load(&key),
            model.keys[key].len(),
            "key {} load",
            key
        );
    }
    Ok(())
}

fn run(
    capacity: usize,
    shards: usize,
    cap: usize,
    actions: Vec<Action>,
) -> Result<(), TestCaseError> {
    let (gates, receivers): (Vec<Sender<Go>>, Vec<Receiver<Go>>) =
        (0..KEYS).map(|_| unbounded()).unzip();
    let receivers = Arc::new(receivers);
    let log = Arc::new(Mutex::new(Vec::new()));
    // A worker per key (and at least one per shard): every key's request
    // that is out finds a free worker.
    let pool = {
        let log = log.clone();
        Pool::builder()
            .name("keyed-model")
            .capacity(capacity)
            .workers(shards)
            .keyed(KeyedMode::Ordered)
            .max_queued_per_key(cap)
            // As the model was written: plain requests stay on their own
            // worker (stealing is the default).
            .steal(false)
            .build(move |_| Gated {
                gates: receivers.clone(),
                log: log.clone(),
            })
            .unwrap()
    };
    prop_assume!(pool.workers() >= KEYS);
    // The gates close before the pool shuts down (see `GatedPool`).
    let gated = GatedPool { gates, pool };
    let (gates, pool) = (&gated.gates, &gated.pool);
    let limits = shard_limits(&pool.stats());
    let mut model = Model {
        usage: vec![0; limits.len()],
        limits,
        keys: (0..KEYS).map(|_| VecDeque::new()).collect(),
        ..Model::default()
    };
    let mut next_id = 0u64;

    for action in actions {
        match action {
            Action::Send { key, start, call } => {
                next_id += 1;
                let id = pool.key_id(&key);
                let predicted = model
                    .unit(start)
                    .map(|shard| (shard, model.keys[key].len() >= cap));
                let outcome = if call {
                    pool.submit_keyed_call(How::At(start), id, (key, next_id))
                        .map(Some)
                        .map_err(Error::from)
                } else {
                    pool.submit_keyed(How::At(start), id, PoolJob::Cast((key, next_id)))
                        .map(|()| None)
                        .map_err(|(error, _)| error)
                };
                match (predicted, outcome) {
                    (Some((shard, false)), Ok(reply)) => {
                        model.usage[shard] += 1;
                        model.counts.accepted += 1;
                        model.keys[key].push_back(Admitted {
                            id: next_id,
                            shard,
                            reply,
                        });
                        model.order.entry(key).or_default().push(next_id);
                    }
                    (Some((_, true)), Err(Error::KeyBusy)) => {}
                    (None, Err(Error::Overload)) => model.counts.rejected += 1,
                    (predicted, outcome) => {
                        prop_assert!(false, "predicted {:?}, got {:?}", predicted, outcome.err())
                    }
                }
            }
            Action::Release { key, crash } => {
                let Some(job) = model.keys[key].pop_front() else {
                    continue;
                };
                gates[key].send(Go::crash_if(crash)).unwrap();
                match job.reply {
                    // The unit and the key's turn go back before the reply.
                    Some(reply) => {
                        let expected = if crash {
                            Err(Error::WorkerPanicked)
                        } else {
                            Ok(job.id)
                        };
                        prop_assert_eq!(reply.recv().unwrap(), expected);
                    }
                    None => {
                        let load = model.keys[key].len();
                        let (completed, panicked) = (model.counts.completed, model.counts.panicked);
                        wait_until(|| {
                            let stats = pool.stats();
                            stats.completed + stats.panicked > completed + panicked
                                && pool.key_load(&key) == load
                        });
                    }
                }
                model.usage[job.shard] -= 1;
                if crash {
                    model.counts.panicked += 1;
                } else {
                    model.counts.completed += 1;
                }
            }
        }
        check(pool, &model)?;
    }

    // Let every queued request through, in each key's order.
    for (gate, queue) in gates.iter().zip(&mut model.keys) {
        for job in queue.drain(..) {
            gate.send(Go::Finish).unwrap();
            if let Some(reply) = job.reply {
                prop_assert_eq!(reply.recv().unwrap(), Ok(job.id));
            }
            model.usage[job.shard] -= 1;
            model.counts.completed += 1;
        }
    }
    pool.shutdown();
    check(pool, &model)?;
    prop_assert_eq!(pool.busy_keys(), 0);
    let log = log.lock().unwrap();
    for key in 0..KEYS {
        let handled: Vec<u64> = log.iter().filter(|r| r.0 == key).map(|r| r.1).collect();
        let admitted = model.order.remove(&key).unwrap_or_default();
        prop_assert_eq!(handled, admitted, "key {} order", key);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn keyed_pool_matches_the_model(
        capacity in 1..10usize,
        shards in 3..5usize,
        cap in 1..4usize,
        actions in proptest::collection::vec(action(), 1..60),
    ) {
        run(capacity, shards, cap, actions)?;
    }
}
