//! The shepherd's public behaviour: attempts, retries and their delays
//! (on a manual clock, never by sleeping), final failures, panics, delayed
//! operations, capacity, attempt timeouts, the budget, the alarm, and
//! shutdown.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sidejob::observe::Alarm;
use sidejob::shepherd::{
    Completion, Failure, Handler, Jitter, LastAttempt, ManualClock, Reason, Recovery, RetryBudget,
    RetryPolicy, Shepherd, UnitRelease,
};
use sidejob::Error;

mod common;
use common::{current_thread, poll_once};

/// A guard for waits that must end: a test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

/// Every attempt's op, number and clock time.
type Seen = Arc<Mutex<Vec<(u32, u32, Option<Instant>)>>>;

/// Fails attempts before `succeed_at`, then answers the op; records every
/// attempt's number and clock time; counts builds.
struct Script {
    succeed_at: u32,
    clock: Option<ManualClock>,
    seen: Seen,
}

impl Handler for Script {
    type Op = u32;
    type Output = u32;
    type Error = u32;
    fn handle(&mut self, op: &u32, attempt: u32) -> Result<u32, u32> {
        let at = self.clock.as_ref().map(ManualClock::now);
        self.seen.lock().unwrap().push((*op, attempt, at));
        if attempt < self.succeed_at {
            Err(attempt)
        } else {
            Ok(*op)
        }
    }
}

fn script(
    succeed_at: u32,
    clock: Option<ManualClock>,
) -> (impl Fn(usize) -> Script + Send + Sync, Seen) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let shared = Arc::clone(&seen);
    let factory = move |_| Script {
        succeed_at,
        clock: clock.clone(),
        seen: Arc::clone(&shared),
    };
    (factory, seen)
}

fn no_backoff(attempts: u32) -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(attempts)
        .backoff(Duration::ZERO, Duration::ZERO)
        .budget(None)
}

#[test]
fn succeeds_on_the_first_attempt() {
    let (factory, seen) = script(1, None);
    let shepherd = Shepherd::builder()
        .capacity(4)
        .workers(2)
        .build(factory)
        .unwrap();
    assert_eq!(shepherd.submit(7).unwrap().wait(), Ok(7));
    assert!(shepherd.wait_idle(PATIENCE));
    let stats = shepherd.stats();
    assert_eq!(
        (stats.attempts, stats.retries, stats.succeeded, stats.failed),
        (1, 0, 1, 0)
    );
    assert_eq!(stats.processed, 1);
    assert_eq!(stats.admission.usage, 0);
    assert_eq!(seen.lock().unwrap().as_slice(), &[(7, 1, None)]);
}

#[test]
fn succeeds_on_the_third_attempt_with_delays_inside_the_policy() {
    let clock = ManualClock::new();
    let (factory, seen) = script(3, Some(clock.clone()));
    let policy = RetryPolicy::new()
        .max_attempts(5)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .budget(None);
    let shepherd = Shepherd::builder()
        .capacity(4)
        .workers(1)
        .retry(policy)
        .clock(clock.clone())
        .seed(42)
        .build(factory)
        .unwrap();
    let start = clock.now();
    let done = shepherd.submit(9).unwrap();
    let mut delays = Vec::new();
    for failures in 1..=2 {
        assert!(shepherd.wait_idle(PATIENCE));
        let stats = shepherd.stats();
        assert_eq!((stats.delayed, stats.due, stats.running), (1, 0, 0));
        let delay = stats.next_due.expect("a retry is scheduled") - clock.now();
        let (low, high) = policy.delay_bounds(failures);
        assert!(
            low <= delay && delay <= high,
            "{delay:?} not in [{low:?}, {high:?}]"
        );
        delays.push(delay);
        // Not a nanosecond early.
        if let Some(early) = delay.checked_sub(Duration::from_nanos(1)) {
            clock.advance(early);
            assert!(shepherd.wait_idle(PATIENCE));
            assert_eq!(shepherd.stats().attempts, u64::from(failures));
            clock.advance(delay - early);
        }
    }
    assert_eq!(done.wait(), Ok(9));
    let seen = seen.lock().unwrap().clone();
    let attempts: Vec<u32> = seen.iter().map(|s| s.1).collect();
    assert_eq!(attempts, [1, 2, 3]);
    // Each attempt ran exactly when its delay ended, on the shepherd's clock.
    let times: Vec<Instant> = seen.iter().map(|s| s.2.unwrap()).collect();
    assert_eq!(times[0], start);
    assert_eq!(times[1] - times[0], delays[0]);
    assert_eq!(times[2] - times[1], delays[1]);
    let stats = shepherd.stats();
    assert_eq!((stats.attempts, stats.retries, stats.succeeded), (3, 2, 1));
}

