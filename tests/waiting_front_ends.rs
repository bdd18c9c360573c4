//! Bounded waiting through the Pool and the Supervisor (issue 8): calls,
//! casts and children wait for capacity under the builder's policy, the
//! `try_` forms never do, deadlines cover the wait, a dropped async waiter
//! leaves nothing behind, and shutdown wakes the waiters.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use sidejob::{Error, Pool, Supervisor, Worker};

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

/// Spins (yielding) until `cond` holds: the tests line threads up on the
/// pool's own counters, never on sleeps.
fn until(cond: impl Fn() -> bool) {
    while !cond() {
        thread::yield_now();
    }
}

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

#[test]
fn max_wait_bounds_a_blocking_call() {
    let (pool, open) = gated_pool(4, Duration::from_millis(20));
    pool.cast(()).unwrap();
    assert_eq!(pool.call(9), Err(Error::Timeout));
    assert_eq!(pool.cast(()), Err(Error::Timeout));
    assert_eq!(pool.stats().timed_out, 2);
    open.send(()).unwrap();
}

#[test]
fn call_async_waits_inside_its_future_and_a_dropped_one_leaves_nothing() {
    let (pool, open) = gated_pool(4, Duration::from_secs(60));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
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
