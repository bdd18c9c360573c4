//! Dispatch in the async pool: by default (`build_async`, one queue every
//! free worker takes from) a free worker runs requests queued behind a
//! stuck one; the unit goes back to the admitting shard before the reply;
//! panics, shutdown, a dropped runtime and the bound hold; `steal(false)`
//! keeps each request on the worker whose shard admitted it. Channels and
//! semaphores, never sleeps.
#![cfg(feature = "tokio")]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::thread;

use crossbeam_channel::{unbounded, Receiver, Sender};
use sidejob::{AsyncPool, AsyncWorker, Error, Pool, WeakAsyncPool};
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

mod common;
use common::{current_thread, multi_thread};

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
    gate: Arc<Semaphore>,
    started: Sender<usize>,
    ran: Sender<(u64, usize)>,
    terminated: Arc<AtomicUsize>,
}

impl Stealer {
    async fn run(&mut self, job: Job) -> usize {
        match job {
            Job::Block => {
                self.started.send(self.index).unwrap();
                self.gate.acquire().await.expect("gate open").forget();
            }
            Job::Fast(id) => self.ran.send((id, self.index)).unwrap(),
            Job::Panic => panic!("told to panic on worker {}", self.index),
        }
        self.index
    }
}

impl AsyncWorker for Stealer {
    type Request = Job;
    type Reply = usize;
    type Message = Job;
    async fn handle_call(&mut self, job: Job) -> usize {
        self.run(job).await
    }
    async fn handle_cast(&mut self, job: Job) {
        self.run(job).await;
    }
    async fn terminate(&mut self) {
        self.terminated.fetch_add(1, SeqCst);
    }
}

struct Rig {
    runtime: Runtime,
    pool: AsyncPool<Stealer>,
    gates: Vec<Arc<Semaphore>>,
    started: Receiver<usize>,
    ran: Receiver<(u64, usize)>,
    builds: Arc<Vec<AtomicUsize>>,
    terminated: Arc<AtomicUsize>,
}

/// An async pool of 2 workers, capacity 16 (8 a shard), built by default
/// (one queue every free worker takes from), on a runtime of its own; the
/// test thread is outside it, so its requests all start at one home shard.
fn rig() -> Rig {
    rig_with(None)
}

