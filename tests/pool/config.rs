//! Building a `Pool`: configuration errors naming the field, the bounds on
//! `workers` and `spin_wait`, thread names, workers beyond the capacity,
//! auto traits.

use std::thread;
use std::time::Duration;

use sidejob::{Error, Pool, PoolBuilder, Refused, TryCallError, WeakPool, Worker};

use crate::Echo;

/// Answers with the name of the thread it runs on.
struct WhereAmI;

impl Worker for WhereAmI {
    type Request = ();
    type Reply = String;
    type Message = ();
    fn handle_call(&mut self, _: ()) -> String {
        thread::current().name().unwrap_or_default().to_string()
    }
    fn handle_cast(&mut self, _: ()) {}
}

/// A worker thread is named `<pool name>-<index>`.
#[test]
fn worker_threads_are_named_after_the_pool() {
    let pool = Pool::builder()
        .name("get_fsm")
        .capacity(1)
        .workers(1)
        .pin_workers(true)
        .build(|_| WhereAmI)
        .unwrap();
    assert_eq!(pool.call(()).unwrap(), "get_fsm-0");
    assert_eq!(pool.name(), "get_fsm");
}

/// A missing or zero capacity, zero workers and a name with a NUL are each
/// a `ConfigError` naming its field.
#[test]
fn bad_configuration_is_a_config_error_naming_the_field() {
    let err = Pool::builder().capacity(0).build(|_| Echo).unwrap_err();
    assert_eq!(err.field(), "capacity");
    let err = Pool::builder().build(|_| Echo).unwrap_err();
    assert_eq!(err.field(), "capacity");
    assert_eq!(err.to_string(), "invalid `capacity`: must be set");
    let err = Pool::builder()
        .capacity(1)
        .workers(0)
        .build(|_| Echo)
        .unwrap_err();
    assert_eq!(err.field(), "workers");
    assert_eq!(err.to_string(), "invalid `workers`: must be at least 1");
    let err = Pool::builder()
        .capacity(1)
        .name("bad\0name")
        .build(|_| Echo)
        .unwrap_err();
    assert_eq!(err.field(), "name");
    assert!(err.to_string().contains("NUL"));
}

/// More worker threads than [`MAX_WORKERS`] are refused before any starts.
/// `workers(20_000)` used to abort the whole process: each thread takes four
/// memory mappings (its stack, the signal stack std gives it, a guard page
/// for each), Linux allows 65,530 by default, and a thread that cannot map
/// its signal stack panics where it cannot unwind. `MAX_WORKERS + 1` is
/// here so that the test fails, rather than aborts, without the limit.
#[test]
fn more_workers_than_max_workers_is_a_config_error() {
    for workers in [PoolBuilder::MAX_WORKERS + 1, 20_000, usize::MAX] {
        let err = Pool::builder()
            .capacity(1)
            .workers(workers)
            .build(|_| Echo)
            .unwrap_err();
        assert_eq!(err.field(), "workers");
        assert_eq!(
            err.to_string(),
            format!(
                "invalid `workers`: must be at most {}",
                PoolBuilder::MAX_WORKERS
            )
        );
    }
}

/// Issue 7: `spin_wait(Duration::MAX)` was accepted; past [`MAX_SPIN_WAIT`]
/// it is a configuration error, and the cap itself is fine.
#[test]
fn spin_wait_beyond_the_cap_is_a_config_error() {
    for spin in [
        Duration::MAX,
        PoolBuilder::MAX_SPIN_WAIT + Duration::from_nanos(1),
    ] {
        let err = Pool::builder()
            .capacity(1)
            .spin_wait(spin)
            .build(|_| Echo)
            .unwrap_err();
        assert_eq!(err.field(), "spin_wait");
        assert_eq!(err.to_string(), "invalid `spin_wait`: must be at most 10ms");
    }
    let pool = Pool::builder()
        .capacity(1)
        .spin_wait(PoolBuilder::MAX_SPIN_WAIT)
        .build(|_| Echo)
        .unwrap();
    assert_eq!(pool.call(1), Ok(1));
}

/// More workers than units: every worker runs (most with a share of 0),
/// and each takes work once the capacity grows to reach it.
#[test]
fn workers_beyond_capacity_all_run_and_take_work_once_it_grows() {
    let pool = Pool::builder()
        .capacity(3)
        .workers(16)
        .build(|_| Echo)
        .unwrap();
    assert_eq!(pool.workers(), 16);
    let limits: Vec<usize> = pool.stats().shards.iter().map(|s| s.limit).collect();
    assert_eq!(limits.iter().filter(|&&l| l == 0).count(), 13);
    pool.set_capacity(16).unwrap();
    let limits: Vec<usize> = pool.stats().shards.iter().map(|s| s.limit).collect();
    assert_eq!(limits, vec![1; 16]);
    for n in 0..16u64 {
        pool.cast(n).unwrap();
    }
    pool.shutdown();
    // Each admitted cast was handled once.
    assert_eq!(pool.stats().completed, 16);
}

/// A pool handle is `Send + Sync` and `Clone`; a `call_async` future is
/// `Send + 'static`.
#[test]
fn handles_and_futures_are_send_and_sync() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send_static<T: Send + 'static>(_: &T) {}
    let pool = Pool::builder().capacity(1).build(|_| Echo).unwrap();
    send_sync(&pool);
    let future = pool.call_async(1);
    send_static(&future);
    let _clone: Pool<Echo> = pool.clone();
    drop(future);
}

/// Issue 7's handles and errors (`WeakPool`, `Refused`, `TryCallError`,
/// `Error::CallingSelf`) are `Send + Sync + 'static`, and `CallingSelf`
/// says what it means.
#[test]
fn new_handles_and_errors_are_send_sync_and_static() {
    fn send_sync<T: Send + Sync>() {}
    fn send_sync_static<T: Send + Sync + 'static>() {}
    send_sync::<WeakPool<Echo>>();
    send_sync::<Pool<Echo>>();
    send_sync_static::<Refused<String>>();
    send_sync_static::<TryCallError<Vec<u8>>>();
    send_sync_static::<Error>();
    let _: fn(&Error) -> bool = Error::is_calling_self;
    assert_eq!(
        Error::CallingSelf.to_string(),
        "the call would wait for the calling worker itself"
    );
}
