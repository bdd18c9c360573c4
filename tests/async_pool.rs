//! Public behaviour of `AsyncPool`: every semantic `Pool` promises, checked
//! against async workers (tests/pool/, case by case, for tokio tasks),
//! with `Notify` gates and channels, never sleeps.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use sidejob::observe::Reporter;
use sidejob::{AsyncPool, AsyncWorker, Error, Pool, WeakAsyncPool};
use tokio::sync::{mpsc, Notify};

mod common;
use common::multi_thread;

/// What one request asks the worker to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    /// Answer at once.
    Echo(u64),
    /// Wait at the gate, then answer.
    Park(u64),
    /// Panic (in a poll after the first, so the future is mid-way).
    Panic,
    /// Call this pool from the handler; answer 1 if it was answered, 0 if
    /// refused with `CallingSelf`.
    CallSelf,
    /// Answer with this worker's count of jobs since it was built.
    Count,
}

/// What every worker of one test pool shares with the test.
#[derive(Default)]
struct Shared {
    open: AtomicBool,
    gate: Notify,
    handled: Mutex<Vec<u64>>,
    terminated: AtomicUsize,
    builds: AtomicUsize,
    pool: OnceLock<WeakAsyncPool<Probe>>,
}

impl Shared {
    /// Lets every parked handler, now and later, through.
    fn open(&self) {
        self.open.store(true, SeqCst);
        self.gate.notify_waiters();
    }

    async fn wait_open(&self) {
        loop {
            let notified = self.gate.notified();
            if self.open.load(SeqCst) {
                return;
            }
            notified.await;
        }
    }

    fn handled_sorted(&self) -> Vec<u64> {
        let mut handled = self.handled.lock().unwrap().clone();
        handled.sort_unstable();
        handled
    }
}

struct Probe {
    shared: Arc<Shared>,
    /// Says which job ids started, in order.
    started: mpsc::UnboundedSender<u64>,
    count: u64,
}

impl Probe {
    async fn run(&mut self, job: Job) -> u64 {
        self.count += 1;
        match job {
            Job::Echo(id) => {
                self.shared.handled.lock().unwrap().push(id);
                id
            }
            Job::Park(id) => {
                let _ = self.started.send(id);
                self.shared.wait_open().await;
                self.shared.handled.lock().unwrap().push(id);
                id
            }
            Job::Panic => {
                tokio::task::yield_now().await;
                panic!("told to panic");
            }
            Job::CallSelf => {
                let pool = self.shared.pool.get().and_then(WeakAsyncPool::upgrade);
                let pool = pool.expect("the test keeps a handle");
                match pool.call_async(Job::Echo(7)).await {
                    Ok(7) => 1,
                    Err(Error::CallingSelf) => 0,
                    other => panic!("unexpected {other:?}"),
                }
            }
            Job::Count => self.count,
        }
    }
}

impl AsyncWorker for Probe {
    type Request = Job;
    type Reply = u64;
    type Message = Job;

    async fn handle_call(&mut self, job: Job) -> u64 {
        self.run(job).await
    }

    async fn handle_cast(&mut self, job: Job) {
        self.run(job).await;
    }

    async fn terminate(&mut self) {
        tokio::task::yield_now().await;
        self.shared.terminated.fetch_add(1, SeqCst);
    }
}

struct Fixture {
    pool: AsyncPool<Probe>,
    shared: Arc<Shared>,
    started: mpsc::UnboundedReceiver<u64>,
}

/// A pool of `Probe`s, built on the current runtime.
fn probe_pool(capacity: usize, workers: usize, waiters: usize) -> Fixture {
    let shared = Arc::new(Shared::default());
    let (tx, started) = mpsc::unbounded_channel();
    let pool = {
        let shared = shared.clone();
        Pool::builder()
            .name("probe")
            .capacity(capacity)
            .workers(workers)
            .max_waiters(waiters)
            .max_wait(Duration::from_secs(60))
            .build_async(move |_| {
                shared.builds.fetch_add(1, SeqCst);
                Probe {
                    shared: shared.clone(),
                    started: tx.clone(),
                    count: 0,
                }
            })
            .unwrap()
    };
    shared.pool.set(pool.downgrade()).ok().unwrap();
    Fixture {
        pool,
        shared,
        started,
    }
}

