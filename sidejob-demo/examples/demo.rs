//! The demo: flood a small pool with more work than it can do, and watch it
//! answer `Overload` at once while admitted requests stay fast. Then send
//! the same flood through an unbounded queue to the same number of workers,
//! and watch the queue and the latency grow without end.
//!
//! Run: `cargo run --release -p sidejob-demo` (`-- --help` for flags).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use sidejob::{Error, Pool, Worker};

const HELP: &str = "\
overload: a sidejob pool under a flood, beside an unbounded queue

USAGE: cargo run --release -p sidejob-demo -- [OPTIONS]

OPTIONS:
  --duration SECS   how long each flood lasts            [default: 4]
  --capacity N      pool capacity (queued + running)      [default: 32]
  --workers N       worker threads (both phases)          [default: 2]
  --producers N     threads generating requests           [default: 4]
  --work-us US      time one request takes to handle      [default: 200]
  --load X          offered load, times what the workers
                    can handle                            [default: 3]
  -h, --help        this text";

#[derive(Debug, Clone, Copy)]
struct Options {
    duration: Duration,
    capacity: usize,
    workers: usize,
    producers: usize,
    work: Duration,
    load: f64,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        duration: Duration::from_secs(4),
        capacity: 32,
        workers: 2,
        producers: 4,
        work: Duration::from_micros(200),
        load: 3.0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "-h" || flag == "--help" {
            println!("{HELP}");
            std::process::exit(0);
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value (see --help)"))?;
        let bad = || format!("{flag}: cannot read {value:?} as a number");
        match flag.as_str() {
            "--duration" => {
                options.duration = Duration::from_secs_f64(value.parse().map_err(|_| bad())?)
            }
            "--capacity" => options.capacity = value.parse().map_err(|_| bad())?,
            "--workers" => options.workers = value.parse().map_err(|_| bad())?,
            "--producers" => options.producers = value.parse().map_err(|_| bad())?,
            "--work-us" => options.work = Duration::from_micros(value.parse().map_err(|_| bad())?),
            "--load" => options.load = value.parse().map_err(|_| bad())?,
            _ => return Err(format!("unknown flag {flag} (see --help)")),
        }
    }
    if options.producers == 0 || options.workers == 0 {
        return Err("--producers and --workers must be at least 1".into());
    }
    if options.load.is_nan()
        || options.load <= 0.0
        || options.duration.is_zero()
        || options.work.is_zero()
    {
        return Err("--load, --duration and --work-us must be positive".into());
    }
    Ok(options)
}

/// One request: when it was made.
struct Job {
    created: Instant,
}

/// Latencies (creation to completion) of handled requests, in microseconds.
type Latencies = Arc<Mutex<Vec<u64>>>;

/// Simulated work: an I/O-bound handler (sleeping, so the demo leaves the
/// CPU to the producers on small machines).
fn handle(job: Job, work: Duration, latencies: &Latencies) {
    thread::sleep(work);
    let waited = job.created.elapsed().as_micros() as u64;
    latencies.lock().unwrap().push(waited);
}

struct DemoWorker {
    work: Duration,
    latencies: Latencies,
}

impl Worker for DemoWorker {
    type Request = ();
    type Reply = ();
    type Message = Job;
    fn handle_call(&mut self, _: ()) {}
    fn handle_cast(&mut self, job: Job) {
        handle(job, self.work, &self.latencies);
    }
}

/// Runs `producers` threads that each offer requests at a steady pace (open
/// loop: arrivals do not wait for completions, as with real clients) until
/// `stop`, calling `offer` for each. Returns the request count offered.
fn flood(options: Options, offer: impl Fn(Job) + Sync, stop: &AtomicBool) -> u64 {
    // What the workers can handle per second, and the pace that overloads them.
    let capacity_per_sec = options.workers as f64 / options.work.as_secs_f64();
    let per_producer = capacity_per_sec * options.load / options.producers as f64;
    let interval = Duration::from_secs_f64(1.0 / per_producer);
    let offered = AtomicU64::new(0);
    thread::scope(|scope| {
        for _ in 0..options.producers {
            scope.spawn(|| {
                let start = Instant::now();
                let mut sent = 0u64;
                while !stop.load(Relaxed) {
                    // Send every request that is due, then sleep until the next.
                    let due = (start.elapsed().as_secs_f64() / interval.as_secs_f64()) as u64;
                    while sent < due {
                        offer(Job {
                            created: Instant::now(),
                        });
                        sent += 1;
                    }
                    thread::sleep(interval.min(Duration::from_millis(1)));
                }
                offered.fetch_add(sent, Relaxed);
            });
        }
    });
    offered.load(Relaxed)
}

/// p50, p99 and max of a set of latencies, in microseconds.
fn percentiles(latencies: &Latencies) -> (u64, u64, u64, usize) {
    let mut all = latencies.lock().unwrap().clone();
    all.sort_unstable();
    if all.is_empty() {
        return (0, 0, 0, 0);
    }
    let at = |q: f64| all[((all.len() - 1) as f64 * q) as usize];
    (at(0.50), at(0.99), *all.last().unwrap(), all.len())
}

fn fmt_us(us: u64) -> String {
    match us {
        0..=999 => format!("{us} µs"),
        1_000..=999_999 => format!("{:.1} ms", us as f64 / 1e3),
        _ => format!("{:.2} s", us as f64 / 1e6),
    }
}

