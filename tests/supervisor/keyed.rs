//! Keyed admission on the `Supervisor` (issue 10): at most `per_key` live
//! children per key on top of the capacity, `KeyBusy` exactly when the key
//! is busy, FIFO per key when waiting, nothing held after the children
//! end, nothing lost when a waiting future is dropped.
//!
//! Threads line up on barriers and channels; a waiter is known to be
//! queued when `waiting_for_keys()` says so. Nothing sleeps and nothing
//! asserts on time.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::task::Poll;
use std::thread;
use std::time::Duration;

use sidejob::{ChildGuard, Error, Supervisor};

use crate::common::{current_thread, poll_once, until, FOREVER};

/// A waiting keyed admission, boxed to be kept in a list and dropped at will.
type Waiting<'a> = Pin<Box<dyn Future<Output = Result<ChildGuard, Error>> + Send + 'a>>;

/// `KeyBusy` exactly when the key has `per_key` live children; other keys
/// and unkeyed children are not held back; a busy key answers before the
/// capacity, and `Overload` leaves the key free.
#[test]
fn key_busy_exactly_when_the_key_has_per_key_live_children() {
    let sup = Supervisor::builder()
        .capacity(4)
        .per_key(2)
        .shards(2)
        .build()
        .unwrap();
    let a1 = sup.try_reserve_keyed("a").unwrap();
    let a2 = sup.reserve_keyed("a").unwrap();
    assert_eq!(sup.try_reserve_keyed("a").unwrap_err(), Error::KeyBusy);
    assert_eq!(sup.reserve_keyed("a").unwrap_err(), Error::KeyBusy);
    // Other keys, and unkeyed children, are not held back.
    let b = sup.try_reserve_keyed("b").unwrap();
    let plain = sup.try_reserve().unwrap();
    assert_eq!(sup.count(), 4);
    // Capacity full, key free: Overload, and the key is not left held.
    assert_eq!(sup.try_reserve_keyed("c").unwrap_err(), Error::Overload);
    assert_eq!(sup.busy_keys(), 2);
    // Capacity full and key busy: the key answers first, no unit touched.
    let rejected = sup.stats().rejected;
    assert_eq!(sup.try_reserve_keyed("a").unwrap_err(), Error::KeyBusy);
    assert_eq!(sup.stats().rejected, rejected, "KeyBusy is not an overload");
    drop(plain);
    drop(a1);
    let a3 = sup.try_reserve_keyed("a").unwrap();
    assert_eq!(sup.try_reserve_keyed("a").unwrap_err(), Error::KeyBusy);
    drop((a2, a3, b));
    assert_eq!((sup.count(), sup.busy_keys()), (0, 0));
    assert!(sup.which_children().is_empty());
}

/// A keyed guard is listed and released like any child, and frees its
/// key.
#[test]
fn a_keyed_guard_is_listed_and_released_like_any_child() {
    let sup = Supervisor::new(2).unwrap();
    let guard = sup.try_reserve_keyed(&17u64).unwrap();
    assert_eq!(sup.which_children(), [guard.id()]);
    let id = guard.id();
    thread::spawn(move || drop(guard)).join().unwrap();
    assert!(!sup.which_children().contains(&id));
    assert_eq!((sup.count(), sup.busy_keys()), (0, 0));
    assert_eq!(sup.stats().completed, 1);
}

/// A keyed guard dropped while its thread unwinds releases its key and
/// counts as panicked.
#[test]
fn a_guard_dropped_while_panicking_releases_its_key() {
    let sup = Supervisor::new(2).unwrap();
    let guard = sup.try_reserve_keyed("k").unwrap();
    let result = thread::spawn(move || {
        let _guard = guard;
        std::panic::resume_unwind(Box::new("boom"));
    })
    .join();
    assert!(result.is_err());
    assert_eq!(sup.stats().panicked, 1);
    assert_eq!((sup.count(), sup.busy_keys()), (0, 0));
    assert!(sup.try_reserve_keyed("k").is_ok());
}

