//! Bounded waiting through the `Pool` (issue 8): calls and casts wait for
//! capacity under the builder's policy, the `try_` forms never do,
//! deadlines cover the wait, a dropped async waiter leaves nothing behind,
//! shutdown wakes the waiters, a grown pool serves them. (The room itself
//! is tested on the `Limiter`, `tests/limiter/waiting.rs`; the
//! `Supervisor`'s waiting in `tests/supervisor/main.rs`.)

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use sidejob::{Error, Pool, Worker};

use crate::common::{multi_thread, until};

/// Calls echo; a cast blocks its worker until the test sends on the gate.
struct Gated(Arc<Mutex<mpsc::Receiver<()>>>);

impl Worker for Gated {
    type Request = u32;
    type Reply = u32;
    type Message = ();
    fn handle_call(&mut self, n: u32) -> u32 {
        n
    }
    fn handle_cast(&mut self, (): ()) {
        let _ = self.0.lock().unwrap().recv();
    }
}

/// A one-worker pool of capacity 1 with a waiting room, and its gate.
fn gated_pool(max_waiters: usize, max_wait: Duration) -> (Pool<Gated>, mpsc::Sender<()>) {
    let (open, gate) = mpsc::channel();
    let gate = Arc::new(Mutex::new(gate));
    let pool = Pool::builder()
        .capacity(1)
        .workers(1)
        .max_waiters(max_waiters)
        .max_wait(max_wait)
        .build(move |_| Gated(Arc::clone(&gate)))
        .unwrap();
    (pool, open)
}

/// Issue 8: a `call` on a full pool waits in the room and is served when
/// the unit frees.
#[test]
fn a_call_waits_for_the_unit_and_is_served_when_it_frees() {
    let (pool, open) = gated_pool(4, Duration::from_secs(60));
    pool.cast(()).unwrap(); // holds the only unit at the gate
    let caller = {
        let pool = pool.clone();
        thread::spawn(move || pool.call(7))
    };
    until(|| pool.waiting() == 1);
    assert_eq!(pool.usage(), 1);
    open.send(()).unwrap();
    assert_eq!(caller.join().unwrap(), Ok(7));
    let stats = pool.stats();
    assert_eq!((stats.waited, stats.timed_out, stats.rejected), (1, 0, 0));
    assert_eq!(pool.waiting(), 0);
}

/// Issue 8: past a full room, `call` and `cast` are refused at once with
/// `Overload`; the `try_` forms never wait, even with room in the queue.
#[test]
fn past_the_waiting_room_overload_at_once_and_try_forms_never_wait() {
    let (pool, open) = gated_pool(1, Duration::from_secs(60));
    pool.cast(()).unwrap();
    let waiter = {
        let pool = pool.clone();
        thread::spawn(move || pool.call(1))
    };
    until(|| pool.waiting() == 1);
    // The room is full: refused at once, counted.
    assert_eq!(pool.call(2), Err(Error::Overload));
    assert_eq!(pool.cast(()), Err(Error::Overload));
    // try_ forms never wait, even with room in the queue.
    let refused = pool.try_cast(()).unwrap_err();
    assert_eq!(refused.error(), Error::Overload);
    let refused = pool.try_call(3).unwrap_err();
    assert_eq!(refused.into_request(), Some(3));
    assert_eq!(pool.stats().rejected, 4);
    open.send(()).unwrap();
    assert_eq!(waiter.join().unwrap(), Ok(1));
}

/// Issue 8: `call_timeout`'s deadline covers the wait for capacity; a call
/// that timed out there was never sent.
#[test]
fn call_timeout_covers_the_wait_for_capacity() {
    let (pool, open) = gated_pool(4, Duration::from_secs(60));
    pool.cast(()).unwrap();
    // Waits for capacity, and the timeout runs out there: not sent.
    assert_eq!(
        pool.call_timeout(5, Duration::from_millis(20)),
        Err(Error::Timeout)
    );
    assert_eq!(pool.waiting(), 0);
    assert_eq!(pool.stats().timed_out, 1);
    open.send(()).unwrap();
    pool.shutdown();
    // Only the cast was ever handled: the timed-out call was never sent.
    assert_eq!(pool.stats().completed, 1);
}

/// Issue 8: `max_wait` bounds a blocking `call` or `cast`.
#[test]
fn max_wait_bounds_a_blocking_call() {
    let (pool, open) = gated_pool(4, Duration::from_millis(20));
    pool.cast(()).unwrap();
    assert_eq!(pool.call(9), Err(Error::Timeout));
    assert_eq!(pool.cast(()), Err(Error::Timeout));
    assert_eq!(pool.stats().timed_out, 2);
    open.send(()).unwrap();
}

/// Issue 8: `call_async` waits inside its future; one dropped while
/// waiting leaves the queue, takes no unit, and never runs.
#[test]
fn call_async_waits_inside_its_future_and_a_dropped_one_leaves_nothing() {
    let (pool, open) = gated_pool(4, Duration::from_secs(60));
    let rt = multi_thread();
    pool.cast(()).unwrap();
    rt.block_on(async {
        // Given up while waiting: the queue is left, no unit leaks.
        let gave_up = tokio::time::timeout(Duration::from_millis(10), pool.call_async(1)).await;
        assert!(gave_up.is_err());
        assert_eq!(pool.waiting(), 0);

        let waiting = tokio::spawn(pool.call_async(2));
        until(|| pool.waiting() == 1);
        open.send(()).unwrap();
        assert_eq!(waiting.await.unwrap(), Ok(2));
    });
    pool.shutdown();
    assert_eq!(pool.usage(), 0);
    // The cast and the one call that waited through; nothing else ran.
    assert_eq!(pool.stats().completed, 2);
}

/// Issue 8: `shutdown` wakes the waiting callers with `Shutdown`.
#[test]
fn shutdown_wakes_waiting_callers_with_shutdown() {
    let (pool, open) = gated_pool(4, Duration::from_secs(60));
    pool.cast(()).unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|n| {
            let pool = pool.clone();
            thread::spawn(move || pool.call(n))
        })
        .collect();
    until(|| pool.waiting() == 3);
    let closer = {
        let pool = pool.clone();
        thread::spawn(move || pool.shutdown())
    };
    until(|| pool.waiting() == 0);
    for waiter in waiters {
        assert_eq!(waiter.join().unwrap(), Err(Error::Shutdown));
    }
    open.send(()).unwrap();
    closer.join().unwrap();
    assert_eq!(pool.usage(), 0);
}

/// Issue 8: growing the pool hands the new unit to a waiter, with no
/// release.
#[test]
fn growing_the_pool_serves_its_waiters() {
    let (pool, open) = gated_pool(4, Duration::from_secs(60));
    pool.cast(()).unwrap();
    let caller = {
        let pool = pool.clone();
        thread::spawn(move || pool.call(11))
    };
    until(|| pool.waiting() == 1);
    // No release: the new unit goes to the waiter (the worker is still at
    // the gate, so the call sits queued behind the cast until it opens).
    pool.set_capacity(2).unwrap();
    until(|| pool.waiting() == 0);
    assert_eq!(pool.usage(), 2);
    open.send(()).unwrap();
    assert_eq!(caller.join().unwrap(), Ok(11));
}