#[test]
fn the_same_seed_draws_the_same_delays() {
    let run = |seed| {
        let clock = ManualClock::new();
        let (factory, _) = script(2, None);
        let shepherd = Shepherd::builder()
            .capacity(1)
            .workers(1)
            .retry(RetryPolicy::new().budget(None))
            .clock(clock.clone())
            .seed(seed)
            .build(factory)
            .unwrap();
        let _done = shepherd.submit(1).unwrap();
        assert!(shepherd.wait_idle(PATIENCE));
        shepherd.stats().next_due.unwrap() - clock.now()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn final_failure_carries_the_last_error_and_the_attempt_count() {
    let (factory, seen) = script(u32::MAX, None);
    let shepherd = Shepherd::builder()
        .capacity(4)
        .workers(2)
        .retry(no_backoff(3))
        .build(factory)
        .unwrap();
    let failure = shepherd.submit(5).unwrap().wait().unwrap_err();
    assert_eq!(failure.reason(), Reason::Exhausted);
    assert_eq!(failure.attempts(), 3);
    assert_eq!(failure.last_error(), Some(&3)); // the third attempt's error
    assert_eq!(failure.error(), None);
    assert_eq!(failure.to_string(), "gave up after 3 attempts: 3");
    assert_eq!(seen.lock().unwrap().len(), 3);
    let stats = shepherd.stats();
    assert_eq!((stats.failed, stats.succeeded, stats.retries), (1, 0, 2));
    assert_eq!(shepherd.usage(), 0);
}

/// Fails with a permanent error; asks to be rebuilt after each failure.
struct Permanent;

impl Handler for Permanent {
    type Op = ();
    type Output = ();
    type Error = &'static str;
    fn handle(&mut self, _: &(), _: u32) -> Result<(), &'static str> {
        Err("no such row")
    }
    fn is_retryable(&self, _: &&'static str) -> bool {
        false
    }
    fn recover(&mut self, _: &&'static str) -> Recovery {
        Recovery::Rebuild
    }
}

#[test]
fn an_error_the_handler_calls_final_is_not_retried_and_recovery_rebuilds() {
    let builds = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&builds);
    let shepherd = Shepherd::builder()
        .capacity(2)
        .workers(1)
        .retry(no_backoff(5))
        .build(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            Permanent
        })
        .unwrap();
    let failure = shepherd.submit(()).unwrap().wait().unwrap_err();
    assert_eq!(
        (failure.reason(), failure.attempts()),
        (Reason::NotRetryable, 1)
    );
    assert_eq!(failure.into_last_error(), Some("no such row"));
    shepherd.shutdown();
    assert_eq!(builds.load(Ordering::SeqCst), 2, "built once, rebuilt once");
}

/// Panics on attempts listed in `panic_on`.
struct Panicky {
    panic_on: Vec<u32>,
}

impl Handler for Panicky {
    type Op = u32;
    type Output = u32;
    type Error = ();
    fn handle(&mut self, op: &u32, attempt: u32) -> Result<u32, ()> {
        if self.panic_on.contains(&attempt) {
            panic!("attempt {attempt} panics");
        }
        Ok(*op)
    }
}

#[test]
fn panics_are_retried_and_rebuild_the_worker() {
    let builds = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&builds);
    let shepherd = Shepherd::builder()
        .capacity(2)
        .workers(1)
        .retry(no_backoff(3))
        .build(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            Panicky {
                panic_on: vec![1, 2],
            }
        })
        .unwrap();
    assert_eq!(shepherd.submit(4).unwrap().wait(), Ok(4));
    let stats = shepherd.stats();
    assert_eq!((stats.attempts, stats.panicked, stats.succeeded), (3, 2, 1));
    shepherd.shutdown();
    assert_eq!(builds.load(Ordering::SeqCst), 3, "two restarts");
}

