//! Small requests behind a large one (issue 35): capacity C = 64, one-unit
//! requests arriving as a Poisson process at 0.95 of capacity with
//! exponential hold times (mean S), and a request of C/2 units every
//! 500 ms. Three waiting rules, in one run:
//!
//! * sidejob's `Limiter::acquire_many_async`: small requests pass a
//!   waiting large one until its pass budget (default: the capacity, one
//!   turnover) is spent, then freed units are kept for it;
//! * tokio's `Semaphore::acquire_many`: strict FIFO, a waiting large
//!   request holds every small one behind it;
//! * first fit (written here, the rule of Effect's and async-lock's
//!   semaphores): a freed unit goes to the first waiter it fits, so a
//!   large request waits for a lull that may not come.
//!
//! Printed for each: the small requests' wait (p50, and p99 among those
//! that arrived *while a large one waited*), the large requests' wait
//! (median, max) and how many were served within the 5 s every wait is
//! cut at. The targets (issue 35): small p99 while a large one waits
//! <= 2 S; every large request served, its wait <= 4 x the time to free
//! C/2 of C held units with no small traffic (S x (H_64 - H_32), about
//! 0.69 S, from the exponential's order statistics).
//!
//! Time is tokio's paused clock (`start_paused`): every hold lasts
//! exactly what it drew, arrivals come exactly on time, and the figures
//! do not depend on how busy the machine is (a real clock's 1 ms timer
//! rounding and wake-up lag added 3-5 % to the load, enough at 0.95 to
//! tip every contender into a growing queue). S is 200 ms of that clock,
//! a large request every 5 s (the 500 ms at S = 20 ms).
//!
//! `WEIGHTED_SECS` sets each contender's run in virtual seconds (default
//! 600).

mod common;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::rng::Rng;
use sidejob::Limiter;
use tokio::sync::{oneshot, Semaphore};

const C: usize = 64;
const LARGE: usize = C / 2;
/// Mean hold time, virtual: far above tokio's 1 ms timer resolution.
const S: Duration = Duration::from_millis(200);
/// The small requests' load, as a fraction of the capacity: the issue's
/// 0.95, and 0.8, where the rules part ways before a backlog forms.
const LOADS: [f64; 2] = [0.8, 0.95];
/// One large request per 25 S.
const LARGE_EVERY: Duration = Duration::from_secs(5);
/// Every wait is cut here (a starved request counts as not served).
const CUT: Duration = Duration::from_secs(50);

/// A first-fit weighted semaphore: a freed unit goes to the first waiter,
/// in arrival order, whose request fits in what is free.
struct FirstFit {
    state: Mutex<FirstFitState>,
}

struct FirstFitState {
    free: usize,
    waiters: VecDeque<(usize, oneshot::Sender<()>)>,
}

impl FirstFit {
    fn new(capacity: usize) -> Self {
        FirstFit {
            state: Mutex::new(FirstFitState {
                free: capacity,
                waiters: VecDeque::new(),
            }),
        }
    }

    async fn acquire(&self, n: usize) {
        let rx = {
            let mut state = self.state.lock().unwrap();
            if state.free >= n {
                state.free -= n;
                return;
            }
            let (tx, rx) = oneshot::channel();
            state.waiters.push_back((n, tx));
            rx
        };
        // A waiter cut off by its timeout drops `rx`: the release that
        // finds its sender closed keeps the units.
        let _ = rx.await;
    }

    fn release(&self, n: usize) {
        let mut state = self.state.lock().unwrap();
        state.free += n;
        let mut i = 0;
        while i < state.waiters.len() {
            let need = state.waiters[i].0;
            if need <= state.free {
                let (need, tx) = state.waiters.remove(i).expect("in range");
                if tx.send(()).is_ok() {
                    state.free -= need;
                }
            } else if state.waiters[i].1.is_closed() {
                state.waiters.remove(i);
            } else {
                i += 1;
            }
        }
    }
}

#[derive(Clone)]
enum Contender {
    /// The limiter, and the pass budget it was built with (`None`: the
    /// default, the capacity).
    Ours(Arc<Limiter>, Option<usize>),
    Tokio(Arc<Semaphore>),
    FirstFit(Arc<FirstFit>),
}

impl Contender {
    fn name(&self) -> String {
        match self {
            Contender::Ours(_, None) => "sidejob, default budget (C)".into(),
            Contender::Ours(_, Some(budget)) => format!("sidejob, pass budget {budget}"),
            Contender::Tokio(_) => "tokio acquire_many (FIFO)".into(),
            Contender::FirstFit(_) => "first fit".into(),
        }
    }

    fn ours(budget: Option<usize>) -> Contender {
        let mut builder = Limiter::builder();
        builder.capacity(C).max_waiters(1 << 20).max_wait(CUT * 2);
        if let Some(budget) = budget {
            builder.pass_budget(budget);
        }
        Contender::Ours(Arc::new(builder.build().unwrap()), budget)
    }

    /// Acquires `n`, holds for `hold`, releases; the wait, or `None` if cut.
    fn run(
        self,
        n: usize,
        hold: Duration,
    ) -> Pin<Box<dyn Future<Output = Option<Duration>> + Send>> {
        Box::pin(async move {
            let began = tokio::time::Instant::now();
            match self {
                Contender::Ours(limiter, _) => {
                    let permit = tokio::time::timeout(CUT, limiter.acquire_many_async(n))
                        .await
                        .ok()?
                        .expect("no refusal: the room is large");
                    let waited = began.elapsed();
                    tokio::time::sleep(hold).await;
                    drop(permit);
                    Some(waited)
                }
                Contender::Tokio(sem) => {
                    let permit = tokio::time::timeout(CUT, sem.acquire_many(n as u32))
                        .await
                        .ok()?
                        .expect("never closed");
                    let waited = began.elapsed();
                    tokio::time::sleep(hold).await;
                    drop(permit);
                    Some(waited)
                }
                Contender::FirstFit(sem) => {
                    tokio::time::timeout(CUT, sem.acquire(n)).await.ok()?;
                    let waited = began.elapsed();
                    tokio::time::sleep(hold).await;
                    sem.release(n);
                    Some(waited)
                }
            }
        })
    }
}