/// `per_key(0)` is a configuration error naming `per_key`.
#[test]
fn per_key_zero_is_a_config_error() {
    let err = Supervisor::builder()
        .capacity(4)
        .per_key(0)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "per_key");
}

/// 8 threads over 12 keys, per key 2, capacity 16: the live children of a
/// key, counted by the children themselves, never exceed 2; every
/// admission is accounted for; the key set is empty at the end.
#[test]
fn per_key_limit_holds_under_8_threads() {
    const THREADS: usize = 8;
    const KEYS: usize = 12;
    const PER_KEY: usize = 2;
    const ROUNDS: usize = 3_000;
    let sup = Supervisor::builder()
        .capacity(16)
        .per_key(PER_KEY)
        .build()
        .unwrap();
    let live: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let peak = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (sup, live, peak, start) = (sup.clone(), live.clone(), peak.clone(), start.clone());
            thread::spawn(move || {
                let (mut admitted, mut busy, mut overload) = (0u64, 0u64, 0u64);
                start.wait();
                for round in 0..ROUNDS {
                    let key = (round * 7 + t * 5) % KEYS;
                    match sup.try_reserve_keyed(&key) {
                        Ok(guard) => {
                            admitted += 1;
                            let now = live[key].fetch_add(1, SeqCst) + 1;
                            peak.fetch_max(now, SeqCst);
                            assert!(now <= PER_KEY, "key {key} has {now} live children");
                            if round % 3 == 0 {
                                thread::yield_now();
                            }
                            live[key].fetch_sub(1, SeqCst);
                            drop(guard);
                        }
                        Err(Error::KeyBusy) => busy += 1,
                        Err(Error::Overload) => overload += 1,
                        Err(other) => panic!("unexpected {other}"),
                    }
                }
                (admitted, busy, overload)
            })
        })
        .collect();
    let (mut admitted, mut busy, mut overload) = (0, 0, 0);
    for worker in workers {
        let (a, b, o) = worker.join().unwrap();
        admitted += a;
        busy += b;
        overload += o;
    }
    assert_eq!(admitted + busy + overload, (THREADS * ROUNDS) as u64);
    assert!(peak.load(SeqCst) <= PER_KEY);
    let stats = sup.stats();
    assert_eq!(stats.accepted, admitted);
    assert_eq!(stats.completed, admitted);
    assert_eq!(stats.rejected, overload);
    assert_eq!(
        (sup.count(), sup.busy_keys(), sup.waiting_for_keys()),
        (0, 0, 0)
    );
}