/// As [`rig`], with `steal` set if given.
fn rig_with(steal: Option<bool>) -> Rig {
    let runtime = multi_thread();
    let gates: Vec<_> = (0..2).map(|_| Arc::new(Semaphore::new(0))).collect();
    let (started_tx, started) = unbounded();
    let (ran_tx, ran) = unbounded();
    let builds = Arc::new((0..2).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
    let terminated = Arc::new(AtomicUsize::new(0));
    let pool = {
        let (gates, builds, terminated) = (gates.clone(), builds.clone(), terminated.clone());
        let mut builder = Pool::builder();
        builder.name("async-steal").capacity(16).workers(2);
        if let Some(steal) = steal {
            builder.steal(steal);
        }
        builder
            .build_async_on(runtime.handle(), move |index| {
                builds[index].fetch_add(1, SeqCst);
                Stealer {
                    index,
                    gate: gates[index].clone(),
                    started: started_tx.clone(),
                    ran: ran_tx.clone(),
                    terminated: terminated.clone(),
                }
            })
            .unwrap()
    };
    Rig {
        runtime,
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
    rig.pool.try_cast(Job::Block).unwrap();
    rig.pool.try_cast(Job::Block).unwrap();
    let mut who = [rig.started.recv().unwrap(), rig.started.recv().unwrap()];
    who.sort();
    assert_eq!(who, [0, 1], "each worker holds one Block");
    let shards = rig.pool.stats().shards;
    shards
        .iter()
        .position(|s| s.usage == 2)
        .expect("both Blocks on one shard")
}

#[test]
fn a_free_worker_runs_requests_queued_behind_a_stuck_one() {
    let rig = rig();
    let home = both_workers_stuck(&rig);
    let other = 1 - home;
    for id in 0..3 {
        rig.pool.try_cast(Job::Fast(id)).unwrap();
    }
    let call = rig.pool.call_async(Job::Fast(3));
    assert_eq!(
        rig.pool.stats().shards[home].usage,
        6,
        "queued at the home worker"
    );
    // Free the worker of the *other* shard: its own mailbox is empty, so
    // it can only get the Fast jobs by taking them from `home`'s mailbox,
    // whose worker is still stuck.
    rig.gates[other].add_permits(1);
    assert_eq!(rig.runtime.block_on(call), Ok(other), "the thief answered");
    let mut ran: Vec<_> = (0..4).map(|_| rig.ran.recv().unwrap()).collect();
    ran.sort();
    assert_eq!(ran, vec![(0, other), (1, other), (2, other), (3, other)]);
    // Their units went back to the shard that admitted them, and the
    // call's before its reply.
    let shards = rig.pool.stats().shards;
    assert_eq!(shards[home].usage, 1, "only the stuck Block holds a unit");
    assert_eq!(shards[other].usage, 0);
    assert_eq!(shards[home].completed, 5, "counted on the admitting shard");
    assert_eq!(shards[other].completed, 0);
    rig.gates[home].add_permits(1);
    rig.runtime.block_on(rig.pool.shutdown_async());
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
    rig.gates[other].add_permits(1);
    assert_eq!(rig.runtime.block_on(panicking), Err(Error::WorkerPanicked));
    // The request behind it was taken by the rebuilt worker.
    assert_eq!(rig.runtime.block_on(after), Ok(other));
    assert_eq!(rig.ran.recv().unwrap(), (7, other));
    assert_eq!(rig.builds[other].load(SeqCst), 2, "the thief was rebuilt");
    assert_eq!(rig.builds[home].load(SeqCst), 1, "the stuck worker was not");
    let stats = rig.pool.stats();
    assert_eq!(stats.panicked, 1);
    assert_eq!(stats.shards[home].panicked, 1, "counted where admitted");
    assert_eq!(stats.shards[home].usage, 1);
    rig.gates[home].add_permits(1);
    rig.runtime.block_on(rig.pool.shutdown_async());
    assert_eq!(rig.pool.usage(), 0);
}

#[test]
fn shutdown_handles_every_stolen_and_queued_request_once() {
    let rig = rig();
    let _home = both_workers_stuck(&rig);
    // Fill the rest of the pool from two threads (two home shards): casts
    // and calls.
    let (admitted, calls): (Vec<u64>, Vec<_>) = thread::scope(|scope| {
        let senders: Vec<_> = (0..2u64)
            .map(|t| {
                let pool = &rig.pool;
                scope.spawn(move || {
                    let mut admitted = Vec::new();
                    let mut calls = Vec::new();
                    for id in (0..10).map(|i| t * 100 + i) {
                        if id % 2 == 0 {
                            match pool.try_cast(Job::Fast(id)) {
                                Ok(()) => admitted.push(id),
                                Err(refused) => assert!(refused.is_overload()),
                            }
                        } else {
                            calls.push((id, pool.call_async(Job::Fast(id))));
                        }
                    }
                    (admitted, calls)
                })
            })
            .collect();
        senders.into_iter().map(|s| s.join().unwrap()).fold(
            (Vec::new(), Vec::new()),
            |(mut a, mut c), (a2, c2)| {
                a.extend(a2);
                c.extend(c2);
                (a, c)
            },
        )
    });
    // Shutdown begins while both workers are stuck and the rest wait.
    rig.pool.shutdown();
    assert_eq!(
        rig.pool.try_cast(Job::Fast(999)).map_err(|r| r.error()),
        Err(Error::Shutdown)
    );
    rig.gates[0].add_permits(1);
    rig.gates[1].add_permits(1);
    let mut admitted = admitted;
    for (id, call) in calls {
        // Every caller resolves: admitted calls answer, refused ones fail.
        match rig.runtime.block_on(call) {
            Ok(_) => admitted.push(id),
            Err(Error::Overload) => {}
            Err(other) => panic!("unexpected {other}"),
        }
    }
    rig.runtime.block_on(rig.pool.shutdown_async());
    assert_eq!(admitted.len(), 14, "16 units, 2 held by the Blocks");
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

#[test]
fn a_dropped_runtime_resolves_every_caller_and_gives_back_every_unit() {
    let rig = rig();
    let _home = both_workers_stuck(&rig);
    let calls: Vec<_> = (0..6)
        .map(|id| rig.pool.call_async(Job::Fast(id)))
        .collect();
    for id in 10..14 {
        rig.pool.try_cast(Job::Fast(id)).unwrap();
    }
    assert_eq!(rig.pool.usage(), 12);
    let Rig { runtime, pool, .. } = rig;
    // The workers are dropped mid-request (the Blocks) and with requests
    // queued: their units come back, the callers hear `Shutdown`.
    drop(runtime);
    let other = current_thread();
    for call in calls {
        assert_eq!(other.block_on(call), Err(Error::Shutdown));
    }
    assert!(pool.is_shutdown());
    assert_eq!(pool.usage(), 0);
}

/// Answers which worker ran it, at once.
struct Index(usize);

impl AsyncWorker for Index {
    type Request = ();
    type Reply = usize;
    type Message = ();
    async fn handle_call(&mut self, _: ()) -> usize {
        self.0
    }
    async fn handle_cast(&mut self, _: ()) {}
}

#[test]
fn a_caller_never_meets_its_own_unit_even_when_stolen() {
    // One unit a shard: a caller that calls again right after its reply
    // would be refused if the unit were released after the reply.
    let runtime = multi_thread();
    let pool = Pool::builder()
        .capacity(3)
        .workers(3)
        .steal(true)
        .build_async_on(runtime.handle(), Index)
        .unwrap();
    let ran_on = runtime.block_on(async {
        let mut ran_on = [0usize; 3];
        for _ in 0..3_000 {
            ran_on[pool
                .call_async(())
                .await
                .expect("released before the reply")] += 1;
        }
        ran_on
    });
    assert_eq!(ran_on.iter().sum::<usize>(), 3_000);
    assert_eq!(pool.usage(), 0);
    assert_eq!(pool.stats().completed, 3_000);
}

/// Calls its own pool from a handler: the inner call goes to another
/// shard, and with stealing any free worker may take it.
struct Caller(Arc<OnceLock<WeakAsyncPool<Caller>>>);

impl AsyncWorker for Caller {
    type Request = u32;
    type Reply = Result<u32, Error>;
    type Message = ();
    async fn handle_call(&mut self, depth: u32) -> Result<u32, Error> {
        if depth == 0 {
            return Ok(0);
        }
        let pool = self.0.get().and_then(WeakAsyncPool::upgrade);
        let pool = pool.ok_or(Error::Shutdown)?;
        Ok(pool.call_async(depth - 1).await?? + 1)
    }
    async fn handle_cast(&mut self, _: ()) {}
}

#[test]
fn a_worker_calling_its_own_pool_is_served_by_another_worker() {
    let runtime = multi_thread();
    let slot = Arc::new(OnceLock::new());
    let pool = {
        let slot = slot.clone();
        Pool::builder()
            .capacity(8)
            .workers(2)
            .steal(true)
            .build_async_on(runtime.handle(), move |_| Caller(slot.clone()))
            .unwrap()
    };
    slot.set(pool.downgrade()).ok().unwrap();
    // Depth 1 on 2 workers: the outer call holds one worker, the inner
    // one must run on the other.
    for _ in 0..100 {
        assert_eq!(runtime.block_on(pool.call_async(1)), Ok(Ok(1)));
    }
    assert_eq!(pool.usage(), 0);
    runtime.block_on(pool.shutdown_async());
    assert_eq!(pool.stats().completed, 200);
}

/// Marks each request it handles (twice fails), counts handlers running
/// at once, and awaits a few times so handlers interleave and queues form.
struct Tracked {
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    marks: Arc<Vec<AtomicBool>>,
}

impl Tracked {
    async fn mark(&self, id: usize) {
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.most.fetch_max(now, SeqCst);
        for _ in 0..id % 4 {
            tokio::task::yield_now().await;
        }
        assert!(!self.marks[id].swap(true, SeqCst), "request {id} twice");
        self.running.fetch_sub(1, SeqCst);
    }
}

impl AsyncWorker for Tracked {
    type Request = usize;
    type Reply = usize;
    type Message = usize;
    async fn handle_call(&mut self, id: usize) -> usize {
        self.mark(id).await;
        id
    }
    async fn handle_cast(&mut self, id: usize) {
        self.mark(id).await;
    }
}

#[test]
fn stress_stealing_keeps_the_bound_and_handles_each_admitted_request_once() {
    const CAPACITY: usize = 6;
    const WORKERS: usize = 3;
    const TASKS: usize = 64;
    const THREADS: usize = 2;
    const PER: usize = 500;
    let total = (TASKS + THREADS) * PER;
    let runtime = multi_thread();
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let marks: Arc<Vec<AtomicBool>> =
        Arc::new((0..total).map(|_| AtomicBool::new(false)).collect());
    let pool = {
        let (running, most, marks) = (running.clone(), most.clone(), marks.clone());
        Pool::builder()
            .capacity(CAPACITY)
            .workers(WORKERS)
            .steal(true)
            .build_async_on(runtime.handle(), move |_| Tracked {
                running: running.clone(),
                most: most.clone(),
                marks: marks.clone(),
            })
            .unwrap()
    };
    let finished = AtomicUsize::new(0);
    // One request: admitted (it must be handled once) or refused (never).
    let outcome = |result: Result<(), Error>| match result {
        Ok(()) => true,
        Err(Error::Overload) => false,
        Err(other) => panic!("unexpected {other}"),
    };
    let admitted: Vec<usize> = thread::scope(|scope| {
        let watcher = {
            let (pool, finished) = (&pool, &finished);
            scope.spawn(move || {
                let mut worst = 0;
                while finished.load(SeqCst) < TASKS + THREADS {
                    worst = worst.max(pool.usage());
                    thread::yield_now();
                }
                worst
            })
        };
        // OS threads outside the runtime: try_cast and blocking on calls.
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (pool, finished, runtime) = (&pool, &finished, &runtime);
                scope.spawn(move || {
                    let mut mine = Vec::new();
                    for id in (TASKS + t) * PER..(TASKS + t + 1) * PER {
                        let ok = if id % 2 == 0 {
                            outcome(pool.try_cast(id).map_err(|r| r.error()))
                        } else {
                            let call = pool.call_async(id);
                            outcome(runtime.block_on(call).map(|echo| assert_eq!(echo, id)))
                        };
                        if ok {
                            mine.push(id);
                        }
                    }
                    finished.fetch_add(1, SeqCst);
                    mine
                })
            })
            .collect();
        // Tokio tasks on the runtime: cast and call_async.
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let pool = pool.clone();
                runtime.spawn(async move {
                    let mut mine = Vec::new();
                    for id in t * PER..(t + 1) * PER {
                        let result = if id % 3 == 0 {
                            pool.cast(id).await
                        } else {
                            pool.call_async(id).await.map(|echo| assert_eq!(echo, id))
                        };
                        let ok = match result {
                            Ok(()) => true,
                            Err(Error::Overload) => {
                                tokio::task::yield_now().await;
                                false
                            }
                            Err(other) => panic!("unexpected {other}"),
                        };
                        if ok {
                            mine.push(id);
                        }
                    }
                    mine
                })
            })
            .collect();
        let mut admitted: Vec<usize> = Vec::new();
        for task in tasks {
            admitted.extend(runtime.block_on(task).unwrap());
            finished.fetch_add(1, SeqCst);
        }
        for thread in threads {
            admitted.extend(thread.join().unwrap());
        }
        assert!(watcher.join().unwrap() <= CAPACITY, "never over capacity");
        admitted
    });
    runtime.block_on(pool.shutdown_async());
    let handled: Vec<usize> = (0..total).filter(|&id| marks[id].load(SeqCst)).collect();
    let mut admitted = admitted;
    admitted.sort_unstable();
    assert_eq!(
        handled, admitted,
        "every admitted request handled exactly once"
    );
    assert!(!admitted.is_empty());
    assert!(
        most.load(SeqCst) <= WORKERS,
        "at most one handler per worker"
    );
    let stats = pool.stats();
    assert_eq!(stats.completed as usize, admitted.len());
    assert_eq!(
        stats.accepted + stats.rejected,
        total as u64,
        "every attempt counted once"
    );
    assert_eq!(pool.usage(), 0);
    assert!(stats.shards.iter().all(|shard| shard.usage == 0));
}

