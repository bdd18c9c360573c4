//! The table's unit tests (its private state is theirs to read).

use super::Table;
use crate::engine::probe::Probe;
use crate::engine::waiters::Policy;
use crate::error::Error;
use crate::sync::Ordering::Relaxed;
use crate::sync::{now, Arc};

fn limits(table: &Table) -> Vec<usize> {
    table.shards.iter().map(|s| s.limit()).collect()
}

/// Polls `future` on this thread, parking between polls; the waker
/// unparks it. No runtime: only the crate's own watcher can time out.
fn block_on_parked<F: std::future::Future + Unpin>(mut future: F) -> F::Output {
    struct Unpark(crate::sync::os_thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(crate::sync::os_thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    loop {
        if let std::task::Poll::Ready(output) = std::pin::Pin::new(&mut future).poll(&mut cx) {
            return output;
        }
        crate::sync::os_thread::park();
    }
}

#[test]
fn an_async_waiter_times_out_at_its_callers_deadline_before_max_wait() {
    let policy = Policy {
        max_waiters: 4,
        max_wait: std::time::Duration::from_secs(3600),
        ..Policy::default()
    };
    let table = Table::new(1, 1, Probe::Thread)
        .unwrap()
        .with_policy(&policy)
        .unwrap();
    let held = table.acquire().unwrap();
    // The caller's deadline, far earlier than `max_wait`: the watcher
    // must ring for it, the only thing that can wake this waiter.
    for wait_ms in [5, 1, 0] {
        let deadline = now() + std::time::Duration::from_millis(wait_ms);
        let result = block_on_parked(table.acquire_async(Some(deadline)));
        assert_eq!(result, Err(Error::Timeout));
        assert!(now() >= deadline);
        assert_eq!(table.waiting(), 0);
    }
    // A deadline already past times out after one re-check, unqueued.
    let past = now();
    assert_eq!(
        block_on_parked(table.acquire_async(Some(past))),
        Err(Error::Timeout)
    );
    assert_eq!(table.stats().timed_out, 4);
    table.release(held, false);
    assert_eq!(table.usage(), 0);
}

#[test]
fn limits_add_up_to_capacity() {
    for capacity in 1..40 {
        for shards in 1..12 {
            let table = Table::new(capacity, shards, Probe::Thread).unwrap();
            let limits = limits(&table);
            assert_eq!(limits.iter().sum::<usize>(), capacity);
            // Every shard is kept: with less capacity than shards, the
            // last ones start at 0 (and full), ready to grow into.
            assert_eq!(limits.len(), shards);
            let (min, max) = (limits.iter().min().unwrap(), limits.iter().max().unwrap());
            assert!(max - min <= 1, "{limits:?}");
            for (i, &limit) in limits.iter().enumerate() {
                assert_eq!(table.full.contains(i), limit == 0, "{limits:?}");
            }
        }
    }
}

#[test]
fn reduce_is_modulo() {
    for shards in [1, 2, 3, 5, 7, 64, 65, 1000] {
        let table = Table::new(10_000, shards, Probe::Thread).unwrap();
        for position in (0..5000).chain([u32::MAX as usize - 1, u32::MAX as usize]) {
            assert_eq!(table.reduce(position), position % shards.min(10_000));
        }
    }
}

#[test]
fn walk_covers_every_shard_from_every_start_across_words() {
    for shards in [1, 2, 63, 64, 65, 130] {
        for start in 0..shards {
            let table = Table::new(shards, shards, Probe::Thread).unwrap();
            let mut got: Vec<usize> = (0..shards)
                .map(|_| table.acquire_at(start).unwrap())
                .collect();
            assert_eq!(got[0], start);
            assert_eq!(table.acquire_at(start), Err(Error::Overload));
            got.sort_unstable();
            assert_eq!(got, (0..shards).collect::<Vec<_>>());
            // Every bit is set now, and one release clears exactly one.
            table.release(shards - 1, false);
            assert_eq!(table.acquire_at(start), Ok(shards - 1));
        }
    }
}

#[test]
fn refusal_past_64_shards_reads_the_count() {
    for shards in [65, 130, 1024] {
        let table = Table::new(shards, shards, Probe::Thread).unwrap();
        assert!(table.counted);
        let got: Vec<usize> = (0..shards).map(|_| table.acquire_at(7).unwrap()).collect();
        // Every shard is marked, and counted once.
        assert_eq!(table.full_count.load(Relaxed), shards);
        assert!(table.all_marked(table.full.word(0)));
        assert_eq!(table.acquire_at(3), Err(Error::Overload));
        // A release uncounts its shard before its unit is back.
        table.release(got[10], false);
        assert_eq!(table.full_count.load(Relaxed), shards - 1);
        assert_eq!(table.acquire_at(3), Ok(got[10]));
        assert_eq!(table.full_count.load(Relaxed), shards);
        for &shard in &got {
            table.release(shard, false);
        }
        assert_eq!(table.full_count.load(Relaxed), 0);
        assert_eq!(table.usage(), 0);
    }
    let small = Table::new(64, 64, Probe::Thread).unwrap();
    assert!(!small.counted);
}

#[test]
fn a_shrink_below_the_holdings_is_a_debt_until_they_drain() {
    let table = Table::new(4, 2, Probe::Thread).unwrap();
    let held: Vec<usize> = (0..4).map(|_| table.acquire().unwrap()).collect();
    table.set_capacity(2).unwrap();
    assert!(table.in_debt());
    assert_eq!(table.available(), 0);
    // Two back: still 2 held, the new capacity; the debt settles at the
    // next admission, which is refused (full).
    table.release(held[0], false);
    table.release(held[1], false);
    assert_eq!(table.acquire(), Err(Error::Overload));
    assert!(!table.in_debt());
    let limits = limits(&table);
    assert_eq!(limits.iter().sum::<usize>(), 2);
    table.release(held[2], false);
    let again = table.acquire().unwrap();
    assert_eq!(table.acquire(), Err(Error::Overload));
    table.release(again, false);
    table.release(held[3], false);
    assert_eq!(table.usage(), 0);
    // Stats see no trace of the gate: accepted = completed.
    let stats = table.stats();
    assert_eq!(stats.accepted, stats.completed);
    assert_eq!(stats.accepted, 5);
}

#[test]
fn resize_respects_the_caps() {
    let table = Table::with_max(2, 6, 3, Probe::Thread).unwrap();
    assert_eq!((table.cap(0), table.cap(1), table.cap(2)), (2, 2, 2));
    table.set_capacity(6).unwrap();
    assert_eq!(limits(&table), [2, 2, 2]);
    assert_eq!(table.set_capacity(7).unwrap_err().field(), "capacity");
    assert!(Table::with_max(7, 6, 3, Probe::Thread).is_err());
}

#[test]
fn a_release_unmarks_before_its_unit_is_back() {
    // Single-threaded, the order is invisible; check the end state the
    // protocol promises: no mark on a shard with room, for every shard.
    let table = Table::new(3, 3, Probe::Thread).unwrap();
    let held: Vec<usize> = (0..3).map(|_| table.acquire().unwrap()).collect();
    assert_eq!(table.full.word(0), 0b111);
    table.release(held[1], false);
    assert_eq!(table.full.word(0), 0b111 & !(1 << held[1]));
}

#[test]
fn lower_bound_is_exact_when_quiet_and_never_above_the_limit() {
    let table = Table::new(4, 1, Probe::Thread).unwrap();
    let shard = table.shard(0);
    for expected in 1..=4 {
        table.acquire().unwrap();
        assert_eq!(shard.lower_bound().0, expected);
        assert_eq!(shard.counts(), shard.lower_bound());
    }
}

#[test]
fn walk_takes_the_next_shard_in_order() {
    let table = Table::new(4, 4, Probe::Thread).unwrap();
    assert_eq!(table.acquire_at(2), Ok(2));
    assert_eq!(table.acquire_at(2), Ok(3));
    assert_eq!(table.acquire_at(2), Ok(0));
    assert_eq!(table.acquire_at(2), Ok(1));
}

#[test]
fn closed_table_refuses_with_shutdown_and_keeps_counts() {
    let table = Table::new(2, 2, Probe::Thread).unwrap();
    let held = table.acquire_at(0).unwrap();
    table.close();
    assert_eq!(table.acquire_at(0), Err(Error::Shutdown));
    assert_eq!(table.acquire_at(1), Err(Error::Shutdown));
    assert_eq!(table.acquire_unbounded(), Err(Error::Shutdown));
    assert_eq!(table.usage(), 1);
    table.release(held, false);
    assert_eq!(table.usage(), 0);
    assert_eq!(table.stats().rejected, 0);
}

#[test]
fn unbounded_takes_are_counted_beyond_the_limit() {
    let table = Table::new(1, 1, Probe::Thread).unwrap();
    table.acquire().unwrap();
    assert_eq!(table.acquire(), Err(Error::Overload));
    table.acquire_unbounded().unwrap();
    assert_eq!(table.usage(), 2);
    // Units taken beyond the limit count in the peak too.
    assert_eq!(table.stats().peak_usage, 2);
    table.release(0, false);
    assert_eq!(table.acquire(), Err(Error::Overload));
    table.release(0, true);
    assert_eq!(table.acquire(), Ok(0));
    let stats = table.stats();
    assert_eq!((stats.accepted, stats.completed, stats.panicked), (3, 1, 1));
    assert_eq!(stats.rejected, 2);
}

/// Refusals are counted exactly whichever counter takes them: a thread
/// whose index names a shard counts on that shard (the fast path's
/// `refused_home`), any other in the table's per-thread slots; with more
/// threads than shards, both at once. A shrunk table's shards over their
/// limit send the refusal down the cold path, counted there.
#[test]
fn refusals_are_counted_exactly_on_every_path() {
    const THREADS: usize = 6;
    const TRIES: usize = 2_000;
    let table = Arc::new(Table::new(2, 2, Probe::Thread).unwrap());
    let held = [table.acquire_at(0).unwrap(), table.acquire_at(1).unwrap()];
    let barrier = Arc::new(std::sync::Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (table, barrier) = (Arc::clone(&table), Arc::clone(&barrier));
            std::thread::spawn(move || {
                // Every thread is live at once: their indices differ, and
                // some are past the two shards.
                barrier.wait();
                let refused = (0..TRIES)
                    .filter(|_| table.acquire() == Err(Error::Overload))
                    .count();
                barrier.wait();
                refused
            })
        })
        .collect();
    let refused: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(refused, THREADS * TRIES);
    assert_eq!(table.stats().rejected, (THREADS * TRIES) as u64);

    // Shrunk under what is held: one shard is at its limit of 1, the other
    // over its limit of 0, a reading the fast path leaves to the cold one,
    // which still refuses and counts.
    table.set_capacity(1).unwrap();
    let before = table.stats().rejected;
    assert_eq!(table.acquire_at(0), Err(Error::Overload));
    assert_eq!(table.acquire_at(1), Err(Error::Overload));
    assert_eq!(table.acquire(), Err(Error::Overload));
    assert_eq!(table.stats().rejected, before + 3);
    for shard in held {
        table.release(shard, false);
    }
    assert_eq!(table.usage(), 0);
}
