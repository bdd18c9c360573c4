//! Panics in and around a `Pool`'s handlers: a panic fails only its own
//! request, the worker is rebuilt and serves its queue; a factory that
//! panics is retried; a panic outside the handler's `catch_unwind` (a
//! reply's, a request's or a panic payload's `Drop`) kills no worker and
//! strands no admitted work (issue 7).

use std::panic::panic_any;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use sidejob::{Error, Pool, Worker};

use crate::common::{bounded, until};
use crate::{gated, Go};

/// A panicking call answers `WorkerPanicked`; the rebuilt worker handles
/// the queue behind it, in order.
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
    until(|| !p.started.lock().unwrap().is_empty());
    for id in 2..5 {
        p.pool.cast(id).unwrap();
    }
    let last = {
        let pool = p.pool.clone();
        thread::spawn(move || pool.call(5))
    };
    until(|| p.pool.usage() >= 5);
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

/// A panicking cast is counted, and the worker keeps serving.
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

/// A factory that panics at start is called again.
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

// ---------------------------------------------------------------------------
// Panics outside the handler's catch (issue 7).
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

/// Issue 7: a reply that panics when the worker drops it (its caller timed
/// out) killed the worker and stranded the work queued behind it.
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

/// Issue 7: a panic payload whose `Drop` panics killed the worker; now the
/// call answers `WorkerPanicked` and the worker survives.
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

/// Issue 7: a factory that always panics with a nasty payload, and requests
/// that panic when dropped unhandled, fail their calls with
/// `WorkerPanicked` and give every unit back.
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
