//! Public behaviour of `Pool`: every semantic its docs promise, checked
//! with barriers and channels (never sleeps).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use sidejob::{Error, Pool, Worker, MAX_WORKERS};

mod common;
use common::GATE_PATIENCE;

/// What a gated job does once the test lets it go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Go {
    Finish,
    Panic,
}

/// A worker whose handlers block until the test says `Go`, so the test
/// decides exactly when each job finishes. Every handled job id is recorded.
struct Gated {
    gate: Receiver<Go>,
    handled: Arc<Mutex<Vec<u64>>>,
    /// Jobs whose handler has started, in order: a test that needs a job
    /// to be in its worker's hands (not merely admitted: admission comes
    /// before the mailbox send) waits on this.
    started: Arc<Mutex<Vec<u64>>>,
    terminated: Arc<AtomicUsize>,
}

impl Gated {
    fn run(&mut self, id: u64) -> u64 {
        self.started.lock().unwrap().push(id);
        let go = self
            .gate
            .recv_timeout(GATE_PATIENCE)
            .expect("the gate opens (a test that failed before opening it ends here)");
        if go == Go::Panic {
            panic!("job {id} told to panic");
        }
        self.handled.lock().unwrap().push(id);
        id
    }
}

impl Worker for Gated {
    type Request = u64;
    type Reply = u64;
    type Message = u64;

    fn handle_call(&mut self, id: u64) -> u64 {
        self.run(id)
    }

    fn handle_cast(&mut self, id: u64) {
        self.run(id);
    }

    fn terminate(&mut self) {
        self.terminated.fetch_add(1, SeqCst);
    }
}

struct GatedPool {
    pool: Pool<Gated>,
    gates: Vec<Sender<Go>>,
    handled: Arc<Mutex<Vec<u64>>>,
    started: Arc<Mutex<Vec<u64>>>,
    terminated: Arc<AtomicUsize>,
    builds: Arc<AtomicUsize>,
}

fn gated(capacity: usize, workers: usize) -> GatedPool {
    let (gates, receivers): (Vec<_>, Vec<_>) = (0..workers).map(|_| unbounded()).unzip();
    let handled = Arc::new(Mutex::new(Vec::new()));
    let started = Arc::new(Mutex::new(Vec::new()));
    let terminated = Arc::new(AtomicUsize::new(0));
    let builds = Arc::new(AtomicUsize::new(0));
    let pool = {
        let (handled, started, terminated, builds) = (
            handled.clone(),
            started.clone(),
            terminated.clone(),
            builds.clone(),
        );
        Pool::builder()
            .name("gated")
            .capacity(capacity)
            .workers(workers)
            .build(move |index| {
                builds.fetch_add(1, SeqCst);
                Gated {
                    gate: receivers[index].clone(),
                    handled: handled.clone(),
                    started: started.clone(),
                    terminated: terminated.clone(),
                }
            })
            .unwrap()
    };
    GatedPool {
        pool,
        gates,
        handled,
        started,
        terminated,
        builds,
    }
}

impl GatedPool {
    fn open_all(&self, per_worker: usize) {
        for gate in &self.gates {
            for _ in 0..per_worker {
                gate.send(Go::Finish).unwrap();
            }
        }
    }

    fn handled_sorted(&self) -> Vec<u64> {
        let mut handled = self.handled.lock().unwrap().clone();
        handled.sort_unstable();
        handled
    }
}

/// A worker that answers at once.
struct Echo;

impl Worker for Echo {
    type Request = u64;
    type Reply = u64;
    type Message = u64;
    fn handle_call(&mut self, n: u64) -> u64 {
        n
    }
    fn handle_cast(&mut self, _: u64) {}
}

#[test]
fn call_returns_the_handlers_reply_and_cast_is_handled() {
    // Capacity above the number of casts: fire-and-forget casts may all be
    // queued at once.
    let pool = Pool::builder()
        .capacity(16)
        .workers(2)
        .build(|_| Echo)
        .unwrap();
    for n in 0..100 {
        assert_eq!(pool.call(n), Ok(n));
    }
    for n in 0..10 {
        pool.cast(n).unwrap();
    }
    pool.shutdown();
    let stats = pool.stats();
    assert_eq!(stats.accepted, 110);
    assert_eq!(stats.completed, 110);
    assert_eq!(stats.usage, 0);
}

