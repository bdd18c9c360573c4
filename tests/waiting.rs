//! Bounded waiting and runtime resize on `Limiter` (issue 8): a waiter is
//! served when a unit frees, times out after `max_wait`, is refused at once
//! when the room is full; the queue orders; cancel safety; shutdown;
//! `try_acquire` never waits; resizes hand room to waiters and never admit
//! above the capacity in force; `available()`; configuration errors.
//!
//! No sleeps and no timed assertions: waiters are lined up by polling
//! `waiting()` with `yield_now`, admissions are reported over channels,
//! and the only deadlines are `max_wait`s that either never run out in a
//! passing test (`LONG`) or must run out (`SHORT`, where only the error is
//! checked).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use sidejob::{Error, Limiter, OwnedPermit, QueueOrder, MAX_WAITERS};

/// A `max_wait` that a passing test never reaches: a waiter that sees it
/// run out fails its assertion (with `Timeout`) instead of hanging.
const LONG: Duration = Duration::from_secs(30);
/// A `max_wait` that must run out: only the error is checked, never the time.
const SHORT: Duration = Duration::from_millis(20);

fn room(
    capacity: usize,
    shards: usize,
    waiters: usize,
    wait: Duration,
    order: QueueOrder,
) -> Arc<Limiter> {
    Arc::new(
        Limiter::builder()
            .capacity(capacity)
            .shards(shards)
            .max_waiters(waiters)
            .max_wait(wait)
            .queue_order(order)
            .build()
            .unwrap(),
    )
}

/// Polls `condition` with `yield_now` until it holds.
fn until(condition: impl Fn() -> bool) {
    while !condition() {
        thread::yield_now();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

/// A waker that does nothing (`Waker::noop` is newer than our MSRV).
fn noop_waker() -> Waker {
    struct Noop;
    impl std::task::Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    Waker::from(Arc::new(Noop))
}

fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(&noop_waker()))
}

/// Takes every unit, so the next caller must wait (no refusal counted).
fn fill(limiter: &Arc<Limiter>) -> Vec<OwnedPermit> {
    let held: Vec<_> = (0..limiter.capacity())
        .map(|_| limiter.try_acquire_owned().unwrap())
        .collect();
    assert_eq!(limiter.available(), 0);
    held
}

/// Takes every unit with `try_acquire`, then checks the next is refused:
/// no unit was lost or duplicated.
fn every_unit_is_there(limiter: &Limiter) {
    assert_eq!(limiter.usage(), 0);
    assert_eq!(limiter.waiting(), 0);
    let all: Vec<_> = (0..limiter.capacity())
        .map(|_| limiter.try_acquire().expect("every unit back"))
        .collect();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    drop(all);
    assert_eq!(limiter.usage(), 0);
}

#[test]
fn a_blocked_waiter_is_admitted_when_a_unit_frees() {
    for shards in [1, 3] {
        let limiter = room(3, shards, 1, LONG, QueueOrder::Fifo);
        let mut held = fill(&limiter);
        let waiter = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.acquire().map(|permit| permit.shard()))
        };
        until(|| limiter.waiting() == 1);
        let freed = held.pop().unwrap();
        let freed_shard = freed.shard();
        drop(freed);
        // Handed straight over: the unit never went back to the table.
        assert_eq!(waiter.join().unwrap(), Ok(freed_shard));
        drop(held);
        let stats = limiter.stats();
        assert_eq!((stats.waiting, stats.peak_waiting), (0, 1));
        assert_eq!((stats.waited, stats.timed_out, stats.rejected), (1, 0, 0));
        assert_eq!((stats.accepted, stats.completed), (4, 4));
        every_unit_is_there(&limiter);
    }
}

#[test]
fn an_async_waiter_is_admitted_when_a_unit_frees() {
    let limiter = room(2, 2, 2, LONG, QueueOrder::Fifo);
    let rt = runtime();
    let mut held = fill(&limiter);
    let borrowed = Arc::clone(&limiter);
    let first = rt.spawn(async move { borrowed.acquire_async().await.map(|p| p.shard()) });
    until(|| limiter.waiting() == 1);
    let second = rt.spawn(Arc::clone(&limiter).acquire_owned_async());
    until(|| limiter.waiting() == 2);
    drop(held.pop());
    assert!(rt.block_on(first).unwrap().is_ok());
    drop(held.pop());
    let second = rt.block_on(second).unwrap().expect("admitted");
    assert_eq!(limiter.usage(), 1);
    drop(second);
    let stats = limiter.stats();
    assert_eq!(
        (stats.waited, stats.timed_out, stats.peak_waiting),
        (2, 0, 2)
    );
    every_unit_is_there(&limiter);
}