#[test]
fn call_returns_the_handlers_reply_and_cast_is_handled() {
    multi_thread().block_on(async {
        let f = probe_pool(64, 2, 0);
        assert_eq!(f.pool.call_async(Job::Echo(5)).await, Ok(5));
        for id in 10..20 {
            f.pool.cast(Job::Echo(id)).await.unwrap();
        }
        f.pool.shutdown_async().await;
        let mut want = vec![5];
        want.extend(10..20);
        assert_eq!(f.shared.handled_sorted(), want);
        assert_eq!(f.pool.stats().completed, 11);
        assert_eq!(f.shared.terminated.load(SeqCst), 2);
    });
}

#[test]
fn capacity_is_exact_counting_queued_and_running_with_handlers_parked_on_a_notify() {
    multi_thread().block_on(async {
        let mut f = probe_pool(4, 2, 0);
        for id in 0..4 {
            f.pool.cast(Job::Park(id)).await.unwrap();
        }
        // Two run (one per worker), two are queued: all four hold a unit.
        let mut started = HashSet::new();
        while started.len() < 2 {
            started.insert(f.started.recv().await.unwrap());
        }
        assert_eq!(f.pool.usage(), 4);
        assert_eq!(f.pool.cast(Job::Echo(9)).await, Err(Error::Overload));
        assert_eq!(f.pool.call_async(Job::Echo(9)).await, Err(Error::Overload));
        let refused = f.pool.try_cast(Job::Echo(9)).unwrap_err();
        assert_eq!(refused.into_parts(), (Error::Overload, Job::Echo(9)));
        let refused = f.pool.try_call(Job::Echo(8)).await.unwrap_err();
        assert_eq!(refused.into_request(), Some(Job::Echo(8)));
        assert_eq!(f.pool.stats().rejected, 4);

        f.shared.open();
        f.pool.shutdown_async().await;
        assert_eq!(f.shared.handled_sorted(), vec![0, 1, 2, 3]);
        assert_eq!(f.pool.usage(), 0);
    });
}

#[test]
fn the_unit_is_released_before_the_reply_arrives() {
    multi_thread().block_on(async {
        let f = probe_pool(1, 1, 0);
        // Capacity 1: a reply that came before its unit was given back
        // would make the next call see the pool full.
        for id in 0..500 {
            assert_eq!(f.pool.try_call(Job::Echo(id)).await.ok(), Some(id));
            assert_eq!(f.pool.usage(), 0);
        }
    });
}

#[test]
fn call_timeout_gives_up_and_the_request_still_runs_and_frees_its_unit() {
    multi_thread().block_on(async {
        let f = probe_pool(1, 1, 0);
        let answer = f
            .pool
            .call_timeout(Job::Park(3), Duration::from_millis(5))
            .await;
        assert_eq!(answer, Err(Error::Timeout));
        assert_eq!(f.pool.usage(), 1, "still admitted");
        f.shared.open();
        f.pool.shutdown_async().await;
        assert_eq!(f.shared.handled_sorted(), vec![3]);
        assert_eq!(f.pool.usage(), 0);
        // In time: the reply.
        let g = probe_pool(1, 1, 0);
        let reply = g
            .pool
            .call_timeout(Job::Echo(4), Duration::from_secs(60))
            .await;
        assert_eq!(reply, Ok(4));
    });
}

#[test]
fn a_panic_fails_only_its_request_and_the_rebuilt_worker_serves_its_mailbox() {
    multi_thread().block_on(async {
        let mut f = probe_pool(8, 1, 0);
        assert_eq!(f.pool.call_async(Job::Count).await, Ok(1));
        f.pool.cast(Job::Park(0)).await.unwrap();
        assert_eq!(f.started.recv().await, Some(0));
        // Queued behind the parked job, in this order.
        let panicking = f.pool.call_async(Job::Panic);
        let after = f.pool.call_async(Job::Count);
        let echo = f.pool.call_async(Job::Echo(5));
        f.shared.open();
        assert_eq!(panicking.await, Err(Error::WorkerPanicked));
        assert_eq!(
            after.await,
            Ok(1),
            "fresh state: the first job since the rebuild"
        );
        assert_eq!(echo.await, Ok(5));
        assert_eq!(f.shared.builds.load(SeqCst), 2);
        let stats = f.pool.stats();
        assert_eq!((stats.panicked, f.pool.usage()), (1, 0));
        // A panicking cast is counted too; the worker keeps serving.
        f.pool.cast(Job::Panic).await.unwrap();
        assert_eq!(f.pool.call_async(Job::Echo(6)).await, Ok(6));
        assert_eq!(f.pool.stats().panicked, 2);
    });
}

