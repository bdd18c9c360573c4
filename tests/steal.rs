//! Stealing (the default; `PoolBuilder::steal`): a free worker runs
//! requests queued at a stuck one; the unit goes back to the admitting
//! shard; panics, shutdown and the bound hold; `steal(false)` keeps each
//! request on the worker whose shard admitted it. Barriers and channels,
//! never sleeps.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread;

use crossbeam_channel::{unbounded, Receiver, Sender};
use sidejob::{Error, Pool, Worker};

mod common;
use common::{current_thread, GATE_PATIENCE};

#[derive(Debug)]
enum Job {
    /// Tell the test this worker started, then wait at this worker's gate.
    Block,
    /// Answer (and report) which worker ran it.
    Fast(u64),
    Panic,
}

/// Per-worker state: its index, its gate, where it reports.
struct Stealer {
    index: usize,
    gate: Receiver<()>,
    started: Sender<usize>,
    ran: Sender<(u64, usize)>,
    terminated: Arc<AtomicUsize>,
}

impl Stealer {
    fn run(&mut self, job: Job) -> usize {
        match job {
            Job::Block => {
                self.started.send(self.index).unwrap();
                self.gate
                    .recv_timeout(GATE_PATIENCE)
                    .expect("the gate opens (a test that failed before opening it ends here)");
            }
            Job::Fast(id) => self.ran.send((id, self.index)).unwrap(),
            Job::Panic => panic!("told to panic on worker {}", self.index),
        }
        self.index
    }
}

impl Worker for Stealer {
    type Request = Job;
    type Reply = usize;
    type Message = Job;
    fn handle_call(&mut self, job: Job) -> usize {
        self.run(job)
    }
    fn handle_cast(&mut self, job: Job) {
        self.run(job);
    }
    fn terminate(&mut self) {
        self.terminated.fetch_add(1, SeqCst);
    }
}

struct Rig {
    pool: Pool<Stealer>,
    gates: Vec<Sender<()>>,
    started: Receiver<usize>,
    ran: Receiver<(u64, usize)>,
    builds: Arc<Vec<AtomicUsize>>,
    terminated: Arc<AtomicUsize>,
}

/// A pool of 2 workers, capacity 16 (8 a shard), built by default (it
/// steals).
fn rig() -> Rig {
    rig_with(None)
}