#[test]
fn a_waiter_gets_timeout_after_max_wait() {
    let limiter = room(1, 1, 4, SHORT, QueueOrder::Fifo);
    let held = fill(&limiter);
    let err = limiter.acquire().unwrap_err();
    assert_eq!(err, Error::Timeout);
    assert!(err.is_timeout());
    let rt = runtime();
    assert_eq!(
        rt.block_on(limiter.acquire_async()).unwrap_err(),
        Error::Timeout
    );
    assert_eq!(
        rt.block_on(Arc::clone(&limiter).acquire_owned_async())
            .unwrap_err(),
        Error::Timeout
    );
    let stats = limiter.stats();
    assert_eq!((stats.timed_out, stats.waited, stats.rejected), (3, 0, 0));
    assert_eq!((stats.waiting, stats.peak_waiting), (0, 1));
    // The held unit was never disturbed, and comes back as usual.
    assert_eq!(limiter.usage(), 1);
    drop(held);
    every_unit_is_there(&limiter);
}

/// Runs `future` on this thread, parking between polls; the waker unparks
/// it and counts its wake-ups. No runtime, so no timer of a runtime's:
/// whatever wakes the future is the crate's own doing.
fn block_on_parked<F: Future + Unpin>(mut future: F) -> (F::Output, usize) {
    struct Unpark(thread::Thread, AtomicUsize);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.1.fetch_add(1, SeqCst);
            self.0.unpark();
        }
    }
    let unpark = Arc::new(Unpark(thread::current(), AtomicUsize::new(0)));
    let waker = Waker::from(Arc::clone(&unpark));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = Pin::new(&mut future).poll(&mut cx) {
            return (output, unpark.1.load(SeqCst));
        }
        // A spurious return only polls again.
        thread::park();
    }
}

#[test]
fn an_async_waiter_times_out_with_nothing_but_the_watcher_to_wake_it() {
    // No release, no newcomer, no runtime: only the room's deadline
    // watcher can wake the waiter, and it must, with `Timeout`.
    for order in [
        QueueOrder::Fifo,
        QueueOrder::Lifo,
        QueueOrder::adaptive_lifo(),
    ] {
        let limiter = room(1, 1, 4, SHORT, order);
        let held = fill(&limiter);
        let (result, wakes) = block_on_parked(Box::pin(limiter.acquire_async()));
        assert_eq!(result.unwrap_err(), Error::Timeout);
        assert!(wakes >= 1, "the watcher woke the waiter");
        assert_eq!(limiter.waiting(), 0);
        let stats = limiter.stats();
        assert_eq!((stats.timed_out, stats.waited, stats.rejected), (1, 0, 0));
        // Again, on the same room: the watcher re-arms after it rang.
        let (result, _) = block_on_parked(Box::pin(limiter.acquire_async()));
        assert_eq!(result.unwrap_err(), Error::Timeout);
        assert_eq!((limiter.waiting(), limiter.stats().timed_out), (0, 2));
        assert_eq!(limiter.usage(), 1);
        drop(held);
        every_unit_is_there(&limiter);
    }
}

#[test]
fn many_async_waiters_on_several_limiters_time_out() {
    // Rooms with different `max_wait`s share the one watcher; in each,
    // the waiters that are not served time out, none is lost, and every
    // room ends empty with its units all there.
    const WAITERS: usize = 16;
    let limiters: Vec<_> = [1u64, 7, 13, 20]
        .iter()
        .zip([
            QueueOrder::Fifo,
            QueueOrder::Lifo,
            QueueOrder::Fifo,
            QueueOrder::adaptive_lifo(),
        ])
        .map(|(&ms, order)| room(2, 2, WAITERS, Duration::from_millis(ms), order))
        .collect();
    let held: Vec<_> = limiters.iter().map(fill).collect();
    let rt = runtime();
    let results = rt.block_on(async {
        let tasks: Vec<_> = limiters
            .iter()
            .flat_map(|limiter| {
                (0..WAITERS).map(move |_| {
                    let limiter = Arc::clone(limiter);
                    tokio::spawn(async move { limiter.acquire_owned_async().await.map(drop) })
                })
            })
            .collect();
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        results
    });
    assert_eq!(results.len(), WAITERS * limiters.len());
    assert!(results.iter().all(|result| *result == Err(Error::Timeout)));
    for limiter in &limiters {
        let stats = limiter.stats();
        assert_eq!(stats.timed_out, WAITERS as u64);
        assert_eq!((stats.waiting, stats.waited, stats.rejected), (0, 0, 0));
    }
    drop(held);
    for limiter in &limiters {
        every_unit_is_there(limiter);
    }
}