#[test]
fn a_panic_not_retried_is_a_final_failure() {
    let shepherd = Shepherd::builder()
        .capacity(2)
        .workers(1)
        .retry(no_backoff(3).retry_panics(false))
        .build(|_| Panicky { panic_on: vec![1] })
        .unwrap();
    let failure = shepherd.submit(1).unwrap().wait().unwrap_err();
    assert_eq!(failure.reason(), Reason::NotRetryable);
    assert_eq!(failure.last(), &LastAttempt::Panicked);
    assert_eq!(failure.error(), Some(Error::WorkerPanicked));
    assert_eq!(shepherd.stats().admission.panicked, 1);
}

#[test]
fn a_factory_that_panics_fails_attempts_without_killing_the_worker() {
    let builds = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&builds);
    let shepherd = Shepherd::builder()
        .capacity(2)
        .workers(1)
        .retry(no_backoff(3))
        .build(move |_| {
            // The first two builds panic; the third works.
            if counted.fetch_add(1, Ordering::SeqCst) < 2 {
                panic!("cannot connect");
            }
            Panicky { panic_on: vec![] }
        })
        .unwrap();
    assert_eq!(shepherd.submit(3).unwrap().wait(), Ok(3));
    assert_eq!(shepherd.stats().panicked, 1, "the attempt with no handler");
}

#[test]
fn submit_after_is_not_run_before_its_delay() {
    let clock = ManualClock::new();
    let (factory, seen) = script(1, Some(clock.clone()));
    let shepherd = Shepherd::builder()
        .capacity(4)
        .workers(2)
        .clock(clock.clone())
        .build(factory)
        .unwrap();
    let start = clock.now();
    let done = shepherd.submit_after(3, Duration::from_secs(5)).unwrap();
    let stats = shepherd.stats();
    assert_eq!(
        (stats.delayed, stats.due, stats.next_due),
        (1, 0, Some(start + Duration::from_secs(5)))
    );
    clock.advance(Duration::from_millis(4_999));
    assert!(shepherd.wait_idle(PATIENCE));
    assert!(seen.lock().unwrap().is_empty(), "ran before its delay");
    let done = done.try_wait().unwrap_err();
    clock.advance(Duration::from_millis(1));
    assert_eq!(done.wait(), Ok(3));
    assert_eq!(
        seen.lock().unwrap()[0].2,
        Some(start + Duration::from_secs(5))
    );
}

#[test]
fn capacity_counts_delayed_and_retrying_operations() {
    let clock = ManualClock::new();
    let (factory, _) = script(2, None);
    let shepherd = Shepherd::builder()
        .capacity(2)
        .workers(2)
        .clock(clock.clone())
        .retry(
            RetryPolicy::new()
                .backoff(Duration::from_secs(1), Duration::from_secs(1))
                .jitter(Jitter::None),
        )
        .build(factory)
        .unwrap();
    let delayed = shepherd.submit_after(1, Duration::from_secs(3600)).unwrap();
    let retrying = shepherd.submit(2).unwrap(); // fails once, retries in 1 s
    assert!(shepherd.wait_idle(PATIENCE));
    let stats = shepherd.stats();
    assert_eq!((stats.delayed, stats.running, stats.due), (2, 0, 0));
    assert_eq!(shepherd.usage(), 2);
    let refused = shepherd.submit(3).unwrap_err();
    assert!(refused.is_overload());
    assert_eq!(refused.into_inner(), 3);
    clock.advance(Duration::from_secs(1));
    assert_eq!(retrying.wait(), Ok(2));
    assert_eq!(shepherd.usage(), 1, "released before the handle resolved");
    // The freed unit admits again at once.
    let again = shepherd.submit(4).unwrap();
    assert!(shepherd.wait_idle(PATIENCE));
    assert_eq!(
        shepherd.stats().delayed,
        2,
        "the new one waits for its retry"
    );
    shepherd.shutdown();
    assert!(delayed.wait().unwrap_err().is_shutdown());
    let failure = again.wait().unwrap_err();
    assert_eq!(
        (failure.reason(), failure.attempts()),
        (Reason::Shutdown, 1)
    );
    assert_eq!(failure.last_error(), Some(&1));
    assert_eq!(shepherd.stats().admission.peak_usage, 2);
}