struct Outcome {
    /// (arrival, wait) of each small request; `None` wait if cut.
    small: Vec<(Instant, Option<Duration>)>,
    /// (arrival, wait) of each large request.
    large: Vec<(Instant, Option<Duration>)>,
}

type Instant = tokio::time::Instant;

fn run(contender: Contender, rho: f64, secs: u64) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut rng = Rng(0x2545_F491_4F6C_DD1D);
        let small_gap = S.div_f64(rho * C as f64);
        let began = tokio::time::Instant::now();
        let end = began + Duration::from_secs(secs);
        let mut next_small = began;
        let mut next_large = began + LARGE_EVERY;
        let mut tasks = Vec::new();
        loop {
            let next = next_small.min(next_large);
            if next >= end {
                break;
            }
            tokio::time::sleep_until(next).await;
            let now = tokio::time::Instant::now();
            while next_small <= now {
                let task = contender.clone().run(1, rng.exp(S));
                tasks.push((false, now, tokio::spawn(task)));
                next_small += rng.exp(small_gap);
            }
            if next_large <= now {
                let task = contender.clone().run(LARGE, rng.exp(S));
                tasks.push((true, now, tokio::spawn(task)));
                next_large += LARGE_EVERY;
            }
        }
        let mut outcome = Outcome {
            small: Vec::new(),
            large: Vec::new(),
        };
        for (large, arrived, task) in tasks {
            let waited = task.await.unwrap();
            if large {
                outcome.large.push((arrived, waited));
            } else {
                outcome.small.push((arrived, waited));
            }
        }
        outcome
    })
}

fn quantile(mut xs: Vec<Duration>, q: f64) -> Duration {
    if xs.is_empty() {
        return Duration::ZERO;
    }
    xs.sort();
    xs[((xs.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read.
    let secs = std::env::var("WEIGHTED_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let free_half: f64 = (LARGE + 1..=C).map(|k| 1.0 / k as f64).sum();
    let free_half = S.mul_f64(free_half);
    for rho in LOADS {
        println!(
            "\nC = {C}, one-unit requests at {rho} of capacity, S = {} ms (exponential), a request of {LARGE} every {} ms, {secs} s each (tokio's paused clock); time to free C/2 of C with no small traffic: T = {:.1} ms",
            S.as_millis(),
            LARGE_EVERY.as_millis(),
            ms(free_half)
        );
        println!(
            "{:<30} {:>9} {:>11} {:>10} {:>10} {:>10} {:>7} {:>9} {:>14}",
            "",
            "small p50",
            "small p99*",
            "small p99",
            "large p50",
            "large max",
            "served",
            "p99* / S",
            "large max / T"
        );
        let contenders = [
            Contender::ours(None),
            Contender::ours(Some(0)),
            Contender::ours(Some(4 * C)),
            Contender::ours(Some(16 * C)),
            Contender::Tokio(Arc::new(Semaphore::new(C))),
            Contender::FirstFit(Arc::new(FirstFit::new(C))),
        ];
        for contender in contenders {
            row(contender, rho, secs, free_half);
        }
    }
    println!("\n* among small requests that arrived while a large one waited; issue 35's targets at 0.95: p99* / S <= 2, large max / T <= 4, every large one served");
}

/// Runs one contender at load `rho` and prints its row.
fn row(contender: Contender, rho: f64, secs: u64, free_half: Duration) {
    let name = contender.name();
    let outcome = run(contender, rho, secs);
    // The windows while a large request waited: its arrival to its
    // admission (to the cut, if it was never served).
    let windows: Vec<(Instant, Instant)> = outcome
        .large
        .iter()
        .map(|&(arrived, waited)| (arrived, arrived + waited.unwrap_or(CUT)))
        .collect();
    let during = |at: Instant| windows.iter().any(|&(a, b)| a <= at && at < b);
    let small_all: Vec<Duration> = outcome
        .small
        .iter()
        .map(|&(_, w)| w.unwrap_or(CUT))
        .collect();
    let small_during: Vec<Duration> = outcome
        .small
        .iter()
        .filter(|&&(at, _)| during(at))
        .map(|&(_, w)| w.unwrap_or(CUT))
        .collect();
    let large: Vec<Duration> = outcome
        .large
        .iter()
        .map(|&(_, w)| w.unwrap_or(CUT))
        .collect();
    let served = outcome.large.iter().filter(|(_, w)| w.is_some()).count();
    let p99_during = quantile(small_during, 0.99);
    let large_max = large.iter().copied().max().unwrap_or_default();
    println!(
        "{:<30} {:>7.1}ms {:>9.1}ms {:>8.1}ms {:>8.1}ms {:>8.1}ms {:>3}/{:<3} {:>9.2} {:>14.2}",
        name,
        ms(quantile(small_all.clone(), 0.5)),
        ms(p99_during),
        ms(quantile(small_all, 0.99)),
        ms(quantile(large.clone(), 0.5)),
        ms(large_max),
        served,
        outcome.large.len(),
        p99_during.as_secs_f64() / S.as_secs_f64(),
        large_max.as_secs_f64() / free_half.as_secs_f64(),
    );
}