#[test]
fn a_factory_that_panics_is_retried_on_the_next_request() {
    multi_thread().block_on(async {
        let builds = Arc::new(AtomicUsize::new(0));
        let pool = {
            let builds = builds.clone();
            let (tx, _rx) = mpsc::unbounded_channel();
            let shared = Arc::new(Shared::default());
            Pool::builder()
                .capacity(4)
                .workers(1)
                .build_async(move |_| {
                    if builds.fetch_add(1, SeqCst) == 0 {
                        panic!("first build fails");
                    }
                    Probe {
                        shared: shared.clone(),
                        started: tx.clone(),
                        count: 0,
                    }
                })
                .unwrap()
        };
        assert_eq!(pool.call_async(Job::Echo(1)).await, Ok(1));
        assert_eq!(builds.load(SeqCst), 2);
    });
}

#[test]
fn shutdown_racing_with_callers_from_many_tasks_handles_every_admitted_request_once() {
    let rt = multi_thread();
    for round in 0..20 {
        rt.block_on(async {
            let f = probe_pool(32, 4, 0);
            let pool = f.pool.clone();
            let start = Arc::new(tokio::sync::Barrier::new(17));
            let callers: Vec<_> = (0..16u64)
                .map(|t| {
                    let (pool, start) = (pool.clone(), start.clone());
                    tokio::spawn(async move {
                        start.wait().await;
                        let mut admitted = Vec::new();
                        for i in 0..200u64 {
                            let id = t * 1_000 + i;
                            let outcome = if i % 2 == 0 {
                                pool.cast(Job::Echo(id)).await
                            } else {
                                pool.call_async(Job::Echo(id)).await.map(|got| {
                                    assert_eq!(got, id);
                                })
                            };
                            match outcome {
                                Ok(()) => admitted.push(id),
                                Err(Error::Overload) => tokio::task::yield_now().await,
                                Err(Error::Shutdown) => break,
                                Err(other) => panic!("{other}"),
                            }
                        }
                        admitted
                    })
                })
                .collect();
            start.wait().await;
            for _ in 0..round {
                tokio::task::yield_now().await;
            }
            pool.shutdown_async().await;
            let mut admitted = Vec::new();
            for caller in callers {
                admitted.extend(caller.await.unwrap());
            }
            admitted.sort_unstable();
            let handled = f.shared.handled_sorted();
            // Every Ok was handled, exactly once; nothing else was.
            assert_eq!(handled, admitted, "round {round}");
            let stats = f.pool.stats();
            assert_eq!(stats.completed as usize, handled.len());
            assert_eq!(f.pool.usage(), 0);
            assert_eq!(f.shared.terminated.load(SeqCst), 4);
        });
    }
}

