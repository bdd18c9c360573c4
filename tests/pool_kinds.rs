//! One suite, both kinds of pool: the semantics the thread `Pool` and the
//! `AsyncPool` share, checked by the same test bodies against each. The
//! handlers differ only in how they wait at the gate (a condition variable
//! on a worker thread, a `Notify` on a worker task). Each kind's own
//! behaviour is in tests/pool/ and tests/async_pool.rs.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};

use sidejob::{AsyncPool, AsyncWorker, Error, Pool, Worker};
use tokio::sync::{mpsc, Notify};

mod common;
use common::multi_thread;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    Echo(u64),
    Park(u64),
    Panic,
    /// Answers how many jobs this worker has run since it was built.
    Count,
}

/// The test's side of the workers: the gate, and what they did.
struct Shared {
    open: AtomicBool,
    lock: Mutex<()>,
    opened: Condvar,
    notify: Notify,
    handled: Mutex<Vec<u64>>,
    started: mpsc::UnboundedSender<u64>,
}

impl Shared {
    fn open(&self) {
        let _held = self.lock.lock().unwrap();
        self.open.store(true, SeqCst);
        self.opened.notify_all();
        self.notify.notify_waiters();
    }

    fn wait_blocking(&self) {
        let mut held = self.lock.lock().unwrap();
        while !self.open.load(SeqCst) {
            held = self.opened.wait(held).unwrap();
        }
    }

    async fn wait_async(&self) {
        loop {
            let notified = self.notify.notified();
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

/// The state both kinds of worker keep.
struct Script {
    shared: Arc<Shared>,
    count: u64,
}

impl Script {
    /// Before the wait: `Some(answer)` if the job needs no wait.
    fn begin(&mut self, job: Job) -> Option<u64> {
        self.count += 1;
        match job {
            Job::Echo(id) => Some(self.finish(id)),
            Job::Park(id) => {
                let _ = self.shared.started.send(id);
                None
            }
            Job::Panic => panic!("told to panic"),
            Job::Count => Some(self.count),
        }
    }

    fn finish(&self, id: u64) -> u64 {
        self.shared.handled.lock().unwrap().push(id);
        id
    }
}

struct ThreadScript(Script);

impl Worker for ThreadScript {
    type Request = Job;
    type Reply = u64;
    type Message = Job;
    fn handle_call(&mut self, job: Job) -> u64 {
        if let Some(answer) = self.0.begin(job) {
            return answer;
        }
        self.0.shared.wait_blocking();
        let Job::Park(id) = job else { unreachable!() };
        self.0.finish(id)
    }
    fn handle_cast(&mut self, job: Job) {
        self.handle_call(job);
    }
}

struct TaskScript(Script);

impl AsyncWorker for TaskScript {
    type Request = Job;
    type Reply = u64;
    type Message = Job;
    async fn handle_call(&mut self, job: Job) -> u64 {
        if let Some(answer) = self.0.begin(job) {
            return answer;
        }
        self.0.shared.wait_async().await;
        let Job::Park(id) = job else { unreachable!() };
        self.0.finish(id)
    }
    async fn handle_cast(&mut self, job: Job) {
        self.handle_call(job).await;
    }
}

type Reply = Pin<Box<dyn Future<Output = Result<u64, Error>> + Send>>;

/// What a test needs of a pool, whichever its kind.
trait Kind: Clone + Send + Sync + 'static {
    const NAME: &'static str;
    fn build(capacity: usize, workers: usize, shared: Arc<Shared>) -> Self;
    fn call(&self, job: Job) -> Reply;
    /// Fail-fast cast: admitted or refused at once.
    fn cast(&self, job: Job) -> Result<(), Error>;
    fn usage(&self) -> usize;
    fn panicked(&self) -> u64;
    /// Shuts down and waits for the workers to end.
    fn shutdown_and_wait(&self) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

impl Kind for Pool<ThreadScript> {
    const NAME: &'static str = "thread pool";
    fn build(capacity: usize, workers: usize, shared: Arc<Shared>) -> Self {
        Pool::builder()
            .capacity(capacity)
            .workers(workers)
            .build(move |_| {
                ThreadScript(Script {
                    shared: shared.clone(),
                    count: 0,
                })
            })
            .unwrap()
    }
    fn call(&self, job: Job) -> Reply {
        Box::pin(self.call_async(job))
    }
    fn cast(&self, job: Job) -> Result<(), Error> {
        Pool::cast(self, job)
    }
    fn usage(&self) -> usize {
        Pool::usage(self)
    }
    fn panicked(&self) -> u64 {
        self.stats().panicked
    }
    fn shutdown_and_wait(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        // `shutdown` joins the worker threads: off the runtime's threads.
        let pool = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || pool.shutdown())
                .await
                .unwrap();
        })
    }
}

