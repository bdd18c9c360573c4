//! The shim: every atomic, lock, spin and clock the crate uses comes from here.
//!
//! Normally these are std's (and parking_lot's lock and condition
//! variable); under `--cfg loom` the atomics, the lock, the condition
//! variable, the thread-locals and the spin hint are loom's, so loom models
//! see every access the admission table, the supervisor's registry and the
//! shutdown and idle-wait protocols make. Nothing outside this file names `std::sync::atomic`, `std::thread`,
//! `Instant::now` or `spin_loop`; `.ci/run` greps for them. (clippy's
//! `disallowed-types` cannot do it: it sees through our re-exports.)
//!
//! What loom cannot see, it does not get: OS threads (the pool's workers and
//! the supervisor's children), channels and the clock stay std's under loom.
//! Loom models therefore drive the table and the drain protocol directly
//! (see `crate::loom_api`), never a whole `Pool`.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// `Arc` is always std's: it appears in the public API
/// (`Limiter::try_acquire_owned` takes `Arc<Limiter>`), and loom only needs
/// it for leak checks that our models do not rely on. `Weak` goes with it
/// (a [`WeakPool`](crate::WeakPool) holds one, and a
/// [`Reporter`](crate::observe::Reporter) holds its front-end through one, so it
/// never keeps it alive).
pub(crate) use std::sync::{Arc, Weak};

/// A cell set once, for the one process-wide deadline watcher
/// (`engine/alarm.rs`). Not under loom: the watcher is not built there
/// (loom has no clock).
#[cfg(not(loom))]
pub(crate) use std::sync::OnceLock;

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
///
/// Under `cfg(test)`, `Builder` is std's behind a seam: a test may have the
/// next spawns from its own thread refused, as the OS refuses a thread, so
/// the builders' paths for a refused thread (shut down and join what
/// started, return the error) are tested without exhausting the OS.
pub(crate) mod os_thread {
    #[cfg(test)]
    pub(crate) use refusing::{refuse_spawns_after, Builder};
    #[cfg(not(test))]
    pub(crate) use std::thread::Builder;
    pub(crate) use std::thread::{current, panicking, JoinHandle, Result, ThreadId};
    #[cfg(test)]
    pub(crate) use std::thread::{park, Thread};

    #[cfg(test)]
    mod refusing {
        use std::cell::Cell;
        use std::io;

        std::thread_local! {
            /// Spawns from this thread still allowed; `None`: all.
            static SPAWNS_LEFT: Cell<Option<usize>> = const { Cell::new(None) };
        }

        /// Lets the next `allowed` spawns from the calling thread through
        /// and refuses the ones after (`WouldBlock`, as Linux's `EAGAIN`),
        /// until the returned guard is dropped.
        pub(crate) fn refuse_spawns_after(allowed: usize) -> Refusing {
            SPAWNS_LEFT.with(|left| left.set(Some(allowed)));
            Refusing(())
        }

        /// Ends [`refuse_spawns_after`] when dropped.
        #[must_use = "spawns are refused only while the guard lives"]
        pub(crate) struct Refusing(());

        impl Drop for Refusing {
            fn drop(&mut self) {
                SPAWNS_LEFT.with(|left| left.set(None));
            }
        }

        /// std's `Builder`, with the seam.
        #[derive(Debug)]
        pub(crate) struct Builder(std::thread::Builder);

        impl Builder {
            pub(crate) fn new() -> Self {
                Builder(std::thread::Builder::new())
            }

            pub(crate) fn name(self, name: String) -> Self {
                Builder(self.0.name(name))
            }

            pub(crate) fn stack_size(self, size: usize) -> Self {
                Builder(self.0.stack_size(size))
            }

            /// As std's; a refused spawn drops `f`, as std's does.
            pub(crate) fn spawn<F, T>(self, f: F) -> io::Result<std::thread::JoinHandle<T>>
            where
                F: FnOnce() -> T + Send + 'static,
                T: Send + 'static,
            {
                let refused = SPAWNS_LEFT.with(|left| match left.get() {
                    Some(0) => true,
                    Some(n) => {
                        left.set(Some(n - 1));
                        false
                    }
                    None => false,
                });
                if refused {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                self.0.spawn(f)
            }
        }
    }
}

/// Parking a thread that waits in a waiting room (`engine/waiters.rs`):
/// std's park normally; in a model, a parker of loom's lock and condition
/// variable with std's meaning (a loom thread parked with std's park would
/// block the whole model).
///
/// Not loom's own `thread::park`: loom's `unpark` makes a thread runnable
/// whatever it is blocked on, so an unpark that arrives late (after the
/// waiter saw its ticket and went on to block in a lock or a `join`) wakes
/// that other wait, which loom then reports as its own internal error.
/// std's unpark only leaves a token for the next park, and so does this
/// parker. Waking after the control lock is let go (`waiters.rs`, "Foreign
/// code") makes such late unparks routine.
pub(crate) mod park {
    #[cfg(loom)]
    pub(crate) use self::model::{current, Thread};
    #[cfg(not(loom))]
    pub(crate) use std::thread::{current, Thread};