#[test]
fn a_full_room_refuses_at_once_with_overload_counted() {
    // A refused caller that waited instead would get `Timeout` (or hang
    // for LONG) and fail the assertion: `Overload` proves it did not wait.
    let limiter = room(1, 1, 2, LONG, QueueOrder::Fifo);
    let mut held = fill(&limiter);
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.acquire().map(drop))
        })
        .collect();
    until(|| limiter.waiting() == 2);
    assert_eq!(limiter.acquire().unwrap_err(), Error::Overload);
    let rt = runtime();
    assert_eq!(
        rt.block_on(limiter.acquire_async()).unwrap_err(),
        Error::Overload
    );
    assert_eq!(
        rt.block_on(Arc::clone(&limiter).acquire_owned_async())
            .unwrap_err(),
        Error::Overload
    );
    assert_eq!(limiter.stats().rejected, 3);
    assert_eq!(limiter.waiting(), 2, "the refused did not join the queue");
    // The two queued are served one after the other by the one unit.
    drop(held.pop());
    for waiter in waiters {
        assert_eq!(waiter.join().unwrap(), Ok(()));
    }
    let stats = limiter.stats();
    assert_eq!(
        (stats.waited, stats.timed_out, stats.peak_waiting),
        (2, 0, 2)
    );
    every_unit_is_there(&limiter);
}

#[test]
fn without_a_room_waiting_calls_fail_fast() {
    // The default `max_waiters` is 0: `acquire` is `try_acquire`.
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(1)
            .max_wait(LONG)
            .build()
            .unwrap(),
    );
    let held = limiter.try_acquire().unwrap();
    assert_eq!(limiter.acquire().unwrap_err(), Error::Overload);
    let rt = runtime();
    assert_eq!(
        rt.block_on(limiter.acquire_async()).unwrap_err(),
        Error::Overload
    );
    let stats = limiter.stats();
    assert_eq!(
        (stats.rejected, stats.peak_waiting, stats.timed_out),
        (2, 0, 0)
    );
    drop(held);
    assert!(limiter.acquire().is_ok());
}

/// Queues `waiters` blocked callers one by one on a full limiter, then
/// frees units one at a time; the order the waiters were admitted in.
///
/// Each step frees exactly one unit (a held one, then the permit of the
/// earliest-admitted waiter) and waits for exactly one admission, so the
/// order read from the channel is the order of service.
fn service_order(order: QueueOrder, capacity: usize, shards: usize, waiters: usize) -> Vec<usize> {
    let limiter = room(capacity, shards, waiters, LONG, order);
    let held = fill(&limiter);
    let (admitted_tx, admitted_rx) = mpsc::channel();
    let mut releases = Vec::new();
    let mut handles = Vec::new();
    for k in 0..waiters {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        releases.push(release_tx);
        let shared = Arc::clone(&limiter);
        let admitted = admitted_tx.clone();
        handles.push(thread::spawn(move || {
            let permit = shared.acquire().expect("admitted within LONG");
            admitted.send(k).unwrap();
            release_rx.recv().unwrap();
            drop(permit);
        }));
        // The next waiter starts only once this one is queued.
        until(|| limiter.waiting() == k + 1);
    }
    let mut served = Vec::new();
    for permit in held {
        drop(permit);
        served.push(admitted_rx.recv().unwrap());
        // Handed over, not given back: still full.
        assert_eq!(limiter.usage(), capacity);
    }
    let mut next = 0;
    while served.len() < waiters {
        releases[served[next]].send(()).unwrap();
        next += 1;
        served.push(admitted_rx.recv().unwrap());
    }
    for &k in &served[next..] {
        releases[k].send(()).unwrap();
    }
    for handle in handles {
        handle.join().unwrap();
    }
    let stats = limiter.stats();
    assert_eq!((stats.waited, stats.timed_out), (waiters as u64, 0));
    assert_eq!(stats.accepted, (capacity + waiters) as u64);
    every_unit_is_there(&limiter);
    served
}

