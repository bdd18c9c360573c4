//! The shim: every atomic, lock, spin and clock the crate uses comes from here.
//!
//! Normally these are std's (and parking_lot's lock); under `--cfg loom` the
//! atomics, the lock, the thread-locals and the spin hint are loom's, so loom
//! models see every access the admission table and the shutdown protocol
//! make. Nothing outside this file names `std::sync::atomic`, `std::thread`,
//! `Instant::now` or `spin_loop`; `.ci/run` greps for them. (clippy's
//! `disallowed-types` cannot do it: it sees through our re-exports.)
//!
//! What loom cannot see, it does not get: OS threads (the pool's workers and
//! the supervisor's children), channels and the clock stay std's under loom.
//! Loom models therefore drive the table and the drain protocol directly
//! (see `crate::loom_api`), never a whole `Pool`.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};

/// `Arc` is always std's: it appears in the public API
/// (`Limiter::try_acquire_owned` takes `Arc<Limiter>`), and loom only needs
/// it for leak checks that our models do not rely on.
pub(crate) use std::sync::Arc;

/// `thread_local!` with a constant initializer: std's `const { }` form
/// normally (no lazy-initialisation check on each access, which matters on
/// the admission path), loom's plain form in a model (loom's macro does not
/// accept `const { }`).
macro_rules! const_thread_local {
    ($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;) => {
        #[cfg(not(loom))]
        std::thread_local! { $(#[$attr])* static $name: $t = const { $init }; }
        #[cfg(loom)]
        loom::thread_local! { $(#[$attr])* static $name: $t = $init; }
    };
}
pub(crate) use const_thread_local;

/// OS threads for workers and children. Loom never runs these: its model
/// threads are coroutines on one OS thread, and a worker blocks on channels
/// loom cannot see.
pub(crate) mod os_thread {
    pub(crate) use std::thread::{current, panicking, Builder, JoinHandle, ThreadId};
}

/// A non-poisoning mutual-exclusion lock: parking_lot's normally, loom's in a
/// model. Both sides offer the same `lock()`.
#[derive(Debug, Default)]
pub(crate) struct Mutex<T> {
    #[cfg(not(loom))]
    inner: parking_lot::Mutex<T>,
    #[cfg(loom)]
    inner: loom::sync::Mutex<T>,
}

#[cfg(not(loom))]
pub(crate) type MutexGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
#[cfg(loom)]
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex {
            #[cfg(not(loom))]
            inner: parking_lot::Mutex::new(value),
            #[cfg(loom)]
            inner: loom::sync::Mutex::new(value),
        }
    }

    /// Locks; never poisons, so a panic in a holder never makes the lock
    /// unusable (the registry must stay readable after a child panics).
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        #[cfg(not(loom))]
        {
            self.inner.lock()
        }
        #[cfg(loom)]
        {
            // loom's Mutex poisons like std's; our critical sections never
            // panic, so a poisoned lock would be a bug in a model.
            self.inner.lock().unwrap()
        }
    }
}

/// Spin-then-yield backoff for wait loops (crossbeam's `Backoff`).
///
/// crossbeam's `Backoff` only yields to loom under its own
/// `--cfg crossbeam_loom`; under ours every step is a `yield_now`, as loom's
/// "Yielding" rule requires of any loop that waits for another thread.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    #[cfg(not(loom))]
    inner: crossbeam_utils::Backoff,
    #[cfg(loom)]
    steps: u32,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// One step of waiting for another thread: spins at first, then yields
    /// the CPU.
    pub(crate) fn snooze(&self) {
        #[cfg(not(loom))]
        self.inner.snooze();
        #[cfg(loom)]
        loom::thread::yield_now();
    }

    /// True once spinning has stopped paying and the caller should block.
    pub(crate) fn is_completed(&self) -> bool {
        #[cfg(not(loom))]
        {
            self.inner.is_completed()
        }
        #[cfg(loom)]
        {
            // In a model, a wait loop that gives up after one yield is
            // enough to explore both outcomes.
            self.steps > 0
        }
    }

    /// Starts counting afresh (after progress was made).
    #[cfg(not(loom))]
    pub(crate) fn reset(&self) {
        self.inner.reset();
    }
}

/// The monotonic clock. Loom has none; nothing a model checks depends on it.
pub(crate) fn now() -> std::time::Instant {
    std::time::Instant::now()
}

/// The CPU the calling thread runs on, if the platform says cheaply.
///
/// On Linux this is `sched_getcpu`, which glibc answers from the rseq area
/// the kernel keeps up to date (no system call). Loom has no CPUs: `None`.
pub(crate) fn current_cpu() -> Option<usize> {
    #[cfg(all(target_os = "linux", not(loom), not(miri)))]
    {
        // SAFETY: `sched_getcpu` takes no arguments, touches no memory of
        // ours and has no preconditions; it returns a CPU number or -1.
        // It is `unsafe` only because every foreign function is.
        let cpu = unsafe { libc::sched_getcpu() };
        if cpu >= 0 {
            return Some(cpu as usize);
        }
        None
    }
    #[cfg(not(all(target_os = "linux", not(loom), not(miri))))]
    {
        None
    }
}