/// Blocks each attempt on a gate the test opens (for [`PATIENCE`] at
/// most); reports each start.
struct Gated {
    gate: Arc<Mutex<mpsc::Receiver<()>>>,
    started: mpsc::Sender<(u32, u32)>,
    fail_first: bool,
}

impl Handler for Gated {
    type Op = u32;
    type Output = u32;
    type Error = &'static str;
    fn handle(&mut self, op: &u32, attempt: u32) -> Result<u32, &'static str> {
        let _ = self.started.send((*op, attempt));
        // Bounded: if a test fails while an attempt waits here, the
        // shepherd's drop (which joins its workers) still ends.
        let _ = self.gate.lock().unwrap().recv_timeout(PATIENCE);
        if self.fail_first && attempt == 1 {
            Err("first attempt fails")
        } else {
            Ok(*op)
        }
    }
}

/// Each attempt's op and number, as it starts.
type Starts = mpsc::Receiver<(u32, u32)>;

fn gated(
    fail_first: bool,
) -> (
    impl Fn(usize) -> Gated + Send + Sync,
    mpsc::Sender<()>,
    Starts,
) {
    let (open, gate) = mpsc::channel();
    let gate = Arc::new(Mutex::new(gate));
    let (started, starts) = mpsc::channel();
    let factory = move |_| Gated {
        gate: Arc::clone(&gate),
        started: started.clone(),
        fail_first,
    };
    (factory, open, starts)
}

#[test]
fn a_retry_without_backoff_runs_on_its_worker_before_newer_operations() {
    let (factory, open, starts) = gated(true);
    let shepherd = Shepherd::builder()
        .capacity(4)
        .workers(1)
        .retry(no_backoff(2))
        .build(factory)
        .unwrap();
    let first = shepherd.submit(1).unwrap();
    assert_eq!(starts.recv_timeout(PATIENCE), Ok((1, 1)));
    // Due behind the first while its first attempt runs (and fails).
    let second = shepherd.submit(2).unwrap();
    for _ in 0..4 {
        open.send(()).unwrap();
    }
    assert_eq!(first.wait(), Ok(1));
    assert_eq!(second.wait(), Ok(2));
    let order: Vec<_> = (0..3)
        .map(|_| starts.recv_timeout(PATIENCE).unwrap())
        .collect();
    // The retry of 1 comes before 2, not behind it on the line.
    assert_eq!(order, [(1, 2), (2, 1), (2, 2)]);
    let stats = shepherd.stats();
    assert_eq!((stats.attempts, stats.retries, stats.succeeded), (4, 2, 2));
    assert_eq!(shepherd.usage(), 0);
}

/// A worker that finds the next operation on the line keeps the
/// count-outs of those it completed for a run (one RMW per run on the
/// line's shared word): the `due` figure must leave them out, and
/// `wait_idle` must still see the shepherd idle once the line runs dry.
#[test]
fn the_due_figure_leaves_out_completions_a_worker_keeps_for_a_run() {
    let (factory, open, starts) = gated(false);
    let shepherd = Shepherd::builder()
        .capacity(8)
        .workers(1)
        .build(factory)
        .unwrap();
    let first = shepherd.submit(1).unwrap();
    assert_eq!(starts.recv_timeout(PATIENCE), Ok((1, 1)));
    let mut handles: Vec<_> = (2..=6).map(|op| shepherd.submit(op).unwrap()).collect();
    handles.insert(0, first);
    // Ops 1 to 4 complete; the worker takes each next one from the line
    // at once, so it keeps their four count-outs, and is in op 5 now.
    for op in 2..=5 {
        open.send(()).unwrap();
        assert_eq!(starts.recv_timeout(PATIENCE), Ok((op, 1)));
    }
    let rest = handles.split_off(4);
    for (op, done) in (1..).zip(handles) {
        assert_eq!(done.wait(), Ok(op));
    }
    let stats = shepherd.stats();
    assert_eq!(
        (stats.due, stats.running, stats.busy),
        (1, 1, 1),
        "{stats:?}"
    );
    assert_eq!((stats.succeeded, shepherd.usage()), (4, 2));
    assert!(
        !shepherd.wait_idle(Duration::ZERO),
        "op 5 runs, op 6 is due"
    );
    open.send(()).unwrap();
    open.send(()).unwrap();
    for (op, done) in (5..).zip(rest) {
        assert_eq!(done.wait(), Ok(op));
    }
    assert!(shepherd.wait_idle(PATIENCE), "the run is counted out");
    let stats = shepherd.stats();
    assert_eq!((stats.due, stats.running, stats.succeeded), (0, 0, 6));
}