#[test]
fn fifo_serves_the_oldest_waiter_first() {
    let oldest_first: Vec<usize> = (0..6).collect();
    assert_eq!(service_order(QueueOrder::Fifo, 1, 1, 6), oldest_first);
    assert_eq!(service_order(QueueOrder::Fifo, 2, 2, 6), oldest_first);
    assert_eq!(service_order(QueueOrder::Fifo, 3, 2, 6), oldest_first);
    // Adaptive LIFO is FIFO while the queue has not stood for `interval`.
    let never_standing = QueueOrder::AdaptiveLifo {
        interval: LONG,
        target: LONG,
    };
    assert_eq!(service_order(never_standing, 1, 1, 6), oldest_first);
}

#[test]
fn lifo_serves_the_newest_waiter_first() {
    let newest_first: Vec<usize> = (0..6).rev().collect();
    assert_eq!(service_order(QueueOrder::Lifo, 1, 1, 6), newest_first);
    assert_eq!(service_order(QueueOrder::Lifo, 2, 2, 6), newest_first);
    // Adaptive LIFO whose queue counts as standing at once: LIFO.
    let standing = QueueOrder::AdaptiveLifo {
        interval: Duration::ZERO,
        target: LONG,
    };
    assert_eq!(service_order(standing, 1, 1, 6), newest_first);
}

#[test]
fn adaptive_lifo_times_out_waiters_past_the_target_once_the_queue_stands() {
    // Standing at once, and every waiter is older than 1 ns by the time a
    // unit is freed: the freed unit goes to the newest (timing it out too
    // would hand the unit back the instant it came), and the other two
    // time out. `max_wait` is LONG, so each `Timeout` is the order's doing.
    let order = QueueOrder::AdaptiveLifo {
        interval: Duration::ZERO,
        target: Duration::from_nanos(1),
    };
    let limiter = room(1, 1, 3, LONG, order);
    let held = fill(&limiter);
    let waiters: Vec<_> = (0..3)
        .map(|k| {
            let shared = Arc::clone(&limiter);
            let handle = thread::spawn(move || shared.acquire().map(drop));
            until(|| limiter.waiting() == k + 1);
            handle
        })
        .collect();
    drop(held);
    let outcomes: Vec<_> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(
        outcomes,
        [Err(Error::Timeout), Err(Error::Timeout), Ok(())],
        "the newest is served, the older two time out"
    );
    let stats = limiter.stats();
    assert_eq!((stats.timed_out, stats.waited, stats.waiting), (2, 1, 0));
    // The newest gave its unit back: it is in the table.
    every_unit_is_there(&limiter);
}

#[test]
fn dropped_async_waiters_never_leak_a_unit() {
    let limiter = room(2, 2, 8, LONG, QueueOrder::Fifo);
    let mut held = fill(&limiter);
    let rt = runtime();

    // 1. `tokio::time::timeout` gives up on a queued waiter.
    let gave_up = rt.block_on(async {
        tokio::time::timeout(Duration::from_millis(1), limiter.acquire_async()).await
    });
    assert!(
        gave_up.is_err(),
        "the limiter is full: the wait is cut short"
    );
    assert_eq!(limiter.waiting(), 0);

    // 2. `select!` drops the waiter once another branch wins, after the
    //    waiter is queued.
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let watcher = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || {
            until(|| limiter.waiting() == 1);
            go_tx.send(()).unwrap();
        })
    };
    let won = rt.block_on(async {
        tokio::select! {
            biased;
            permit = limiter.acquire_async() => permit.map(drop),
            _ = go_rx => Err(Error::Shutdown), // a marker: the other branch won
        }
    });
    assert_eq!(won, Err(Error::Shutdown));
    watcher.join().unwrap();
    assert_eq!(limiter.waiting(), 0);

    // 3. Polled once (queued), then dropped while still waiting.
    let mut once = Box::pin(limiter.acquire_async());
    assert!(poll_once(&mut once).is_pending());
    assert_eq!(limiter.waiting(), 1);
    drop(once);
    assert_eq!(limiter.waiting(), 0);

    // 4. A unit handed to a waiter that is dropped before it sees it goes
    //    on to the next waiter...
    let mut granted = Box::pin(limiter.acquire_async());
    let mut next = Box::pin(Arc::clone(&limiter).acquire_owned_async());
    assert!(poll_once(&mut granted).is_pending());
    assert!(poll_once(&mut next).is_pending());
    assert_eq!(limiter.waiting(), 2);
    drop(held.pop());
    assert_eq!(limiter.waiting(), 1, "handed to the first waiter");
    assert_eq!(limiter.usage(), 2);
    drop(granted);
    assert_eq!(limiter.waiting(), 0, "passed on to the next one");
    assert_eq!(limiter.usage(), 2);
    let Poll::Ready(Ok(next)) = poll_once(&mut next) else {
        panic!("the next waiter holds the passed-on unit");
    };
    // ...and, from the last waiter, back to the table.
    let mut last = Box::pin(limiter.acquire_async());
    assert!(poll_once(&mut last).is_pending());
    drop(next);
    assert_eq!((limiter.waiting(), limiter.usage()), (0, 2));
    drop(last);
    assert_eq!(limiter.usage(), 1);
    drop(held);

    let stats = limiter.stats();
    assert_eq!((stats.timed_out, stats.rejected), (0, 0));
    assert_eq!(stats.completed, stats.accepted);
    every_unit_is_there(&limiter);
}

