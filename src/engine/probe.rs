//! Where a caller starts probing the shard table: its thread's index or its
//! CPU.
//!
//! Callers on different cores should start on different shards, so that
//! under load they touch different cache lines. Two ways to get there:
//!
//! * [`Probe::Thread`] (the default): every live thread holds a small index,
//!   handed out lowest-free-first and given back when the thread exits, so
//!   the live threads are spread evenly over the shards. Reading it is one
//!   thread-local load.
//! * [`Probe::Cpu`]: the CPU the thread runs on right now (`sched_getcpu`,
//!   answered by glibc from the kernel's rseq area), modulo the shard
//!   count. It follows migrations, and with at least as many shards as
//!   CPUs (the default: one shard per CPU) two threads on different cores
//!   never share a start shard; with fewer shards, CPU `c` starts at shard
//!   `c mod shards`, so cores whose numbers differ by a multiple of the
//!   shard count share one. It costs a call into libc on every admission.
//!
//! `benches/admission.rs` measures both; `PERFORMANCE.md` gives the numbers behind
//! the default.
//!
//! The thread index has a second job: it names the one thread allowed to
//! write a per-thread counter slot (`stats::RejectCounter`, and its home
//! shard's `refused_home`), so counting a
//! rejection needs no locked instruction. That is why indices are unique
//! among live threads and recycled through a lock-protected min-heap: the
//! lock hands a slot's last value from the exiting owner to the next one.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::sync::{const_thread_local, current_cpu, Mutex};

/// How a caller picks the shard it tries first.
///
/// Set with [`LimiterBuilder::probe`](crate::LimiterBuilder::probe) (and the
/// same setter on the pool and supervisor builders). Either way the caller
/// then walks the other shards in order, so the choice only affects speed,
/// never whether a request is admitted.
///
/// # Examples
///
/// ```
/// use sidejob::probe::Probe;
/// use sidejob::Limiter;
///
/// let limiter = Limiter::builder().capacity(8).shards(4).probe(Probe::Cpu).build()?;
/// assert!(limiter.try_acquire().is_ok());
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Probe {
    /// Start at the calling thread's index (one thread-local read).
    #[default]
    Thread,
    /// Start at the CPU the calling thread runs on, modulo the shard count
    /// (Linux `sched_getcpu`; elsewhere this falls back to the thread
    /// index). Threads on different cores start on different shards only
    /// when there are at least as many shards as CPUs.
    Cpu,
}

impl Probe {
    /// The raw start position; the table reduces it modulo its shard count.
    #[inline]
    pub(crate) fn start(self) -> usize {
        match self {
            Probe::Thread => thread_index(),
            Probe::Cpu => current_cpu().unwrap_or_else(thread_index),
        }
    }
}

/// Marks a thread that has not asked for an index yet.
const UNASSIGNED: usize = usize::MAX;
/// Marks a thread whose index was already given back (it is exiting, and
/// some thread-local destructor still admits work). Such a thread uses
/// `DYING_INDEX`, which is never handed out and so never owns a slot.
const DYING: usize = usize::MAX - 1;
/// The index a dying thread uses: larger than any slot count.
const DYING_INDEX: usize = usize::MAX >> 1;

const_thread_local! {
    static INDEX: std::cell::Cell<usize> = std::cell::Cell::new(UNASSIGNED);
}

/// The calling thread's index: unique among live threads, small, reused.
#[inline]
pub(crate) fn thread_index() -> usize {
    let index = INDEX.with(|cell| cell.get());
    if index < DYING {
        index
    } else {
        assign_index(index)
    }
}

/// The calling thread's index as stored: [`thread_index`] without the
/// check that it was assigned. Not assigned yet, or given back, it reads
/// `usize::MAX` or `usize::MAX - 1`, above any shard count and slot count:
/// so a caller that compares it against such a count first
/// (`Table::acquire`, `Table::count_refusal`) checks it for free, and calls
/// [`thread_index`] when it is not below.
#[inline(always)]
pub(crate) fn raw_thread_index() -> usize {
    INDEX.with(|cell| cell.get())
}

#[cold]
fn assign_index(current: usize) -> usize {
    if current == DYING {
        return DYING_INDEX;
    }
    let index = registry().take();
    INDEX.with(|cell| cell.set(index));
    // The guard's destructor gives the index back when the thread exits.
    // If the thread is already tearing down its thread-locals, the guard
    // cannot be registered: keep the index (a leak of one small number).
    //
    // Not under loom: a model tears down all of a thread's mock
    // thread-locals at once (INDEX may be gone before the guard runs), and
    // the main model thread's after the model's lazy statics (the registry)
    // are dropped. A model's registry lives for one execution, so there is
    // nothing to give back.
    #[cfg(not(loom))]
    let _ = GUARD.try_with(|_| ());
    index
}

/// Gives the thread's index back at thread exit.
#[cfg(not(loom))]
struct IndexGuard;

