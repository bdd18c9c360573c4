//! Stopping a `Supervisor` and waiting for it: `close` refuses new
//! children and lets the live ones finish (issue 7), `wait_idle` wakes when
//! the last child leaves, and `wait_idle_async` (issue 7) is a `Send`
//! future woken by a child's exit on any thread, cancel-safe.

use std::future::Future;
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::Duration;

use sidejob::{Error, Supervisor};

use crate::common::{current_thread, multi_thread, FOREVER};

/// Issue 7: `close` (from any handle) refuses new children with `Shutdown`
/// and lets the live ones finish; `wait_idle` still waits for them.
#[test]
fn supervisor_close_refuses_new_children_and_lets_the_live_ones_finish() {
    let sup = Supervisor::builder().capacity(4).shards(2).build().unwrap();
    let guard = sup.reserve().unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let child = sup.spawn(move || go_rx.recv().unwrap()).unwrap();
    let other_handle = sup.clone();
    other_handle.close();
    assert!(sup.is_closed(), "every handle sees the close");
    assert_eq!(sup.reserve().unwrap_err(), Error::Shutdown);
    assert!(matches!(sup.spawn(|| ()), Err(Error::Shutdown)));
    assert_eq!(sup.count(), 2);
    assert_eq!(sup.which_children().len(), 2);

    // wait_idle still works after close: it waits for the two live ones.
    let waiter = {
        let sup = sup.clone();
        thread::spawn(move || sup.wait_idle(FOREVER))
    };
    drop(guard);
    go_tx.send(()).unwrap();
    child.join().unwrap();
    assert!(waiter.join().unwrap());
    assert_eq!(sup.count(), 0);
    assert_eq!(sup.reserve().unwrap_err(), Error::Shutdown);
    let stats = sup.stats();
    assert_eq!((stats.accepted, stats.completed, stats.rejected), (2, 2, 0));
}

/// Issue 7: a full supervisor, once closed, says `Shutdown`, not
/// `Overload`.
#[test]
fn a_full_supervisor_once_closed_says_shutdown() {
    let sup = Supervisor::builder().capacity(1).shards(1).build().unwrap();
    let guard = sup.reserve().unwrap();
    assert_eq!(sup.reserve().unwrap_err(), Error::Overload);
    sup.close();
    assert_eq!(sup.reserve().unwrap_err(), Error::Shutdown);
    drop(guard);
    assert!(sup.wait_idle(Duration::ZERO));
}

/// Issue 7: `close` racing with reservers: each reserve is admitted or
/// refused, and `wait_idle` after the close sees every admitted one gone.
#[test]
fn close_races_with_reservers_and_every_admitted_child_is_waited_for() {
    // Threads reserve in a loop while the main thread closes: every reserve
    // is admitted or refused, and wait_idle after close sees them all gone.
    let sup = Supervisor::builder().capacity(8).shards(4).build().unwrap();
    let start = Arc::new(Barrier::new(5));
    let reservers: Vec<_> = (0..4)
        .map(|_| {
            let (sup, start) = (sup.clone(), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                let mut admitted = 0u64;
                loop {
                    match sup.reserve() {
                        Ok(guard) => {
                            admitted += 1;
                            drop(guard);
                        }
                        Err(Error::Overload) => {}
                        Err(Error::Shutdown) => return admitted,
                        Err(other) => panic!("{other}"),
                    }
                }
            })
        })
        .collect();
    start.wait();
    sup.close();
    let admitted: u64 = reservers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(sup.wait_idle(FOREVER));
    let stats = sup.stats();
    assert_eq!(stats.accepted, admitted);
    assert_eq!(stats.completed, admitted);
    assert_eq!(sup.count(), 0);
}

/// `wait_idle` is false at once with children alive, and a waiter wakes
/// when the last one leaves.
#[test]
fn wait_idle_wakes_when_the_last_child_leaves() {
    let sup = Supervisor::builder().capacity(4).shards(2).build().unwrap();
    let guards: Vec<_> = (0..4).map(|_| sup.reserve().unwrap()).collect();
    assert!(!sup.wait_idle(Duration::ZERO));
    let (waiting_tx, waiting_rx) = mpsc::channel();
    let waiter = {
        let sup = sup.clone();
        thread::spawn(move || {
            waiting_tx.send(()).unwrap();
            sup.wait_idle(FOREVER)
        })
    };
    waiting_rx.recv().unwrap();
    drop(guards);
    assert!(waiter.join().unwrap());
    assert_eq!(sup.count(), 0);
}