#[test]
fn dropping_the_last_handle_shuts_down_and_the_workers_drain_and_terminate() {
    multi_thread().block_on(async {
        let f = probe_pool(16, 2, 0);
        for id in 0..10 {
            f.pool.cast(Job::Park(id)).await.unwrap();
        }
        let weak = f.pool.downgrade();
        let shared = f.shared.clone();
        drop(f.pool);
        assert!(weak.upgrade().is_none());
        shared.open();
        // The workers drain on their own; wait for both terminates.
        while shared.terminated.load(SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(shared.handled_sorted(), (0..10).collect::<Vec<_>>());
    });
}

#[test]
fn after_shutdown_every_form_is_refused_with_shutdown() {
    multi_thread().block_on(async {
        let f = probe_pool(4, 2, 1);
        f.pool.shutdown();
        assert!(f.pool.is_shutdown());
        assert_eq!(f.pool.call_async(Job::Echo(1)).await, Err(Error::Shutdown));
        assert_eq!(
            f.pool
                .call_timeout(Job::Echo(1), Duration::from_secs(1))
                .await,
            Err(Error::Shutdown)
        );
        assert_eq!(f.pool.cast(Job::Echo(1)).await, Err(Error::Shutdown));
        assert!(f.pool.try_cast(Job::Echo(1)).unwrap_err().is_shutdown());
        let refused = f.pool.try_call(Job::Echo(2)).await.unwrap_err();
        assert_eq!(refused.into_request(), Some(Job::Echo(2)));
        f.pool.shutdown_async().await; // idempotent
    });
}

#[test]
fn a_worker_calling_its_own_pool_is_never_queued_behind_itself() {
    multi_thread().block_on(async {
        // One worker: refused at once (it would wait for itself).
        let one = probe_pool(4, 1, 4);
        assert_eq!(one.pool.call_async(Job::CallSelf).await, Ok(0));
        // Several workers: served by another one, even while the caller's
        // own shard has room.
        let two = probe_pool(4, 2, 4);
        for _ in 0..20 {
            assert_eq!(two.pool.call_async(Job::CallSelf).await, Ok(1));
        }
    });
}

#[test]
fn a_waiting_room_admits_a_waiter_when_a_unit_frees_and_times_out_otherwise() {
    multi_thread().block_on(async {
        let mut f = probe_pool(1, 1, 1);
        f.pool.cast(Job::Park(0)).await.unwrap();
        assert_eq!(f.started.recv().await, Some(0));
        let waiter = tokio::spawn({
            let pool = f.pool.clone();
            async move { pool.call_async(Job::Echo(1)).await }
        });
        while f.pool.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        // The room holds one: the next is refused at once.
        assert_eq!(f.pool.call_async(Job::Echo(2)).await, Err(Error::Overload));
        f.shared.open();
        assert_eq!(waiter.await.unwrap(), Ok(1));
        assert_eq!(f.pool.stats().waited, 1);

        // A short deadline: the caller's own timeout ends the wait.
        let g = probe_pool(1, 1, 1);
        g.pool.cast(Job::Park(0)).await.unwrap();
        let answer = g
            .pool
            .call_timeout(Job::Echo(3), Duration::from_millis(5))
            .await;
        assert_eq!(answer, Err(Error::Timeout));
        assert_eq!(g.pool.waiting(), 0);
        g.shared.open();
    });
}

#[test]
fn a_dropped_runtime_gives_back_the_units_of_what_its_workers_had_not_done() {
    let worker_rt = multi_thread();
    let f = {
        let _guard = worker_rt.enter();
        probe_pool(8, 2, 0)
    };
    let caller_rt = multi_thread();
    let pending = caller_rt.block_on(async {
        let mut f_started = f.started;
        let mut pending = Vec::new();
        for id in 0..6 {
            pending.push(f.pool.call_async(Job::Park(id)));
        }
        // Both workers hold a parked job; four are queued.
        for _ in 0..2 {
            f_started.recv().await.unwrap();
        }
        pending
    });
    assert_eq!(f.pool.usage(), 6);
    drop(worker_rt); // the workers' tasks are dropped mid-handler
    assert_eq!(f.pool.usage(), 0, "every unit given back");
    caller_rt.block_on(async {
        for call in pending {
            assert_eq!(call.await, Err(Error::Shutdown));
        }
        // The pool shut down with its runtime, and says so.
        assert!(f.pool.is_shutdown());
        assert_eq!(f.pool.call_async(Job::Echo(1)).await, Err(Error::Shutdown));
        assert_eq!(f.pool.usage(), 0);
    });
}

#[test]
fn bad_configuration_is_a_config_error_naming_the_field() {
    struct Sink;
    impl AsyncWorker for Sink {
        type Request = ();
        type Reply = ();
        type Message = ();
        async fn handle_call(&mut self, _: ()) {}
        async fn handle_cast(&mut self, _: ()) {}
    }
    // Outside a runtime.
    let err = Pool::builder()
        .capacity(4)
        .build_async(|_| Sink)
        .unwrap_err();
    assert_eq!(err.field(), "workers");
    assert!(err.to_string().contains("no tokio runtime"), "{err}");

    let rt = multi_thread();
    let _guard = rt.enter();
    let cases = [
        (
            Pool::builder().build_async(|_| Sink).unwrap_err(),
            "capacity",
        ),
        (
            Pool::builder()
                .capacity(0)
                .build_async(|_| Sink)
                .unwrap_err(),
            "capacity",
        ),
        (
            Pool::builder()
                .capacity(4)
                .workers(0)
                .build_async(|_| Sink)
                .unwrap_err(),
            "workers",
        ),
        (
            Pool::builder()
                .capacity(4)
                .workers(1 << 20)
                .build_async(|_| Sink)
                .unwrap_err(),
            "workers",
        ),
        (
            Pool::builder()
                .capacity(4)
                .name("a\0b")
                .build_async(|_| Sink)
                .unwrap_err(),
            "name",
        ),
    ];
    for (err, field) in cases {
        assert_eq!(err.field(), field, "{err}");
    }
    // The default worker count: one per unit, capped.
    let small = Pool::builder().capacity(8).build_async(|_| Sink).unwrap();
    assert_eq!(small.workers(), 8);
    let large = Pool::builder()
        .capacity(10_000)
        .build_async(|_| Sink)
        .unwrap();
    assert_eq!(
        large.workers(),
        sidejob::PoolBuilder::MAX_DEFAULT_ASYNC_WORKERS
    );
    // On a named runtime, from outside it.
    drop(_guard);
    let named = Pool::builder()
        .capacity(2)
        .build_async_on(rt.handle(), |_| Sink)
        .unwrap();
    assert_eq!(rt.block_on(named.call_async(())), Ok(()));
}

#[test]
fn handles_and_futures_are_send_and_sync() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send + 'static>(_: &T) {}
    let rt = multi_thread();
    let _guard = rt.enter();
    let f = probe_pool(2, 1, 0);
    send_sync(&f.pool);
    send_sync(&f.pool.downgrade());
    send(&f.pool.call_async(Job::Echo(1)));
    send(&f.pool.call_timeout(Job::Echo(1), Duration::from_secs(1)));
    send(&f.pool.cast(Job::Echo(1)));
    send(&f.pool.try_call(Job::Echo(1)));
    send(&f.pool.shutdown_async());
}

