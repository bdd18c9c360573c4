//! Waiting for capacity on the `Supervisor` (issue 8): `reserve` and
//! `spawn` wait under the builder's policy, `try_reserve` never does, and
//! `close` wakes blocking and async waiters with `Shutdown`. (The room
//! itself is tested on the `Limiter`, `tests/limiter/waiting.rs`.)

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use sidejob::{Error, Supervisor};

use crate::common::{current_thread, until};

/// Issue 8: `reserve` waits for a unit and is served when one frees;
/// `try_reserve` refuses at once.
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

/// Issue 8: `spawn` on a full supervisor waits for a child to end.
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

/// Issue 8: `close` wakes the blocking and the async waiters with
/// `Shutdown`.
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
    let rt = current_thread();
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
