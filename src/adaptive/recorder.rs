//! The sample recorder: counter cells that timed requests add to, lock-free,
//! and that a tick drains into one [`Drained`] sum.
//!
//! There is one cell per slot, a power of two of them (as many as CPUs, at
//! most 64), each on its own cache line pair, and a request picks its cell
//! by its thread's index, so threads on different cores mostly write
//! different lines. A record is four or five relaxed RMWs on its cell; a
//! drain swaps every counter of every cell with 0. A record that races a
//! drain may land half in one window and half in the next (its count in
//! one, its latency in the other): each counter stays exact over time, and
//! a window's figures are a close reading, never a lost or doubled sample.
//!
//! Latencies go into a log-linear histogram of [`BUCKETS`] buckets, four per
//! power of two from 1 µs (below: the first bucket) up to about 17 s
//! (above: the last), for a p99 to within a quarter of a power of two.

use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::engine::probe::thread_index;
use crate::sync::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Histogram buckets: one below 1 µs, then four per power of two.
#[cfg(not(loom))]
pub(crate) const BUCKETS: usize = 98;
/// Under loom, a few: every bucket is an atomic the model branches on,
/// and the protocol does not depend on their number.
#[cfg(loom)]
pub(crate) const BUCKETS: usize = 4;
/// log2 of the first bucket's upper edge (1,024 ns).
const FIRST_SHIFT: u32 = 10;

/// One slot's counters.
#[derive(Debug)]
struct Cell {
    samples: AtomicU64,
    dropped: AtomicU64,
    sum_nanos: AtomicU64,
    min_nanos: AtomicU64,
    buckets: [AtomicUsize; BUCKETS],
}

impl Cell {
    fn new() -> Self {
        Cell {
            samples: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
            min_nanos: AtomicU64::new(u64::MAX),
            buckets: std::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }
}

/// The cells.
#[derive(Debug)]
pub(crate) struct Recorder {
    cells: Box<[CachePadded<Cell>]>,
    /// `cells.len() - 1`: the length is a power of two.
    mask: usize,
}

/// What one drain summed.
#[derive(Debug, Clone)]
pub(crate) struct Drained {
    pub(crate) samples: u64,
    pub(crate) dropped: u64,
    pub(crate) sum_nanos: u64,
    pub(crate) min_nanos: u64,
    pub(crate) buckets: [u64; BUCKETS],
}

impl Drained {
    /// The mean latency of the successes, if any. The sum saturates, so
    /// huge samples read low: never below the least sample.
    pub(crate) fn mean(&self) -> Option<Duration> {
        (self.samples > 0).then(|| {
            let mean = self.sum_nanos / self.samples;
            let least = if self.min_nanos == u64::MAX {
                0
            } else {
                self.min_nanos
            };
            Duration::from_nanos(mean.max(least))
        })
    }

    /// The shortest success, if any.
    pub(crate) fn min(&self) -> Option<Duration> {
        (self.samples > 0 && self.min_nanos != u64::MAX)
            .then(|| Duration::from_nanos(self.min_nanos))
    }

    /// The upper edge of the bucket that holds the `q`-quantile, if any.
    pub(crate) fn quantile(&self, q: f64) -> Option<Duration> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        // The rank of the quantile, 1-based: the smallest bucket whose
        // running count reaches it.
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (index, &count) in self.buckets.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(Duration::from_nanos(upper_edge(index)));
            }
        }
        None
    }
}

impl Recorder {
    pub(crate) fn new(slots: usize) -> Self {
        let slots = slots.clamp(1, 64).next_power_of_two();
        Recorder {
            cells: (0..slots).map(|_| CachePadded::new(Cell::new())).collect(),
            mask: slots - 1,
        }
    }

    /// Adds one sample: a success of `latency`, or a drop (`dropped`),
    /// whose latency is left out.
    pub(crate) fn record(&self, latency: Duration, dropped: bool) {
        let cell = &self.cells[thread_index() & self.mask];
        // Relaxed, every counter of this file: they are statistics, read
        // by a drain that publishes nothing and orders nothing; each is
        // exact by itself because every change is an RMW on it.
        if dropped {
            // Relaxed: a statistic; the drain's swap takes it, nothing
            // pairs with it.
            cell.dropped.fetch_add(1, Relaxed);
            return;
        }
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: a statistic, taken by the drain's swap; pairs with
        // nothing (the count and the sum may land in different windows).
        cell.samples.fetch_add(1, Relaxed);
        // Saturating, not wrapping: one `Duration::MAX` sample would
        // otherwise carry the sum round to a mean below the minimum. A
        // CAS loop on a cell its thread mostly owns, on sampled requests
        // only. (Relaxed both ways: as above.)
        let _ = cell
            .sum_nanos
            .fetch_update(Relaxed, Relaxed, |sum| Some(sum.saturating_add(nanos)));
        // Skipped when not lower: a load is cheaper than an RMW that
        // writes nothing. Relaxed: a hint; the `fetch_min` below decides.
        if nanos < cell.min_nanos.load(Relaxed) {
            // Relaxed: a statistic, exact as an RMW; the drain's swap
            // takes it, nothing pairs with it.
            cell.min_nanos.fetch_min(nanos, Relaxed);
        }
        // Relaxed: as `samples`.
        cell.buckets[bucket(nanos)].fetch_add(1, Relaxed);
    }