#[test]
fn a_reporter_reads_an_async_pool_without_keeping_it_alive() {
    let rt = multi_thread();
    let guard = rt.enter();
    let mut f = probe_pool(4, 2, 0);
    drop(guard);
    let mut reporter = Reporter::builder().build(&f.pool).unwrap();
    assert_eq!((reporter.kind(), reporter.name()), ("async_pool", "probe"));
    rt.block_on(async {
        f.pool.cast(Job::Park(1)).await.unwrap();
        f.started.recv().await.unwrap();
    });
    let stats = reporter.tick(std::time::Instant::now()).unwrap();
    assert_eq!((stats.usage, stats.capacity), (1, 4));
    f.shared.open();
    drop(f.pool);
    // The reporter's handle is weak: the pool's table outlives the pool
    // only while its workers drain; once they have, nothing is read.
    rt.block_on(async {
        while f.shared.terminated.load(SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
    });
    // Every worker task (and its handle on the table) is gone with it.
    drop(rt);
    assert!(reporter.tick(std::time::Instant::now()).is_none());
}

/// Hardening 3, item 3: at the capacity `null` gives in an `Env`
/// (`LimiterBuilder::MAX_CAPACITY`) and at 2^30, the async pool builds and
/// serves on either runtime, stealing or not. Its queues grow as they
/// fill: sized to the capacity up front, the first panicked (`capacity
/// overflow`) and the second asked for 32 GiB and aborted. That the
/// process is still here, having built eight of them, is the check that
/// memory stayed small.
#[test]
fn an_async_pool_at_the_largest_capacity_builds_and_serves_a_call() {
    struct Echo;
    impl AsyncWorker for Echo {
        type Request = u64;
        type Reply = u64;
        type Message = ();
        async fn handle_call(&mut self, n: u64) -> u64 {
            n
        }
        async fn handle_cast(&mut self, _: ()) {}
    }
    let unlimited = sidejob::env::Env::with_lookup("ASYNC_", |var| {
        (var == "ASYNC_CAPACITY").then(|| "null".to_owned())
    });
    let from_env = sidejob::PoolBuilder::from_env(&unlimited)
        .unwrap()
        .expect("the capacity is set");
    for rt in [multi_thread(), common::current_thread()] {
        for steal in [true, false] {
            let mut builders = vec![from_env.clone(), Pool::builder()];
            builders[1].capacity(1 << 30);
            for mut builder in builders {
                let pool = builder
                    .steal(steal)
                    .build_async_on(rt.handle(), |_| Echo)
                    .unwrap();
                assert!(pool.capacity() >= 1 << 30);
                assert_eq!(rt.block_on(pool.call_async(7)), Ok(7));
                assert_eq!(pool.usage(), 0);
                rt.block_on(pool.shutdown_async());
            }
        }
    }
}

/// The timeout from now to the largest `Instant` this platform holds, less
/// `margin`.
fn to_the_largest_instant_less(margin: Duration) -> Duration {
    let now = std::time::Instant::now();
    // The largest `n` nanoseconds that `now` takes: a binary search.
    let (mut fits, mut overflows) = (0u128, Duration::MAX.as_nanos() + 1);
    while overflows - fits > 1 {
        let mid = fits + (overflows - fits) / 2;
        let d = Duration::new((mid / 1_000_000_000) as u64, (mid % 1_000_000_000) as u32);
        if now.checked_add(d).is_some() {
            fits = mid;
        } else {
            overflows = mid;
        }
    }
    let largest = Duration::new((fits / 1_000_000_000) as u64, (fits % 1_000_000_000) as u32);
    largest - margin
}

/// Hardening 3, item 4: a `call_timeout` whose deadline lands within a
/// millisecond of the largest `Instant` is answered, admitted at once or
/// after a wait for a unit. tokio rounds a timer's deadline up to the
/// next millisecond by adding 999,999 ns, which overflowed the `Instant`
/// and panicked in the caller's task at the timer's first poll.
#[test]
fn call_timeout_ending_within_a_millisecond_of_the_largest_instant_is_answered() {
    multi_thread().block_on(async {
        let mut f = probe_pool(1, 1, 1);
        // Parked at the closed gate, the reply cannot have come at the
        // first poll: that poll arms the timer.
        let timeout = to_the_largest_instant_less(Duration::from_micros(500));
        let mut parked = Box::pin(f.pool.call_timeout(Job::Park(1), timeout));
        assert!(common::poll_once(&mut parked).is_pending());
        assert_eq!(f.started.recv().await, Some(1));
        // The one unit is held: this call waits for it, then for its reply.
        let timeout = to_the_largest_instant_less(Duration::from_micros(500));
        let waiting = f.pool.call_timeout(Job::Echo(2), timeout);
        assert_eq!(f.pool.usage(), 1);
        f.shared.open();
        assert_eq!(parked.await, Ok(1));
        assert_eq!(waiting.await, Ok(2));
        for margin_us in [1, 100, 900] {
            let timeout = to_the_largest_instant_less(Duration::from_micros(margin_us));
            let call = f.pool.call_timeout(Job::Echo(margin_us), timeout);
            assert_eq!(call.await, Ok(margin_us));
        }
        f.pool.shutdown_async().await;
        assert_eq!(f.shared.handled_sorted(), vec![1, 1, 2, 100, 900]);
    });
}

/// Issue 35: `call_with_async` and `cast_with` hold every unit of their
/// ask until the handler ends; 0 units and more than the capacity are
/// `TooLarge`, a fail-fast ask that does not fit `Overload`; a waiting
/// future dropped leaves nothing behind, units handed to it included; a
/// panicking handler gives every unit back.
#[test]
fn requests_of_many_units_hold_them_until_handled_and_a_dropped_wait_returns_them() {
    use sidejob::units::Ask;
    multi_thread().block_on(async {
        let mut f = probe_pool(6, 2, 4);
        let big = f.pool.call_with_async(Ask::new().units(4), Job::Park(1));
        assert_eq!(f.started.recv().await, Some(1));
        assert_eq!(f.pool.usage(), 4);
        let refused = f
            .pool
            .call_with_async(Ask::new().units(3).fail_fast(), Job::Echo(2));
        assert_eq!(refused.await, Err(Error::Overload));
        let zero = f.pool.cast_with(Ask::new().units(0), Job::Echo(2));
        assert_eq!(zero.await, Err(Error::TooLarge));
        let wide = f.pool.call_with_async(Ask::new().units(7), Job::Echo(2));
        assert_eq!(wide.await, Err(Error::TooLarge));

        // A waiting call, dropped while it waits: gone from the room.
        let mut waiting = Box::pin(f.pool.call_with_async(Ask::new().units(3), Job::Echo(3)));
        assert!(common::poll_once(&mut waiting).is_pending());
        assert_eq!(f.pool.waiting(), 1);
        drop(waiting);
        assert_eq!((f.pool.waiting(), f.pool.usage()), (0, 4));

        // A waiting cast handed its units when the big call ends, dropped
        // before it polls again: the units go back.
        let mut handed = Box::pin(f.pool.cast_with(Ask::new().units(5), Job::Echo(4)));
        assert!(common::poll_once(&mut handed).is_pending());
        f.shared.open();
        assert_eq!(big.await, Ok(1));
        while f.pool.waiting() > 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(f.pool.usage(), 5, "handed to the waiting cast");
        drop(handed);
        assert_eq!(f.pool.usage(), 0);

        let boom = f.pool.call_with_async(Ask::new().units(6), Job::Panic);
        assert_eq!(boom.await, Err(Error::WorkerPanicked));
        assert_eq!(f.pool.usage(), 0);
        f.pool
            .cast_with(Ask::new().units(2), Job::Echo(5))
            .await
            .unwrap();
        f.pool.shutdown_async().await;
        assert_eq!(f.pool.usage(), 0);
        assert!(f.shared.handled_sorted().contains(&5));
        assert!(
            !f.shared.handled_sorted().contains(&3),
            "the dropped call never ran"
        );
        assert!(
            !f.shared.handled_sorted().contains(&4),
            "the dropped cast never ran"
        );
    });
}

/// Issue 36: the async pool's asks carry their class: a gated class stops
/// at its share (0.8 of 5 by default for `Sheddable`), the default class
/// fills the rest, and a waiting sheddable call is served only once a
/// unit comes back under its line.
#[test]
fn a_sheddable_request_stops_at_its_share_and_waits_under_its_line() {
    use sidejob::{units::Ask, Class};
    multi_thread().block_on(async {
        let mut f = probe_pool(5, 1, 4);
        let sheddable = Ask::new().class(Class::Sheddable);
        let parked = f.pool.call_with_async(sheddable, Job::Park(1));
        assert_eq!(f.started.recv().await, Some(1));
        f.pool
            .cast_with(sheddable.units(3).fail_fast(), Job::Echo(2))
            .await
            .unwrap();
        let refused = f.pool.cast_with(sheddable.fail_fast(), Job::Echo(3));
        assert_eq!(refused.await, Err(Error::Overload));
        f.pool.cast(Job::Echo(4)).await.unwrap();
        assert_eq!(f.pool.usage(), 5);
        let mut waiting = Box::pin(f.pool.call_with_async(sheddable, Job::Echo(5)));
        assert!(common::poll_once(&mut waiting).is_pending());
        f.shared.open();
        assert_eq!(parked.await, Ok(1));
        assert_eq!(waiting.await, Ok(5));
        f.pool.shutdown_async().await;
        assert_eq!(f.shared.handled_sorted(), vec![1, 2, 4, 5]);
        let stats = f.pool.stats();
        let by = &stats.classes[Class::Sheddable.rank()];
        assert_eq!((by.accepted, by.rejected), (5, 1));
    });
}

/// With a mailbox per worker, a request of many units across shards gives
/// back units of other workers' shards: a shutdown begun meanwhile still
/// ends, every worker woken to leave.
#[test]
fn a_shutdown_ends_after_a_request_held_units_of_other_workers_shards() {
    use sidejob::units::Ask;
    multi_thread().block_on(async {
        let shared = Arc::new(Shared::default());
        let (tx, mut started) = mpsc::unbounded_channel();
        let pool = {
            let shared = shared.clone();
            Pool::builder()
                .capacity(6)
                .workers(3)
                .steal(false)
                .build_async(move |_| Probe {
                    shared: shared.clone(),
                    started: tx.clone(),
                    count: 0,
                })
                .unwrap()
        };
        pool.cast_with(Ask::new().units(5), Job::Park(9))
            .await
            .unwrap();
        assert_eq!(started.recv().await, Some(9));
        assert_eq!(pool.usage(), 5);
        let closing = tokio::spawn({
            let pool = pool.clone();
            async move { pool.shutdown_async().await }
        });
        while !pool.is_shutdown() {
            tokio::task::yield_now().await;
        }
        shared.open();
        tokio::time::timeout(Duration::from_secs(20), closing)
            .await
            .expect("the shutdown ends")
            .unwrap();
        assert_eq!(pool.usage(), 0);
        assert_eq!(shared.handled_sorted(), [9]);
    });
}
