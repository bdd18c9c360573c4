//! The async pool's shared queue (`pool/async_idle.rs`), driven through
//! the real poll over the real queue (its lock is loom's), each worker a
//! future under loom's `block_on` (whose waker unparks a loom thread, so a
//! waker nobody wakes is a deadlock loom reports): a free worker is woken
//! for a request (no lost wake-up), also while another worker is busy with
//! one, or away (its handler awaits, and what waits at it moves to the
//! common queue); each request is taken once and its unit goes back to the shard
//! that admitted it; a shutdown racing the last requests still lets every
//! worker drain and end, the last release waking the sleepers; a worker
//! dropped asleep leaves the stack, and one dropped after its ring passes
//! the ring on; on a current-thread runtime's one queue as well.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release --test loom_async_steal`.
#![cfg(loom)]

use std::future::Future;

use loom::future::block_on;
use loom::sync::Arc;
use loom::thread;
use loom_tests::Count;
use sidejob::loom_api::{SharedQueue, SharedWorker, Table};

struct Rig {
    table: Table,
    queue: SharedQueue,
    handled: Count,
}

impl Rig {
    fn new(capacity: usize) -> Arc<Rig> {
        Rig::with(capacity, SharedQueue::new(2))
    }

    /// As on a current-thread runtime (`SharedQueue::current_thread`).
    fn current_thread(capacity: usize) -> Arc<Rig> {
        Rig::with(capacity, SharedQueue::current_thread(2))
    }

    fn with(capacity: usize, queue: SharedQueue) -> Arc<Rig> {
        Arc::new(Rig {
            table: Table::new(capacity, 2),
            queue,
            handled: Count::default(),
        })
    }

    /// A caller: admits one unit on shard `shard`, queues it, rings.
    fn submit(&self, shard: usize) {
        assert_eq!(self.table.acquire_at(shard), Ok(shard));
        assert!(self.queue.push(shard), "the workers are alive");
    }

    /// Worker `me`'s task: take, run `handle`, release on the admitting
    /// shard; until the pool is closed and drained. The thread ends with
    /// the task (joined: a task that never ends is a deadlock).
    fn worker(rig: &Arc<Rig>, me: usize, handle: impl Fn() + 'static) -> thread::JoinHandle<()> {
        let rig = Arc::clone(rig);
        thread::spawn(move || {
            block_on(async {
                let mut worker = SharedWorker::new(me);
                while let Some(from) = worker.next(&rig.queue, &rig.table).await {
                    handle();
                    rig.table.release(from);
                    rig.handled.bump();
                }
            })
        })
    }

    /// Worker 1 starts (and, if `asleep`, is waited for until it sleeps),
    /// then worker 0, whose handler is stuck until worker 1 has handled a
    /// request (and first goes away, if `away`); two requests of shard 0
    /// arrive. The second must reach worker 1 while worker 0 is stuck: a
    /// ring lost, or spent on worker 0, is a deadlock.
    fn one_busy_one_free(rig: Arc<Rig>, asleep: bool, away: bool) {
        let by_one = Arc::new(Count::default());
        let one = {
            let by_one = by_one.clone();
            Rig::worker(&rig, 1, move || by_one.bump())
        };
        while asleep && rig.queue.sleepers() == 0 {
            thread::yield_now();
        }
        let zero = {
            // The rig, to go away with, only where the model needs it.
            let (by_one, away) = (by_one.clone(), away.then(|| Arc::clone(&rig)));
            Rig::worker(&rig, 0, move || {
                if let Some(rig) = &away {
                    rig.queue.away(0);
                }
                by_one.wait_for(1)
            })
        };
        rig.submit(0);
        rig.submit(0);
        rig.handled.wait_for(2);
        rig.shut_down(vec![zero, one], 2);
    }

    /// Shutdown: close, wake, join the workers; then every request was
    /// handled once and every unit is back.
    fn shut_down(&self, workers: Vec<thread::JoinHandle<()>>, handled: usize) {
        self.table.close();
        self.queue.wake_all();
        for worker in workers {
            worker.join().unwrap();
        }
        assert_eq!(self.handled.get(), handled, "each request handled once");
        assert_eq!(self.table.usage(), 0, "every unit back on its shard");
        assert!(self.queue.is_empty());
    }
}

/// One worker, free (maybe already asleep); a request must wake it: the
/// caller waits for it with no other wake-up in play, so a lost one is a
/// deadlock loom reports.
#[test]
fn a_free_worker_is_woken_for_a_request() {
    loom::model(|| {
        let rig = Rig::new(2);
        let worker = Rig::worker(&rig, 1, || {});
        rig.submit(0);
        rig.handled.wait_for(1);
        rig.shut_down(vec![worker], 1);
    });
}

/// Both workers run; two requests of two shards are queued and shutdown
/// begins at once. Each is handled once, every unit goes back to its
/// shard, and both workers drain and end (the last release wakes a worker
/// asleep waiting for the pool to drain).
#[test]
fn two_workers_take_each_request_once_across_shutdown() {
    loom::model(|| {
        let rig = Rig::new(4);
        let workers = (0..2).map(|me| Rig::worker(&rig, me, || {})).collect();
        rig.submit(0);
        rig.submit(1);
        rig.shut_down(workers, 2);
    });
}