#[test]
fn capacity_is_exact_across_workers_while_they_are_blocked() {
    for (capacity, workers) in [(1, 1), (4, 2), (5, 2), (7, 3), (2, 8)] {
        let p = gated(capacity, workers);
        let mut admitted = 0;
        for id in 0..(capacity as u64 * 3) {
            match p.pool.cast(id) {
                Ok(()) => admitted += 1,
                Err(Error::Overload) => {}
                Err(other) => panic!("unexpected {other}"),
            }
        }
        assert_eq!(admitted, capacity, "capacity {capacity}, workers {workers}");
        assert_eq!(p.pool.usage(), capacity);
        assert_eq!(p.pool.stats().rejected, capacity as u64 * 2);
        // Per worker, the queue never exceeds the shard's limit.
        for shard in p.pool.stats().shards {
            assert_eq!(shard.usage, shard.limit);
        }
        p.open_all(capacity);
        p.pool.shutdown();
        assert_eq!(p.handled_sorted().len(), capacity);
        assert_eq!(p.pool.usage(), 0);
    }
}

#[test]
fn the_unit_is_released_before_the_reply_arrives() {
    // Capacity 1: if the worker replied before giving the unit back, the
    // next call would sometimes meet a stale unit and get Overload.
    let pool = Pool::builder()
        .capacity(1)
        .workers(1)
        .build(|_| Echo)
        .unwrap();
    for n in 0..20_000 {
        assert_eq!(pool.call(n), Ok(n));
    }
    assert_eq!(pool.stats().rejected, 0);
}

#[test]
fn timeout_leaves_the_request_to_run_and_frees_its_unit_then() {
    let p = gated(1, 1);
    let answer = p.pool.call_timeout(7, Duration::from_millis(20));
    assert_eq!(answer, Err(Error::Timeout));
    assert_eq!(p.pool.usage(), 1, "the timed-out request is still admitted");
    assert_eq!(p.pool.cast(8), Err(Error::Overload));
    p.gates[0].send(Go::Finish).unwrap();
    p.pool.shutdown();
    assert_eq!(p.handled_sorted(), vec![7]);
    assert_eq!(p.pool.usage(), 0);
}

#[test]
fn call_timeout_with_a_reply_in_time_returns_it() {
    let pool = Pool::builder().capacity(2).build(|_| Echo).unwrap();
    assert_eq!(pool.call_timeout(3, Duration::from_secs(60)), Ok(3));
    // A duration too long for a deadline means "no deadline".
    assert_eq!(pool.call_timeout(4, Duration::MAX), Ok(4));
}

#[test]
fn a_panic_fails_only_its_request_and_the_queue_behind_it_is_handled() {
    let p = gated(10, 1);
    // Queue: a call that will panic, three casts, then a call.
    let doomed = {
        let pool = p.pool.clone();
        thread::spawn(move || pool.call(1))
    };
    // Wait until the doomed call is in its worker's hands (admitted is not
    // enough: admission comes before the mailbox send, and a cast sent now
    // could reach the mailbox first) before queueing behind it.
    while p.started.lock().unwrap().is_empty() {
        thread::yield_now();
    }
    for id in 2..5 {
        p.pool.cast(id).unwrap();
    }
    let last = {
        let pool = p.pool.clone();
        thread::spawn(move || pool.call(5))
    };
    while p.pool.usage() < 5 {
        thread::yield_now();
    }
    p.gates[0].send(Go::Panic).unwrap();
    for _ in 0..4 {
        p.gates[0].send(Go::Finish).unwrap();
    }
    assert_eq!(doomed.join().unwrap(), Err(Error::WorkerPanicked));
    assert_eq!(last.join().unwrap(), Ok(5));
    p.pool.shutdown();
    assert_eq!(p.handled_sorted(), vec![2, 3, 4, 5]);
    assert_eq!(p.builds.load(SeqCst), 2, "one restart after the panic");
    let stats = p.pool.stats();
    assert_eq!((stats.panicked, stats.completed, stats.usage), (1, 4, 0));
}

#[test]
fn a_panicking_cast_is_counted_and_the_worker_keeps_serving() {
    let p = gated(4, 1);
    p.pool.cast(1).unwrap();
    p.gates[0].send(Go::Panic).unwrap();
    p.gates[0].send(Go::Finish).unwrap();
    assert_eq!(p.pool.call(2), Ok(2));
    assert_eq!(p.pool.stats().panicked, 1);
}

