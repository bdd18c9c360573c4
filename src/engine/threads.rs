//! Worker threads: what the front-ends that start them share. How many
//! at most, how long a waiting thread spins before it parks, and the one
//! check of a builder's `workers` and `spin_wait`, so a thread pool and a
//! shepherd refuse the same settings with the same words.

use std::time::Duration;

use crate::error::ConfigError;

/// How long a waiting caller or an idle worker polls before parking, unless
/// the builder's `spin_wait` ([`PoolBuilder::spin_wait`](crate::PoolBuilder::spin_wait),
/// [`ShepherdBuilder::spin_wait`](crate::shepherd::ShepherdBuilder::spin_wait)) says
/// otherwise.
pub(crate) const DEFAULT_SPIN_WAIT: Duration = Duration::from_micros(50);

/// The longest `spin_wait` a pool or a shepherd accepts: 10 ms.
///
/// Spinning only pays while it is shorter than parking and being woken (a
/// futex round trip, 5–40 µs); past a millisecond or so it buys nothing.
/// Every worker spins this long after each request before it parks, and so
/// does every waiting caller: a budget much larger would keep an idle pool
/// burning a core per worker (with `Duration::MAX`, forever). 10 ms leaves
/// two orders of magnitude of room for experiments above the default and
/// bounds the cost of a mistake to one tick's worth of CPU per request.
pub(crate) const MAX_SPIN_WAIT: Duration = Duration::from_millis(10);

/// The most worker threads a thread pool ([`PoolBuilder::workers`](crate::PoolBuilder::workers)) or a
/// [`Shepherd`](crate::shepherd::Shepherd) ([`ShepherdBuilder::workers`](crate::shepherd::ShepherdBuilder::workers))
/// runs: 4096. Their builders refuse more with a [`ConfigError`] naming
/// `workers`, before starting any thread. An async pool's workers are
/// tasks, not threads: this does not limit them.
///
/// Why a limit at all: past a number of threads the OS will not give, std
/// does not always return an error, it can abort the process. Each thread
/// costs four memory mappings (its stack and guard page, and the signal
/// stack std sets up for it with its own guard page), and Linux allows a
/// process 65,530 (`vm.max_map_count`). The signal stack is mapped by the
/// new thread itself once it runs, after `spawn` returned `Ok`; when that
/// fails, std panics where it cannot unwind, and the process aborts
/// (measured: a program starting 20,000 threads aborts at about 16,370).
///
/// Why 4096: that many threads take 16,384 mappings, a quarter of Linux's
/// default, leaving the rest to the heap, the libraries and the program's
/// other threads and pools; they also reserve 8 GiB of address space at
/// std's 2 MiB stacks. And a pool of thousands of OS threads is not what
/// this crate is for: a thread pool's workers run blocking or CPU-bound
/// handlers and are sized to the cores (one per shard); for thousands of
/// I/O-bound handlers, use an async pool, whose workers are tasks.
pub(crate) const MAX_WORKERS: usize = 4096;

/// A builder's `workers` setting, checked: the number of CPUs when unset
/// (capped at [`MAX_WORKERS`], so a default is never refused). Checked
/// before any thread starts: too many threads abort the process instead of
/// failing `spawn` (see [`MAX_WORKERS`]).
///
/// # Errors
///
/// [`ConfigError`] naming `workers` when it is 0 or above [`MAX_WORKERS`].
pub(crate) fn workers(setting: Option<usize>) -> Result<usize, ConfigError> {
    let workers = setting.unwrap_or_else(|| num_cpus::get().min(MAX_WORKERS));
    if workers == 0 {
        return Err(ConfigError::zero("workers"));
    }
    if workers > MAX_WORKERS {
        return Err(ConfigError::too_large("workers", MAX_WORKERS));
    }
    Ok(workers)
}

/// A builder's `spin_wait` setting, checked: [`DEFAULT_SPIN_WAIT`] when
/// unset.
///
/// # Errors
///
/// [`ConfigError`] naming `spin_wait` when it is above [`MAX_SPIN_WAIT`].
pub(crate) fn spin_wait(setting: Option<Duration>) -> Result<Duration, ConfigError> {
    let spin = setting.unwrap_or(DEFAULT_SPIN_WAIT);
    if spin > MAX_SPIN_WAIT {
        return Err(ConfigError::too_long("spin_wait", MAX_SPIN_WAIT));
    }
    Ok(spin)
}