#[test]
fn shutdown_resolves_every_handle() {
    let clock = ManualClock::new();
    let (factory, open, starts) = gated(true);
    let shepherd = Shepherd::builder()
        .capacity(8)
        .workers(1)
        .clock(clock.clone())
        .retry(
            RetryPolicy::new()
                .max_attempts(3)
                .backoff(Duration::from_secs(1), Duration::from_secs(1))
                .jitter(Jitter::None),
        )
        .build(factory)
        .unwrap();
    // 1 fails its first attempt and waits for its retry.
    let retrying = shepherd.submit(1).unwrap();
    assert_eq!(starts.recv_timeout(PATIENCE), Ok((1, 1)));
    open.send(()).unwrap();
    assert!(shepherd.wait_idle(PATIENCE));
    // 2 runs (blocked at the gate); 3 is due behind it; 4 is delayed.
    let running = shepherd.submit(2).unwrap();
    assert_eq!(starts.recv_timeout(PATIENCE), Ok((2, 1)));
    let queued = shepherd.submit(3).unwrap();
    let delayed = shepherd.submit_after(4, Duration::from_secs(60)).unwrap();
    let stats = shepherd.stats();
    assert_eq!((stats.running, stats.due, stats.delayed), (1, 1, 2));

    let stopper = {
        let shepherd = shepherd.clone();
        thread::spawn(move || shepherd.shutdown())
    };
    // Not yet due: completed with `Shutdown` at once, while 2 still runs.
    let failure = retrying.wait().unwrap_err();
    assert_eq!(
        (failure.reason(), failure.attempts()),
        (Reason::Shutdown, 1)
    );
    assert_eq!(failure.last_error(), Some(&"first attempt fails"));
    let failure = delayed.wait().unwrap_err();
    assert_eq!(
        (failure.reason(), failure.attempts(), failure.last()),
        (Reason::Shutdown, 0, &LastAttempt::None)
    );
    assert_eq!(failure.error(), Some(Error::Shutdown));
    assert_eq!(shepherd.submit(5).unwrap_err().error(), Error::Shutdown);
    // Due ones still run: 2 fails its first attempt, which is final now.
    open.send(()).unwrap();
    let failure = running.wait().unwrap_err();
    assert_eq!(
        (failure.reason(), failure.attempts()),
        (Reason::Shutdown, 1)
    );
    assert_eq!(starts.recv_timeout(PATIENCE), Ok((3, 1)));
    open.send(()).unwrap();
    let failure = queued.wait().unwrap_err();
    assert_eq!(failure.reason(), Reason::Shutdown);
    stopper.join().unwrap();
    let stats = shepherd.stats();
    assert_eq!(stats.admission.usage, 0);
    assert_eq!((stats.succeeded, stats.failed), (0, 4));
    assert_eq!(stats.admission.accepted, 4);
}