/// A worker whose factory panics the first time it is called.
struct Fragile;

impl Worker for Fragile {
    type Request = ();
    type Reply = &'static str;
    type Message = ();
    fn handle_call(&mut self, _: ()) -> &'static str {
        "ok"
    }
    fn handle_cast(&mut self, _: ()) {}
}

#[test]
fn a_factory_that_panics_at_start_is_retried() {
    let first = Arc::new(AtomicUsize::new(0));
    let pool = Pool::builder()
        .capacity(2)
        .workers(1)
        .build(move |_| {
            if first.fetch_add(1, SeqCst) == 0 {
                panic!("first build fails");
            }
            Fragile
        })
        .unwrap();
    assert_eq!(pool.call(()), Ok("ok"));
}

#[test]
fn shutdown_while_casting_handles_every_ok_cast_exactly_once() {
    const PRODUCERS: u64 = 4;
    let p = gated(64, 2);
    // Let every job through as soon as it starts.
    for gate in &p.gates {
        for _ in 0..1_000_000 {
            if gate.send(Go::Finish).is_err() {
                break;
            }
            if gate.len() > 200_000 {
                break;
            }
        }
    }
    let barrier = Arc::new(Barrier::new(PRODUCERS as usize + 1));
    let (progress_tx, progress_rx) = unbounded::<()>();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|t| {
            let pool = p.pool.clone();
            let barrier = barrier.clone();
            let progress = progress_tx.clone();
            thread::spawn(move || {
                barrier.wait();
                let (mut ok, mut overloaded) = (Vec::new(), 0u64);
                for i in 0.. {
                    let id = t * 1_000_000 + i;
                    match pool.cast(id) {
                        Ok(()) => ok.push(id),
                        Err(Error::Overload) => overloaded += 1,
                        Err(Error::Shutdown) => break,
                        Err(other) => panic!("unexpected {other}"),
                    }
                    if i == 100 {
                        let _ = progress.send(());
                    }
                }
                (ok, overloaded)
            })
        })
        .collect();
    barrier.wait();
    // Shut down once every producer is well under way.
    for _ in 0..PRODUCERS {
        progress_rx.recv().unwrap();
    }
    p.pool.shutdown();
    let mut sent = Vec::new();
    let mut overloaded = 0;
    for producer in producers {
        let (ok, over) = producer.join().unwrap();
        sent.extend(ok);
        overloaded += over;
    }
    sent.sort_unstable();
    let handled = p.handled_sorted();
    assert_eq!(
        handled, sent,
        "every Ok cast handled exactly once, nothing else"
    );
    assert_eq!(p.terminated.load(SeqCst), 2, "terminate once per worker");
    let stats = p.pool.stats();
    assert_eq!(stats.accepted, sent.len() as u64);
    assert_eq!(stats.rejected, overloaded);
    assert_eq!(stats.usage, 0);
}

#[test]
fn dropping_the_last_handle_shuts_down_and_joins() {
    let p = gated(8, 2);
    let clone = p.pool.clone();
    p.pool.cast(1).unwrap();
    p.gates[0].send(Go::Finish).unwrap();
    p.gates[1].send(Go::Finish).unwrap();
    let other = thread::spawn(move || drop(clone));
    other.join().unwrap();
    assert_eq!(p.terminated.load(SeqCst), 0, "a handle is still alive");
    let GatedPool {
        pool,
        handled,
        terminated,
        ..
    } = p;
    drop(pool); // the last handle: drains, terminates, joins
    assert_eq!(terminated.load(SeqCst), 2);
    assert_eq!(*handled.lock().unwrap(), vec![1]);
}

#[test]
fn calls_after_shutdown_are_refused_with_shutdown() {
    let pool = Pool::builder().capacity(4).build(|_| Echo).unwrap();
    pool.shutdown();
    assert!(pool.is_shutdown());
    assert_eq!(pool.call(1), Err(Error::Shutdown));
    assert_eq!(
        pool.call_timeout(1, Duration::from_secs(1)),
        Err(Error::Shutdown)
    );
    assert_eq!(pool.cast(1), Err(Error::Shutdown));
    assert_eq!(pool.call_unbounded(1), Err(Error::Shutdown));
    assert_eq!(pool.cast_unbounded(1), Err(Error::Shutdown));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert_eq!(runtime.block_on(pool.call_async(1)), Err(Error::Shutdown));
    assert_eq!(pool.stats().rejected, 0, "Shutdown is not an Overload");
}

