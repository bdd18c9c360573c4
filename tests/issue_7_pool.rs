//! Regression tests for issue 7 (adversarial review), the `Pool` part:
//!
//! 1. a handler that calls its own pool hung forever;
//! 2. a panic outside the handler's `catch_unwind` (a reply's or a panic
//!    payload's `Drop`) killed the worker and stranded admitted work;
//! 3. workers holding a handle to their own pool kept it alive forever;
//! 4. `spin_wait(Duration::MAX)` was accepted;
//! 5. a refused request was dropped instead of handed back.
//!
//! A test whose bug was a hang runs the call on its own thread and waits for
//! it with a bound ([`bounded`]): a guard against hanging, not a sleep.

use std::panic::panic_any;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use sidejob::{Error, Pool, Refused, TryCallError, WeakPool, Worker, MAX_SPIN_WAIT};

/// How long a test waits for something that hung before the fix.
const BOUND: Duration = Duration::from_secs(20);

/// Runs `f` on its own thread; its result, or a failure naming `what` if it
/// has not returned within [`BOUND`].
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, result) = unbounded();
    thread::spawn(move || {
        let _ = done.send(f());
    });
    match result.recv_timeout(BOUND) {
        Ok(value) => value,
        Err(_) => panic!("{what}: hung (or panicked) instead of returning"),
    }
}

/// Receives within [`BOUND`], or fails naming `what`.
fn within<T>(what: &str, receiver: &Receiver<T>) -> T {
    receiver
        .recv_timeout(BOUND)
        .unwrap_or_else(|_| panic!("{what}: nothing within {BOUND:?}"))
}

// ---------------------------------------------------------------------------
// 1. A handler that calls its own pool.
// ---------------------------------------------------------------------------

/// How a [`SelfCaller`] handles a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// Answer with this worker's index.
    Leaf,
    /// Ask the own pool for a `Leaf`, through each waiting call form.
    Call,
    CallTimeout,
    CallUnbounded,
    CallAsync,
    TryCall,
    /// Block until the test opens the gate (fills a shard).
    Block,
}

/// A worker that calls its own pool through a weak handle.
struct SelfCaller {
    index: usize,
    pool: Arc<OnceLock<WeakPool<SelfCaller>>>,
    gate: Receiver<()>,
}

impl Worker for SelfCaller {
    type Request = Ask;
    /// `(worker that handled the request, what the inner call answered)`.
    type Reply = (usize, Result<usize, Error>);
    type Message = Ask;

    fn handle_call(&mut self, ask: Ask) -> Self::Reply {
        let Some(pool) = self.pool.get().and_then(WeakPool::upgrade) else {
            return (self.index, Err(Error::Shutdown));
        };
        let inner = match ask {
            Ask::Leaf => return (self.index, Ok(self.index)),
            Ask::Block => {
                let _ = self.gate.recv();
                return (self.index, Ok(self.index));
            }
            Ask::Call => pool.call(Ask::Leaf),
            Ask::CallTimeout => pool.call_timeout(Ask::Leaf, BOUND),
            Ask::CallUnbounded => pool.call_unbounded(Ask::Leaf),
            Ask::CallAsync => tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime")
                .block_on(pool.call_async(Ask::Leaf)),
            Ask::TryCall => match pool.try_call(Ask::Leaf) {
                Ok(reply) => Ok(reply),
                // The request must come back intact.
                Err(TryCallError::Refused(refused)) => {
                    assert_eq!(refused.clone().into_inner(), Ask::Leaf);
                    Err(refused.error())
                }
                Err(TryCallError::Failed(error)) => Err(error),
            },
        };
        (self.index, inner.map(|(served_by, _)| served_by))
    }

    fn handle_cast(&mut self, ask: Ask) {
        if ask == Ask::Block {
            let _ = self.gate.recv();
        }
    }
}

struct SelfCallers {
    pool: Pool<SelfCaller>,
    gate: Sender<()>,
}

fn self_callers(capacity: usize, workers: usize) -> SelfCallers {
    let slot = Arc::new(OnceLock::new());
    let (gate, opened) = unbounded();
    let pool = {
        let slot = slot.clone();
        Pool::builder()
            .capacity(capacity)
            .workers(workers)
            .build(move |index| SelfCaller {
                index,
                pool: slot.clone(),
                gate: opened.clone(),
            })
            .unwrap()
    };
    slot.set(pool.downgrade()).unwrap();
    SelfCallers { pool, gate }
}