/// As [`rig`], with `steal` set if given.
fn rig_with(steal: Option<bool>) -> Rig {
    let (gates, gate_rx): (Vec<_>, Vec<_>) = (0..2).map(|_| unbounded()).unzip();
    let gate_rx = Arc::new(gate_rx);
    let (started_tx, started) = unbounded();
    let (ran_tx, ran) = unbounded();
    let builds = Arc::new((0..2).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
    let terminated = Arc::new(AtomicUsize::new(0));
    let pool = {
        let (builds, terminated) = (builds.clone(), terminated.clone());
        let mut builder = Pool::builder();
        builder.name("steal").capacity(16).workers(2);
        if let Some(steal) = steal {
            builder.steal(steal);
        }
        builder
            .build(move |index| {
                builds[index].fetch_add(1, SeqCst);
                Stealer {
                    index,
                    gate: gate_rx[index].clone(),
                    started: started_tx.clone(),
                    ran: ran_tx.clone(),
                    terminated: terminated.clone(),
                }
            })
            .unwrap()
    };
    Rig {
        pool,
        gates,
        started,
        ran,
        builds,
        terminated,
    }
}

/// Casts two `Block`s from this thread (both admitted on its home shard)
/// and waits until both workers hold one: one ran its own, the other stole.
/// Returns the home shard.
fn both_workers_stuck(rig: &Rig) -> usize {
    rig.pool.cast(Job::Block).unwrap();
    rig.pool.cast(Job::Block).unwrap();
    let mut who = [rig.started.recv().unwrap(), rig.started.recv().unwrap()];
    who.sort();
    assert_eq!(who, [0, 1], "each worker holds one Block");
    let shards = rig.pool.stats().shards;
    let home = shards
        .iter()
        .position(|s| s.usage == 2)
        .expect("both Blocks on one shard");
    home
}

#[test]
fn a_free_worker_runs_requests_queued_behind_a_stuck_one() {
    let rig = rig();
    let home = both_workers_stuck(&rig);
    let other = 1 - home;
    for id in 0..3 {
        rig.pool.cast(Job::Fast(id)).unwrap();
    }
    assert_eq!(
        rig.pool.stats().shards[home].usage,
        5,
        "queued at the home worker"
    );
    // Free the worker of the *other* shard: its own mailbox is empty, so
    // it can only get the Fast jobs by taking them from `home`'s mailbox,
    // whose worker is still stuck.
    rig.gates[other].send(()).unwrap();
    let mut ran: Vec<_> = (0..3).map(|_| rig.ran.recv().unwrap()).collect();
    ran.sort();
    assert_eq!(ran, vec![(0, other), (1, other), (2, other)]);
    // Their units went back to the shard that admitted them.
    let shards = rig.pool.stats().shards;
    assert_eq!(shards[home].usage, 1, "only the stuck Block holds a unit");
    assert_eq!(shards[other].usage, 0);
    assert_eq!(shards[home].completed, 4, "counted on the admitting shard");
    rig.gates[home].send(()).unwrap();
    rig.pool.shutdown();
    assert_eq!(rig.pool.usage(), 0);
    assert_eq!(rig.terminated.load(SeqCst), 2);
}

#[test]
fn a_panic_in_a_stolen_request_restarts_the_worker_that_ran_it() {
    let rig = rig();
    let home = both_workers_stuck(&rig);
    let other = 1 - home;
    // Admitted now, on this thread's home shard, behind the stuck worker.
    let panicking = rig.pool.call_async(Job::Panic);
    let after = rig.pool.call_async(Job::Fast(7));
    assert_eq!(rig.pool.stats().shards[home].usage, 4);
    rig.gates[other].send(()).unwrap();
    let runtime = current_thread();
    assert_eq!(runtime.block_on(panicking), Err(Error::WorkerPanicked));
    // The request behind it was taken by the rebuilt worker.
    assert_eq!(runtime.block_on(after), Ok(other));
    assert_eq!(rig.ran.recv().unwrap(), (7, other));
    assert_eq!(rig.builds[other].load(SeqCst), 2, "the thief was rebuilt");
    assert_eq!(rig.builds[home].load(SeqCst), 1, "the stuck worker was not");
    let stats = rig.pool.stats();
    assert_eq!(stats.panicked, 1);
    assert_eq!(stats.shards[home].panicked, 1, "counted where admitted");
    assert_eq!(stats.shards[home].usage, 1);
    rig.gates[home].send(()).unwrap();
    rig.pool.shutdown();
    assert_eq!(rig.pool.usage(), 0);
}

#[test]
fn shutdown_handles_every_stolen_and_queued_request_once() {
    let rig = rig();
    let _home = both_workers_stuck(&rig);
    // Fill the rest of the pool from two threads (two home shards).
    let admitted: Vec<u64> = thread::scope(|scope| {
        let senders: Vec<_> = (0..2u64)
            .map(|t| {
                let pool = &rig.pool;
                scope.spawn(move || {
                    (0..10)
                        .map(|i| t * 100 + i)
                        .filter(|&id| match pool.cast(Job::Fast(id)) {
                            Ok(()) => true,
                            Err(Error::Overload) => false,
                            Err(other) => panic!("unexpected {other}"),
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        senders
            .into_iter()
            .flat_map(|s| s.join().unwrap())
            .collect()
    });
    assert_eq!(admitted.len(), 14, "16 units, 2 held by the Blocks");
    // Shutdown begins while both workers are stuck and 14 requests wait.
    thread::scope(|scope| {
        let stopper = scope.spawn(|| rig.pool.shutdown());
        while !rig.pool.is_shutdown() {
            thread::yield_now();
        }
        let late = rig.pool.cast(Job::Fast(999));
        // The gates first: a failed assertion must fail the test, not
        // leave the blocked workers (and the shutdown) waiting forever.
        rig.gates[0].send(()).unwrap();
        rig.gates[1].send(()).unwrap();
        stopper.join().unwrap();
        assert_eq!(late, Err(Error::Shutdown));
    });
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for (id, _) in rig.ran.try_iter() {
        *counts.entry(id).or_default() += 1;
    }
    for id in &admitted {
        assert_eq!(counts.get(id), Some(&1), "request {id} handled once");
    }
    assert_eq!(counts.len(), admitted.len(), "nothing unadmitted ran");
    assert_eq!(rig.pool.usage(), 0);
    assert_eq!(rig.terminated.load(SeqCst), 2);
}

/// Answers which worker ran it, at once.
struct Index(usize);

impl Worker for Index {
    type Request = ();
    type Reply = usize;
    type Message = ();
    fn handle_call(&mut self, _: ()) -> usize {
        self.0
    }
    fn handle_cast(&mut self, _: ()) {}
}

#[test]
fn a_caller_never_meets_its_own_unit_even_when_stolen() {
    // One unit a shard: a caller that calls again right after its reply
    // would be refused if the unit were released after the reply.
    let pool = Pool::builder()
        .capacity(3)
        .workers(3)
        .steal(true)
        .spin_wait(std::time::Duration::ZERO)
        .build(Index)
        .unwrap();
    let mut ran_on = [0usize; 3];
    for _ in 0..3_000 {
        ran_on[pool.call(()).expect("released before the reply")] += 1;
    }
    assert_eq!(ran_on.iter().sum::<usize>(), 3_000);
    assert_eq!(pool.usage(), 0);
    assert_eq!(pool.stats().completed, 3_000);
}

/// Counts how many of its handlers run at once, pool-wide, and the most.
struct Tracked {
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    handled: Arc<Mutex<Vec<u64>>>,
}

impl Worker for Tracked {
    type Request = u64;
    type Reply = u64;
    type Message = u64;
    fn handle_call(&mut self, id: u64) -> u64 {
        self.handle_cast(id);
        id
    }
    fn handle_cast(&mut self, id: u64) {
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        self.handled.lock().unwrap().push(id);
        self.running.fetch_sub(1, SeqCst);
    }
}

#[test]
fn stress_stealing_keeps_the_bound_and_handles_each_admitted_request_once() {
    const CAPACITY: usize = 6;
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let handled = Arc::new(Mutex::new(Vec::new()));
    let pool = {
        let (running, most, handled) = (running.clone(), most.clone(), handled.clone());
        Pool::builder()
            .capacity(CAPACITY)
            .workers(3)
            .steal(true)
            .spin_wait(std::time::Duration::ZERO)
            .build(move |_| Tracked {
                running: running.clone(),
                most: most.clone(),
                handled: handled.clone(),
            })
            .unwrap()
    };
    let done = AtomicUsize::new(0);
    let admitted: Vec<u64> = thread::scope(|scope| {
        let watcher_pool = &pool;
        let done = &done;
        let watcher = scope.spawn(move || {
            let mut worst = 0;
            while done.load(SeqCst) < 4 {
                worst = worst.max(watcher_pool.usage());
            }
            worst
        });
        let callers: Vec<_> = (0..4u64)
            .map(|t| {
                let pool = &pool;
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..3_000u64 {
                        let id = t * 1_000_000 + i;
                        let outcome = if i % 2 == 0 {
                            pool.cast(id)
                        } else {
                            pool.call(id).map(|echo| assert_eq!(echo, id))
                        };
                        match outcome {
                            Ok(()) => mine.push(id),
                            Err(Error::Overload) => {}
                            Err(other) => panic!("unexpected {other}"),
                        }
                    }
                    done.fetch_add(1, SeqCst);
                    mine
                })
            })
            .collect();
        let admitted = callers
            .into_iter()
            .flat_map(|c| c.join().unwrap())
            .collect();
        assert!(watcher.join().unwrap() <= CAPACITY, "never over capacity");
        admitted
    });
    pool.shutdown();
    let mut handled = handled.lock().unwrap().clone();
    handled.sort();
    let mut admitted = admitted;
    admitted.sort();
    assert_eq!(
        handled, admitted,
        "every admitted request handled exactly once"
    );
    assert!(most.load(SeqCst) <= 3, "at most one handler per worker");
    let stats = pool.stats();
    assert_eq!(stats.completed as usize, admitted.len());
    assert_eq!(pool.usage(), 0);
}

#[test]
fn steal_false_keeps_every_request_on_the_worker_whose_shard_admitted_it() {
    let rig = rig_with(Some(false));
    // Both Blocks and three Fast jobs, all from this thread: all admitted on
    // its home shard, all queued at its worker.
    rig.pool.cast(Job::Block).unwrap();
    rig.pool.cast(Job::Block).unwrap();
    let home = rig.started.recv().unwrap();
    for id in 0..3 {
        rig.pool.cast(Job::Fast(id)).unwrap();
    }
    assert_eq!(rig.pool.stats().shards[home].usage, 5);
    // The home worker takes its second Block only once its first is done:
    // the other worker, free all along, never took it.
    rig.gates[home].send(()).unwrap();
    assert_eq!(rig.started.recv().unwrap(), home);
    rig.gates[home].send(()).unwrap();
    let ran: Vec<_> = (0..3).map(|_| rig.ran.recv().unwrap()).collect();
    assert_eq!(
        ran,
        vec![(0, home), (1, home), (2, home)],
        "in order, at home"
    );
    rig.pool.shutdown();
    assert_eq!(rig.pool.usage(), 0);
    assert!(rig.ran.try_recv().is_err(), "nothing else ran");
    assert_eq!(rig.pool.stats().shards[1 - home].completed, 0);
}
