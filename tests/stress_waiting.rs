//! Waiting and resizing at once (issue 8): blocking threads and many tokio
//! tasks acquire with a waiting room (some cancelled by a random
//! `tokio::time::timeout`, some dropped after one poll, some `try_`),
//! while another thread resizes the limiter at random between 0 and twice
//! its start capacity every few hundred microseconds.
//!
//! Invariants, for each queue order:
//!
//! * **The capacity in force bounds the permits held.** Every admission
//!   bumps an `active` counter (never above the usage: bumped after the
//!   admission, lowered before the release) and checks it against the
//!   largest capacity that a resize set or was setting between the start
//!   of its call and the check (a generation counter, odd while a resize
//!   runs, brackets each one). That is `set_capacity`'s promise: once it
//!   has returned, nothing is admitted while `n` or more are held,
//!   whatever was held before a shrink.
//! * **Spot checks by the resizer.** After each resize, `usage()` stays
//!   within a bound: the larger of the new capacity and the previous bound
//!   while attempts that began before the resize are still in progress,
//!   plus one unit for each of them; the new capacity alone once none is
//!   left. The extra unit is the table's documented over-take (`table.rs`,
//!   "Resize"): a taker that read a limit before the resize can land its
//!   CAS after it, and for the moment before it undoes itself the reading
//!   counts that unit. Only such takers can, so the ledger below sorts the
//!   attempts in progress into those begun before the last resize and
//!   after it, under a lock that orders each beginning against the resize.
//! * **Exact accounting.** Every attempt ends exactly once: admitted,
//!   `Overload`, `Timeout` or cancelled; `rejected` and `timed_out` match
//!   the callers' counts exactly; `accepted` is at least the admissions the
//!   callers saw (a unit handed to a future that was then dropped counts,
//!   and goes on to someone else) and `completed == accepted`.
//! * **Nothing left behind.** Every thread and task is joined; `usage()`
//!   and `waiting()` are 0, and every unit can be taken again.
//!
//! No sleeps: the resizer paces itself with `yield_now` against the clock
//! (pacing only, nothing waits on it), and workers run a fixed number of
//! attempts.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sidejob::{Error, Limiter, QueueOrder};

mod common;
use common::{multi_thread, Rng};

const START: usize = 8;
const THREADS: usize = 3;
const THREAD_ATTEMPTS: usize = 16_000;
const TASKS: usize = 48;
const TASK_ATTEMPTS: usize = 1_200;
const MAX_RESIZES: usize = 20_000;
/// The workers go on past their attempts until the resizer has done this
/// many resizes, so the churn overlaps resizing however the threads are
/// scheduled (a fast run once left the resizer 6 turns).
const MIN_RESIZES: usize = 10;

/// The shared books.
struct Books {
    limiter: Arc<Limiter>,
    /// Resize generation: odd while `set_capacity` runs; resize `k` moves
    /// it to `2k - 1`, then `2k`.
    generation: AtomicUsize,
    /// `capacities[k]`: what resize `k` set (`[0]`: the start).
    capacities: Vec<AtomicUsize>,
    /// Permits held by the workers.
    active: AtomicUsize,
    /// Attempts begun and not yet over (permit and future dropped).
    inside: Mutex<Ledger>,
    /// Admissions checked against the capacity in force.
    checked: AtomicUsize,
    /// Resizes done so far.
    resizes: AtomicUsize,
}

/// The attempts in progress, sorted by whether they began before the last
/// resize (`stale`) or after it (`current`).
#[derive(Default)]
struct Ledger {
    /// Resizes that had returned when the last attempt began.
    epoch: usize,
    current: usize,
    stale: usize,
}

impl Books {
    /// An attempt begins: its epoch, for [`end`](Self::end). The lock makes
    /// every resize that [`resized`](Self::resized) has counted happen
    /// before the attempt's takes, so they read that resize's limits.
    fn begin(&self) -> usize {
        let mut ledger = self.inside.lock();
        ledger.current += 1;
        ledger.epoch
    }

    /// The attempt that began in `epoch` is over.
    fn end(&self, epoch: usize) {
        let mut ledger = self.inside.lock();
        if epoch == ledger.epoch {
            ledger.current -= 1;
        } else {
            ledger.stale -= 1;
        }
    }

    /// A resize has returned: every attempt in progress began before it.
    fn resized(&self) {
        let mut ledger = self.inside.lock();
        ledger.epoch += 1;
        ledger.stale += ledger.current;
        ledger.current = 0;
    }

    /// Attempts in progress that began before the last resize.
    fn stale(&self) -> usize {
        self.inside.lock().stale
    }

    /// Attempts in progress.
    fn in_progress(&self) -> usize {
        let ledger = self.inside.lock();
        ledger.current + ledger.stale
    }
}

impl Books {
    /// True once a worker that has made `attempts` may stop: it has made
    /// its share, and the resizer has had its turns.
    fn may_stop(&self, attempts: usize, share: usize) -> bool {
        attempts >= share && self.resizes.load(SeqCst) > MIN_RESIZES
    }
}

