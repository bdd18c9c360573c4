//! What the integration tests share: a no-op waker and a one-poll helper,
//! waiting on a condition without sleeping, a bound on what must not hang,
//! runtimes, a seeded generator, and the patience constants.
//!
//! A test file pulls it in with `mod common;` (a test crate in a folder,
//! `tests/pool/`, with `#[path = "../common/mod.rs"] mod common;`).

// Each test crate compiles this module on its own and uses what it needs.
#![allow(dead_code)]

use std::future::Future;
use std::pin::Pin;
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

/// How long a blocked handler waits for its gate. Only a test that failed
/// before opening it waits this long: the handler then gives up, so the
/// pool's drop can join its workers and the test reports its failure
/// instead of hanging.
pub const GATE_PATIENCE: Duration = Duration::from_secs(60);

/// Long enough never to be reached by a passing test.
pub const FOREVER: Duration = Duration::from_secs(120);

/// How long [`bounded`] waits before it calls a scenario hung. Never a
/// measure of speed: a passing scenario is done in microseconds.
pub const HUNG: Duration = Duration::from_secs(20);

/// A waker that does nothing (`Waker::noop` is newer than our MSRV, 1.75).
pub fn noop_waker() -> Waker {
    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    Waker::from(Arc::new(Noop))
}

/// Polls `future` once with a [`noop_waker`]. A pinned box or a
/// `Pin<&mut _>` is `Unpin`, so any future can be polled through one.
pub fn poll_once<F: Future + Unpin + ?Sized>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(&noop_waker()))
}

/// Spins (yielding) until `condition` holds: for "this waiter is queued
/// now" and the like, read off the front-end's own counters, which no
/// channel can say. Never a sleep.
pub fn until(condition: impl Fn() -> bool) {
    while !condition() {
        thread::yield_now();
    }
}

/// Runs `scenario` on a thread of its own; its result, or a failure naming
/// `what` if it has not returned within [`HUNG`]. For scenarios whose bug
/// was a hang (a deadlock, a worker waiting for itself): the bound turns
/// the hang into a failure, it is not a sleep.
pub fn bounded<T: Send + 'static>(what: &str, scenario: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, result) = mpsc::channel();
    thread::spawn(move || {
        let _ = done.send(scenario());
    });
    result
        .recv_timeout(HUNG)
        .unwrap_or_else(|_| panic!("{what}: hung (or panicked) instead of returning"))
}

/// A tokio runtime of two worker threads, with its timer and IO drivers.
pub fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A tokio runtime on the calling thread, with its timer and IO drivers.
pub fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// xorshift64: a cheap generator, deterministic per seed (which must not be
/// zero), no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A draw in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