const WAITING_FORMS: [Ask; 5] = [
    Ask::Call,
    Ask::CallTimeout,
    Ask::CallUnbounded,
    Ask::CallAsync,
    Ask::TryCall,
];

#[test]
fn a_single_worker_calling_its_own_pool_gets_calling_self_at_once() {
    let SelfCallers { pool, .. } = self_callers(4, 1);
    let outcomes = {
        let pool = pool.clone();
        bounded("a self-call on a one-worker pool", move || {
            WAITING_FORMS.map(|ask| pool.call(ask))
        })
    };
    for (ask, outcome) in WAITING_FORMS.iter().zip(outcomes) {
        assert_eq!(outcome, Ok((0, Err(Error::CallingSelf))), "{ask:?}");
    }
    let stats = pool.stats();
    assert_eq!(stats.rejected, 0, "CallingSelf is not a rejection");
    assert_eq!(
        stats.accepted,
        WAITING_FORMS.len() as u64,
        "the outer calls only"
    );
    assert_eq!(pool.usage(), 0, "no unit taken for the refused calls");
    assert!(!pool.is_shutdown());
    bounded("dropping the pool after a self-call", move || drop(pool));
}

#[test]
fn a_self_call_on_two_workers_is_served_by_the_other_worker() {
    let SelfCallers { pool, .. } = self_callers(8, 2);
    for _ in 0..10 {
        for ask in WAITING_FORMS {
            let pool = pool.clone();
            let (caller, inner) = bounded("a self-call on a two-worker pool", move || {
                pool.call(ask).unwrap()
            });
            assert_eq!(inner, Ok(1 - caller), "{ask:?} served by the other worker");
        }
    }
    assert_eq!(pool.stats().rejected, 0);
    assert_eq!(pool.usage(), 0);
    bounded("shutting the pool down", move || pool.shutdown());
}

#[test]
fn a_self_call_is_refused_with_overload_when_every_other_worker_is_full() {
    // Two workers, two units each. The first two casts fill the test
    // thread's home shard; the call then lands on the other worker, whose
    // own shard still has room. Before the fix its self-call could be queued
    // there, behind itself, and hang.
    let SelfCallers { pool, gate } = self_callers(4, 2);
    pool.cast(Ask::Block).unwrap();
    pool.cast(Ask::Block).unwrap();
    let full: Vec<usize> = pool.stats().shards.iter().map(|s| s.usage).collect();
    let blocked = full.iter().position(|&usage| usage == 2).unwrap();
    let (caller, inner) = {
        let pool = pool.clone();
        bounded("a self-call while the other shard is full", move || {
            pool.call(Ask::Call).unwrap()
        })
    };
    assert_eq!(caller, 1 - blocked, "the call went to the shard with room");
    assert_eq!(
        inner,
        Err(Error::Overload),
        "never queued behind the caller"
    );
    assert_eq!(pool.stats().rejected, 1, "that Overload is counted");

    // `call_unbounded` goes past the limit, to the other worker's shard: it
    // is queued behind the two blocked casts there and answered once the
    // gate opens.
    let unbounded_self_call = {
        let pool = pool.clone();
        thread::spawn(move || pool.call(Ask::CallUnbounded))
    };
    for _ in 0..3 {
        gate.send(()).unwrap();
    }
    let (caller, inner) = bounded("an unbounded self-call", move || {
        unbounded_self_call.join().unwrap().unwrap()
    });
    assert_eq!(inner, Ok(1 - caller));
    bounded("shutting the pool down", move || pool.shutdown());
}

/// A one-worker pool whose handler calls *another* one-worker pool.
struct Forwarder(Pool<Plain>);

impl Worker for Forwarder {
    type Request = u32;
    type Reply = Result<u32, Error>;
    type Message = ();
    fn handle_call(&mut self, n: u32) -> Result<u32, Error> {
        self.0.call(n + 1)
    }
    fn handle_cast(&mut self, _: ()) {}
}