#[cfg(not(loom))]
impl Drop for IndexGuard {
    fn drop(&mut self) {
        let index = INDEX.with(|cell| cell.replace(DYING));
        if index < DYING {
            registry().give_back(index);
        }
    }
}

#[cfg(not(loom))]
const_thread_local! {
    static GUARD: IndexGuard = IndexGuard;
}

/// Hands out the lowest free index.
struct Registry {
    state: Mutex<RegistryState>,
}

#[derive(Default)]
struct RegistryState {
    /// The lowest index never handed out.
    next: usize,
    /// Indices given back, lowest on top: `take` and `give_back` are
    /// O(log n) under the lock, where a scan of a plain list was O(n) (and
    /// held the lock through it) with many threads exited.
    free: BinaryHeap<Reverse<usize>>,
}

impl Registry {
    fn take(&self) -> usize {
        let mut state = self.state.lock();
        // Lowest free first keeps indices dense, so per-thread slots stay
        // few and live threads spread evenly over the shards.
        if let Some(Reverse(index)) = state.free.pop() {
            return index;
        }
        let index = state.next;
        state.next += 1;
        index
    }

    // Only the thread-exit guard gives indices back, and it does not exist
    // under loom (see `assign_index`).
    #[cfg(not(loom))]
    fn give_back(&self, index: usize) {
        self.state.lock().free.push(Reverse(index));
    }
}

#[cfg(not(loom))]
fn registry() -> &'static Registry {
    static REGISTRY: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(|| Registry {
        state: Mutex::new(RegistryState::default()),
    })
}

#[cfg(loom)]
fn registry() -> &'static Registry {
    // A fresh registry per model execution keeps runs deterministic.
    loom::lazy_static! {
        static ref REGISTRY: Registry = Registry {
            state: Mutex::new(RegistryState::default()),
        };
    }
    &REGISTRY
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn index_is_stable_within_a_thread() {
        assert_eq!(thread_index(), thread_index());
    }

    #[test]
    fn live_threads_hold_distinct_indices() {
        use std::sync::{Arc, Barrier};
        let barrier = Arc::new(Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    let index = thread_index();
                    // Hold the index until every thread has taken one.
                    barrier.wait();
                    index
                })
            })
            .collect();
        let mut indices: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), 4);
    }

    /// Issue 7, item 7: indices given back by exiting threads are handed
    /// out again lowest first, whatever order the threads exited in. The
    /// threads use a registry of their own (the process-wide one is shared
    /// with every other test), taking on start and giving back on exit as
    /// `IndexGuard` does; channels fix the order of both.
    #[test]
    fn indices_come_back_lowest_first_after_threads_exit() {
        use std::sync::{mpsc, Arc};

        struct Holder(Arc<Registry>, usize);
        impl Drop for Holder {
            fn drop(&mut self) {
                self.0.give_back(self.1);
            }
        }

        let registry = Arc::new(Registry {
            state: Mutex::new(RegistryState::default()),
        });
        // Five threads take indices 0..5 in turn and hold them until told
        // to exit.
        let mut exits = Vec::new();
        let mut threads = Vec::new();
        for expected in 0..5 {
            let (taken_tx, taken_rx) = mpsc::channel();
            let (exit_tx, exit_rx) = mpsc::channel::<()>();
            let registry = Arc::clone(&registry);
            threads.push(std::thread::spawn(move || {
                let holder = Holder(Arc::clone(&registry), registry.take());
                taken_tx.send(holder.1).unwrap();
                exit_rx.recv().unwrap();
            }));
            assert_eq!(taken_rx.recv().unwrap(), expected);
            exits.push(exit_tx);
        }
        // Threads 3, 0 and 2 exit, in that order; each is joined before the
        // next is told to go.
        for index in [3, 0, 2] {
            exits[index].send(()).unwrap();
        }
        let mut threads: Vec<Option<_>> = threads.into_iter().map(Some).collect();
        for index in [3, 0, 2] {
            threads[index].take().unwrap().join().unwrap();
        }
        // New threads get 0, 2, 3 (lowest first), then a fresh 5.
        let taken: Vec<usize> = (0..4)
            .map(|_| {
                let registry = Arc::clone(&registry);
                // Each keeps its index: no Holder, nothing given back.
                std::thread::spawn(move || registry.take()).join().unwrap()
            })
            .collect();
        assert_eq!(taken, [0, 2, 3, 5]);
        for index in [1, 4] {
            exits[index].send(()).unwrap();
            threads[index].take().unwrap().join().unwrap();
        }
        assert_eq!(registry.take(), 1);
        assert_eq!(registry.take(), 4);
        assert_eq!(registry.take(), 6);
    }

    #[test]
    fn cpu_probe_gives_a_position() {
        // On Linux a CPU number, elsewhere the thread index: never a panic.
        let _ = Probe::Cpu.start();
        assert_eq!(Probe::Thread.start(), thread_index());
    }
}
