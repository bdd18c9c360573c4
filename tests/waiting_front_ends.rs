//! Bounded waiting through the Pool and the Supervisor (issue 8): calls,
//! casts and children wait for capacity under the builder's policy, the
//! `try_` forms never do, deadlines cover the wait, a dropped async waiter
//! leaves nothing behind, and shutdown wakes the waiters.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use sidejob::{Error, Supervisor};

/// Spins (yielding) until `cond` holds: the tests line threads up on the
/// pool's own counters, never on sleeps.
fn until(cond: impl Fn() -> bool) {
    while !cond() {
        thread::yield_now();
    }
}

#[test]
fn supervisor_reserve_waits_and_try_reserve_does_not() {
    let sup = Supervisor::builder()
        .capacity(1)
        .max_waiters(2)
        .max_wait(Duration::from_secs(60))
        .build()
        .unwrap();
    let first = sup.reserve().unwrap();
    assert_eq!(sup.try_reserve().unwrap_err(), Error::Overload);
    let waiter = {
        let sup = sup.clone();
        thread::spawn(move || sup.reserve().map(|guard| guard.id()))
    };
    until(|| sup.waiting() == 1);
    drop(first);
    let id = waiter.join().unwrap().unwrap();
    // The waiter's guard was dropped with its thread: no child left.
    assert_eq!(sup.count(), 0);
    assert_eq!(id.shard(), 0);
    assert_eq!(sup.stats().waited, 1);
}

#[test]
fn supervisor_spawn_waits_for_a_child_to_end() {
    let sup = Supervisor::builder()
        .capacity(1)
        .shards(1)
        .max_waiters(1)
        .max_wait(Duration::from_secs(60))
        .build()
        .unwrap();
    let (go, gate) = mpsc::channel::<()>();
    let first = sup.spawn(move || gate.recv().unwrap()).unwrap();
    let second = {
        let sup = sup.clone();
        thread::spawn(move || sup.spawn(|| 2).unwrap().join().unwrap())
    };
    until(|| sup.waiting() == 1);
    go.send(()).unwrap();
    first.join().unwrap();
    assert_eq!(second.join().unwrap(), 2);
    assert!(sup.wait_idle(Duration::from_secs(60)));
}

#[test]
fn supervisor_close_wakes_async_and_blocking_waiters() {
    let sup = Supervisor::builder()
        .capacity(1)
        .max_waiters(4)
        .max_wait(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = sup.reserve().unwrap();
    let blocking = {
        let sup = sup.clone();
        thread::spawn(move || sup.reserve().map(drop))
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let result = rt.block_on(async {
        let waiting = async { sup.reserve_async().await.map(drop) };
        let closing = async {
            // `join!` polls the async waiter first, so it is queued by now;
            // wait for the blocking one too, then close.
            until(|| sup.waiting() == 2);
            sup.close();
        };
        tokio::join!(waiting, closing).0
    });
    assert_eq!(result, Err(Error::Shutdown));
    assert_eq!(blocking.join().unwrap(), Err(Error::Shutdown));
    assert_eq!(sup.waiting(), 0);
    drop(held);
    assert_eq!(sup.count(), 0);
}
