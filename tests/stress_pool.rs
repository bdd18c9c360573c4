//! Several threads calling and casting into small pools at once: the bound
//! holds at every reading, every admitted request is handled exactly once,
//! refused ones never, and the books balance. No sleeps: threads line up
//! on a `Barrier`; the monitor stops when the producers say so.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Barrier};
use std::thread;

use sidejob::{Error, Pool, Worker};

const PER_THREAD: usize = if cfg!(miri) { 50 } else { 20_000 };

/// Marks each request id it handles; a second mark is a double handling.
struct Marker(Arc<Vec<AtomicU8>>);

impl Marker {
    fn mark(&self, id: usize) {
        let before = self.0[id].fetch_add(1, SeqCst);
        assert_eq!(before, 0, "request {id} handled twice");
    }
}

impl Worker for Marker {
    type Request = usize;
    type Reply = usize;
    type Message = usize;
    fn handle_call(&mut self, id: usize) -> usize {
        self.mark(id);
        id
    }
    fn handle_cast(&mut self, id: usize) {
        self.mark(id);
    }
}

/// Watches the bound while a storm runs: at least one reading, however
/// late the scheduler runs this thread (a small storm can end before it is
/// first scheduled), and as many as fit until `done`. Joining it re-raises
/// a failed reading.
fn watch_the_bound<W: Worker>(
    pool: &Pool<W>,
    capacity: usize,
    done: &Arc<AtomicBool>,
    barrier: &Arc<Barrier>,
) -> thread::JoinHandle<()> {
    let (pool, done, barrier) = (pool.clone(), done.clone(), barrier.clone());
    thread::spawn(move || {
        barrier.wait();
        loop {
            let over = done.load(SeqCst);
            let usage = pool.usage();
            assert!(usage <= capacity, "usage {usage} > capacity {capacity}");
            if over {
                break;
            }
        }
    })
}

fn storm(threads: usize, capacity: usize, workers: usize) {
    let total = threads * PER_THREAD;
    let marks: Arc<Vec<AtomicU8>> = Arc::new((0..total).map(|_| AtomicU8::new(0)).collect());
    let pool = {
        let marks = marks.clone();
        Pool::builder()
            .capacity(capacity)
            .workers(workers)
            .build(move |_| Marker(marks.clone()))
            .unwrap()
    };
    // The producers, the monitor and this thread.
    let barrier = Arc::new(Barrier::new(threads + 2));
    let done = Arc::new(AtomicBool::new(false));

    let monitor = watch_the_bound(&pool, capacity, &done, &barrier);
    let producers: Vec<_> = (0..threads)
        .map(|t| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let mut admitted = Vec::new();
                let mut refused = 0u64;
                for i in 0..PER_THREAD {
                    let id = t * PER_THREAD + i;
                    // Alternate: calls wait for their reply, casts do not.
                    let outcome = if i % 2 == 0 {
                        pool.call(id).map(|reply| assert_eq!(reply, id))
                    } else {
                        pool.cast(id)
                    };
                    match outcome {
                        Ok(()) => admitted.push(id),
                        Err(Error::Overload) => refused += 1,
                        Err(other) => panic!("unexpected {other}"),
                    }
                }
                (admitted, refused)
            })
        })
        .collect();
    barrier.wait();
    let mut admitted = Vec::new();
    let mut refused = 0;
    for producer in producers {
        let (ok, no) = producer.join().unwrap();
        admitted.extend(ok);
        refused += no;
    }
    pool.shutdown(); // every admitted cast is handled before this returns
    done.store(true, SeqCst);
    monitor.join().unwrap(); // re-raises the monitor's failed assertion

    let mut was_admitted = vec![false; total];
    for &id in &admitted {
        was_admitted[id] = true;
    }
    for (id, mark) in marks.iter().enumerate() {
        let expected = u8::from(was_admitted[id]);
        assert_eq!(mark.load(SeqCst), expected, "request {id}");
    }
    let stats = pool.stats();
    assert_eq!(stats.accepted, admitted.len() as u64);
    assert_eq!(stats.rejected, refused);
    assert_eq!(stats.accepted + stats.rejected, total as u64);
    assert_eq!(stats.completed, stats.accepted);
    assert_eq!((stats.usage, stats.panicked), (0, 0));
    assert!(stats.peak_usage <= capacity);
}

#[test]
fn four_threads_capacity_3_over_2_workers() {
    storm(4, 3, 2);
}

#[test]
fn six_threads_capacity_8_over_3_workers() {
    storm(6, 8, 3);
}

