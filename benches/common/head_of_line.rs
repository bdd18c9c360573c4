//! The head-of-line workload that `dispatch` and `async_dispatch` offer to
//! each contender alike: a paced stream of fast requests with a slow one in
//! every 200, and the latency summary of the fast ones.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Requests in one stream.
pub const REQUESTS: usize = 6_000;
/// The gap between two requests of the stream.
pub const GAP: Duration = Duration::from_micros(200);
/// How long a fast request works.
pub const FAST: Duration = Duration::from_micros(20);
/// How long the slow one in every 200 works (or awaits).
pub const SLOW: Duration = Duration::from_millis(50);

/// What a request is: when it was sent, and how long it works.
pub type Job = (Instant, Duration);

/// Offers the paced stream to `offer` (false: refused) from the calling
/// thread; the refused count.
pub fn offer_stream(mut offer: impl FnMut(Job) -> bool) -> usize {
    let start = Instant::now();
    let mut refused = 0;
    for i in 0..REQUESTS {
        let due = start + GAP * i as u32;
        while Instant::now() < due {
            std::hint::spin_loop();
        }
        let work = if i % 200 == 100 { SLOW } else { FAST };
        if !offer((Instant::now(), work)) {
            refused += 1;
        }
    }
    refused
}

/// The fast requests' latency (queue + service) in one run.
pub struct Latency {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
    pub refused: usize,
}

/// Takes the recorded latencies out of `latencies` and summarises them.
pub fn summarize(latencies: &Mutex<Vec<Duration>>, refused: usize) -> Latency {
    let (p50, p99, max) = super::quantiles(std::mem::take(&mut *latencies.lock().unwrap()));
    Latency {
        p50,
        p99,
        max,
        refused,
    }
}