#[test]
fn close_wakes_blocked_and_async_waiters_with_shutdown() {
    let limiter = room(1, 2, 4, LONG, QueueOrder::Fifo);
    let held = fill(&limiter);
    let rt = runtime();
    let blocked: Vec<_> = (0..2)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.acquire().map(drop))
        })
        .collect();
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            rt.spawn(async move { limiter.acquire_owned_async().await.map(drop) })
        })
        .collect();
    until(|| limiter.waiting() == 4);
    limiter.close();
    for waiter in blocked {
        assert_eq!(waiter.join().unwrap(), Err(Error::Shutdown));
    }
    for task in tasks {
        assert_eq!(rt.block_on(task).unwrap(), Err(Error::Shutdown));
    }
    assert_eq!(limiter.waiting(), 0);
    // Later callers are refused with Shutdown, never queued.
    assert_eq!(limiter.acquire().unwrap_err(), Error::Shutdown);
    assert_eq!(
        rt.block_on(limiter.acquire_async()).unwrap_err(),
        Error::Shutdown
    );
    // The permit out at the close stays valid and is given back as usual.
    assert_eq!(limiter.usage(), 1);
    drop(held);
    let stats = limiter.stats();
    assert_eq!(stats.usage, 0);
    assert_eq!(
        (stats.timed_out, stats.waited, stats.peak_waiting),
        (0, 0, 4)
    );
    // A shutdown is not an overload.
    assert_eq!(stats.rejected, 0);
}

#[test]
fn try_acquire_never_waits_nor_jumps_the_queue() {
    let limiter = room(1, 1, 4, LONG, QueueOrder::Fifo);
    let held = fill(&limiter);
    // A room with space, but `try_acquire` answers at once.
    for _ in 0..3 {
        assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
        assert_eq!(limiter.try_acquire_owned().unwrap_err(), Error::Overload);
    }
    let stats = limiter.stats();
    assert_eq!(
        (stats.rejected, stats.peak_waiting, stats.timed_out),
        (6, 0, 0)
    );

    // With a waiter queued, a freed unit goes to it, not to a newcomer.
    let (admitted_tx, admitted_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let waiter = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || {
            let permit = limiter.acquire();
            admitted_tx.send(permit.is_ok()).unwrap();
            release_rx.recv().unwrap();
        })
    };
    until(|| limiter.waiting() == 1);
    drop(held);
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    assert!(admitted_rx.recv().unwrap());
    release_tx.send(()).unwrap();
    waiter.join().unwrap();
    every_unit_is_there(&limiter);
}

