//! A state-machine model of [`Pool`], in the spirit of Erlang sidejob's
//! QuickCheck model: workers block inside their handler until the test
//! tells them to finish or to crash.
//!
//! Properties checked after every action:
//!
//! * **Admission is predicted exactly.** A request from start shard `s` is
//!   admitted on the first shard, walking `s, s+1, …` and wrapping once,
//!   whose queued + running count is under its limit; otherwise `Overload`.
//! * **Strict outstanding bound.** A request counts from admission until
//!   its handler has finished, so each worker's usage equals the model's
//!   queue length (sidejob's worker releases on dequeue; ours does not).
//! * **Panics fail only their request.** A crashed call answers
//!   `WorkerPanicked`; the worker is rebuilt and the queue behind it is
//!   still served in order.
//! * **The counters match**: accepted, rejected, completed, panicked.
//!
//! The start shard comes with each action through the crate-private
//! `How::At` seam; concurrency itself is loom's and the stress tests'
//! job.

use std::collections::VecDeque;

use crossbeam_channel::{unbounded, Receiver, Sender};
use proptest::prelude::*;

use super::harness::{shard_limits, shard_usage, wait_until, walk, Counts, GatedPool, Go};
use crate::engine::ask::How;
use crate::pool::ReplyReceiver;
use crate::{Error, Pool, Worker};

/// A worker that waits at its gate in every handler.
struct Gated(Receiver<Go>);

impl Gated {
    fn pass(&mut self) {
        Go::obey(self.0.recv());
    }
}

impl Worker for Gated {
    type Request = u64;
    type Reply = u64;
    type Message = u64;
    fn handle_call(&mut self, id: u64) -> u64 {
        self.pass();
        id
    }
    fn handle_cast(&mut self, _: u64) {
        self.pass();
    }
}

#[derive(Debug, Clone)]
enum Action {
    Call {
        start: usize,
    },
    Cast {
        start: usize,
    },
    /// Let the job at the head of worker `k`'s queue finish (or crash).
    Release {
        worker: usize,
        crash: bool,
    },
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => (0..8usize).prop_map(|start| Action::Call { start }),
        3 => (0..8usize).prop_map(|start| Action::Cast { start }),
        4 => (0..8usize, proptest::bool::weighted(0.25))
            .prop_map(|(worker, crash)| Action::Release { worker, crash }),
    ]
}

/// One admitted job, as the model sees it.
enum Job {
    Call(u64, ReplyReceiver<Gated>),
    Cast,
}

struct Model {
    limits: Vec<usize>,
    queues: Vec<VecDeque<Job>>,
    counts: Counts,
}

impl Model {
    /// The shard a request from `start` lands on, or `None` for Overload.
    fn admit(&self, start: usize) -> Option<usize> {
        walk(start, self.limits.len(), |shard| {
            self.queues[shard].len() < self.limits[shard]
        })
    }
}

fn check(pool: &Pool<Gated>, model: &Model) -> Result<(), TestCaseError> {
    let stats = pool.stats();
    let expected: Vec<usize> = model.queues.iter().map(VecDeque::len).collect();
    prop_assert_eq!(shard_usage(&stats), expected, "per-worker usage");
    model.counts.check(&stats)
}

fn run(capacity: usize, workers: usize, actions: Vec<Action>) -> Result<(), TestCaseError> {
    let (gates, receivers): (Vec<Sender<Go>>, Vec<Receiver<Go>>) =
        (0..workers.min(capacity)).map(|_| unbounded()).unzip();
    // Affinity: the model predicts each worker's own queue, so no worker
    // may take another's requests (stealing is the default).
    let pool = Pool::builder()
        .name("model")
        .capacity(capacity)
        .workers(workers)
        .steal(false)
        .build(move |index| Gated(receivers[index].clone()))
        .unwrap();
    // If a check fails half-way, workers are still waiting at their gates:
    // closing the gates first lets the pool's drop drain instead of hang.
    let gated = GatedPool { gates, pool };
    let (gates, pool) = (&gated.gates, &gated.pool);
    let limits = shard_limits(&pool.stats());
    let mut model = Model {
        queues: limits.iter().map(|_| VecDeque::new()).collect(),
        limits,
        counts: Counts::default(),
    };
    let mut next_id = 0u64;

    for action in actions {
        match action {
            Action::Call { start } | Action::Cast { start } => {
                next_id += 1;
                let predicted = model.admit(start);
                let outcome = match action {
                    Action::Call { .. } => pool
                        .submit_call(How::At(start), next_id)
                        .map_err(Error::from)
                        .map(|reply| Job::Call(next_id, reply)),
                    _ => pool
                        .submit_cast(How::At(start), next_id)
                        .map_err(Error::from)
                        .map(|()| Job::Cast),
                };
                match (predicted, outcome) {
                    (Some(shard), Ok(job)) => {
                        model.queues[shard].push_back(job);
                        model.counts.accepted += 1;
                    }
                    (None, Err(Error::Overload)) => model.counts.rejected += 1,
                    (predicted, outcome) => {
                        prop_assert!(false, "predicted {:?}, got {:?}", predicted, outcome.err())
                    }
                }
            }
            Action::Release { worker, crash } => {
                let shard = worker % model.queues.len();
                let Some(job) = model.queues[shard].pop_front() else {
                    continue;
                };
                let before = pool.stats().shards[shard].clone();
                gates[shard].send(Go::crash_if(crash)).unwrap();
                match job {
                    Job::Call(id, reply) => {
                        // The unit is released before the reply is sent, so
                        // the counters are final once the reply is here.
                        let expected = if crash {
                            Err(Error::WorkerPanicked)
                        } else {
                            Ok(id)
                        };
                        prop_assert_eq!(reply.recv().unwrap(), expected);
                    }
                    Job::Cast => wait_until(|| {
                        let now = &pool.stats().shards[shard];
                        now.completed + now.panicked > before.completed + before.panicked
                    }),
                }
                if crash {
                    model.counts.panicked += 1;
                } else {
                    model.counts.completed += 1;
                }
            }
        }
        check(pool, &model)?;
    }

    // Let every queued job through, then shut down: all are handled.
    for (shard, queue) in model.queues.iter_mut().enumerate() {
        for job in queue.drain(..) {
            gates[shard].send(Go::Finish).unwrap();
            if let Job::Call(id, reply) = job {
                prop_assert_eq!(reply.recv().unwrap(), Ok(id));
            }
            model.counts.completed += 1;
        }
    }
    pool.shutdown();
    check(pool, &model)?;
    prop_assert_eq!(pool.call(0), Err(Error::Shutdown));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn pool_matches_the_model(
        capacity in 1..8usize,
        workers in 1..5usize,
        actions in proptest::collection::vec(action(), 1..60),
    ) {
        // Handlers that crash unwind through `catch_unwind` in the worker;
        // a panic that reached this thread would fail the case.
        run(capacity, workers, actions)?;
    }
}
