//! Thousands of tokio tasks calling and casting through a small async pool,
//! with caller futures cancelled at random points: the bound holds at every
//! reading, every admitted request is handled exactly once, refused ones
//! never, every reply goes to its own caller, and the books balance.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use sidejob::{AsyncWorker, Error, Pool};

mod common;
use common::{multi_thread, Rng};

const TASKS: usize = 4_000;
const PER_TASK: usize = 20;

/// Marks each request id it handles (a second mark fails the test), after
/// yielding a few times so handlers interleave with callers.
struct Marker(Arc<Vec<AtomicU8>>);

impl Marker {
    async fn mark(&self, id: usize) {
        for _ in 0..id % 3 {
            tokio::task::yield_now().await;
        }
        let before = self.0[id].fetch_add(1, SeqCst);
        assert_eq!(before, 0, "request {id} handled twice");
    }
}

impl AsyncWorker for Marker {
    type Request = usize;
    type Reply = usize;
    type Message = usize;
    async fn handle_call(&mut self, id: usize) -> usize {
        self.mark(id).await;
        id
    }
    async fn handle_cast(&mut self, id: usize) {
        self.mark(id).await;
    }
}

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Its future was dropped before it answered: handled once or never.
    Cancelled,
    /// Answered `Ok`: handled exactly once.
    Admitted,
    /// Answered `Overload` or `Timeout`: never handled.
    Refused,
}

async fn yields(n: u64) {
    for _ in 0..n {
        tokio::task::yield_now().await;
    }
}

/// A storm on a pool of `capacity` and `workers`, with a waiting room of
/// `waiters`; `steal(false)` (each worker its own mailbox) if `affinity`,
/// else the default (one queue every free worker takes from).
fn storm(capacity: usize, workers: usize, waiters: usize, affinity: bool) {
    let rt = multi_thread();
    let total = TASKS * PER_TASK;
    let marks: Arc<Vec<AtomicU8>> = Arc::new((0..total).map(|_| AtomicU8::new(0)).collect());
    rt.block_on(async {
        let pool = {
            let marks = marks.clone();
            Pool::builder()
                .capacity(capacity)
                .workers(workers)
                .max_waiters(waiters)
                .max_wait(Duration::from_secs(30))
                .steal(!affinity)
                .build_async(move |_| Marker(marks.clone()))
                .unwrap()
        };
        let done = Arc::new(AtomicBool::new(false));
        let monitor = tokio::spawn({
            let (pool, done) = (pool.clone(), done.clone());
            async move {
                let mut readings = 0u64;
                while !done.load(SeqCst) {
                    let usage = pool.usage();
                    assert!(usage <= capacity, "usage {usage} > capacity {capacity}");
                    readings += 1;
                    tokio::task::yield_now().await;
                }
                readings
            }
        });
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
                    let mut fates = Vec::with_capacity(PER_TASK);
                    for i in 0..PER_TASK {
                        let id = t * PER_TASK + i;
                        let cast = rng.below(4) == 0;
                        // A future polled this many times at most, then
                        // dropped if it has not answered; a third run to
                        // the end.
                        let patience = match rng.below(3) {
                            0 => None,
                            _ => Some(rng.below(4)),
                        };
                        let outcome = async {
                            if cast {
                                pool.cast(id).await.map(|()| id)
                            } else {
                                pool.call_async(id).await
                            }
                        };
                        let answered = match patience {
                            None => Some(outcome.await),
                            Some(n) => tokio::select! {
                                biased;
                                answer = outcome => Some(answer),
                                () = yields(n) => None,
                            },
                        };
                        fates.push(match answered {
                            None => Fate::Cancelled,
                            Some(Ok(reply)) => {
                                assert_eq!(reply, id, "a reply went to the wrong caller");
                                Fate::Admitted
                            }
                            Some(Err(Error::Overload | Error::Timeout)) => Fate::Refused,
                            Some(Err(other)) => panic!("request {id}: {other}"),
                        });
                    }
                    fates
                })
            })
            .collect();
        let mut fates = Vec::with_capacity(total);
        for task in tasks {
            fates.extend(task.await.unwrap());
        }
        done.store(true, SeqCst);
        assert!(monitor.await.unwrap() > 0);
        pool.shutdown_async().await;

        let mut handled = 0;
        let mut counts = [0usize; 3];
        for (id, fate) in fates.iter().enumerate() {
            let mark = marks[id].load(SeqCst);
            match fate {
                Fate::Admitted => assert_eq!(mark, 1, "admitted request {id} handled {mark} times"),
                Fate::Refused => assert_eq!(mark, 0, "refused request {id} was handled"),
                Fate::Cancelled => assert!(mark <= 1),
            }
            handled += mark as usize;
            counts[*fate as usize] += 1;
        }
        let stats = pool.stats();
        assert_eq!(pool.usage(), 0);
        assert_eq!(stats.panicked, 0);
        assert_eq!(stats.completed as usize, handled);
        assert!(
            stats.peak_usage <= capacity,
            "peak {} > {capacity}",
            stats.peak_usage
        );
        // The storm did what it is for: some of each fate.
        assert!(
            counts.iter().all(|&n| n > 0),
            "fates (cancelled, admitted, refused): {counts:?}"
        );
    });
}

#[test]
fn fail_fast_storm_with_cancelled_callers() {
    storm(8, 4, 0, false);
}

#[test]
fn fail_fast_storm_with_affinity() {
    storm(8, 4, 0, true);
}

#[test]
fn waiting_room_storm_with_cancelled_callers() {
    storm(8, 4, 64, false);
}

#[test]
fn one_worker_storm_with_cancelled_callers() {
    storm(4, 1, 16, false);
}