impl Books {
    /// The largest capacity in force between generation readings `before`
    /// (taken before the call) and `after` (after the check).
    fn bound(&self, before: usize, after: usize) -> usize {
        (before / 2..=after.div_ceil(2))
            .map(|k| self.capacities[k].load(SeqCst))
            .max()
            .unwrap()
    }

    /// Called right after an admission whose call began at generation
    /// `before`: bumps `active` and checks it.
    fn admitted(&self, before: usize) {
        let now = self.active.fetch_add(1, SeqCst) + 1;
        let after = self.generation.load(SeqCst);
        let bound = self.bound(before, after);
        assert!(
            now <= bound,
            "{now} held, but the capacity in force was at most {bound} (generations {before}..={after})"
        );
        self.checked.fetch_add(1, SeqCst);
    }

    fn released(&self) {
        self.active.fetch_sub(1, SeqCst);
    }
}

/// How attempts ended, per worker.
#[derive(Default, Debug, Clone, Copy)]
struct Tally {
    attempts: u64,
    admitted: u64,
    overload: u64,
    timeout: u64,
    cancelled: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.attempts += other.attempts;
        self.admitted += other.admitted;
        self.overload += other.overload;
        self.timeout += other.timeout;
        self.cancelled += other.cancelled;
    }

    fn refused(&mut self, err: Error) {
        match err {
            Error::Overload => self.overload += 1,
            Error::Timeout => self.timeout += 1,
            other => panic!("unexpected {other}"),
        }
    }
}

/// Polls the inner future once: its output, or `None` if it was pending
/// (the future is then dropped with this one: a cancelled wait).
struct PollOnce<F>(Pin<Box<F>>);

impl<F: Future> Future for PollOnce<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.0.as_mut().poll(cx) {
            Poll::Ready(output) => Poll::Ready(Some(output)),
            Poll::Pending => Poll::Ready(None),
        }
    }
}

fn blocking_worker(books: &Books, seed: u64) -> Tally {
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    while !books.may_stop(tally.attempts as usize, THREAD_ATTEMPTS) {
        tally.attempts += 1;
        let epoch = books.begin();
        let before = books.generation.load(SeqCst);
        let result = if rng.below(8) == 0 {
            books.limiter.try_acquire()
        } else {
            books.limiter.acquire()
        };
        match result {
            Ok(permit) => {
                books.admitted(before);
                tally.admitted += 1;
                for _ in 0..rng.below(3) {
                    thread::yield_now();
                }
                books.released();
                drop(permit);
            }
            Err(err) => tally.refused(err),
        }
        books.end(epoch);
    }
    tally
}

async fn task_worker(books: Arc<Books>, seed: u64) -> Tally {
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    while !books.may_stop(tally.attempts as usize, TASK_ATTEMPTS) {
        tally.attempts += 1;
        let epoch = books.begin();
        let before = books.generation.load(SeqCst);
        let acquire = Arc::clone(&books.limiter).acquire_owned_async();
        let result = match rng.below(4) {
            // Cancelled by a caller-side deadline, or our own `max_wait`.
            0 => {
                let limit = Duration::from_micros(rng.below(2_000));
                // `Err(Elapsed)`: the wait was dropped, cancelled.
                tokio::time::timeout(limit, acquire).await.ok()
            }
            // Polled once, then dropped if it has to wait.
            1 => PollOnce(Box::pin(acquire)).await,
            _ => Some(acquire.await),
        };
        match result {
            Some(Ok(permit)) => {
                books.admitted(before);
                tally.admitted += 1;
                if rng.below(2) == 0 {
                    tokio::task::yield_now().await;
                }
                books.released();
                drop(permit);
            }
            Some(Err(err)) => tally.refused(err),
            None => tally.cancelled += 1,
        }
        books.end(epoch);
    }
    tally
}

/// Resizes at random until `done`, pacing itself every 100-500 µs; spot
/// checks the usage after each resize. The number of resizes.
fn resizer(books: &Books, done: &AtomicBool, seed: u64) -> usize {
    let mut rng = Rng(seed);
    let limiter = &books.limiter;
    let mut bound = START;
    let mut resizes = 0;
    while !done.load(SeqCst) && resizes < MAX_RESIZES - 1 {
        resizes += 1;
        let capacity = rng.below(2 * START as u64 + 1) as usize;
        books.capacities[resizes].store(capacity, SeqCst);
        books.generation.fetch_add(1, SeqCst);
        limiter.set_capacity(capacity).unwrap();
        books.resized();
        books.generation.fetch_add(1, SeqCst);
        books.resizes.store(resizes, SeqCst);
        assert_eq!(limiter.capacity(), capacity);
        // Before any sighting: what was held at the gate (at most the old
        // bound) may still be held, and nothing more is admitted above the
        // new capacity.
        bound = bound.max(capacity);
        let pace = Duration::from_micros(100 + rng.below(400));
        let began = Instant::now();
        loop {
            // Read before the usage: it only falls until the next resize,
            // so it covers every over-take that reading can count.
            let stale = books.stale();
            // Every attempt begun before the resize is over: no unit held
            // from before it, no take with an old limit; from now on the
            // new limits keep the units within the capacity.
            if stale == 0 {
                bound = capacity;
            }
            let usage = limiter.usage();
            assert!(
                usage <= bound + stale,
                "usage {usage} above {bound} + {stale} over-takes at most, after set_capacity({capacity})"
            );
            if began.elapsed() >= pace {
                break;
            }
            thread::yield_now();
        }
    }
    // Leave the start capacity in force for the final checks.
    resizes += 1;
    books.capacities[resizes].store(START, SeqCst);
    books.generation.fetch_add(1, SeqCst);
    limiter.set_capacity(START).unwrap();
    books.generation.fetch_add(1, SeqCst);
    resizes
}