#[test]
fn steal_true_is_the_default_shared_queue() {
    let rig = rig_with(Some(true));
    let home = both_workers_stuck(&rig);
    let other = 1 - home;
    let call = rig.pool.call_async(Job::Fast(1));
    rig.gates[other].add_permits(1);
    assert_eq!(rig.runtime.block_on(call), Ok(other));
    rig.gates[home].add_permits(1);
    rig.runtime.block_on(rig.pool.shutdown_async());
    assert_eq!(rig.pool.usage(), 0);
}

#[test]
fn steal_false_keeps_every_request_on_the_worker_whose_shard_admitted_it() {
    let rig = rig_with(Some(false));
    // Both Blocks and three Fast jobs, all from this thread: all admitted on
    // its home shard, all queued at its worker.
    rig.pool.try_cast(Job::Block).unwrap();
    rig.pool.try_cast(Job::Block).unwrap();
    let home = rig.started.recv().unwrap();
    for id in 0..3 {
        rig.pool.try_cast(Job::Fast(id)).unwrap();
    }
    assert_eq!(rig.pool.stats().shards[home].usage, 5);
    // The home worker takes its second Block only once its first is done:
    // the other worker, free all along, never took it.
    rig.gates[home].add_permits(1);
    assert_eq!(rig.started.recv().unwrap(), home);
    rig.gates[home].add_permits(1);
    let ran: Vec<_> = (0..3).map(|_| rig.ran.recv().unwrap()).collect();
    assert_eq!(
        ran,
        vec![(0, home), (1, home), (2, home)],
        "in order, at home"
    );
    rig.runtime.block_on(rig.pool.shutdown_async());
    assert_eq!(rig.pool.usage(), 0);
    assert!(rig.ran.try_recv().is_err(), "nothing else ran");
    assert_eq!(rig.pool.stats().shards[1 - home].completed, 0);
}