#[test]
fn a_late_attempt_is_answered_at_its_deadline_and_its_worker_rebuilt() {
    let clock = ManualClock::new();
    let builds = Arc::new(AtomicUsize::new(0));
    let (factory, open, starts) = gated(false);
    let counted = Arc::clone(&builds);
    let shepherd = Shepherd::builder()
        .capacity(4)
        .workers(2)
        .clock(clock.clone())
        .attempt_timeout(Duration::from_secs(1))
        .retry(no_backoff(2))
        .build(move |index| {
            counted.fetch_add(1, Ordering::SeqCst);
            factory(index)
        })
        .unwrap();
    let done = shepherd.submit(6).unwrap();
    assert_eq!(starts.recv_timeout(PATIENCE), Ok((6, 1)));
    clock.advance(Duration::from_millis(999));
    let stats = shepherd.stats();
    assert_eq!((stats.running, stats.timed_out), (1, 0));
    clock.advance(Duration::from_millis(1));
    // The other worker takes the retry while the first is stuck.
    assert_eq!(starts.recv_timeout(PATIENCE), Ok((6, 2)));
    let stats = shepherd.stats();
    assert_eq!((stats.running, stats.busy, stats.timed_out), (1, 2, 1));
    // Open the gate for both; the late attempt's result is dropped.
    open.send(()).unwrap();
    open.send(()).unwrap();
    assert_eq!(done.wait(), Ok(6));
    shepherd.shutdown();
    let stats = shepherd.stats();
    assert_eq!(
        (stats.attempts, stats.timed_out, stats.succeeded),
        (2, 1, 1)
    );
    assert_eq!(stats.processed, 2, "the late attempt returned too");
    assert_eq!(
        builds.load(Ordering::SeqCst),
        3,
        "the late worker was rebuilt"
    );
}

#[test]
fn a_timeout_not_retried_fails_with_timeout() {
    let clock = ManualClock::new();
    let (factory, open, starts) = gated(false);
    let shepherd = Shepherd::builder()
        .capacity(2)
        .workers(1)
        .clock(clock.clone())
        .attempt_timeout(Duration::from_millis(10))
        .retry(no_backoff(5).retry_timeouts(false))
        .build(factory)
        .unwrap();
    let done = shepherd.submit(1).unwrap();
    starts.recv_timeout(PATIENCE).unwrap();
    clock.advance(Duration::from_millis(10));
    let failure = done.wait().unwrap_err();
    assert_eq!(
        (failure.reason(), failure.last()),
        (Reason::NotRetryable, &LastAttempt::TimedOut)
    );
    assert_eq!(failure.error(), Some(Error::Timeout));
    assert_eq!(
        shepherd.stats().busy,
        1,
        "the late attempt still holds its worker"
    );
    assert_eq!(shepherd.usage(), 0, "but not its unit");
    open.send(()).unwrap();
}

#[test]
fn the_budget_stops_retries_that_would_multiply_the_load() {
    let (factory, _) = script(u32::MAX, None);
    let shepherd = Shepherd::builder()
        .capacity(4)
        .workers(1)
        // No reserve, 50 %: two first attempts pay for one retry.
        .retry(no_backoff(10).budget(Some(RetryBudget::new(Duration::from_secs(60), 0, 50))))
        .build(factory)
        .unwrap();
    let first = shepherd.submit(1).unwrap().wait().unwrap_err();
    assert_eq!(
        (first.reason(), first.attempts()),
        (Reason::BudgetExhausted, 1)
    );
    let second = shepherd.submit(2).unwrap().wait().unwrap_err();
    // Two first attempts deposited one retry; the second op spends it.
    assert_eq!(
        (second.reason(), second.attempts()),
        (Reason::BudgetExhausted, 2)
    );
    assert_eq!(shepherd.stats().budget_refused, 2);
}

#[test]
fn the_due_count_raises_an_alarm_when_it_stays_above_the_workers() {
    let clock = ManualClock::new();
    let (factory, open, starts) = gated(false);
    let shepherd = Shepherd::builder()
        .capacity(8)
        .workers(1)
        .clock(clock.clone())
        .build(factory)
        .unwrap();
    let alarm = Alarm::builder()
        .threshold(shepherd.workers())
        .raise_after(Duration::from_secs(60))
        .build()
        .unwrap();
    let handles: Vec<_> = (0..4).map(|n| shepherd.submit(n).unwrap()).collect();
    starts.recv_timeout(PATIENCE).unwrap(); // one runs, three are due
    assert_eq!(shepherd.due(), 3);
    assert_eq!(shepherd.observe_due(&alarm), None);
    clock.advance(Duration::from_secs(60));
    let event = shepherd.observe_due(&alarm).expect("raised");
    assert_eq!((event.value, event.threshold), (3, 1));
    assert!(alarm.is_raised());
    for _ in 0..4 {
        open.send(()).unwrap();
    }
    for handle in handles {
        handle.wait().unwrap();
    }
    assert!(shepherd.observe_due(&alarm).is_some(), "cleared");
    assert!(!alarm.is_raised());
}