#[test]
fn growing_the_capacity_admits_waiters_without_a_release() {
    for shards in [1, 2, 4] {
        let limiter = room(1, shards, 4, LONG, QueueOrder::Fifo);
        let held = fill(&limiter);
        let (admitted_tx, admitted_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
        let waiters: Vec<_> = (0..2)
            .map(|k| {
                let shared = Arc::clone(&limiter);
                let admitted = admitted_tx.clone();
                let release = Arc::clone(&release_rx);
                let handle = thread::spawn(move || {
                    let permit = shared.acquire().expect("admitted by the resize");
                    admitted.send(k).unwrap();
                    release.lock().unwrap().recv().unwrap();
                    drop(permit);
                });
                until(|| limiter.waiting() == k + 1);
                handle
            })
            .collect();
        // One more unit: the oldest waiter has it when `set_capacity`
        // returns (granted before the shards are un-gated).
        limiter.set_capacity(2).unwrap();
        assert_eq!(limiter.waiting(), 1);
        assert_eq!(limiter.usage(), 2);
        assert_eq!(admitted_rx.recv().unwrap(), 0);
        assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
        limiter.set_capacity(3).unwrap();
        assert_eq!(admitted_rx.recv().unwrap(), 1);
        assert_eq!((limiter.waiting(), limiter.usage()), (0, 3));
        assert_eq!(limiter.available(), 0);
        for _ in 0..2 {
            release_tx.send(()).unwrap();
        }
        for waiter in waiters {
            waiter.join().unwrap();
        }
        drop(held);
        let stats = limiter.stats();
        assert_eq!((stats.waited, stats.timed_out, stats.accepted), (2, 0, 3));
        every_unit_is_there(&limiter);
    }
}

#[test]
fn growing_from_zero_admits_a_waiter() {
    let limiter = room(2, 2, 1, LONG, QueueOrder::Fifo);
    limiter.set_capacity(0).unwrap();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    let waiter = {
        let limiter = Arc::clone(&limiter);
        thread::spawn(move || limiter.acquire().map(drop))
    };
    until(|| limiter.waiting() == 1);
    limiter.set_capacity(1).unwrap();
    assert_eq!(waiter.join().unwrap(), Ok(()));
    every_unit_is_there(&limiter);
}

/// Churners admit through `acquire` while the main thread resizes through
/// `SIZES`; each admission checks that the permits held (an `active`
/// counter, bumped while a permit is held, never above the usage) are
/// within the capacity in force. A resize is bracketed by a generation
/// counter (odd while it runs); an admission whose call began and whose
/// check ran in one even generation was made under that generation's
/// capacity, and `set_capacity`'s promise (once it has returned, nothing is
/// admitted while `n` or more are held) bounds `active` by it, whatever
/// was held before the shrink.
#[test]
fn shrinking_under_churn_never_admits_above_the_new_capacity() {
    const START: usize = 6;
    const SIZES: [usize; 8] = [2, 5, 1, 0, 3, 6, 1, 4];
    const THREADS: usize = 6;
    // Each resize waits for this many more finished attempts.
    const STEP: usize = 300;
    let limiter = room(
        START,
        2,
        THREADS,
        Duration::from_millis(5),
        QueueOrder::Fifo,
    );
    let generation = Arc::new(AtomicUsize::new(0));
    let capacity_in_force = Arc::new(AtomicUsize::new(START));
    let active = Arc::new(AtomicUsize::new(0));
    let attempts = Arc::new(AtomicUsize::new(0));
    let checked = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let churners: Vec<_> = (0..THREADS)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            let generation = Arc::clone(&generation);
            let capacity_in_force = Arc::clone(&capacity_in_force);
            let active = Arc::clone(&active);
            let attempts = Arc::clone(&attempts);
            let checked = Arc::clone(&checked);
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                let mut outcomes = [0u64; 3]; // admitted, overload, timeout
                while !stop.load(SeqCst) {
                    let before = generation.load(SeqCst);
                    let capacity = capacity_in_force.load(SeqCst);
                    match limiter.acquire() {
                        Ok(permit) => {
                            let now = active.fetch_add(1, SeqCst) + 1;
                            if before % 2 == 0 && generation.load(SeqCst) == before {
                                assert!(now <= capacity, "{now} held under capacity {capacity}");
                                checked.fetch_add(1, SeqCst);
                            }
                            thread::yield_now();
                            active.fetch_sub(1, SeqCst);
                            drop(permit);
                            outcomes[0] += 1;
                        }
                        Err(Error::Overload) => outcomes[1] += 1,
                        Err(Error::Timeout) => outcomes[2] += 1,
                        Err(other) => panic!("{other}"),
                    }
                    attempts.fetch_add(1, SeqCst);
                }
                outcomes
            })
        })
        .collect();
    for &size in &SIZES {
        let target = attempts.load(SeqCst) + STEP;
        until(|| attempts.load(SeqCst) >= target);
        generation.fetch_add(1, SeqCst);
        limiter.set_capacity(size).unwrap();
        capacity_in_force.store(size, SeqCst);
        generation.fetch_add(1, SeqCst);
        assert_eq!(limiter.capacity(), size);
    }
    let target = attempts.load(SeqCst) + STEP;
    until(|| attempts.load(SeqCst) >= target);
    stop.store(true, SeqCst);
    let mut totals = [0u64; 3];
    for churner in churners {
        for (total, n) in totals.iter_mut().zip(churner.join().unwrap()) {
            *total += n;
        }
    }
    assert!(checked.load(SeqCst) > 0, "no admission was checked");
    let stats = limiter.stats();
    assert_eq!(stats.rejected, totals[1]);
    assert_eq!(stats.timed_out, totals[2]);
    assert_eq!(
        totals.iter().sum::<u64>(),
        attempts.load(SeqCst) as u64,
        "every attempt resolved"
    );
    assert!(stats.accepted >= totals[0]);
    assert_eq!(stats.completed, stats.accepted);
    every_unit_is_there(&limiter);
}