#[test]
fn three_threads_capacity_1() {
    storm(3, 1, 1);
}

/// Each caller has at most one request out and every shard's limit covers
/// all callers, so no shard can ever fill: any `Overload` is a bug.
#[test]
fn no_overload_when_no_shard_can_fill() {
    const CALLERS: usize = 4;
    const WORKERS: usize = 2;
    let marks: Arc<Vec<AtomicU8>> = Arc::new(
        (0..CALLERS * PER_THREAD)
            .map(|_| AtomicU8::new(0))
            .collect(),
    );
    let pool = {
        let marks = marks.clone();
        Pool::builder()
            .capacity(CALLERS * WORKERS)
            .workers(WORKERS)
            .build(move |_| Marker(marks.clone()))
            .unwrap()
    };
    let barrier = Arc::new(Barrier::new(CALLERS));
    let callers: Vec<_> = (0..CALLERS)
        .map(|t| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                for i in 0..PER_THREAD {
                    let id = t * PER_THREAD + i;
                    assert_eq!(pool.call(id), Ok(id));
                }
            })
        })
        .collect();
    for caller in callers {
        caller.join().unwrap();
    }
    assert!(marks.iter().all(|mark| mark.load(SeqCst) == 1));
    assert_eq!(pool.stats().rejected, 0);
}

/// Records, per worker, the `(thread, sequence)` of what it handled.
struct Logger {
    log: Arc<std::sync::Mutex<Vec<(usize, usize)>>>,
}

impl Worker for Logger {
    type Request = (usize, usize);
    type Reply = ();
    type Message = (usize, usize);
    fn handle_call(&mut self, request: (usize, usize)) {
        self.log.lock().unwrap().push(request);
    }
    fn handle_cast(&mut self, message: (usize, usize)) {
        self.log.lock().unwrap().push(message);
    }
}

/// A pool that does not steal, grown far past the rings it was built
/// with: its workers give casts' units back in runs, and its mailboxes
/// spill into their overflow. Under four threads casting and calling at
/// once, the bound holds at every reading, every admitted request is
/// handled exactly once, and each worker handles each thread's requests in
/// the order that thread sent them.
#[test]
fn a_plain_pool_keeps_each_senders_order_through_its_overflow() {
    const THREADS: usize = 4;
    const BUILT: usize = 16;
    const GROWN: usize = 512;
    let logs: Vec<_> = (0..2)
        .map(|_| Arc::new(std::sync::Mutex::new(Vec::new())))
        .collect();
    let pool = {
        let logs = logs.clone();
        Pool::builder()
            .capacity(BUILT)
            .workers(2)
            .steal(false)
            .build(move |index| Logger {
                log: logs[index].clone(),
            })
            .unwrap()
    };
    // Rings of 8 (the built limit); a limit of 256 each from here on.
    pool.set_capacity(GROWN).unwrap();
    let barrier = Arc::new(Barrier::new(THREADS + 2));
    let done = Arc::new(AtomicBool::new(false));
    let monitor = watch_the_bound(&pool, GROWN, &done, &barrier);
    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (pool, barrier) = (pool.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let mut admitted = 0usize;
                for i in 0..PER_THREAD {
                    let outcome = if i % 8 == 0 {
                        pool.call((t, i))
                    } else {
                        pool.cast((t, i))
                    };
                    match outcome {
                        Ok(()) => admitted += 1,
                        Err(Error::Overload) => {}
                        Err(other) => panic!("unexpected {other}"),
                    }
                }
                admitted
            })
        })
        .collect();
    barrier.wait();
    let admitted: usize = producers.into_iter().map(|p| p.join().unwrap()).sum();
    pool.shutdown();
    done.store(true, SeqCst);
    monitor.join().unwrap();

    let mut handled = std::collections::HashSet::new();
    for log in &logs {
        let log = log.lock().unwrap();
        let mut last = [None::<usize>; THREADS];
        for &(t, i) in log.iter() {
            if let Some(before) = last[t] {
                assert!(
                    before < i,
                    "thread {t}'s request {i} handled after {before}"
                );
            }
            last[t] = Some(i);
            assert!(handled.insert((t, i)), "request {t}/{i} handled twice");
        }
    }
    assert_eq!(handled.len(), admitted, "every admitted request, once");
    let stats = pool.stats();
    assert_eq!(stats.accepted, admitted as u64);
    assert_eq!(stats.completed, stats.accepted);
    assert_eq!(stats.usage, 0);
    assert!(stats.peak_usage <= GROWN);
}
