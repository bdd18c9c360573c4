//! The `Pool`'s request forms: `call`, `cast`, `call_timeout`,
//! `*_unbounded`, `call_async`, `try_call` and `try_cast`. The capacity is
//! exact across workers, a unit is back before its reply, a refused
//! request is handed back intact (issue 7), a worker calling its own pool
//! is never queued behind itself (issue 7: `CallingSelf`), one sender's
//! requests keep their order.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use sidejob::{Error, Pool, Refused, TryCallError, WeakPool, Worker};

use crate::common::{bounded, current_thread, multi_thread, until, HUNG};
use crate::{gated, Echo, Go};

/// `call` answers with the handler's reply; every `cast` is handled.
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

/// Exactly `capacity` requests are admitted however the workers split it,
/// each worker's queue at its shard's limit, the rest `Overload`.
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

/// The worker gives the unit back before it sends the reply: back-to-back
/// calls on a capacity of 1 are never refused.
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

/// A timed-out call still runs, and holds its unit until it has.
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

/// `call_timeout` with a reply in time returns it; `Duration::MAX` means no
/// deadline.
#[test]
fn call_timeout_with_a_reply_in_time_returns_it() {
    let pool = Pool::builder().capacity(2).build(|_| Echo).unwrap();
    assert_eq!(pool.call_timeout(3, Duration::from_secs(60)), Ok(3));
    // A duration too long for a deadline means "no deadline".
    assert_eq!(pool.call_timeout(4, Duration::MAX), Ok(4));
}

/// `cast_unbounded` and `call_unbounded` pass a full pool, and are counted
/// as accepted.
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
    until(|| p.pool.usage() >= 3);
    p.open_all(3);
    assert_eq!(call.join().unwrap(), Ok(4));
    p.pool.shutdown();
    assert_eq!(p.handled_sorted(), vec![1, 3, 4]);
    let stats = p.pool.stats();
    assert_eq!((stats.accepted, stats.rejected, stats.completed), (3, 1, 3));
}

/// `call_async` from many tokio tasks: every reply reaches its own caller.
#[test]
fn call_async_from_many_tokio_tasks() {
    let pool = Pool::builder()
        .capacity(512)
        .workers(2)
        .build(|_| Echo)
        .unwrap();
    let runtime = multi_thread();
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

/// `call_async` admits when called (not when polled) and refuses at once
/// when full; a dropped future's request still runs.
#[test]
fn call_async_refuses_at_once_when_full_and_dropped_futures_still_run() {
    let p = gated(1, 1);
    let runtime = current_thread();
    let admitted = p.pool.call_async(1); // admitted now, before any poll
    assert_eq!(p.pool.usage(), 1);
    assert_eq!(runtime.block_on(p.pool.call_async(2)), Err(Error::Overload));
    drop(admitted); // cancel: the request still runs
    p.gates[0].send(Go::Finish).unwrap();
    p.pool.shutdown();
    assert_eq!(p.handled_sorted(), vec![1]);
    assert_eq!(p.pool.usage(), 0);
}

/// The per-worker stats show each worker's usage and handled count.
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

// ---------------------------------------------------------------------------
// try_call and try_cast hand a refused value back (issue 7).
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

/// Issue 7: a refused request was dropped. Refused with `Overload`,
/// `try_call` and `try_cast` hand it back intact, and each is counted.
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

/// Issue 7: refused with `Shutdown`, the request comes back intact too,
/// and is not counted as an overload.
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

/// Issue 7: an admitted `try_call` whose handler panics is `Failed`, with
/// no request to hand back; the worker keeps serving.
#[test]
fn an_admitted_try_call_that_fails_is_failed_without_its_request() {
    let (pool, _gate) = held(4);
    let failed = pool.try_call(Vec::new()).unwrap_err(); // the handler panics
    assert_eq!(failed, TryCallError::Failed(Error::WorkerPanicked));
    assert!(!failed.is_refused());
    assert_eq!(failed.into_request(), None);
    assert_eq!(pool.try_call(words()), Ok(2));
}

/// Issue 7: `?` turns a refusal into an `Error` (and a boxed std error).
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

/// Issue 7: a refusal prints its error without its value, which need not
/// be `Debug`.
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

// ---------------------------------------------------------------------------
// A handler that calls its own pool (issue 7: it hung forever).
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
            Ask::CallTimeout => pool.call_timeout(Ask::Leaf, HUNG),
            Ask::CallUnbounded => pool.call_unbounded(Ask::Leaf),
            Ask::CallAsync => current_thread().block_on(pool.call_async(Ask::Leaf)),
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
        // Affinity: these tests place requests on chosen workers' shards
        // and watch where a self-call is queued, so no worker may take
        // another's requests (stealing is the default).
        Pool::builder()
            .capacity(capacity)
            .workers(workers)
            .steal(false)
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

/// Issue 7: on a one-worker pool, a handler's call to its own pool (in
/// every waiting form) is refused with `CallingSelf` at once, takes no
/// unit and is no rejection.
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

/// Issue 7: on two workers, a self-call is served by the other worker.
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

/// Issue 7: a self-call is `Overload` when every other worker is full,
/// never queued behind its caller; `call_unbounded` queues at the other
/// worker and is served.
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

/// Issue 7's `CallingSelf` is per pool: a worker calling *another*
/// one-worker pool is served.
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