fn stress(order: QueueOrder, seed: u64) {
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(START)
            .shards(2)
            .max_waiters(32)
            .max_wait(Duration::from_millis(3))
            .queue_order(order)
            .build()
            .unwrap(),
    );
    let mut capacities: Vec<AtomicUsize> = (0..MAX_RESIZES).map(|_| AtomicUsize::new(0)).collect();
    capacities[0] = AtomicUsize::new(START);
    let books = Arc::new(Books {
        limiter: Arc::clone(&limiter),
        generation: AtomicUsize::new(0),
        capacities,
        active: AtomicUsize::new(0),
        inside: Mutex::new(Ledger::default()),
        checked: AtomicUsize::new(0),
        resizes: AtomicUsize::new(0),
    });
    let rt = multi_thread();
    let done = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(THREADS + 2));

    let resizer = {
        let books = Arc::clone(&books);
        let done = Arc::clone(&done);
        let start = Arc::clone(&start);
        thread::spawn(move || {
            start.wait();
            resizer(&books, &done, seed ^ 0x5eed)
        })
    };
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let books = Arc::clone(&books);
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                blocking_worker(&books, seed.wrapping_add(t as u64 + 1) | 1)
            })
        })
        .collect();
    start.wait();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            rt.spawn(task_worker(
                Arc::clone(&books),
                seed.wrapping_mul(31).wrapping_add(t as u64 + 100) | 1,
            ))
        })
        .collect();

    let mut tally = Tally::default();
    for thread in threads {
        tally.add(thread.join().unwrap());
    }
    for task in tasks {
        tally.add(rt.block_on(task).unwrap());
    }
    done.store(true, SeqCst);
    let resizes = resizer.join().unwrap();

    let attempts = tally.attempts;
    assert!(
        attempts >= (THREADS * THREAD_ATTEMPTS + TASKS * TASK_ATTEMPTS) as u64,
        "every worker made its share: {tally:?}"
    );
    assert_eq!(
        tally.admitted + tally.overload + tally.timeout + tally.cancelled,
        attempts,
        "every attempt ended once: {tally:?}"
    );
    let stats = limiter.stats();
    assert_eq!(stats.rejected, tally.overload, "{tally:?} {stats:?}");
    assert_eq!(stats.timed_out, tally.timeout, "{tally:?} {stats:?}");
    assert!(stats.accepted >= tally.admitted, "{tally:?} {stats:?}");
    // The extra: units handed to futures that were then dropped, and a
    // waiter's second unit, given back at once (each such waiter waited).
    assert!(
        stats.accepted <= tally.admitted + tally.cancelled + stats.waited,
        "{tally:?} {stats:?}"
    );
    assert_eq!(stats.completed, stats.accepted, "{stats:?}");
    assert_eq!(stats.panicked, 0);
    assert_eq!(books.active.load(SeqCst), 0);
    assert_eq!(books.in_progress(), 0);
    assert_eq!(books.checked.load(SeqCst) as u64, tally.admitted);
    assert!(resizes > 10, "the resizer ran: {resizes}");
    // Waiting really happened, and so did every ending.
    assert!(stats.waited > 0 && stats.peak_waiting > 0, "{stats:?}");
    assert!(tally.overload > 0 && tally.cancelled > 0, "{tally:?}");

    assert_eq!(limiter.usage(), 0);
    assert_eq!(limiter.waiting(), 0);
    assert_eq!(limiter.capacity(), START);
    let all: Vec<_> = (0..START)
        .map(|_| limiter.try_acquire().expect("every unit back"))
        .collect();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    drop(all);
}

#[test]
fn fifo_under_random_resizes() {
    stress(QueueOrder::Fifo, 0x9e37_79b9_7f4a_7c15);
}

#[test]
fn lifo_under_random_resizes() {
    stress(QueueOrder::Lifo, 0xbf58_476d_1ce4_e5b9);
}

#[test]
fn adaptive_lifo_under_random_resizes() {
    stress(
        QueueOrder::AdaptiveLifo {
            interval: Duration::from_micros(500),
            target: Duration::from_millis(1),
        },
        0x94d0_49bb_1331_11eb,
    );
}
