//! The `Limiter`'s waiting room (issue 8): a waiter is served when a unit
//! frees, times out after `max_wait`, is refused at once when the room is
//! full; the queue orders (FIFO, LIFO, adaptive LIFO); dropped async waiters
//! leak nothing; `close` wakes the waiters; `try_acquire` never waits;
//! configuration errors. (Resizing with waiters: `resize.rs`.)

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use sidejob::{Error, Limiter, LimiterBuilder, QueueOrder};

use crate::common::{multi_thread, poll_once, until};
use crate::{every_unit_is_there, fill, room, LONG, SHORT};

/// Issue 8: a blocked waiter is handed the freed unit directly (it never
/// goes back to the table), on one shard or several.
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

/// Issue 8: async waiters (borrowed and owned) are admitted as units free.
#[test]
fn an_async_waiter_is_admitted_when_a_unit_frees() {
    let limiter = room(2, 2, 2, LONG, QueueOrder::Fifo);
    let rt = multi_thread();
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

/// Issue 8: a waiter, blocking or async, gets `Timeout` after `max_wait`,
/// and the held unit is undisturbed.
#[test]
fn a_waiter_gets_timeout_after_max_wait() {
    let limiter = room(1, 1, 4, SHORT, QueueOrder::Fifo);
    let held = fill(&limiter);
    let err = limiter.acquire().unwrap_err();
    assert_eq!(err, Error::Timeout);
    assert!(err.is_timeout());
    let rt = multi_thread();
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

/// Issue 8: with no release, no newcomer and no runtime, the room's
/// deadline watcher alone wakes an async waiter with `Timeout`, and re-arms.
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

/// Issue 8: rooms with different `max_wait`s share the one watcher; every
/// unserved waiter of each times out, none is lost.
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
    let rt = multi_thread();
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

/// Issue 8: past a full room a caller is refused at once with `Overload`,
/// counted, and does not join the queue.
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
    let rt = multi_thread();
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

/// Issue 8: without a room (`max_waiters` 0, the default) the waiting calls
/// fail fast like `try_acquire`.
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
    let rt = multi_thread();
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

/// Issue 8: FIFO (and adaptive LIFO while the queue does not stand) serves
/// the oldest waiter first.
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

/// Issue 8: LIFO (and adaptive LIFO once the queue stands) serves the
/// newest waiter first.
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

/// Issue 8: adaptive LIFO, once the queue stands, serves the newest and
/// times out the waiters older than its target.
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

/// Issue 8: async waiters dropped at every stage (timed out, lost a
/// `select!`, queued, handed a unit) never leak a unit or a place.
#[test]
fn dropped_async_waiters_never_leak_a_unit() {
    let limiter = room(2, 2, 8, LONG, QueueOrder::Fifo);
    let mut held = fill(&limiter);
    let rt = multi_thread();

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

/// Issue 8: `close` wakes blocked and async waiters with `Shutdown`; later
/// callers are refused, never queued; held permits stay valid.
#[test]
fn close_wakes_blocked_and_async_waiters_with_shutdown() {
    let limiter = room(1, 2, 4, LONG, QueueOrder::Fifo);
    let held = fill(&limiter);
    let rt = multi_thread();
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

/// Issue 8: `try_acquire` never waits, and a freed unit goes to the queued
/// waiter, not to a `try_acquire` newcomer.
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

/// Issue 8: `max_waiters` past `MAX_WAITERS` and an adaptive LIFO target of
/// zero are configuration errors naming their field.
#[test]
fn bad_waiting_config_names_the_field() {
    let err = Limiter::builder()
        .capacity(1)
        .max_waiters(LimiterBuilder::MAX_WAITERS + 1)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "max_waiters");
    assert!(err.to_string().contains("max_waiters"), "{err}");
    assert!(Limiter::builder()
        .capacity(1)
        .max_waiters(LimiterBuilder::MAX_WAITERS)
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

/// Issue 8: the waiting futures are `Send` (the owned one `'static`).
#[test]
fn waiting_futures_are_send() {
    fn send<T: Send>(_: &T) {}
    fn send_static<T: Send + 'static>(_: &T) {}
    let limiter = Arc::new(Limiter::new(1).unwrap());
    send(&limiter.acquire_async());
    send_static(&Arc::clone(&limiter).acquire_owned_async());
}