#[test]
fn a_worker_calling_another_one_worker_pool_is_served() {
    // The identity is per pool: only a call to the worker's own pool is
    // refused.
    let downstream = Pool::builder()
        .capacity(2)
        .workers(1)
        .build(|_| Plain)
        .unwrap();
    let upstream = Pool::builder()
        .capacity(2)
        .workers(1)
        .build(move |_| Forwarder(downstream.clone()))
        .unwrap();
    assert_eq!(upstream.call(41), Ok(Ok(42)));
}

// ---------------------------------------------------------------------------
// 2. Panics outside the handler's catch.
// ---------------------------------------------------------------------------

/// A reply that panics when dropped while armed.
#[derive(Debug, PartialEq, Eq)]
struct Bomb {
    armed: bool,
    value: u32,
}

impl Drop for Bomb {
    fn drop(&mut self) {
        if self.armed {
            panic!("a reply that panics when dropped");
        }
    }
}

/// A panic payload whose `Drop` panics with another such payload, `0` times
/// more: `Nasty(3)` makes a drop panic three levels deep.
struct Nasty(u32);

impl Drop for Nasty {
    fn drop(&mut self) {
        if self.0 > 0 {
            panic_any(Nasty(self.0 - 1));
        }
    }
}

#[derive(Debug)]
enum Hostile {
    /// Wait at the gate, then answer with an armed bomb.
    GatedBomb,
    /// Panic with a payload whose drop panics.
    NastyPanic,
    /// Answer with a harmless reply.
    Plain(u32),
}

struct HostileWorker(Receiver<()>);

impl Worker for HostileWorker {
    type Request = Hostile;
    type Reply = Bomb;
    type Message = ();

    fn handle_call(&mut self, request: Hostile) -> Bomb {
        match request {
            Hostile::GatedBomb => {
                let _ = self.0.recv();
                Bomb {
                    armed: true,
                    value: 0,
                }
            }
            Hostile::NastyPanic => panic_any(Nasty(3)),
            Hostile::Plain(value) => Bomb {
                armed: false,
                value,
            },
        }
    }

    fn handle_cast(&mut self, _: ()) {}
}

fn hostile() -> (Pool<HostileWorker>, Sender<()>) {
    let (gate, opened) = unbounded();
    let pool = Pool::builder()
        .capacity(4)
        .workers(1)
        .build(move |_| HostileWorker(opened.clone()))
        .unwrap();
    (pool, gate)
}

#[test]
fn a_reply_that_panics_when_dropped_after_its_caller_timed_out_does_not_kill_the_worker() {
    let (pool, gate) = hostile();
    // The handler waits at the gate, so this times out for sure.
    assert_eq!(
        pool.call_timeout(Hostile::GatedBomb, Duration::from_millis(1)),
        Err(Error::Timeout)
    );
    pool.cast(()).unwrap(); // queued behind it, holding a unit
    gate.send(()).unwrap(); // the armed reply is now dropped on the worker
    let next = {
        let pool = pool.clone();
        bounded("the next call", move || pool.call(Hostile::Plain(5)))
    };
    assert_eq!(
        next,
        Ok(Bomb {
            armed: false,
            value: 5
        }),
        "the worker keeps serving"
    );
    assert_eq!(pool.usage(), 0, "every unit came back, the cast's included");
    assert!(!pool.is_shutdown());
    assert_eq!(pool.stats().completed, 3);
    bounded("shutting the pool down", move || pool.shutdown());
}

#[test]
fn a_panic_payload_whose_drop_panics_gives_worker_panicked_and_the_worker_survives() {
    let (pool, _gate) = hostile();
    let outcomes = {
        let pool = pool.clone();
        bounded(
            "a call whose handler panics with a nasty payload",
            move || {
                let panicked = pool.call(Hostile::NastyPanic);
                pool.cast(()).unwrap();
                (panicked, pool.call(Hostile::Plain(7)))
            },
        )
    };
    assert_eq!(outcomes.0, Err(Error::WorkerPanicked));
    assert_eq!(
        outcomes.1,
        Ok(Bomb {
            armed: false,
            value: 7
        })
    );
    let stats = pool.stats();
    assert_eq!((stats.usage, stats.panicked, stats.completed), (0, 1, 2));
    assert!(!pool.is_shutdown());
    bounded("shutting the pool down", move || pool.shutdown());
}

