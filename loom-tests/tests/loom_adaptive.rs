//! Loom model of the adaptive controller's tick: the algorithm is taken out
//! of its slot under the lock, run under no lock, and put back.
//!
//! What it shows, under every interleaving loom explores:
//!
//! * two racing ticks never run the algorithm at once (the second finds
//!   the slot empty or the lock held, and returns `None` at once, without
//!   waiting);
//! * the algorithm is never lost: after the joins, a tick runs it again;
//! * a sample recorded by a third thread is counted once, in the window
//!   of whichever tick drained it or in the next.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p loom-tests --release`.
#![cfg(loom)]

use std::sync::Arc;
use std::time::Duration;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::thread;
use sidejob::adaptive::{Algorithm, Controller, Outcome, Window};
use sidejob::Limiter;

/// Counts who is inside `update`, and how many samples it has seen.
struct Watched {
    active: Arc<AtomicUsize>,
    runs: Arc<AtomicUsize>,
    samples: Arc<AtomicUsize>,
}

impl Algorithm for Watched {
    fn update(&mut self, window: &Window) -> usize {
        // SeqCst: test bookkeeping only, the strongest order for the check.
        let inside = self.active.fetch_add(1, Ordering::SeqCst);
        assert_eq!(inside, 0, "two ticks ran the algorithm at once");
        thread::yield_now();
        self.samples
            .fetch_add(window.samples() as usize, Ordering::SeqCst);
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.active.fetch_sub(1, Ordering::SeqCst);
        window.limit()
    }
}

#[test]
fn ticks_exclude_each_other_and_lose_nothing() {
    // A tick reads the limiter's stats and drains the sample cells, a few
    // dozen atomics: more branches than loom's default allows.
    let mut builder = loom::model::Builder::new();
    builder.max_branches = 100_000;
    builder.check(|| {
        let active = Arc::new(AtomicUsize::new(0));
        let runs = Arc::new(AtomicUsize::new(0));
        let samples = Arc::new(AtomicUsize::new(0));
        let limiter = Arc::new(Limiter::builder().capacity(2).shards(1).build().unwrap());
        let controller = Arc::new(
            Controller::builder()
                .min_samples(0)
                .interval(Duration::from_secs(3600))
                .build(
                    Arc::clone(&limiter),
                    Watched {
                        active: Arc::clone(&active),
                        runs: Arc::clone(&runs),
                        samples: Arc::clone(&samples),
                    },
                )
                .unwrap(),
        );
        let ticker = {
            let controller = Arc::clone(&controller);
            thread::spawn(move || controller.tick_at(Duration::from_secs(1)).is_some())
        };
        let recorder = {
            let controller = Arc::clone(&controller);
            thread::spawn(move || {
                controller.record_at(
                    Duration::from_secs(1),
                    Duration::from_millis(5),
                    Outcome::Success,
                )
            })
        };
        let here = controller.tick_at(Duration::from_secs(2)).is_some();
        let there = ticker.join().unwrap();
        recorder.join().unwrap();
        assert_eq!(
            runs.load(Ordering::SeqCst),
            usize::from(here) + usize::from(there)
        );
        // Put back: a later tick runs it, and the sample is counted once.
        assert!(controller.tick_at(Duration::from_secs(3)).is_some());
        assert_eq!(samples.load(Ordering::SeqCst), 1);
        assert_eq!(active.load(Ordering::SeqCst), 0);
    });
}