    #[cfg(loom)]
    mod model {
        use std::sync::Arc;

        use loom::sync::{Condvar, Mutex};

        /// A thread's token and the condition variable it sleeps on.
        #[derive(Debug)]
        struct Parker {
            token: Mutex<bool>,
            woken: Condvar,
        }

        loom::thread_local! {
            static PARKER: Arc<Parker> = Arc::new(Parker {
                token: Mutex::new(false),
                woken: Condvar::new(),
            });
        }

        /// A handle that unparks one model thread.
        #[derive(Debug, Clone)]
        pub(crate) struct Thread(Arc<Parker>);

        impl Thread {
            /// Leaves the token and wakes the thread if it sleeps.
            pub(crate) fn unpark(&self) {
                *self.0.token.lock().unwrap() = true;
                self.0.woken.notify_one();
            }
        }

        /// The calling thread's handle.
        pub(crate) fn current() -> Thread {
            PARKER.with(|parker| Thread(Arc::clone(parker)))
        }

        /// Sleeps until the token is there, and takes it.
        pub(super) fn park() {
            PARKER.with(|parker| {
                let mut token = parker.token.lock().unwrap();
                while !*token {
                    token = parker.woken.wait(token).unwrap();
                }
                *token = false;
            });
        }
    }

    /// Parks the calling thread until it is unparked or `deadline` passes
    /// (`None`: no deadline). May return early, as std's park may: callers
    /// re-check their condition. Under loom there is no clock: a deadline is
    /// ignored, so a protocol that could lose its wake-up shows up as a
    /// deadlock the model reports instead of being papered over.
    pub(crate) fn park_until(deadline: Option<std::time::Instant>) {
        #[cfg(not(loom))]
        match deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(super::now());
                if !left.is_zero() {
                    std::thread::park_timeout(left);
                }
            }
            None => std::thread::park(),
        }
        #[cfg(loom)]
        {
            let _ = deadline;
            model::park();
        }
    }
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

    /// Locks if nobody holds the lock, else `None` at once: for tests that
    /// check who holds it, and for the adaptive controller's tick, which
    /// skips rather than waits.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        #[cfg(not(loom))]
        {
            self.inner.try_lock()
        }
        #[cfg(loom)]
        {
            // Held or (never, as in `lock`) poisoned: not taken.
            self.inner.try_lock().ok()
        }
    }
}

/// Polls `poll`, spinning between tries, for at most `budget`; `None` if
/// nothing came, and the caller should block.
///
/// Why spin at all: waking a parked thread costs a futex round trip, 5–40 µs
/// on small virtual machines, while a request handed between two running
/// threads costs well under a microsecond. A waiting caller and an idle
/// worker therefore poll for a while before they park; past the budget they
/// park, so an idle pool costs no CPU.
///
/// Why not crossbeam's `Backoff`: its spin phase is 127 `pause`s (well under
/// a microsecond on recent x86), after which it calls `sched_yield`, which
/// on a VM is a costly exit and does not help a thread whose partner runs
/// on another core. Measured here, a pool whose callers backed off that way
/// parked on most calls (≈9 µs each); spinning on a time budget, ≈0.5 µs.
///
/// Under loom: one poll, one `yield_now` (loom's rule for wait loops), one
/// more poll.
pub(crate) fn spin_poll<T>(
    budget: std::time::Duration,
    mut poll: impl FnMut() -> Option<T>,
) -> Option<T> {
    if let Some(value) = poll() {
        return Some(value);
    }
    #[cfg(loom)]
    {
        let _ = budget;
        loom::thread::yield_now();
        poll()
    }
    #[cfg(not(loom))]
    {
        if budget.is_zero() {
            return None;
        }
        let start = now();
        let mut rounds = 0u32;
        loop {
            // Read the clock only every few polls: it costs ~20 ns.
            for _ in 0..32 {
                std::hint::spin_loop();
                if let Some(value) = poll() {
                    return Some(value);
                }
            }
            rounds += 1;
            // After the first microseconds (a hand-off between two running
            // threads is done by then), yield between rounds: when threads
            // outnumber cores, the partner may be waiting for this very CPU.
            if rounds > SPIN_ROUNDS {
                std::thread::yield_now();
            }
            if start.elapsed() >= budget {
                return None;
            }
        }
    }
}

/// Rounds of 32 polls spun before `spin_poll` starts yielding: a few
/// microseconds.
#[cfg(not(loom))]
const SPIN_ROUNDS: u32 = 64;

/// Lets other threads run: std's `yield_now`, or loom's (a wait loop in a
/// model must yield, or loom reports it as a livelock).
pub(crate) fn yield_now() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// The monotonic clock. Loom has none; nothing a model checks depends on it.
pub(crate) fn now() -> std::time::Instant {
    std::time::Instant::now()
}