struct Row {
    name: &'static str,
    offered: u64,
    admitted: u64,
    refused: u64,
    latency: (u64, u64, u64, usize),
    left: usize,
}

fn run_pool(options: Options) -> Row {
    let latencies: Latencies = Arc::default();
    let pool = {
        let latencies = latencies.clone();
        Pool::builder()
            .name("demo")
            .capacity(options.capacity)
            .workers(options.workers)
            .build(move |_| DemoWorker {
                work: options.work,
                latencies: latencies.clone(),
            })
            .expect("valid options")
    };
    let stop = AtomicBool::new(false);
    let offered = thread::scope(|scope| {
        scope.spawn(|| {
            // The live status line, a few times a second.
            let began = Instant::now();
            let mut last = (pool.stats(), Instant::now());
            while began.elapsed() < options.duration {
                thread::sleep(Duration::from_millis(250));
                let now = (pool.stats(), Instant::now());
                let rates = now.0.rates_since(&last.0, now.1 - last.1);
                eprint!(
                    "\r  sidejob  {:4.1}s  admitted {:7.0}/s  overloaded {:8.0}/s  usage {:3}/{}   ",
                    began.elapsed().as_secs_f64(),
                    rates.accepted,
                    rates.rejected,
                    now.0.usage,
                    now.0.capacity,
                );
                last = now;
            }
            stop.store(true, Relaxed);
        });
        flood(
            options,
            |job| match pool.cast(job) {
                Ok(()) | Err(Error::Overload) => {}
                Err(other) => panic!("unexpected: {other}"),
            },
            &stop,
        )
    });
    eprintln!();
    pool.shutdown(); // drains what was admitted: at most `capacity` requests
    let stats = pool.stats();
    Row {
        name: "sidejob pool",
        offered,
        admitted: stats.accepted,
        refused: stats.rejected,
        latency: percentiles(&latencies),
        left: 0,
    }
}

fn run_unbounded(options: Options) -> Row {
    let latencies: Latencies = Arc::default();
    let (queue, inbox) = crossbeam_channel::unbounded::<Job>();
    let stop = AtomicBool::new(false);
    let (offered, left) = thread::scope(|scope| {
        for _ in 0..options.workers {
            let (inbox, latencies) = (inbox.clone(), latencies.clone());
            let stop = &stop;
            scope.spawn(move || {
                while let Ok(job) = inbox.recv() {
                    if stop.load(Relaxed) {
                        break; // the flood is over; what is left stays queued
                    }
                    handle(job, options.work, &latencies);
                }
            });
        }
        scope.spawn(|| {
            let began = Instant::now();
            while began.elapsed() < options.duration {
                thread::sleep(Duration::from_millis(250));
                eprint!(
                    "\r  queue    {:4.1}s  queued {:8}  handled {:8}               ",
                    began.elapsed().as_secs_f64(),
                    queue.len(),
                    latencies.lock().unwrap().len(),
                );
            }
            stop.store(true, Relaxed);
        });
        let offered = flood(
            options,
            |job| queue.send(job).expect("workers hold the receiver"),
            &stop,
        );
        let left = queue.len();
        // Unblock workers waiting on an empty queue.
        for _ in 0..options.workers {
            let _ = queue.send(Job {
                created: Instant::now(),
            });
        }
        (offered, left)
    });
    eprintln!();
    let latency = percentiles(&latencies);
    Row {
        name: "unbounded queue",
        offered,
        admitted: offered,
        refused: 0,
        latency,
        left,
    }
}

fn main() {
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("error: {message}");
            std::process::exit(2);
        }
    };
    let can_do = options.workers as f64 / options.work.as_secs_f64();
    println!(
        "{} workers x {} µs per request = {:.0} requests/s; offering {:.1}x that ({:.0}/s) from {} producers for {:.1} s\n",
        options.workers,
        options.work.as_micros(),
        can_do,
        options.load,
        can_do * options.load,
        options.producers,
        options.duration.as_secs_f64(),
    );
    println!("1. a sidejob pool, capacity {}:", options.capacity);
    let pool = run_pool(options);
    println!("2. the same flood through an unbounded queue:");
    let queue = run_unbounded(options);

    println!();
    println!(
        "{:<16} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>12}",
        "", "offered", "admitted", "overloaded", "p50", "p99", "max", "left queued"
    );
    for row in [&pool, &queue] {
        let (p50, p99, max, _) = row.latency;
        println!(
            "{:<16} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>12}",
            row.name,
            row.offered,
            row.admitted,
            row.refused,
            fmt_us(p50),
            fmt_us(p99),
            fmt_us(max),
            row.left,
        );
    }
    // What the workers really managed (sleeps overshoot), and so how long
    // a full pool's queue takes to clear: the bound on an admitted wait.
    let served = pool.admitted as f64 / options.duration.as_secs_f64();
    let drain = queue.left as f64 / served;
    println!(
        "\nThe pool said \"overloaded\" at once to what it could not take; an admitted request \
waited at most about capacity / throughput = {} / {served:.0} per s = {}.",
        options.capacity,
        fmt_us((options.capacity as f64 / served * 1e6) as u64)
    );
    println!(
        "The unbounded queue took everything: its latency grew for as long as the flood lasted, \
and {} requests were still waiting ({:.1} s of work).",
        queue.left, drain
    );
}