impl Kind for AsyncPool<TaskScript> {
    const NAME: &'static str = "async pool";
    fn build(capacity: usize, workers: usize, shared: Arc<Shared>) -> Self {
        Pool::builder()
            .capacity(capacity)
            .workers(workers)
            .build_async(move |_| {
                TaskScript(Script {
                    shared: shared.clone(),
                    count: 0,
                })
            })
            .unwrap()
    }
    fn call(&self, job: Job) -> Reply {
        Box::pin(self.call_async(job))
    }
    fn cast(&self, job: Job) -> Result<(), Error> {
        self.try_cast(job).map_err(|refused| refused.error())
    }
    fn usage(&self) -> usize {
        AsyncPool::usage(self)
    }
    fn panicked(&self) -> u64 {
        self.stats().panicked
    }
    fn shutdown_and_wait(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(self.shutdown_async())
    }
}

/// Runs `body` for one kind on a 2-thread runtime, with a fresh gate.
fn run<K: Kind, Fut>(body: impl FnOnce(Arc<Shared>, mpsc::UnboundedReceiver<u64>) -> Fut)
where
    Fut: Future<Output = ()>,
{
    let rt = multi_thread();
    let (started, receiver) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        open: AtomicBool::new(false),
        lock: Mutex::new(()),
        opened: Condvar::new(),
        notify: Notify::new(),
        handled: Mutex::new(Vec::new()),
        started,
    });
    rt.block_on(body(shared, receiver));
}

fn exact_capacity_counts_queued_and_running<K: Kind>() {
    run::<K, _>(|shared, mut started| async move {
        let pool = K::build(4, 2, shared.clone());
        for id in 0..4 {
            pool.cast(Job::Park(id)).unwrap();
        }
        for _ in 0..2 {
            started.recv().await.unwrap();
        }
        assert_eq!(pool.usage(), 4, "{}", K::NAME);
        assert_eq!(pool.cast(Job::Echo(9)), Err(Error::Overload), "{}", K::NAME);
        assert_eq!(
            pool.call(Job::Echo(9)).await,
            Err(Error::Overload),
            "{}",
            K::NAME
        );
        shared.open();
        pool.shutdown_and_wait().await;
        assert_eq!(shared.handled_sorted(), vec![0, 1, 2, 3], "{}", K::NAME);
        assert_eq!(pool.usage(), 0, "{}", K::NAME);
    });
}

fn the_unit_is_released_before_the_reply<K: Kind>() {
    run::<K, _>(|shared, _started| async move {
        let pool = K::build(1, 1, shared);
        for id in 0..300 {
            assert_eq!(pool.call(Job::Echo(id)).await, Ok(id), "{}", K::NAME);
        }
    });
}

fn a_panic_fails_its_request_and_the_rebuilt_worker_keeps_the_mailbox<K: Kind>() {
    run::<K, _>(|shared, mut started| async move {
        let pool = K::build(8, 1, shared.clone());
        pool.cast(Job::Park(0)).unwrap();
        assert_eq!(started.recv().await, Some(0));
        let panicking = pool.call(Job::Panic);
        let after = pool.call(Job::Count);
        shared.open();
        assert_eq!(panicking.await, Err(Error::WorkerPanicked), "{}", K::NAME);
        assert_eq!(after.await, Ok(1), "{}: fresh state", K::NAME);
        assert_eq!(pool.panicked(), 1, "{}", K::NAME);
    });
}

fn shutdown_racing_callers_handles_every_admitted_request_once<K: Kind>() {
    for round in 0..10u64 {
        run::<K, _>(|shared, _started| async move {
            let pool = K::build(16, 2, shared.clone());
            let barrier = Arc::new(tokio::sync::Barrier::new(9));
            let callers: Vec<_> = (0..8u64)
                .map(|t| {
                    let (pool, barrier) = (pool.clone(), barrier.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        let mut admitted = Vec::new();
                        for i in 0..100 {
                            let id = t * 1_000 + i;
                            let outcome = if i % 2 == 0 {
                                pool.cast(Job::Echo(id))
                            } else {
                                pool.call(Job::Echo(id)).await.map(|_| ())
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
            barrier.wait().await;
            for _ in 0..round {
                tokio::task::yield_now().await;
            }
            pool.shutdown_and_wait().await;
            let mut admitted = Vec::new();
            for caller in callers {
                admitted.extend(caller.await.unwrap());
            }
            admitted.sort_unstable();
            assert_eq!(
                shared.handled_sorted(),
                admitted,
                "{} round {round}",
                K::NAME
            );
            assert_eq!(pool.usage(), 0, "{}", K::NAME);
        });
    }
}

macro_rules! both_kinds {
    ($($test:ident),* $(,)?) => {
        mod thread_pool {
            $(#[test] fn $test() { super::$test::<sidejob::Pool<super::ThreadScript>>(); })*
        }
        mod async_pool {
            $(#[test] fn $test() { super::$test::<sidejob::AsyncPool<super::TaskScript>>(); })*
        }
    };
}

both_kinds!(
    exact_capacity_counts_queued_and_running,
    the_unit_is_released_before_the_reply,
    a_panic_fails_its_request_and_the_rebuilt_worker_keeps_the_mailbox,
    shutdown_racing_callers_handles_every_admitted_request_once,
);