/// Issue 7: the `wait_idle_async` future is `Send`.
#[test]
fn wait_idle_async_is_send() {
    fn send<T: Send>(_: &T) {}
    let sup = Supervisor::new(1).unwrap();
    let future = sup.wait_idle_async();
    send(&future);
}

/// Issue 7: `wait_idle_async` is pending while children live and is woken
/// by the last one's exit on its own thread.
#[test]
fn wait_idle_async_resolves_when_a_child_on_another_thread_ends() {
    let sup = Supervisor::builder().capacity(4).shards(2).build().unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Arc::new(std::sync::Mutex::new(go_rx));
    let children: Vec<_> = (0..3)
        .map(|_| {
            let go_rx = Arc::clone(&go_rx);
            sup.spawn(move || go_rx.lock().unwrap().recv().unwrap())
                .unwrap()
        })
        .collect();
    current_thread().block_on(async {
        let mut wait = std::pin::pin!(sup.wait_idle_async());
        // Poll once: children are alive, so it registers and is pending.
        tokio::select! {
            biased;
            _ = &mut wait => panic!("resolved with children alive"),
            _ = std::future::ready(()) => {}
        }
        for _ in 0..3 {
            go_tx.send(()).unwrap();
        }
        // Woken by the last child's exit on its own thread.
        wait.await;
        assert_eq!(sup.count(), 0);
    });
    for child in children {
        child.join().unwrap();
    }
}

/// Issue 7: `wait_idle_async` runs as a spawned task on a multi-threaded
/// runtime (so it must be `Send`), woken by guards dropped elsewhere.
#[test]
fn wait_idle_async_runs_on_a_multi_thread_runtime_as_a_spawned_task() {
    let rt = multi_thread();
    let sup = Supervisor::builder().capacity(2).shards(2).build().unwrap();
    let guards: Vec<_> = (0..2).map(|_| sup.reserve().unwrap()).collect();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let waiter = {
        let sup = sup.clone();
        // `tokio::spawn` needs the future to be Send.
        rt.spawn(async move {
            ready_tx.send(()).unwrap();
            sup.wait_idle_async().await;
            sup.count()
        })
    };
    ready_rx.recv().unwrap();
    let dropper = thread::spawn(move || drop(guards));
    dropper.join().unwrap();
    assert_eq!(rt.block_on(waiter).unwrap(), 0);
}

/// Issue 7: a `wait_idle_async` dropped while registered (a timeout) leaves
/// nothing behind; a later one resolves, at once when already idle.
#[test]
fn wait_idle_async_cancelled_by_a_timeout_then_awaited_again() {
    let sup = Supervisor::new(2).unwrap();
    let guard = sup.reserve().unwrap();
    let rt = current_thread();
    rt.block_on(async {
        // The child is held, so this can only time out: the future is
        // dropped while registered.
        let timed_out = tokio::time::timeout(Duration::from_millis(1), sup.wait_idle_async());
        assert!(timed_out.await.is_err());
    });
    let dropper = thread::spawn(move || drop(guard));
    rt.block_on(sup.wait_idle_async());
    dropper.join().unwrap();
    assert_eq!(sup.count(), 0);
    // Idle already: resolves on the first poll.
    rt.block_on(sup.wait_idle_async());
}

/// Issue 7: `wait_idle_async` after `close` resolves once the live child
/// ends.
#[test]
fn wait_idle_async_after_close() {
    let sup = Supervisor::new(2).unwrap();
    let guard = sup.reserve().unwrap();
    sup.close();
    let dropper = thread::spawn(move || drop(guard));
    current_thread().block_on(sup.wait_idle_async());
    dropper.join().unwrap();
    assert_eq!(sup.count(), 0);
    assert_eq!(sup.reserve().unwrap_err(), Error::Shutdown);
}

/// The future type is usable where a `Future<Output = ()>` is expected.
#[allow(dead_code)]
fn wait_idle_async_is_a_unit_future(sup: &Supervisor) -> impl Future<Output = ()> + Send + '_ {
    sup.wait_idle_async()
}