/// Worker 1 sleeps; worker 0 starts and two requests arrive. Whichever
/// worker takes the first: worker 0 is stuck in it until worker 1 has
/// handled a request, so the second request must reach worker 1 while
/// worker 0 is busy (a ring lost, or spent on worker 0, is a deadlock).
#[test]
fn a_request_reaches_the_free_worker_while_the_other_is_busy() {
    loom::model(|| Rig::one_busy_one_free(Rig::new(4), true, false));
}

/// As above, but worker 0's handler awaits (it goes away): what was
/// queued at worker 0 moves to the common queue, and what is pushed for
/// it meanwhile goes there. Whichever way each push and the move
/// interleave with worker 1's sleep, the second request must reach
/// worker 1 while worker 0 is stuck (a request left at the away worker,
/// or a ring lost in the move, is a deadlock).
#[test]
fn a_request_queued_at_a_worker_that_goes_away_reaches_the_free_one() {
    loom::model(|| Rig::one_busy_one_free(Rig::new(4), true, true));
}

/// Worker 0 is in a request when shutdown begins, and gives its unit back
/// only after the close; worker 1, free, sleeps or is woken by the close
/// and finds the pool not yet drained. The last release must wake it to
/// end (its look and that release are ordered by the queue's lock).
#[test]
fn the_last_release_after_the_close_wakes_the_sleepers() {
    loom::model(|| {
        let rig = Rig::new(2);
        let closed = Arc::new(Count::default());
        let zero = {
            let closed = closed.clone();
            Rig::worker(&rig, 0, move || closed.wait_for(1))
        };
        let one = Rig::worker(&rig, 1, || {});
        rig.submit(0);
        // Whoever took it (worker 1 may have), the close comes while the
        // request may be running.
        rig.table.close();
        rig.queue.wake_all();
        closed.bump();
        for worker in [zero, one] {
            worker.join().unwrap();
        }
        assert_eq!(rig.handled.get(), 1);
        assert_eq!(rig.table.usage(), 0);
    });
}

/// On a current-thread runtime's one queue: two workers take two requests
/// across a shutdown, each once, and both end; a request also reaches the
/// free worker while the other is busy.
#[test]
fn current_thread_workers_take_each_request_once_and_reach_the_free_one() {
    loom::model(|| {
        let rig = Rig::current_thread(4);
        let workers = (0..2).map(|me| Rig::worker(&rig, me, || {})).collect();
        rig.submit(0);
        rig.submit(1);
        rig.shut_down(workers, 2);
    });
    loom::model(|| Rig::one_busy_one_free(Rig::current_thread(4), false, false));
}

/// A worker's loop dropped while it sleeps (its runtime dropping it) takes
/// itself off the stack: a later request rings the other worker.
#[test]
fn a_worker_dropped_asleep_leaves_the_stack() {
    loom::model(|| {
        let rig = Rig::new(2);
        let mut gone = SharedWorker::new(0);
        // Put worker 0 to sleep with one poll, then drop its loop.
        {
            let mut next = Box::pin(gone.next(&rig.queue, &rig.table));
            let waker = futures_noop_waker();
            let mut cx = std::task::Context::from_waker(&waker);
            assert!(next.as_mut().poll(&mut cx).is_pending());
        }
        gone.leave(&rig.queue);
        assert_eq!(rig.queue.sleepers(), 0);
        let one = Rig::worker(&rig, 1, || {});
        rig.submit(0);
        rig.handled.wait_for(1);
        rig.shut_down(vec![one], 1);
    });
}

/// A worker rung for a request (its waker taken) whose loop is dropped
/// before it looks (its runtime dropping it) passes the ring on: the other
/// sleeper must take the request, or it waits forever (a deadlock loom
/// reports).
#[test]
fn a_worker_dropped_after_its_ring_passes_it_on() {
    loom::model(|| {
        let rig = Rig::new(2);
        let one = Rig::worker(&rig, 1, || {});
        while rig.queue.sleepers() == 0 {
            thread::yield_now();
        }
        // Worker 0 sleeps on top of the stack: the next push rings it
        // (unless worker 1 was polled again meanwhile and went on top: then
        // it is rung itself; both cases must end with the request handled).
        let mut gone = SharedWorker::new(0);
        {
            let mut next = Box::pin(gone.next(&rig.queue, &rig.table));
            let waker = futures_noop_waker();
            let mut cx = std::task::Context::from_waker(&waker);
            assert!(next.as_mut().poll(&mut cx).is_pending());
        }
        rig.submit(0);
        gone.leave(&rig.queue);
        rig.handled.wait_for(1);
        rig.shut_down(vec![one], 1);
    });
}

/// A waker that does nothing, for one manual poll.
fn futures_noop_waker() -> std::task::Waker {
    struct Noop;
    impl std::task::Wake for Noop {
        fn wake(self: std::sync::Arc<Self>) {}
    }
    std::task::Waker::from(std::sync::Arc::new(Noop))
}