/// The unit comes back with the outcome: an outcome in but not taken holds
/// it; taking it (a wait, a poll, an `.await`) or dropping the handle gives
/// it back; a handle dropped before its operation completed leaves the
/// unit to the completion.
#[test]
fn the_unit_comes_back_as_the_outcome_is_handed_over() {
    let (factory, open, starts) = gated(false);
    let shepherd = Shepherd::builder()
        .capacity(2)
        .workers(1)
        .build(factory)
        .unwrap();
    let held = |expected: usize, why: &str| {
        assert!(shepherd.wait_idle(PATIENCE));
        assert_eq!(shepherd.usage(), expected, "{why}");
    };

    // Completed, not taken: it holds its unit; a wait gives it back.
    let done = shepherd.submit(1).unwrap();
    open.send(()).unwrap();
    held(1, "an outcome not taken holds its unit");
    let other = shepherd.try_submit(2).unwrap();
    assert!(shepherd.try_submit(3).unwrap_err().is_overload());
    open.send(()).unwrap();
    assert_eq!(done.wait(), Ok(1));
    held(1, "the outcome taken, its unit is back");
    // A handle dropped with its outcome in gives its unit back.
    drop(other);
    held(0, "a dropped handle gives its unit back");

    // Dropped before the operation ran: the completion gives it back.
    let early = shepherd.submit(4).unwrap();
    assert_eq!(starts.recv_timeout(PATIENCE), Ok((1, 1)));
    assert_eq!(starts.recv_timeout(PATIENCE), Ok((2, 1)));
    assert_eq!(starts.recv_timeout(PATIENCE), Ok((4, 1)));
    drop(early);
    assert_eq!(shepherd.usage(), 1, "still running");
    open.send(()).unwrap();
    held(
        0,
        "a handle gone before its outcome: the completion gives it back",
    );

    // Taken by a poll.
    let mut polled = shepherd.submit(5).unwrap();
    open.send(()).unwrap();
    held(1, "in, not taken");
    assert_eq!(poll_once(&mut polled), std::task::Poll::Ready(Ok(5)));
    assert_eq!(
        shepherd.usage(),
        0,
        "a poll that answers gives the unit back"
    );
    drop(polled);
    assert_eq!(shepherd.usage(), 0, "and only once");
    let stats = shepherd.stats();
    assert_eq!((stats.succeeded, stats.failed), (4, 0));
}

/// With `UnitRelease::OnCompletion` the worker gives the unit back as the
/// operation completes, before the handle resolves: an unread outcome
/// holds nothing, and a submitter with a waiting room may submit a batch
/// larger than the capacity before it reads any outcome (it waits for the
/// workers, not for itself). A panic's unit is counted when it comes back.
#[test]
fn on_completion_the_worker_gives_the_unit_back() {
    let shepherd = Shepherd::builder()
        .capacity(2)
        .workers(1)
        .max_waiters(1)
        .max_wait(PATIENCE)
        .retry(no_backoff(3).retry_panics(false))
        .unit_release(UnitRelease::OnCompletion)
        .build(|_| Panicky { panic_on: vec![] })
        .unwrap();
    let unread = shepherd.submit(1).unwrap();
    assert!(shepherd.wait_idle(PATIENCE));
    assert_eq!(shepherd.usage(), 0, "an unread outcome holds no unit");
    // A batch of 3 × the capacity, read only after the last submit.
    let batch: Vec<_> = (10..16).map(|op| shepherd.submit(op).unwrap()).collect();
    let read: Vec<_> = batch.into_iter().map(|done| done.wait()).collect();
    assert_eq!(read, (10..16).map(Ok).collect::<Vec<_>>());
    assert_eq!(unread.wait(), Ok(1));
    assert_eq!(shepherd.usage(), 0);
    assert_eq!(shepherd.stats().admission.rejected, 0);

    let panics = Shepherd::builder()
        .capacity(1)
        .workers(1)
        .retry(no_backoff(3).retry_panics(false))
        .unit_release(UnitRelease::OnCompletion)
        .build(|_| Panicky { panic_on: vec![1] })
        .unwrap();
    let failed = panics.submit(1).unwrap();
    assert!(panics.wait_idle(PATIENCE));
    assert_eq!(panics.usage(), 0);
    assert_eq!(
        panics.stats().admission.panicked,
        1,
        "counted as it came back"
    );
    assert_eq!(failed.wait().unwrap_err().last(), &LastAttempt::Panicked);
}

