//! The oracle: real in-flight units across every node of a test, with a
//! high-water mark, and load generators that hold units for random times.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use sidejob::Limiter;

#[derive(Default)]
pub struct Resource {
    pub inflight: AtomicUsize,
    pub high: AtomicUsize,
    pub served: AtomicU64,
}

impl Resource {
    pub fn enter(&self) {
        let now = self.inflight.fetch_add(1, SeqCst) + 1;
        self.high.fetch_max(now, SeqCst);
    }
    pub fn leave(&self) {
        self.inflight.fetch_sub(1, SeqCst);
        self.served.fetch_add(1, SeqCst);
    }
    pub fn high(&self) -> usize {
        self.high.load(SeqCst)
    }
}

/// `threads` callers on `limiter` while `on` is set: each admitted request
/// is one unit of the shared resource held for 1..=`max_hold_ms` ms.
pub fn load(
    limiter: Arc<Limiter>,
    resource: Arc<Resource>,
    on: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    threads: usize,
    max_hold_ms: u64,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..threads)
        .map(|i| {
            let (limiter, resource, on, stop) =
                (limiter.clone(), resource.clone(), on.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
                while !stop.load(SeqCst) {
                    if !on.load(SeqCst) {
                        std::thread::sleep(Duration::from_millis(2)); // idle load generator
                        continue;
                    }
                    match limiter.try_acquire() {
                        Ok(permit) => {
                            resource.enter();
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            std::thread::sleep(Duration::from_millis(1 + x % max_hold_ms)); // the work
                            resource.leave();
                            drop(permit);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(1)), // shed, retry later
                    }
                }
            })
        })
        .collect()
}