    /// Takes every count recorded since the last drain.
    pub(crate) fn drain(&self) -> Drained {
        let mut drained = Drained {
            samples: 0,
            dropped: 0,
            sum_nanos: 0,
            min_nanos: u64::MAX,
            buckets: [0; BUCKETS],
        };
        for cell in self.cells.iter() {
            // Relaxed, each swap: as in `record`. Being RMWs, the swaps
            // take every add before them in each counter's own order and
            // lose none after, with nothing to pair with.
            drained.samples += cell.samples.swap(0, Relaxed);
            // Relaxed: as `samples`.
            drained.dropped += cell.dropped.swap(0, Relaxed);
            // Relaxed: as `samples`.
            let sum_nanos = cell.sum_nanos.swap(0, Relaxed);
            drained.sum_nanos = drained.sum_nanos.saturating_add(sum_nanos);
            // Relaxed: as `samples`.
            let min_nanos = cell.min_nanos.swap(u64::MAX, Relaxed);
            drained.min_nanos = drained.min_nanos.min(min_nanos);
            for (sum, bucket) in drained.buckets.iter_mut().zip(cell.buckets.iter()) {
                // Relaxed: a hint that spares an empty bucket the swap; an
                // add it misses is taken by the next drain.
                if bucket.load(Relaxed) != 0 {
                    // Relaxed: as `samples`.
                    *sum += bucket.swap(0, Relaxed) as u64;
                }
            }
        }
        drained
    }
}

/// The bucket of a latency of `nanos`.
pub(crate) fn bucket(nanos: u64) -> usize {
    if nanos < 1 << FIRST_SHIFT {
        return 0;
    }
    let octave = 63 - nanos.leading_zeros(); // >= FIRST_SHIFT
    let quarter = (nanos >> (octave - 2)) & 3;
    let index = 1 + (octave - FIRST_SHIFT) as usize * 4 + quarter as usize;
    index.min(BUCKETS - 1)
}

/// The largest latency bucket `index` holds, in nanoseconds.
pub(crate) fn upper_edge(index: usize) -> u64 {
    if index == 0 {
        return (1 << FIRST_SHIFT) - 1;
    }
    let octave = (index - 1) / 4 + FIRST_SHIFT as usize;
    let quarter = ((index - 1) % 4) as u64;
    ((5 + quarter) << (octave - 2)) - 1
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_what_they_say() {
        for nanos in [0, 1023, 1024, 1279, 1280, 5_000, 1_000_000, 3_000_000_000] {
            let index = bucket(nanos);
            assert!(nanos <= upper_edge(index), "{nanos} above bucket {index}");
            if index > 0 {
                assert!(
                    nanos > upper_edge(index - 1),
                    "{nanos} fits bucket {}",
                    index - 1
                );
            }
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn a_huge_sample_saturates_the_sum() {
        let recorder = Recorder::new(1);
        recorder.record(Duration::from_millis(1), false);
        recorder.record(Duration::MAX, false);
        let drained = recorder.drain();
        // A wrapped sum read a mean of 499.999 µs, below the minimum.
        assert_eq!(drained.min(), Some(Duration::from_millis(1)));
        assert_eq!(drained.mean(), Some(Duration::from_nanos(u64::MAX / 2)));
        // All huge: the mean is never below the least sample.
        recorder.record(Duration::from_nanos(u64::MAX - 1), false);
        recorder.record(Duration::from_nanos(u64::MAX - 1), false);
        let drained = recorder.drain();
        assert_eq!(drained.mean(), drained.min());
    }

    #[test]
    fn drain_sums_and_resets() {
        let recorder = Recorder::new(4);
        for ms in 1..=100 {
            recorder.record(Duration::from_millis(ms), false);
        }
        recorder.record(Duration::from_secs(9), true);
        let drained = recorder.drain();
        assert_eq!((drained.samples, drained.dropped), (100, 1));
        assert_eq!(drained.mean(), Some(Duration::from_micros(50_500)));
        assert_eq!(drained.min(), Some(Duration::from_millis(1)));
        let p99 = drained.quantile(0.99).unwrap();
        // The 99th of 1..=100 ms is 99 ms; its bucket spans a quarter octave.
        assert!(
            p99 >= Duration::from_millis(99) && p99 < Duration::from_millis(125),
            "{p99:?}"
        );
        let again = recorder.drain();
        assert_eq!((again.samples, again.dropped, again.mean()), (0, 0, None));
        assert_eq!(again.quantile(0.99), None);
    }
}
