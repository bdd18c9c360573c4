//! Many threads submit operations that fail (and panic) at random: every
//! handle resolves exactly once, no attempt starts after its operation was
//! reported done, each operation succeeds at most once, attempts never
//! exceed the policy's maximum, and the capacity bound holds throughout.
//! Some handles are dropped at once and some once their outcome is in,
//! unread: every unit still comes back (a unit travels with its outcome and
//! goes back wherever the outcome is dropped).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use sidejob::shepherd::{Completion, Failure, Handler, RetryPolicy, Shepherd};

const THREADS: usize = 4;
const PER_THREAD: usize = 300;
const OPS: usize = THREADS * PER_THREAD;
const CAPACITY: usize = 24;
const MAX_ATTEMPTS: u32 = 4;

/// Per operation: what the workers saw.
#[derive(Default)]
struct Book {
    done: AtomicBool,
    runs: AtomicU32,
    successes: AtomicU32,
}

struct Ledger {
    books: Vec<Book>,
    /// Attempts that started after their operation was reported done, or
    /// beyond the maximum.
    violations: AtomicUsize,
}

struct Chaos {
    ledger: Arc<Ledger>,
}

/// A deterministic coin per (op, attempt): ~30 % errors, ~5 % panics.
fn roll(op: usize, attempt: u32) -> u64 {
    let mut x = (op as u64) << 8 | u64::from(attempt);
    x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    x % 100
}

impl Handler for Chaos {
    type Op = usize;
    type Output = usize;
    type Error = u32;
    fn handle(&mut self, op: &usize, attempt: u32) -> Result<usize, u32> {
        let book = &self.ledger.books[*op];
        if book.done.load(SeqCst) || attempt > MAX_ATTEMPTS {
            self.ledger.violations.fetch_add(1, SeqCst);
        }
        book.runs.fetch_add(1, SeqCst);
        match roll(*op, attempt) {
            0..=4 => panic!("chaos"),
            5..=34 => Err(attempt),
            _ => {
                book.successes.fetch_add(1, SeqCst);
                Ok(*op)
            }
        }
    }
}

#[test]
fn random_failures_every_handle_resolves_once_and_the_bound_holds() {
    run(None);
}

/// The same with an attempt timeout far beyond any attempt: the workers
/// then keep each record in their slot, where the timer could take it, and
/// share the operation (the other path of `worker.rs`).
#[test]
fn with_an_attempt_timeout_the_slot_path_holds_too() {
    run(Some(Duration::from_secs(3600)));
}