/// A worker whose factory always panics, with a payload whose drop panics.
struct NeverBuilt;

impl Worker for NeverBuilt {
    type Request = Bomb;
    type Reply = ();
    type Message = Bomb;
    fn handle_call(&mut self, _: Bomb) {}
    fn handle_cast(&mut self, _: Bomb) {}
}

#[test]
fn a_factory_that_panics_nastily_and_requests_that_panic_when_dropped_do_not_kill_the_worker() {
    let pool = Pool::builder()
        .capacity(4)
        .workers(1)
        .build(|_| -> NeverBuilt { panic_any(Nasty(3)) })
        .unwrap();
    let armed = || Bomb {
        armed: true,
        value: 1,
    };
    let outcomes = {
        let pool = pool.clone();
        bounded("calls to a worker that cannot be built", move || {
            let first = pool.call(armed());
            pool.cast(armed()).unwrap();
            (first, pool.call(armed()))
        })
    };
    assert_eq!(
        outcomes,
        (Err(Error::WorkerPanicked), Err(Error::WorkerPanicked))
    );
    let stats = pool.stats();
    assert_eq!(
        (stats.usage, stats.panicked),
        (0, 3),
        "every unit came back"
    );
    assert!(!pool.is_shutdown());
    bounded("shutting the pool down", move || pool.shutdown());
}

// ---------------------------------------------------------------------------
// 3. Weak handles.
// ---------------------------------------------------------------------------

/// Passes a countdown on through its own pool; reports `terminate`.
struct Relay {
    pool: Arc<OnceLock<WeakPool<Relay>>>,
    terminated: Arc<AtomicUsize>,
    done: Sender<usize>,
    index: usize,
    /// Rendezvous for [`Relay`]'s `Hold` cast (see the last-drop test).
    hold: Option<(Sender<&'static str>, Receiver<()>)>,
}

#[derive(Debug)]
enum Hop {
    /// Re-cast with one hop less, until zero.
    Left(u32),
    /// Upgrade, say so, wait for the test, drop the handle, say so.
    Hold,
}

impl Worker for Relay {
    type Request = ();
    type Reply = ();
    type Message = Hop;

    fn handle_call(&mut self, _: ()) {}

    fn handle_cast(&mut self, hop: Hop) {
        match hop {
            Hop::Left(0) => {}
            Hop::Left(n) => {
                if let Some(pool) = self.pool.get().and_then(WeakPool::upgrade) {
                    // Refused with Shutdown once the outside drops the pool.
                    let _ = pool.cast(Hop::Left(n - 1));
                }
            }
            Hop::Hold => {
                let (say, go) = self.hold.as_ref().expect("a rendezvous");
                let pool = self.pool.get().and_then(WeakPool::upgrade);
                say.send("upgraded").unwrap();
                go.recv().unwrap();
                drop(pool); // the last handle, dropped on this worker
                say.send("dropped").unwrap();
            }
        }
    }