/// A cheap monotonic clock for time stamps that need milliseconds, not
/// nanoseconds (a supervised child's start time).
///
/// On Linux it reads `CLOCK_MONOTONIC_COARSE`: the time of the last
/// scheduler tick, answered by the vDSO from a shared page without reading
/// the TSC, a few nanoseconds against `Instant::now()`'s ~20 (and far more
/// on a VM whose clock source is not the TSC). Its resolution is one tick
/// (1–4 ms). A reading is kept as nanoseconds since the clock was made and
/// turned back into an [`Instant`](std::time::Instant) relative to a base
/// `Instant` taken at the same moment; the two clocks count the same
/// `CLOCK_MONOTONIC` time, so a converted reading is off by at most a tick.
/// Elsewhere (and under loom or Miri) it is `Instant::elapsed`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CoarseClock {
    base: std::time::Instant,
    #[cfg(all(target_os = "linux", not(loom), not(miri)))]
    base_nanos: u64,
}

impl CoarseClock {
    pub(crate) fn new() -> Self {
        CoarseClock {
            // The coarse base is read first, so it is at most the precise one.
            #[cfg(all(target_os = "linux", not(loom), not(miri)))]
            base_nanos: coarse_monotonic_nanos(),
            base: std::time::Instant::now(),
        }
    }

    /// Nanoseconds since this clock was made, to a tick's resolution.
    #[inline]
    pub(crate) fn ticks(&self) -> u64 {
        #[cfg(all(target_os = "linux", not(loom), not(miri)))]
        {
            coarse_monotonic_nanos().saturating_sub(self.base_nanos)
        }
        #[cfg(not(all(target_os = "linux", not(loom), not(miri))))]
        {
            self.base.elapsed().as_nanos() as u64
        }
    }

    /// The [`Instant`](std::time::Instant) a reading of [`ticks`](Self::ticks)
    /// stands for, on this clock's base: comparable with other readings of
    /// this clock, not with `Instant::now()`.
    #[inline]
    pub(crate) fn at(&self, ticks: u64) -> std::time::Instant {
        self.base + std::time::Duration::from_nanos(ticks)
    }

    /// The [`Instant`](std::time::Instant) a reading of [`ticks`](Self::ticks)
    /// stands for, never later than `now`.
    pub(crate) fn instant(&self, ticks: u64, now: std::time::Instant) -> std::time::Instant {
        self.at(ticks).min(now)
    }
}

#[cfg(all(target_os = "linux", not(loom), not(miri)))]
#[inline]
fn coarse_monotonic_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` that lives across the
    // call, and CLOCK_MONOTONIC_COARSE is a clock id every Linux since 2.6.32
    // knows. On the impossible failure `ts` stays zero, which only makes a
    // start time early.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts);
    }
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// A condition variable for the shim's [`Mutex`]: parking_lot's normally,
/// loom's in a model.
///
/// Under loom, [`wait_until`](Self::wait_until) waits for a notification
/// with no deadline (loom's `Condvar::wait_timeout` never times out, and a
/// model must not wait on the real clock): a protocol that could miss its
/// wake-up then shows up as a deadlock the model reports, instead of being
/// papered over by a timeout. Callers re-check their condition after every
/// return, as they must for spurious wake-ups anyway.
#[derive(Debug, Default)]
pub(crate) struct Condvar {
    #[cfg(not(loom))]
    inner: parking_lot::Condvar,
    #[cfg(loom)]
    inner: loom::sync::Condvar,
}

impl Condvar {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Releases `guard`'s lock and waits for a notification or `deadline`,
    /// then locks again. Returns the guard and `true` if it timed out (never
    /// under loom). May wake early.
    pub(crate) fn wait_until<'a, T>(
        &self,
        mut guard: MutexGuard<'a, T>,
        deadline: std::time::Instant,
    ) -> (MutexGuard<'a, T>, bool) {
        #[cfg(not(loom))]
        {
            let timed_out = self.inner.wait_until(&mut guard, deadline).timed_out();
            (guard, timed_out)
        }
        #[cfg(loom)]
        {
            let _ = deadline;
            // loom's Mutex poisons like std's; the critical sections around
            // this wait never panic, so a poisoned lock is a model bug.
            guard = self.inner.wait(guard).unwrap();
            (guard, false)
        }
    }

    /// Releases `guard`'s lock and waits for a notification with no
    /// deadline, then locks again. May wake early.
    pub(crate) fn wait<'a, T>(&self, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        #[cfg(not(loom))]
        {
            self.inner.wait(&mut guard);
            guard
        }
        #[cfg(loom)]
        {
            // As in `wait_until`: a poisoned lock is a model bug.
            guard = self.inner.wait(guard).unwrap();
            guard
        }
    }

    /// Wakes one waiter.
    pub(crate) fn notify_one(&self) {
        self.inner.notify_one();
    }

    /// Wakes every waiter.
    pub(crate) fn notify_all(&self) {
        self.inner.notify_all();
    }
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