/// The same with waiting: every caller waits for its key (and capacity),
/// so every admission succeeds, and still no key ever has two live
/// children.
#[test]
fn waiting_callers_never_exceed_the_key_limit_and_all_get_in() {
    const THREADS: usize = 8;
    const KEYS: usize = 5;
    const ROUNDS: usize = 500;
    let sup = Supervisor::builder()
        .capacity(4)
        .max_waiters(64)
        .max_wait(FOREVER)
        .build()
        .unwrap();
    let live: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let start = Arc::new(Barrier::new(THREADS));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (sup, live, start) = (sup.clone(), live.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                for round in 0..ROUNDS {
                    let key = (round + t) % KEYS;
                    let guard = sup.reserve_keyed(&key).unwrap();
                    let now = live[key].fetch_add(1, SeqCst) + 1;
                    assert_eq!(now, 1, "key {key} has {now} live children");
                    live[key].fetch_sub(1, SeqCst);
                    drop(guard);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let stats = sup.stats();
    assert_eq!(stats.accepted, (THREADS * ROUNDS) as u64);
    assert_eq!(stats.rejected, 0);
    assert_eq!(
        (sup.count(), sup.busy_keys(), sup.waiting_for_keys()),
        (0, 0, 0)
    );
}

/// Blocked threads waiting for one key are served in arrival order, each
/// the moment the previous child of the key ends.
#[test]
fn blocked_waiters_of_a_key_are_served_first_come_first_served() {
    const WAITERS: usize = 5;
    let sup = Supervisor::builder()
        .capacity(16)
        .max_waiters(16)
        .max_wait(FOREVER)
        .build()
        .unwrap();
    let holder = sup.reserve_keyed("wf").unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let (next_tx, next_rx) = mpsc::channel::<()>();
    let next_rx = Arc::new(Mutex::new(next_rx));
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let (child_sup, order, next_rx) = (sup.clone(), order.clone(), next_rx.clone());
        waiters.push(thread::spawn(move || {
            let guard = child_sup.reserve_keyed("wf").unwrap();
            order.lock().unwrap().push(i);
            // Hold the key until the test says the next may go.
            next_rx.lock().unwrap().recv().unwrap();
            drop(guard);
        }));
        // Waiter i is queued before waiter i + 1 starts.
        until(|| sup.waiting_for_keys() == i + 1);
    }
    // Other keys are not held back meanwhile.
    drop(sup.try_reserve_keyed("other").unwrap());
    drop(holder);
    for i in 0..WAITERS {
        until(|| order.lock().unwrap().len() == i + 1);
        assert_eq!(sup.busy_keys(), 1);
        next_tx.send(()).unwrap();
    }
    for waiter in waiters {
        waiter.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>());
    assert_eq!(
        (sup.count(), sup.busy_keys(), sup.waiting_for_keys()),
        (0, 0, 0)
    );
}

/// A key's async waiters are served in FIFO order; one dropped while
/// queued leaves, one dropped after it was handed the key passes it on.
#[test]
fn async_waiters_of_a_key_are_served_in_order_and_dropped_ones_lose_nothing() {
    let sup = Supervisor::builder()
        .capacity(8)
        .max_waiters(8)
        .max_wait(FOREVER)
        .build()
        .unwrap();
    let holder = sup.try_reserve_keyed("wf").unwrap();
    let mut waiters: Vec<Waiting<'_>> = (0..4)
        .map(|_| Box::pin(sup.reserve_keyed_async("wf")) as Waiting<'_>)
        .collect();
    for waiter in waiters.iter_mut() {
        assert!(poll_once(waiter).is_pending());
    }
    assert_eq!(sup.waiting_for_keys(), 4);
    // A queued waiter dropped: it leaves the queue.
    let second = waiters.remove(1);
    drop(second);
    assert_eq!(sup.waiting_for_keys(), 3);
    // The holder ends: the first waiter is handed the key, but is dropped
    // before it sees it; the slot passes on to the next (the third).
    drop(holder);
    let first = waiters.remove(0);
    drop(first);
    assert_eq!(sup.waiting_for_keys(), 2);
    assert_eq!(sup.busy_keys(), 1);
    let Poll::Ready(third) = poll_once(&mut waiters[0]) else {
        panic!("the third waiter was not handed the key");
    };
    let third = third.unwrap();
    assert!(
        poll_once(&mut waiters[1]).is_pending(),
        "FIFO: the fourth waits"
    );
    drop(third);
    let Poll::Ready(fourth) = poll_once(&mut waiters[1]) else {
        panic!("the fourth waiter was not handed the key");
    };
    drop(fourth.unwrap());
    drop(waiters);
    assert_eq!(
        (sup.count(), sup.busy_keys(), sup.waiting_for_keys()),
        (0, 0, 0)
    );
    assert_eq!(sup.stats().accepted, 3);
}

/// A future that took its key and then waits for capacity gives the key
/// back when dropped.
#[test]
fn a_future_dropped_while_waiting_for_capacity_releases_its_key() {
    let sup = Supervisor::builder()
        .capacity(1)
        .max_waiters(4)
        .max_wait(FOREVER)
        .build()
        .unwrap();
    let full = sup.try_reserve().unwrap();
    let mut waiting = Box::pin(sup.reserve_keyed_async("k"));
    assert!(poll_once(&mut waiting).is_pending());
    assert_eq!(sup.busy_keys(), 1, "the key is taken first");
    assert_eq!(sup.waiting(), 1, "then the wait for capacity");
    drop(waiting);
    assert_eq!((sup.busy_keys(), sup.waiting()), (0, 0));
    drop(full);
    assert!(sup.try_reserve_keyed("k").is_ok());
}

/// Waiting for a busy key ends with `Timeout` after `max_wait`, blocking or
/// async (woken by the deadline watcher), and both are counted.
#[test]
fn waiting_for_a_busy_key_times_out() {
    let sup = Supervisor::builder()
        .capacity(4)
        .max_waiters(4)
        .max_wait(Duration::from_millis(10))
        .build()
        .unwrap();
    let holder = sup.try_reserve_keyed("k").unwrap();
    assert_eq!(sup.reserve_keyed("k").unwrap_err(), Error::Timeout);
    // The async form is timed out by the deadline watcher.
    let rt = current_thread();
    assert_eq!(
        rt.block_on(sup.reserve_keyed_async("k")).unwrap_err(),
        Error::Timeout
    );
    assert_eq!((sup.busy_keys(), sup.waiting_for_keys()), (1, 0));
    // Both waits ran out waiting for the key: both are in the figures.
    let stats = sup.stats();
    assert_eq!(stats.timed_out, 2);
    assert_eq!(
        (stats.waiting_for_keys, stats.peak_waiting_for_keys),
        (0, 1)
    );
    // A wait for capacity that runs out counts in the same figure, once.
    let other = sup.try_reserve_keyed("other").unwrap();
    let fill: Vec<_> = (0..2).map(|_| sup.try_reserve().unwrap()).collect();
    assert_eq!(sup.reserve_keyed("third").unwrap_err(), Error::Timeout);
    assert_eq!(sup.stats().timed_out, 3);
    assert_eq!(sup.stats().peak_waiting, 1);
    drop((holder, other, fill));
    assert_eq!(sup.busy_keys(), 0);
}

/// Several callers wait for one key at once: the peak says how many.
#[test]
fn the_peak_of_key_waiters_counts_them_at_once() {
    let sup = Supervisor::builder()
        .capacity(8)
        .max_waiters(8)
        .max_wait(FOREVER)
        .build()
        .unwrap();
    let holder = sup.try_reserve_keyed("k").unwrap();
    let mut waiting: Vec<Waiting<'_>> = (0..3)
        .map(|_| Box::pin(sup.reserve_keyed_async("k")) as Waiting<'_>)
        .collect();
    for wait in &mut waiting {
        assert!(poll_once(wait).is_pending());
    }
    let stats = sup.stats();
    assert_eq!(
        (stats.waiting_for_keys, stats.peak_waiting_for_keys),
        (3, 3)
    );
    assert_eq!((stats.waiting, stats.peak_waiting), (0, 0));
    drop(waiting);
    drop(holder);
    let stats = sup.stats();
    assert_eq!(
        (stats.waiting_for_keys, stats.peak_waiting_for_keys),
        (0, 3)
    );
    assert_eq!(stats.timed_out, 0, "a dropped wait is not a timeout");
}

/// The waiting room for keys is bounded by `max_waiters`: past it,
/// `KeyBusy` at once.
#[test]
fn the_waiting_room_for_keys_is_bounded() {
    let sup = Supervisor::builder()
        .capacity(4)
        .max_waiters(1)
        .max_wait(FOREVER)
        .build()
        .unwrap();
    let holder = sup.try_reserve_keyed("k").unwrap();
    let mut first = Box::pin(sup.reserve_keyed_async("k"));
    assert!(poll_once(&mut first).is_pending());
    // The room is full: refused at once with KeyBusy.
    let mut second = Box::pin(sup.reserve_keyed_async("k"));
    assert!(matches!(
        poll_once(&mut second),
        Poll::Ready(Err(Error::KeyBusy))
    ));
    assert_eq!(sup.reserve_keyed("k").unwrap_err(), Error::KeyBusy);
    drop(holder);
    assert!(matches!(poll_once(&mut first), Poll::Ready(Ok(_))));
    assert_eq!((sup.busy_keys(), sup.waiting_for_keys()), (0, 0));
}

/// `close` wakes the key's blocking and async waiters with `Shutdown`; a
/// busy key of a closed supervisor answers `Shutdown` too.
#[test]
fn close_wakes_key_waiters_with_shutdown() {
    let sup = Supervisor::builder()
        .capacity(4)
        .max_waiters(4)
        .max_wait(FOREVER)
        .build()
        .unwrap();
    let holder = sup.try_reserve_keyed("k").unwrap();
    let blocked = {
        let sup = sup.clone();
        thread::spawn(move || sup.reserve_keyed("k").map(drop))
    };
    let mut pending = Box::pin(sup.reserve_keyed_async("k"));
    assert!(poll_once(&mut pending).is_pending());
    until(|| sup.waiting_for_keys() == 2);
    sup.close();
    assert_eq!(blocked.join().unwrap().unwrap_err(), Error::Shutdown);
    assert!(matches!(
        poll_once(&mut pending),
        Poll::Ready(Err(Error::Shutdown))
    ));
    assert_eq!(sup.try_reserve_keyed("x").unwrap_err(), Error::Shutdown);
    // A busy key of a closed supervisor answers Shutdown too.
    assert_eq!(sup.try_reserve_keyed("k").unwrap_err(), Error::Shutdown);
    assert_eq!(sup.reserve_keyed("k").unwrap_err(), Error::Shutdown);
    drop(holder);
    assert_eq!(
        (sup.count(), sup.busy_keys(), sup.waiting_for_keys()),
        (0, 0, 0)
    );
}

/// The keyed waiting future is `Send`.
#[test]
fn keyed_futures_are_send() {
    fn is_send<T: Send>(_: &T) {}
    let sup = Supervisor::new(1).unwrap();
    let future = sup.reserve_keyed_async("k");
    is_send(&future);
}

#[cfg(feature = "tokio")]
mod tasks {
    use super::*;
    use crate::common::multi_thread;

    /// Many tokio tasks over a few keys on a multi-threaded runtime: a
    /// key's tasks never overlap and run in submission order; every task
    /// runs; nothing is held afterwards.
    #[test]
    fn keyed_tasks_of_one_key_never_overlap_and_run_in_order() {
        const KEYS: usize = 16;
        const TASKS: usize = 2_000;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .build()
            .unwrap();
        let sup = Supervisor::builder()
            .capacity(8)
            .max_waiters(TASKS)
            .max_wait(FOREVER)
            .build()
            .unwrap();
        let live: Arc<Vec<AtomicUsize>> =
            Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
        let log: Arc<Vec<Mutex<Vec<usize>>>> =
            Arc::new((0..KEYS).map(|_| Mutex::new(Vec::new())).collect());
        let done = rt.block_on({
            let (sup, live, log) = (sup.clone(), live.clone(), log.clone());
            async move {
                let mut tasks = Vec::with_capacity(TASKS);
                for n in 0..TASKS {
                    let key = n % KEYS;
                    let (live, log) = (live.clone(), log.clone());
                    let task = sup
                        .spawn_task_keyed_async(&key, async move {
                            let now = live[key].fetch_add(1, SeqCst) + 1;
                            assert_eq!(now, 1, "key {key}: {now} tasks at once");
                            log[key].lock().unwrap().push(n);
                            tokio::task::yield_now().await;
                            live[key].fetch_sub(1, SeqCst);
                        })
                        .await
                        .unwrap();
                    tasks.push(task);
                }
                let mut done = 0;
                for task in tasks {
                    task.await.unwrap();
                    done += 1;
                }
                done
            }
        });
        assert_eq!(done, TASKS);
        for (key, log) in log.iter().enumerate() {
            let log = log.lock().unwrap();
            let expected: Vec<usize> = (0..TASKS).filter(|n| n % KEYS == key).collect();
            assert_eq!(*log, expected, "key {key} ran out of order");
        }
        let stats = sup.stats();
        assert_eq!(
            (stats.accepted, stats.completed),
            (TASKS as u64, TASKS as u64)
        );
        rt.block_on(sup.wait_idle_async());
        assert_eq!(
            (sup.count(), sup.busy_keys(), sup.waiting_for_keys()),
            (0, 0, 0)
        );
    }

    /// Fail-fast keyed spawns from many tasks at once: `KeyBusy` only while
    /// a task of the key runs, and never two at once.
    #[test]
    fn spawn_task_keyed_refuses_a_busy_key_and_admits_it_again_after() {
        let rt = multi_thread();
        let sup = Supervisor::new(64).unwrap();
        let live = Arc::new(AtomicUsize::new(0));
        let (admitted, busy) = rt.block_on({
            let (sup, live) = (sup.clone(), live.clone());
            async move {
                let mut spawners = Vec::new();
                for _ in 0..8 {
                    let (sup, live) = (sup.clone(), live.clone());
                    spawners.push(tokio::spawn(async move {
                        let (mut admitted, mut busy) = (0u64, 0u64);
                        let mut tasks = Vec::new();
                        for _ in 0..200 {
                            let live = live.clone();
                            match sup.spawn_task_keyed("one", async move {
                                assert_eq!(live.fetch_add(1, SeqCst), 0, "two at once");
                                tokio::task::yield_now().await;
                                live.fetch_sub(1, SeqCst);
                            }) {
                                Ok(task) => {
                                    admitted += 1;
                                    tasks.push(task);
                                }
                                Err(Error::KeyBusy) => busy += 1,
                                Err(other) => panic!("unexpected {other}"),
                            }
                            tokio::task::yield_now().await;
                        }
                        for task in tasks {
                            task.await.unwrap();
                        }
                        (admitted, busy)
                    }));
                }
                let (mut admitted, mut busy) = (0, 0);
                for spawner in spawners {
                    let (a, b) = spawner.await.unwrap();
                    admitted += a;
                    busy += b;
                }
                (admitted, busy)
            }
        });
        assert_eq!(admitted + busy, 1_600);
        assert!(admitted >= 1);
        assert_eq!(sup.stats().accepted, admitted);
        assert_eq!((sup.count(), sup.busy_keys()), (0, 0));
    }

    /// A keyed task that panics or is aborted releases its key.
    #[test]
    fn a_panicking_or_aborted_keyed_task_releases_its_key() {
        let rt = current_thread();
        let sup = Supervisor::new(4).unwrap();
        rt.block_on(async {
            let task = sup
                .spawn_task_keyed("k", async { std::panic::resume_unwind(Box::new("boom")) })
                .unwrap();
            assert!(task.await.unwrap_err().is_panic());
            assert_eq!(sup.busy_keys(), 0);
            let task = sup
                .spawn_task_keyed("k", std::future::pending::<()>())
                .unwrap();
            assert_eq!(
                sup.spawn_task_keyed("k", async {}).unwrap_err(),
                Error::KeyBusy
            );
            task.abort();
            assert!(task.await.unwrap_err().is_cancelled());
            assert_eq!((sup.count(), sup.busy_keys()), (0, 0));
            sup.spawn_task_keyed("k", async {}).unwrap().await.unwrap();
        });
        let stats = sup.stats();
        assert_eq!((stats.panicked, stats.completed), (1, 2));
    }

    /// `spawn_task_keyed` outside a runtime is `Error::NoRuntime` and holds
    /// neither a unit nor the key.
    #[test]
    fn spawn_task_keyed_outside_a_runtime_is_an_error_and_takes_nothing() {
        let sup = Supervisor::new(4).unwrap();
        assert!(matches!(
            sup.spawn_task_keyed("k", async {}),
            Err(Error::NoRuntime)
        ));
        assert_eq!((sup.count(), sup.busy_keys()), (0, 0));
    }
}
