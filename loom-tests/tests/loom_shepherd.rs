//! Loom models of the shepherd's due line and its workers' sleep/wake
//! protocol (`src/shepherd/line.rs`).
//!
//! What they show, under every interleaving loom explores:
//!
//! * a worker never sleeps through a submit: a worker that found the line
//!   empty and a submitter that reserves and publishes meet, whichever
//!   order the worker's registration and the submitter's push take (a lost
//!   wake-up leaves the model deadlocked, which loom reports);
//! * two pushes, a submit and the timer's promotion of a delayed operation
//!   that became due, each reach a worker while two workers sleep: one
//!   wake per record, none lost;
//! * shutdown wakes every sleeping worker, and a submit racing it is either
//!   refused or taken by a worker before the workers leave (nothing is
//!   stranded on a closed line), a record stays counted until its worker
//!   finishes it, and the finish that empties a closed line lets every
//!   sleeper leave;
//! * the count is zero (the line idle) exactly once every record taken is
//!   finished;
//! * a worker that counts out in runs (takes the next record with
//!   `try_take` while it keeps the count-outs of those it finished, and
//!   makes them in one `finish_many` before its next `take`) strands
//!   nothing and keeps nobody: with a second worker asleep, a submit and
//!   a close racing, every record is taken once and both workers leave.
//!
//! The records are `usize` stand-ins: the completion (a oneshot, which
//! loom cannot see) stays out of the model; the line is the protocol.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p loom-tests --release --test loom_shepherd`
//! (CI uses 2).
#![cfg(loom)]

use std::sync::Arc;

use loom::thread;
use sidejob::loom_api::DueLine;

/// One worker, one submit: the worker's take ends with the record.
#[test]
fn a_worker_never_sleeps_through_a_submit() {
    loom::model(|| {
        let line = Arc::new(DueLine::new(1));
        let submitter = {
            let line = Arc::clone(&line);
            thread::spawn(move || {
                assert!(line.reserve(), "the line is open");
                line.publish(7);
            })
        };
        assert_eq!(line.take(0), Some(7));
        assert!(!line.is_idle(), "taken, not finished");
        assert!(line.finish(), "the last record open");
        submitter.join().unwrap();
        assert_eq!(line.open(), 0);
        assert!(line.is_idle());
        line.close();
        assert_eq!(line.take(0), None);
    });
}

/// Two workers each wait for one record; a submitter and the timer (the
/// main thread, promoting a delayed operation) push one each. Both workers
/// must wake: the two records go to two different takes.
#[test]
fn a_submit_and_a_promotion_wake_two_sleepers() {
    loom::model(|| {
        let line = Arc::new(DueLine::new(2));
        let workers: Vec<_> = (0..2)
            .map(|index| {
                let line = Arc::clone(&line);
                thread::spawn(move || {
                    let took = line.take(index);
                    if took.is_some() {
                        line.finish();
                    }
                    took
                })
            })
            .collect();
        let submitter = {
            let line = Arc::clone(&line);
            thread::spawn(move || assert!(line.push(1)))
        };
        assert!(line.push(2), "the timer's promotion");
        submitter.join().unwrap();
        let mut taken: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        taken.sort_unstable();
        assert_eq!(taken, [Some(1), Some(2)]);
        assert!(line.is_idle());
    });
}

/// Shutdown with two workers asleep (or about to be) and a submit racing
/// it: every worker leaves, and the submit was refused or taken.
#[test]
fn shutdown_wakes_every_worker_and_strands_nothing() {
    let mut builder = loom::model::Builder::new();
    // Four threads; a bound keeps CI's run short (3 locally is within it).
    builder.preemption_bound.get_or_insert(3);
    builder.check(|| {
        let line = Arc::new(DueLine::new(2));
        let workers: Vec<_> = (0..2)
            .map(|index| {
                let line = Arc::clone(&line);
                thread::spawn(move || {
                    let mut took = 0;
                    // A worker finishes what it took before it takes
                    // again; the other may sleep meanwhile, and must be
                    // let go by this finish if the line is closed.
                    while let Some(record) = line.take(index) {
                        assert_eq!(record, 5);
                        took += 1;
                        line.finish();
                    }
                    took
                })
            })
            .collect();
        let submitter = {
            let line = Arc::clone(&line);
            thread::spawn(move || line.push(5))
        };
        line.close();
        let accepted = submitter.join().unwrap();
        let took: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(took, usize::from(accepted), "a record taken iff accepted");
        assert!(line.is_idle(), "a refused reservation leaves nothing open");
        assert!(!line.push(6), "closed");
    });
}

/// Worker 0 counts out in runs (worker.rs's discipline); worker 1 counts
/// out each record as it finishes it. A submitter pushes one record while
/// the main thread pushes another and closes. Every accepted record is
/// taken exactly once, and both workers leave: the run's one decrement
/// that leaves the line closed and empty wakes a sleeper, and no worker
/// sleeps or leaves with a count-out still kept.
#[test]
fn a_worker_counting_out_in_runs_strands_nothing() {
    let mut builder = loom::model::Builder::new();
    // Four threads, as in the shutdown model.
    builder.preemption_bound.get_or_insert(3);
    builder.check(|| {
        let line = Arc::new(DueLine::new(2));
        let runner = {
            let line = Arc::clone(&line);
            thread::spawn(move || {
                let mut took = Vec::new();
                while let Some(record) = line.take(0) {
                    took.push(record);
                    let mut kept = 1;
                    while let Some(record) = line.try_take() {
                        took.push(record);
                        kept += 1;
                    }
                    line.finish_many(kept);
                }
                took
            })
        };
        let single = {
            let line = Arc::clone(&line);
            thread::spawn(move || {
                let mut took = Vec::new();
                while let Some(record) = line.take(1) {
                    took.push(record);
                    line.finish();
                }
                took
            })
        };
        let submitter = {
            let line = Arc::clone(&line);
            thread::spawn(move || line.push(1))
        };
        let second = line.push(2);
        line.close();
        let first = submitter.join().unwrap();
        let mut took = runner.join().unwrap();
        took.extend(single.join().unwrap());
        took.sort_unstable();
        let accepted: Vec<usize> = [(first, 1), (second, 2)]
            .iter()
            .filter(|(accepted, _)| *accepted)
            .map(|&(_, record)| record)
            .collect();
        assert_eq!(took, accepted, "each accepted record taken once");
        assert!(line.is_idle(), "every count-out made");
    });
}