/// A final failure carries its unit as a success does, and a panic's is
/// counted as a panic when it comes back.
#[test]
fn a_final_failure_hands_its_unit_over_too() {
    let shepherd = Shepherd::builder()
        .capacity(1)
        .workers(1)
        .retry(no_backoff(3).retry_panics(false))
        .build(|_| Panicky { panic_on: vec![1] })
        .unwrap();
    let failed = shepherd.submit(1).unwrap();
    assert!(shepherd.wait_idle(PATIENCE));
    assert_eq!(shepherd.usage(), 1, "a failure not taken holds its unit");
    assert_eq!(shepherd.stats().admission.panicked, 0);
    let failure = failed.wait().unwrap_err();
    assert_eq!(failure.last(), &LastAttempt::Panicked);
    assert_eq!(shepherd.usage(), 0);
    let stats = shepherd.stats();
    assert_eq!((stats.failed, stats.admission.panicked), (1, 1));
}

#[test]
fn a_completion_is_a_future_and_can_still_be_waited_for_after_a_poll() {
    let (factory, open, _starts) = gated(false);
    let shepherd = Shepherd::builder()
        .capacity(4)
        .workers(1)
        .build(factory)
        .unwrap();
    let mut done = shepherd.submit(1).unwrap();
    // Polled once (turned async), then waited for on a thread.
    assert!(poll_once(&mut done).is_pending());
    let done = done.wait_timeout(Duration::from_millis(1)).unwrap_err();
    open.send(()).unwrap();
    assert_eq!(done.wait(), Ok(1));

    let runtime = current_thread();
    let handle = shepherd.submit(2).unwrap();
    open.send(()).unwrap();
    assert_eq!(runtime.block_on(handle), Ok(2));
}

#[test]
fn auto_traits() {
    fn send_sync<T: Send + Sync>() {}
    fn send_static<T: Send + 'static>() {}
    fn future<F: Future + Send + 'static>() {}
    send_sync::<Shepherd<Script>>();
    send_static::<Completion<u32, u32>>();
    future::<Completion<u32, u32>>();
    send_sync::<Failure<u32>>();
}

#[test]
fn bad_configuration_names_the_field() {
    let field = |builder: &mut sidejob::shepherd::ShepherdBuilder| {
        builder
            .build(|_| Panicky { panic_on: vec![] })
            .unwrap_err()
            .field()
    };
    assert_eq!(field(&mut Shepherd::builder()), "capacity");
    assert_eq!(field(Shepherd::builder().capacity(0)), "capacity");
    assert_eq!(field(Shepherd::builder().capacity(1).workers(0)), "workers");
    assert_eq!(field(Shepherd::builder().capacity(1).name("a\0b")), "name");
    assert_eq!(
        field(
            Shepherd::builder()
                .capacity(1)
                .attempt_timeout(Duration::ZERO)
        ),
        "attempt_timeout"
    );
    assert_eq!(
        field(
            Shepherd::builder()
                .capacity(1)
                .spin_wait(Duration::from_secs(1))
        ),
        "spin_wait"
    );
    assert_eq!(
        field(
            Shepherd::builder()
                .capacity(1)
                .retry(RetryPolicy::new().backoff(Duration::from_secs(2), Duration::from_secs(1)))
        ),
        "backoff"
    );
}