/// A worker that shuts its own pool down from inside a handler.
struct SelfStopping(Arc<Mutex<Option<Pool<SelfStopping>>>>);

impl Worker for SelfStopping {
    type Request = ();
    type Reply = ();
    type Message = ();
    fn handle_call(&mut self, _: ()) {
        let pool = self.0.lock().unwrap().take();
        if let Some(pool) = pool {
            pool.shutdown(); // must not wait for this very worker
        }
    }
    fn handle_cast(&mut self, _: ()) {}
}

#[test]
fn shutdown_from_inside_a_handler_does_not_deadlock() {
    let slot = Arc::new(Mutex::new(None));
    let pool = {
        let slot = slot.clone();
        Pool::builder()
            .capacity(2)
            .workers(1)
            .build(move |_| SelfStopping(slot.clone()))
            .unwrap()
    };
    *slot.lock().unwrap() = Some(pool.clone());
    assert_eq!(pool.call(()), Ok(()));
    assert_eq!(pool.cast(()), Err(Error::Shutdown));
    pool.shutdown(); // from outside: joins the worker
}

#[test]
fn unbounded_requests_pass_a_full_pool_and_are_counted() {
    let p = gated(1, 1);
    p.pool.cast(1).unwrap();
    assert_eq!(p.pool.cast(2), Err(Error::Overload));
    p.pool.cast_unbounded(3).unwrap();
    assert_eq!(p.pool.usage(), 2);
    let call = {
        let pool = p.pool.clone();
        thread::spawn(move || pool.call_unbounded(4))
    };
    while p.pool.usage() < 3 {
        thread::yield_now();
    }
    p.open_all(3);
    assert_eq!(call.join().unwrap(), Ok(4));
    p.pool.shutdown();
    assert_eq!(p.handled_sorted(), vec![1, 3, 4]);
    let stats = p.pool.stats();
    assert_eq!((stats.accepted, stats.rejected, stats.completed), (3, 1, 3));
}

/// Answers with the name of the thread it runs on.
struct WhereAmI;

impl Worker for WhereAmI {
    type Request = ();
    type Reply = String;
    type Message = ();
    fn handle_call(&mut self, _: ()) -> String {
        thread::current().name().unwrap_or_default().to_string()
    }
    fn handle_cast(&mut self, _: ()) {}
}

#[test]
fn worker_threads_are_named_after_the_pool() {
    let pool = Pool::builder()
        .name("get_fsm")
        .capacity(1)
        .workers(1)
        .pin_workers(true)
        .build(|_| WhereAmI)
        .unwrap();
    assert_eq!(pool.call(()).unwrap(), "get_fsm-0");
    assert_eq!(pool.name(), "get_fsm");
}

#[test]
fn bad_configuration_is_a_config_error_naming_the_field() {
    let err = Pool::builder().capacity(0).build(|_| Echo).unwrap_err();
    assert_eq!(err.field(), "capacity");
    let err = Pool::builder().build(|_| Echo).unwrap_err();
    assert_eq!(err.field(), "capacity");
    assert_eq!(err.to_string(), "invalid `capacity`: must be set");
    let err = Pool::builder()
        .capacity(1)
        .workers(0)
        .build(|_| Echo)
        .unwrap_err();
    assert_eq!(err.field(), "workers");
    assert_eq!(err.to_string(), "invalid `workers`: must be at least 1");
    let err = Pool::builder()
        .capacity(1)
        .name("bad\0name")
        .build(|_| Echo)
        .unwrap_err();
    assert_eq!(err.field(), "name");
    assert!(err.to_string().contains("NUL"));
}

/// More worker threads than [`MAX_WORKERS`] are refused before any starts.
/// `workers(20_000)` used to abort the whole process: each thread takes four
/// memory mappings (its stack, the signal stack std gives it, a guard page
/// for each), Linux allows 65,530 by default, and a thread that cannot map
/// its signal stack panics where it cannot unwind. `MAX_WORKERS + 1` is
/// here so that the test fails, rather than aborts, without the limit.
#[test]
fn more_workers_than_max_workers_is_a_config_error() {
    for workers in [MAX_WORKERS + 1, 20_000, usize::MAX] {
        let err = Pool::builder()
            .capacity(1)
            .workers(workers)
            .build(|_| Echo)
            .unwrap_err();
        assert_eq!(err.field(), "workers");
        assert_eq!(
            err.to_string(),
            format!("invalid `workers`: must be at most {MAX_WORKERS}")
        );
    }
}