    fn terminate(&mut self) {
        self.terminated.fetch_add(1, SeqCst);
        let _ = self.done.send(self.index);
    }
}

struct Relays {
    pool: Pool<Relay>,
    weak: WeakPool<Relay>,
    terminated: Arc<AtomicUsize>,
    done: Receiver<usize>,
    said: Receiver<&'static str>,
    go: Sender<()>,
}

fn relays(workers: usize) -> Relays {
    let slot = Arc::new(OnceLock::new());
    let terminated = Arc::new(AtomicUsize::new(0));
    let (done_tx, done) = unbounded();
    let (say, said) = unbounded();
    let (go, went) = unbounded();
    let pool = {
        let (slot, terminated) = (slot.clone(), terminated.clone());
        Pool::builder()
            .capacity(64)
            .workers(workers)
            .build(move |index| Relay {
                pool: slot.clone(),
                terminated: terminated.clone(),
                done: done_tx.clone(),
                index,
                hold: Some((say.clone(), went.clone())),
            })
            .unwrap()
    };
    let weak = pool.downgrade();
    slot.set(weak.clone()).unwrap();
    Relays {
        pool,
        weak,
        terminated,
        done,
        said,
        go,
    }
}

#[test]
fn workers_holding_a_weak_handle_do_not_keep_their_pool_alive() {
    let Relays {
        pool,
        weak,
        terminated,
        done,
        ..
    } = relays(2);
    pool.cast(Hop::Left(1_000)).unwrap();
    drop(pool);
    let mut stopped = vec![
        within("worker terminate", &done),
        within("worker terminate", &done),
    ];
    stopped.sort_unstable();
    assert_eq!(stopped, [0, 1], "every worker's terminate ran");
    assert_eq!(terminated.load(SeqCst), 2, "exactly once each");
    assert!(weak.upgrade().is_none(), "the pool is gone");
}

#[test]
fn the_last_handle_dropped_on_a_worker_shuts_down_without_joining_itself() {
    let Relays {
        pool,
        weak,
        terminated,
        done,
        said,
        go,
    } = relays(2);
    pool.cast(Hop::Hold).unwrap();
    assert_eq!(within("the worker's upgrade", &said), "upgraded");
    drop(pool); // not the last: the worker holds one
    assert!(weak.upgrade().is_some());
    go.send(()).unwrap();
    assert_eq!(
        within("the drop on the worker", &said),
        "dropped",
        "the drop returned on the worker thread"
    );
    let mut stopped = vec![
        within("worker terminate", &done),
        within("worker terminate", &done),
    ];
    stopped.sort_unstable();
    assert_eq!(stopped, [0, 1]);
    assert_eq!(terminated.load(SeqCst), 2);
    assert!(weak.upgrade().is_none());
}

#[test]
fn weak_pool_debug_clone_and_upgrade() {
    let pool = Pool::builder().capacity(1).build(|_| Plain).unwrap();
    let weak = pool.downgrade();
    let twin = weak.clone();
    assert_eq!(format!("{weak:?}"), "WeakPool { alive: true }");
    assert_eq!(twin.upgrade().unwrap().call(3), Ok(3));
    drop(pool);
    assert_eq!(format!("{twin:?}"), "WeakPool { alive: false }");
    assert!(weak.upgrade().is_none());
}

// ---------------------------------------------------------------------------
// 4. spin_wait is bounded.
// ---------------------------------------------------------------------------

/// Answers at once; `Debug` deliberately not implemented by the values.
struct Plain;

impl Worker for Plain {
    type Request = u32;
    type Reply = u32;
    type Message = NotDebug;
    fn handle_call(&mut self, n: u32) -> u32 {
        n
    }
    fn handle_cast(&mut self, _: NotDebug) {}
}

/// A message type without `Debug`, to show `Refused` does not need it.
#[derive(PartialEq, Eq)]
struct NotDebug(Vec<u8>);

#[test]
fn spin_wait_beyond_the_cap_is_a_config_error() {
    for spin in [Duration::MAX, MAX_SPIN_WAIT + Duration::from_nanos(1)] {
        let err = Pool::builder()
            .capacity(1)
            .spin_wait(spin)
            .build(|_| Plain)
            .unwrap_err();
        assert_eq!(err.field(), "spin_wait");
        assert_eq!(err.to_string(), "invalid `spin_wait`: must be at most 10ms");
    }
    let pool = Pool::builder()
        .capacity(1)
        .spin_wait(MAX_SPIN_WAIT)
        .build(|_| Plain)
        .unwrap();
    assert_eq!(pool.call(1), Ok(1));
}

// ---------------------------------------------------------------------------
// 5. try_call and try_cast hand a refused value back.
// ---------------------------------------------------------------------------

/// One worker whose casts wait at a gate, so the test can fill the pool.
struct Held(Receiver<()>);

impl Worker for Held {
    type Request = Vec<String>;
    type Reply = usize;
    type Message = String;
    fn handle_call(&mut self, request: Vec<String>) -> usize {
        if request.is_empty() {
            panic!("told to panic");
        }
        request.len()
    }
    fn handle_cast(&mut self, _: String) {
        let _ = self.0.recv();
    }
}

fn held(capacity: usize) -> (Pool<Held>, Sender<()>) {
    let (gate, opened) = unbounded();
    let pool = Pool::builder()
        .capacity(capacity)
        .workers(1)
        .build(move |_| Held(opened.clone()))
        .unwrap();
    (pool, gate)
}

fn words() -> Vec<String> {
    vec!["not".to_string(), "lost".to_string()]
}

#[test]
fn overload_hands_the_request_back_intact() {
    let (pool, gate) = held(1);
    pool.try_cast("first".to_string()).unwrap(); // holds the only unit
    let refused = pool.try_call(words()).unwrap_err();
    assert!(refused.is_refused());
    assert_eq!(refused.error(), Error::Overload);
    assert_eq!(refused.into_request(), Some(words()));
    let refused = pool.try_cast("second".to_string()).unwrap_err();
    assert!(refused.is_overload());
    assert_eq!(refused.into_inner(), "second");
    assert_eq!(pool.stats().rejected, 2, "each refusal is counted");
    gate.send(()).unwrap();
    pool.shutdown();
    assert_eq!(pool.stats().completed, 1);
}

#[test]
fn shutdown_hands_the_request_back_intact() {
    let (pool, _gate) = held(4);
    pool.shutdown();
    match pool.try_call(words()) {
        Err(TryCallError::Refused(refused)) => {
            assert!(refused.is_shutdown());
            assert_eq!(refused.into_parts(), (Error::Shutdown, words()));
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let refused = pool.try_cast("late".to_string()).unwrap_err();
    assert_eq!(refused.error(), Error::Shutdown);
    assert_eq!(refused.into_inner(), "late");
    assert_eq!(pool.stats().rejected, 0, "Shutdown is not an Overload");
}

#[test]
fn an_admitted_try_call_that_fails_is_failed_without_its_request() {
    let (pool, _gate) = held(4);
    let failed = pool.try_call(Vec::new()).unwrap_err(); // the handler panics
    assert_eq!(failed, TryCallError::Failed(Error::WorkerPanicked));
    assert!(!failed.is_refused());
    assert_eq!(failed.into_request(), None);
    assert_eq!(pool.try_call(words()), Ok(2));
}

#[test]
fn question_mark_turns_refusals_into_error() {
    fn call(pool: &Pool<Held>) -> Result<usize, Error> {
        Ok(pool.try_call(words())?)
    }
    fn cast(pool: &Pool<Held>) -> Result<(), Error> {
        pool.try_cast("x".to_string())?;
        Ok(())
    }
    let (pool, gate) = held(1);
    assert_eq!(call(&pool), Ok(2));
    assert_eq!(cast(&pool), Ok(())); // now full
    assert_eq!(call(&pool), Err(Error::Overload));
    assert_eq!(cast(&pool), Err(Error::Overload));
    let boxed: Box<dyn std::error::Error + Send + Sync> =
        pool.try_cast("y".to_string()).unwrap_err().into();
    assert_eq!(boxed.to_string(), Error::Overload.to_string());
    gate.send(()).unwrap();
    pool.shutdown();
}

#[test]
fn refusals_print_without_their_value() {
    let pool = Pool::builder().capacity(1).build(|_| Plain).unwrap();
    pool.shutdown();
    let refused: Refused<NotDebug> = pool.try_cast(NotDebug(vec![1])).unwrap_err();
    assert_eq!(format!("{refused:?}"), "Refused { error: Shutdown, .. }");
    assert_eq!(refused.to_string(), "shut down");
    assert!(refused.into_inner() == NotDebug(vec![1]));
    let refused = pool.try_call(9).unwrap_err();
    assert_eq!(
        format!("{refused:?}"),
        "Refused(Refused { error: Shutdown, .. })"
    );
    assert_eq!(
        format!(
            "{:?}",
            TryCallError::<NotDebug>::Failed(Error::WorkerPanicked)
        ),
        "Failed(WorkerPanicked)"
    );
}

#[test]
fn new_handles_and_errors_are_send_sync_and_static() {
    fn send_sync<T: Send + Sync>() {}
    fn send_sync_static<T: Send + Sync + 'static>() {}
    send_sync::<WeakPool<Plain>>();
    send_sync::<Pool<Plain>>();
    send_sync_static::<Refused<String>>();
    send_sync_static::<TryCallError<Vec<u8>>>();
    send_sync_static::<Error>();
    let _: fn(&Error) -> bool = Error::is_calling_self;
    assert_eq!(
        Error::CallingSelf.to_string(),
        "the call would wait for the calling worker itself"
    );
}
