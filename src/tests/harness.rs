//! What the proptest models share: the even split and the admission walk
//! they predict with, the counters they keep and check against `Stats`,
//! the gated pool the pool models drive, and the quiet ways to crash a
//! handler or a child.
//!
//! A model is a `run(…, actions)` that applies each action to the real
//! front-end and to a plain model of it, then checks that they agree
//! (`check`); each model's own file says which properties that proves.
//! The case counts stay with each model's `proptest!` block: they are
//! weighed against CI's time one by one.

use std::panic::{self, AssertUnwindSafe};
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvError, Sender};
use proptest::prelude::*;

use crate::{Pool, Stats, Worker};

/// The limits `capacity` splits into over `shards` shards: `capacity /
/// shards` each, the first `capacity % shards` one more. Written out here,
/// not taken from the crate, so the models check the crate's split.
pub(crate) fn even_split(capacity: usize, shards: usize) -> Vec<usize> {
    (0..shards)
        .map(|i| capacity / shards + usize::from(i < capacity % shards))
        .collect()
}

/// The shard that admits a caller whose walk starts at `start`: the first,
/// walking `start, start + 1, …` and wrapping once over `shards` shards,
/// that `has_room`; `None` means `Overload`.
pub(crate) fn walk(start: usize, shards: usize, has_room: impl Fn(usize) -> bool) -> Option<usize> {
    (0..shards)
        .map(|step| (start % shards + step) % shards)
        .find(|&shard| has_room(shard))
}

/// Each shard's usage, as `Stats` reads it.
pub(crate) fn shard_usage(stats: &Stats) -> Vec<usize> {
    stats.shards.iter().map(|s| s.usage).collect()
}

/// Each shard's limit, as `Stats` reads it.
pub(crate) fn shard_limits(stats: &Stats) -> Vec<usize> {
    stats.shards.iter().map(|s| s.limit).collect()
}

/// The counters every model keeps, and checks against the front-end's.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) accepted: u64,
    pub(crate) rejected: u64,
    pub(crate) completed: u64,
    pub(crate) panicked: u64,
}

impl Counts {
    /// The front-end's counters equal the model's.
    pub(crate) fn check(&self, stats: &Stats) -> Result<(), TestCaseError> {
        prop_assert_eq!(stats.accepted, self.accepted);
        prop_assert_eq!(stats.rejected, self.rejected);
        prop_assert_eq!(stats.completed, self.completed);
        prop_assert_eq!(stats.panicked, self.panicked);
        Ok(())
    }
}

/// What a handler blocked at its gate is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Go {
    Finish,
    Crash,
}

impl Go {
    pub(crate) fn crash_if(crash: bool) -> Go {
        if crash {
            Go::Crash
        } else {
            Go::Finish
        }
    }

    /// Does what the gate said: a crash unwinds, through `resume_unwind`,
    /// which skips the panic hook, so the output stays quiet.
    pub(crate) fn obey(told: Result<Go, RecvError>) {
        if told == Ok(Go::Crash) {
            panic::resume_unwind(Box::new("told to crash"));
        }
    }
}

/// A pool whose handlers wait at gates, and the gates. The fields drop in
/// order: if a check fails half-way, workers are still waiting at their
/// gates, and closing the gates first lets the pool's drop drain instead
/// of hang.
pub(crate) struct GatedPool<W: Worker> {
    pub(crate) gates: Vec<Sender<Go>>,
    pub(crate) pool: Pool<W>,
}

/// How long a model waits for what must happen: a hang is a failure,
/// never a pass, and never a measure of speed.
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

/// Polls until `done` holds; a hang is a failure, never a pass.
pub(crate) fn wait_until(mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "the pool never got there");
        std::thread::yield_now();
    }
}

/// Drops `held` while unwinding (`resume_unwind`, which skips the panic
/// hook, so the output stays quiet): a guard drops with
/// `thread::panicking()` true, as in a child that crashed. Whether it
/// unwound.
pub(crate) fn drop_unwinding<T>(held: T) -> bool {
    panic::catch_unwind(AssertUnwindSafe(move || {
        let _held = held;
        panic::resume_unwind(Box::new("child crashed"));
    }))
    .is_err()
}
