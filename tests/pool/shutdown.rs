//! Stopping a `Pool`: `shutdown` while callers race it handles every
//! admitted request once; the last handle's drop shuts down and joins;
//! later requests are refused with `Shutdown`; a handler may shut its own
//! pool down; workers holding a weak handle to their own pool do not keep
//! it alive (issue 7).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex, OnceLock};
use std::thread;
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use sidejob::{Error, Pool, WeakPool, Worker};

use crate::common::{current_thread, HUNG};
use crate::{gated, Echo, GatedPool, Go};

/// Receives within [`HUNG`], or fails naming `what`.
fn within<T>(what: &str, receiver: &Receiver<T>) -> T {
    receiver
        .recv_timeout(HUNG)
        .unwrap_or_else(|_| panic!("{what}: nothing within {HUNG:?}"))
}

/// Producers cast while the pool shuts down: every `Ok` cast is handled
/// exactly once and nothing else is; `terminate` runs once per worker.
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

/// Dropping a clone does nothing; dropping the last handle drains the
/// queues, runs `terminate` and joins the workers.
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

/// After `shutdown`, every request form is refused with `Shutdown`, which
/// is not counted as an overload.
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
    let runtime = current_thread();
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

/// `shutdown` called from inside a handler does not wait for that very
/// worker.
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

// ---------------------------------------------------------------------------
// Weak handles (issue 7: workers holding a handle to their own pool kept it
// alive forever).
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

/// Issue 7: workers re-casting through a weak handle to their own pool do
/// not keep it alive once the outside drops it; every `terminate` runs once.
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

/// Issue 7: the last handle, dropped on one of the pool's own workers,
/// shuts the pool down without that worker joining itself.
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

/// Issue 7's `WeakPool`: `Debug` says whether the pool lives, a clone
/// upgrades while it does, none after.
#[test]
fn weak_pool_debug_clone_and_upgrade() {
    let pool = Pool::builder().capacity(1).build(|_| Echo).unwrap();
    let weak = pool.downgrade();
    let twin = weak.clone();
    assert_eq!(format!("{weak:?}"), "WeakPool { alive: true }");
    assert_eq!(twin.upgrade().unwrap().call(3), Ok(3));
    drop(pool);
    assert_eq!(format!("{twin:?}"), "WeakPool { alive: false }");
    assert!(weak.upgrade().is_none());
}