#[test]
fn available_follows_usage_and_capacity() {
    let limiter = room(5, 2, 1, LONG, QueueOrder::Fifo);
    assert_eq!(limiter.available(), 5);
    let mut held: Vec<_> = (0..3)
        .map(|_| limiter.try_acquire_owned().unwrap())
        .collect();
    assert_eq!(limiter.available(), 2);
    limiter.set_capacity(10).unwrap();
    assert_eq!(limiter.available(), 7);
    // Three held above a capacity of 2: nothing available until repaid.
    limiter.set_capacity(2).unwrap();
    assert_eq!((limiter.capacity(), limiter.available()), (2, 0));
    drop(held.pop());
    assert_eq!(limiter.available(), 0);
    drop(held.pop());
    assert_eq!(limiter.available(), 1);
    limiter.set_capacity(0).unwrap();
    assert_eq!(limiter.available(), 0);
    drop(held.pop());
    assert_eq!((limiter.usage(), limiter.available()), (0, 0));
    limiter.set_capacity(4).unwrap();
    assert_eq!(limiter.available(), 4);
    let one = limiter.try_acquire().unwrap();
    assert_eq!(limiter.available(), 3);
    drop(one);
    every_unit_is_there(&limiter);
}

#[test]
fn bad_waiting_config_names_the_field() {
    let err = Limiter::builder()
        .capacity(1)
        .max_waiters(MAX_WAITERS + 1)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "max_waiters");
    assert!(err.to_string().contains("max_waiters"), "{err}");
    assert!(Limiter::builder()
        .capacity(1)
        .max_waiters(MAX_WAITERS)
        .build()
        .is_ok());

    let err = Limiter::builder()
        .capacity(1)
        .max_waiters(1)
        .queue_order(QueueOrder::AdaptiveLifo {
            interval: Duration::from_millis(100),
            target: Duration::ZERO,
        })
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "queue_order");
    assert!(err.to_string().contains("queue_order"), "{err}");
    // A zero interval is fine (standing at once), as is the default pair.
    for order in [
        QueueOrder::AdaptiveLifo {
            interval: Duration::ZERO,
            target: Duration::from_millis(5),
        },
        QueueOrder::adaptive_lifo(),
    ] {
        assert!(Limiter::builder()
            .capacity(1)
            .max_waiters(1)
            .queue_order(order)
            .build()
            .is_ok());
    }
    // Without a room the order is still checked: the setting is refused,
    // not silently ignored.
    assert_eq!(
        Limiter::builder()
            .capacity(1)
            .queue_order(QueueOrder::AdaptiveLifo {
                interval: Duration::ZERO,
                target: Duration::ZERO,
            })
            .build()
            .unwrap_err()
            .field(),
        "queue_order"
    );
}

#[test]
fn waiting_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    fn send_static<T: Send + 'static>(_: &T) {}
    let limiter = Arc::new(Limiter::new(1).unwrap());
    send(&limiter.acquire_async());
    send_static(&Arc::clone(&limiter).acquire_owned_async());
}