fn run(attempt_timeout: Option<Duration>) {
    // The handlers' panics are expected; keep the output readable.
    std::panic::set_hook(Box::new(|_| {}));
    let ledger = Arc::new(Ledger {
        books: (0..OPS).map(|_| Book::default()).collect(),
        violations: AtomicUsize::new(0),
    });
    let shepherd = {
        let ledger = Arc::clone(&ledger);
        let mut builder = Shepherd::builder();
        if let Some(timeout) = attempt_timeout {
            builder.attempt_timeout(timeout);
        }
        builder
            .capacity(CAPACITY)
            .workers(3)
            .shards(2)
            .retry(
                RetryPolicy::new()
                    .max_attempts(MAX_ATTEMPTS)
                    .backoff(Duration::ZERO, Duration::from_micros(200))
                    // No budget: every operation may reach the maximum.
                    .budget(None),
            )
            .build(move |_| Chaos {
                ledger: Arc::clone(&ledger),
            })
            .unwrap()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let over_bound = Arc::new(AtomicUsize::new(0));
    let monitor = {
        let (shepherd, stop, over_bound) = (shepherd.clone(), stop.clone(), over_bound.clone());
        thread::spawn(move || {
            while !stop.load(SeqCst) {
                if shepherd.usage() > CAPACITY {
                    over_bound.fetch_add(1, SeqCst);
                }
                thread::yield_now();
            }
        })
    };
    let succeeded = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let abandoned = Arc::new(AtomicU64::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let submitters: Vec<_> = (0..THREADS)
        .map(|t| {
            let (shepherd, ledger, start) = (shepherd.clone(), ledger.clone(), start.clone());
            let (succeeded, failed, rejected, abandoned) = (
                succeeded.clone(),
                failed.clone(),
                rejected.clone(),
                abandoned.clone(),
            );
            thread::spawn(move || {
                start.wait();
                let mut pending: VecDeque<(usize, Completion<usize, u32>)> = VecDeque::new();
                // Handles left unread, dropped later: at most two a thread,
                // as an unread outcome holds its unit.
                let mut unread: VecDeque<Completion<usize, u32>> = VecDeque::new();
                let settle = |op: usize, outcome: Result<usize, Failure<u32>>| {
                    // Reported done: from here no attempt may start.
                    ledger.books[op].done.store(true, SeqCst);
                    match outcome {
                        Ok(value) => {
                            assert_eq!(value, op);
                            succeeded.fetch_add(1, SeqCst);
                        }
                        Err(failure) => {
                            assert!(failure.attempts() >= 1 && failure.attempts() <= MAX_ATTEMPTS);
                            failed.fetch_add(1, SeqCst);
                        }
                    }
                };
                for op in t * PER_THREAD..(t + 1) * PER_THREAD {
                    let mut op_value = op;
                    loop {
                        match shepherd.submit(op_value) {
                            Ok(done) => {
                                match op % 8 {
                                    // Dropped at once: its unit comes back
                                    // when its outcome is sent.
                                    5 => {
                                        abandoned.fetch_add(1, SeqCst);
                                        drop(done);
                                    }
                                    // Dropped later, unread.
                                    6 => {
                                        abandoned.fetch_add(1, SeqCst);
                                        unread.push_back(done);
                                        if unread.len() > 2 {
                                            drop(unread.pop_front());
                                        }
                                    }
                                    _ => pending.push_back((op, done)),
                                }
                                break;
                            }
                            Err(refused) => {
                                assert!(refused.is_overload());
                                rejected.fetch_add(1, SeqCst);
                                op_value = refused.into_inner();
                                // Full: wait for our oldest, if we have one.
                                match pending.pop_front() {
                                    Some((old, done)) => settle(old, done.wait()),
                                    None => thread::yield_now(),
                                }
                            }
                        }
                    }
                }
                for (op, done) in pending {
                    settle(op, done.wait());
                }
                drop(unread);
            })
        })
        .collect();
    for submitter in submitters {
        submitter.join().unwrap();
    }
    stop.store(true, SeqCst);
    monitor.join().unwrap();
    assert!(shepherd.wait_idle(Duration::from_secs(20)));
    let _ = std::panic::take_hook();

    let stats = shepherd.stats();
    let (ok, bad) = (succeeded.load(SeqCst), failed.load(SeqCst));
    let abandoned = abandoned.load(SeqCst);
    assert!(abandoned > 0);
    assert_eq!(ok + bad + abandoned, OPS as u64, "every handle resolved");
    assert_eq!(
        stats.succeeded + stats.failed,
        OPS as u64,
        "every operation completed, read or not"
    );
    assert!(stats.succeeded >= ok && stats.failed >= bad);
    assert_eq!(stats.admission.accepted, OPS as u64);
    assert_eq!(stats.admission.rejected, rejected.load(SeqCst));
    assert_eq!(over_bound.load(SeqCst), 0, "usage went above the capacity");
    assert!(stats.admission.peak_usage <= CAPACITY);
    assert_eq!(shepherd.usage(), 0, "every unit came back, read or not");
    assert_eq!(
        ledger.violations.load(SeqCst),
        0,
        "an attempt ran after done or past the maximum"
    );
    let runs: u64 = ledger
        .books
        .iter()
        .map(|b| u64::from(b.runs.load(SeqCst)))
        .sum();
    assert_eq!(runs, stats.attempts);
    let successes: u64 = ledger
        .books
        .iter()
        .map(|b| u64::from(b.successes.load(SeqCst)))
        .sum();
    assert_eq!(
        successes, stats.succeeded,
        "each operation succeeded at most once, and only the reported ones"
    );
    assert!(ledger.books.iter().all(|b| b.successes.load(SeqCst) <= 1));
    assert!(
        stats.retries > 0 && stats.panicked > 0,
        "the chaos happened"
    );
    println!(
        "{OPS} ops: {ok} ok, {bad} failed, {} attempts, {} retries, {} panics, {} budget refusals, {} overloads",
        stats.attempts, stats.retries, stats.panicked, stats.budget_refused, stats.admission.rejected
    );
}