#[test]
fn workers_beyond_capacity_all_run_and_take_work_once_it_grows() {
    let pool = Pool::builder()
        .capacity(3)
        .workers(16)
        .build(|_| Echo)
        .unwrap();
    assert_eq!(pool.workers(), 16);
    let limits: Vec<usize> = pool.stats().shards.iter().map(|s| s.limit).collect();
    assert_eq!(limits.iter().filter(|&&l| l == 0).count(), 13);
    pool.set_capacity(16).unwrap();
    let limits: Vec<usize> = pool.stats().shards.iter().map(|s| s.limit).collect();
    assert_eq!(limits, vec![1; 16]);
    for n in 0..16u64 {
        pool.cast(n).unwrap();
    }
    pool.shutdown();
    // Each admitted cast was handled once.
    assert_eq!(pool.stats().completed, 16);
}

#[test]
fn call_async_from_many_tokio_tasks() {
    let pool = Pool::builder()
        .capacity(512)
        .workers(2)
        .build(|_| Echo)
        .unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let replies = runtime.block_on(async {
        let tasks: Vec<_> = (0..400u64)
            .map(|n| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.call_async(n).await })
            })
            .collect();
        let mut replies = HashSet::new();
        for task in tasks {
            replies.insert(task.await.unwrap().unwrap());
        }
        replies
    });
    assert_eq!(replies, (0..400).collect());
    assert_eq!(pool.stats().completed, 400);
}

#[test]
fn call_async_refuses_at_once_when_full_and_dropped_futures_still_run() {
    let p = gated(1, 1);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let admitted = p.pool.call_async(1); // admitted now, before any poll
    assert_eq!(p.pool.usage(), 1);
    assert_eq!(runtime.block_on(p.pool.call_async(2)), Err(Error::Overload));
    drop(admitted); // cancel: the request still runs
    p.gates[0].send(Go::Finish).unwrap();
    p.pool.shutdown();
    assert_eq!(p.handled_sorted(), vec![1]);
    assert_eq!(p.pool.usage(), 0);
}

#[test]
fn handles_and_futures_are_send_and_sync() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send_static<T: Send + 'static>(_: &T) {}
    let pool = Pool::builder().capacity(1).build(|_| Echo).unwrap();
    send_sync(&pool);
    let future = pool.call_async(1);
    send_static(&future);
    let _clone: Pool<Echo> = pool.clone();
    drop(future);
}

#[test]
fn per_worker_stats_show_usage_and_handled_counts() {
    let p = gated(4, 2);
    for id in 0..4 {
        p.pool.cast(id).unwrap();
    }
    let stats = p.pool.stats();
    assert_eq!(
        stats.shards.iter().map(|s| s.usage).collect::<Vec<_>>(),
        [2, 2]
    );
    p.open_all(2);
    p.pool.shutdown();
    let stats = p.pool.stats();
    assert_eq!(
        stats.shards.iter().map(|s| s.completed).collect::<Vec<_>>(),
        [2, 2]
    );
    assert_eq!(stats.peak_usage, 4);
}

/// A mailbox's ring holds what its shard may hold; `*_unbounded` requests
/// and a grown capacity go past it, to the overflow. One sender's requests
/// still run in the order it sent them, across the two, and every one of
/// them once.
#[test]
fn one_senders_requests_keep_their_order_past_the_mailboxs_ring() {
    let g = gated(2, 1);
    // The worker blocks in job 0; the rest queue behind it.
    g.pool.cast(0).unwrap();
    for id in 1..=40 {
        g.pool.cast_unbounded(id).unwrap();
    }
    g.pool.set_capacity(100).unwrap();
    for id in 41..=60 {
        g.pool.try_cast(id).unwrap();
    }
    g.open_all(62);
    // One worker: the call runs after every cast, and its reply comes once
    // every unit is back.
    assert_eq!(g.pool.call(61), Ok(61));
    assert_eq!(*g.handled.lock().unwrap(), (0..=61).collect::<Vec<u64>>());
    assert_eq!(g.pool.usage(), 0);
    assert_eq!(g.pool.stats().completed, 62);
}
