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
//! `Admission::At` seam; concurrency itself is loom's and the stress tests'
//! job.

use std::collections::VecDeque;
use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use proptest::prelude::*;

use crate::engine::table::Admission;
use crate::pool::ReplyReceiver;
use crate::{Error, Pool, Worker};

/// What a blocked handler is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Go {
    Finish,
    Crash,
}

/// A worker that waits at its gate in every handler.
struct Gated(Receiver<Go>);

impl Gated {
    fn pass(&mut self) {
        if self.0.recv() == Ok(Go::Crash) {
            // `resume_unwind` skips the panic hook: the output stays quiet.
            panic::resume_unwind(Box::new("told to crash"));
        }
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
    accepted: u64,
    rejected: u64,
    completed: u64,
    panicked: u64,
}

impl Model {
    /// The shard a request from `start` lands on, or `None` for Overload.
    fn admit(&self, start: usize) -> Option<usize> {
        let n = self.limits.len();
        (0..n)
            .map(|step| (start % n + step) % n)
            .find(|&shard| self.queues[shard].len() < self.limits[shard])
    }
}

/// Polls until `done` holds; a hang is a failure, never a pass.
fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "the pool never got there");
        std::thread::yield_now();
    }
}

fn check(pool: &Pool<Gated>, model: &Model) -> Result<(), TestCaseError> {
    let stats = pool.stats();
    let usage: Vec<usize> = stats.shards.iter().map(|s| s.usage).collect();
    let expected: Vec<usize> = model.queues.iter().map(VecDeque::len).collect();
    prop_assert_eq!(usage, expected, "per-worker usage");
    prop_assert_eq!(stats.accepted, model.accepted);
    prop_assert_eq!(stats.rejected, model.rejected);
    prop_assert_eq!(stats.completed, model.completed);
    prop_assert_eq!(stats.panicked, model.panicked);
    Ok(())
}

/// Fields drop in order: the gates close before the pool shuts down.
struct Harness {
    gates: Vec<Sender<Go>>,
    pool: Pool<Gated>,
}

fn run(capacity: usize, workers: usize, actions: Vec<Action>) -> Result<(), TestCaseError> {
    let (gates, receivers): (Vec<Sender<Go>>, Vec<Receiver<Go>>) =
        (0..workers.min(capacity)).map(|_| unbounded()).unzip();
    let pool = Pool::builder()
        .name("model")
        .capacity(capacity)
        .workers(workers)
        .build(move |index| Gated(receivers[index].clone()))
        .unwrap();
    // If a check fails half-way, workers are still waiting at their gates:
    // closing the gates first lets the pool's drop drain instead of hang.
    let harness = Harness { gates, pool };
    let (gates, pool) = (&harness.gates, &harness.pool);
    let limits: Vec<usize> = pool.stats().shards.iter().map(|s| s.limit).collect();
    let mut model = Model {
        queues: limits.iter().map(|_| VecDeque::new()).collect(),
        limits,
        accepted: 0,
        rejected: 0,
        completed: 0,
        panicked: 0,
    };
    let mut next_id = 0u64;

    for action in actions {
        match action {
            Action::Call { start } | Action::Cast { start } => {
                next_id += 1;
                let predicted = model.admit(start);
                let outcome = match action {
                    Action::Call { .. } => pool
                        .submit_call(Admission::At(start), next_id)
                        .map_err(Error::from)
                        .map(|reply| Job::Call(next_id, reply)),
                    _ => pool
                        .submit_cast(Admission::At(start), next_id)
                        .map_err(Error::from)
                        .map(|()| Job::Cast),
                };
                match (predicted, outcome) {
                    (Some(shard), Ok(job)) => {
                        model.queues[shard].push_back(job);
                        model.accepted += 1;
                    }
                    (None, Err(Error::Overload)) => model.rejected += 1,
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
                gates[shard]
                    .send(if crash { Go::Crash } else { Go::Finish })
                    .unwrap();
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
                    model.panicked += 1;
                } else {
                    model.completed += 1;
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
            model.completed += 1;
        }
    }
    pool.shutdown();
    check(pool, &model)?;
    prop_assert_eq!(pool.call(0), Err(Error::Shutdown));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_the_model(
        capacity in 1..8usize,
        workers in 1..5usize,
        actions in proptest::collection::vec(action(), 1..60),
    ) {
        // Handlers that crash unwind through `catch_unwind` in the worker;
        // nothing here should reach the test thread.
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| run(capacity, workers, actions)));
        match outcome {
            Ok(result) => result?,
            Err(panic) => panic::resume_unwind(panic),
        }
    }
}
