//! Regression tests for issue 7 (adversarial review), the Supervisor,
//! Limiter and probe part: `close`, `wait_idle_async`, `abort_all`,
//! `Permit::forget`. Synchronised with barriers and channels; nothing
//! sleeps and nothing asserts on time. (The `wait_idle` lock-hold fix is
//! checked by `supervisor::tests::wait_idle_scans_without_the_idle_lock`,
//! which needs the crate's internals, and by the loom models.)

use std::future::Future;
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::Duration;

use sidejob::{Error, Limiter, Supervisor};

/// Long enough never to be reached by a passing test.
const FOREVER: Duration = Duration::from_secs(120);

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

// ---- item 2: close ----

#[test]
fn limiter_close_refuses_every_new_permit_and_keeps_the_held_ones() {
    let limiter = Arc::new(Limiter::builder().capacity(4).shards(2).build().unwrap());
    let held = limiter.try_acquire().unwrap();
    let owned = limiter.try_acquire_owned().unwrap();
    assert!(!limiter.is_closed());
    limiter.close();
    assert!(limiter.is_closed());
    // From this thread and others (other start shards): all refused.
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Shutdown);
    assert_eq!(limiter.try_acquire_owned().unwrap_err(), Error::Shutdown);
    let others: Vec<_> = (0..4)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.try_acquire().map(|_| ()))
        })
        .collect();
    for other in others {
        assert_eq!(other.join().unwrap(), Err(Error::Shutdown));
    }
    assert_eq!(limiter.usage(), 2, "held permits stay counted");
    drop(held);
    drop(owned);
    assert_eq!(limiter.usage(), 0);
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.completed), (2, 2));
    assert_eq!(
        stats.rejected, 0,
        "a refusal after close is not an overload"
    );
    // Closing again changes nothing.
    limiter.close();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Shutdown);
}

#[test]
fn a_full_limiter_once_closed_says_shutdown_not_overload() {
    let limiter = Limiter::builder().capacity(2).shards(2).build().unwrap();
    let held: Vec<_> = (0..2).map(|_| limiter.try_acquire().unwrap()).collect();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    limiter.close();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Shutdown);
    drop(held);
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Shutdown);
    assert_eq!(limiter.stats().rejected, 1);
}

#[test]
fn supervisor_close_refuses_new_children_and_lets_the_live_ones_finish() {
    let sup = Supervisor::builder().capacity(4).shards(2).build().unwrap();
    let guard = sup.reserve().unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let child = sup.spawn(move || go_rx.recv().unwrap()).unwrap();
    let other_handle = sup.clone();
    other_handle.close();
    assert!(sup.is_closed(), "every handle sees the close");
    assert_eq!(sup.reserve().unwrap_err(), Error::Shutdown);
    assert!(matches!(sup.spawn(|| ()), Err(Error::Shutdown)));
    assert_eq!(sup.count(), 2);
    assert_eq!(sup.which_children().len(), 2);

    // wait_idle still works after close: it waits for the two live ones.
    let waiter = {
        let sup = sup.clone();
        thread::spawn(move || sup.wait_idle(FOREVER))
    };
    drop(guard);
    go_tx.send(()).unwrap();
    child.join().unwrap();
    assert!(waiter.join().unwrap());
    assert_eq!(sup.count(), 0);
    assert_eq!(sup.reserve().unwrap_err(), Error::Shutdown);
    let stats = sup.stats();
    assert_eq!((stats.accepted, stats.completed, stats.rejected), (2, 2, 0));
}

#[test]
fn a_full_supervisor_once_closed_says_shutdown() {
    let sup = Supervisor::builder().capacity(1).shards(1).build().unwrap();
    let guard = sup.reserve().unwrap();
    assert_eq!(sup.reserve().unwrap_err(), Error::Overload);
    sup.close();
    assert_eq!(sup.reserve().unwrap_err(), Error::Shutdown);
    drop(guard);
    assert!(sup.wait_idle(Duration::ZERO));
}

#[test]
fn close_races_with_reservers_and_every_admitted_child_is_waited_for() {
    // Threads reserve in a loop while the main thread closes: every reserve
    // is admitted or refused, and wait_idle after close sees them all gone.
    let sup = Supervisor::builder().capacity(8).shards(4).build().unwrap();
    let start = Arc::new(Barrier::new(5));
    let reservers: Vec<_> = (0..4)
        .map(|_| {
            let (sup, start) = (sup.clone(), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                let mut admitted = 0u64;
                loop {
                    match sup.reserve() {
                        Ok(guard) => {
                            admitted += 1;
                            drop(guard);
                        }
                        Err(Error::Overload) => {}
                        Err(Error::Shutdown) => return admitted,
                        Err(other) => panic!("{other}"),
                    }
                }
            })
        })
        .collect();
    start.wait();
    sup.close();
    let admitted: u64 = reservers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(sup.wait_idle(FOREVER));
    let stats = sup.stats();
    assert_eq!(stats.accepted, admitted);
    assert_eq!(stats.completed, admitted);
    assert_eq!(sup.count(), 0);
}

// ---- item 3: wait_idle_async ----

#[test]
fn wait_idle_async_is_send() {
    fn send<T: Send>(_: &T) {}
    let sup = Supervisor::new(1).unwrap();
    let future = sup.wait_idle_async();
    send(&future);
}

#[test]
fn wait_idle_async_resolves_when_a_child_on_another_thread_ends() {
    let sup = Supervisor::builder().capacity(4).shards(2).build().unwrap();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Arc::new(std::sync::Mutex::new(go_rx));
    let children: Vec<_> = (0..3)
        .map(|_| {
            let go_rx = Arc::clone(&go_rx);
            sup.spawn(move || go_rx.lock().unwrap().recv().unwrap())
                .unwrap()
        })
        .collect();
    current_thread_runtime().block_on(async {
        let mut wait = std::pin::pin!(sup.wait_idle_async());
        // Poll once: children are alive, so it registers and is pending.
        tokio::select! {
            biased;
            _ = &mut wait => panic!("resolved with children alive"),
            _ = std::future::ready(()) => {}
        }
        for _ in 0..3 {
            go_tx.send(()).unwrap();
        }
        // Woken by the last child's exit on its own thread.
        wait.await;
        assert_eq!(sup.count(), 0);
    });
    for child in children {
        child.join().unwrap();
    }
}

#[test]
fn wait_idle_async_runs_on_a_multi_thread_runtime_as_a_spawned_task() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let sup = Supervisor::builder().capacity(2).shards(2).build().unwrap();
    let guards: Vec<_> = (0..2).map(|_| sup.reserve().unwrap()).collect();
    let (ready_tx, ready_rx) = mpsc::channel::<()>();
    let waiter = {
        let sup = sup.clone();
        // `tokio::spawn` needs the future to be Send.
        rt.spawn(async move {
            ready_tx.send(()).unwrap();
            sup.wait_idle_async().await;
            sup.count()
        })
    };
    ready_rx.recv().unwrap();
    let dropper = thread::spawn(move || drop(guards));
    dropper.join().unwrap();
    assert_eq!(rt.block_on(waiter).unwrap(), 0);
}

#[test]
fn wait_idle_async_cancelled_by_a_timeout_then_awaited_again() {
    let sup = Supervisor::new(2).unwrap();
    let guard = sup.reserve().unwrap();
    let rt = current_thread_runtime();
    rt.block_on(async {
        // The child is held, so this can only time out: the future is
        // dropped while registered.
        let timed_out = tokio::time::timeout(Duration::from_millis(1), sup.wait_idle_async());
        assert!(timed_out.await.is_err());
    });
    let dropper = thread::spawn(move || drop(guard));
    rt.block_on(sup.wait_idle_async());
    dropper.join().unwrap();
    assert_eq!(sup.count(), 0);
    // Idle already: resolves on the first poll.
    rt.block_on(sup.wait_idle_async());
}

#[test]
fn wait_idle_async_after_close() {
    let sup = Supervisor::new(2).unwrap();
    let guard = sup.reserve().unwrap();
    sup.close();
    let dropper = thread::spawn(move || drop(guard));
    current_thread_runtime().block_on(sup.wait_idle_async());
    dropper.join().unwrap();
    assert_eq!(sup.count(), 0);
    assert_eq!(sup.reserve().unwrap_err(), Error::Shutdown);
}

/// The future type is usable where a `Future<Output = ()>` is expected.
#[allow(dead_code)]
fn wait_idle_async_is_a_unit_future(sup: &Supervisor) -> impl Future<Output = ()> + Send + '_ {
    sup.wait_idle_async()
}

// ---- item 5: Permit::forget / OwnedPermit::forget ----

#[test]
fn forgotten_permits_stay_counted_and_shrink_the_capacity_for_good() {
    let limiter = Arc::new(Limiter::builder().capacity(3).shards(1).build().unwrap());
    limiter.try_acquire().unwrap().forget();
    limiter.try_acquire_owned().unwrap().forget();
    assert_eq!(limiter.usage(), 2);
    // One unit left, and it is reused as usual.
    for _ in 0..3 {
        let last = limiter.try_acquire().unwrap();
        assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
        drop(last);
    }
    let stats = limiter.stats();
    assert_eq!(stats.forgotten, 2);
    assert_eq!(stats.accepted, 5);
    assert_eq!(stats.completed, 3, "a forgotten unit is not completed");
    assert_eq!(stats.usage, 2);
    assert_eq!(stats.shards[0].forgotten, 2);
    // The owned permit's Arc was dropped by forget: only ours is left.
    assert_eq!(Arc::strong_count(&limiter), 1);
}

#[test]
fn forgetting_every_unit_refuses_everything_after() {
    let limiter = Limiter::builder().capacity(2).shards(2).build().unwrap();
    limiter.try_acquire().unwrap().forget();
    limiter.try_acquire().unwrap().forget();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    assert_eq!(limiter.usage(), 2);
    assert_eq!(limiter.stats().forgotten, 2);
    // Close still works on a limiter whose units are all forgotten.
    limiter.close();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Shutdown);
}

#[test]
fn a_forgotten_owned_permit_on_another_thread_is_counted_once() {
    let limiter = Arc::new(Limiter::builder().capacity(2).shards(2).build().unwrap());
    let permit = limiter.try_acquire_owned().unwrap();
    let shard = permit.shard();
    thread::spawn(move || permit.forget()).join().unwrap();
    let stats = limiter.stats();
    assert_eq!(stats.forgotten, 1);
    assert_eq!(stats.shards[shard].forgotten, 1);
    assert_eq!(stats.shards[shard].usage, 1);
    assert_eq!(stats.completed, 0);
}

// ---- item 4: abort_all ----

#[cfg(feature = "tokio")]
mod abort_all {
    use super::*;

    #[test]
    fn tasks_pending_forever_are_all_aborted_and_guards_are_not() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let sup = Supervisor::builder()
            .capacity(64)
            .shards(4)
            .build()
            .unwrap();
        let guards: Vec<_> = (0..3).map(|_| sup.reserve().unwrap()).collect();
        let guard_ids: Vec<_> = guards.iter().map(|g| g.id()).collect();
        // A reserved guard inside a tokio task is not a `spawn_task` task.
        let (in_task_tx, in_task_rx) = tokio::sync::oneshot::channel::<()>();
        let in_task_guard = sup.reserve().unwrap();
        let guarded = rt.spawn(async move {
            let _guard = in_task_guard;
            in_task_rx.await.unwrap();
        });
        let tasks: Vec<_> = (0..40)
            .map(|_| {
                sup.spawn_task_on(rt.handle(), std::future::pending::<()>())
                    .unwrap()
            })
            .collect();
        assert_eq!(sup.count(), 44);

        assert_eq!(sup.abort_all(), 40);
        for task in tasks {
            let err = rt.block_on(task).unwrap_err();
            assert!(err.is_cancelled(), "{err}");
        }
        // Every aborted task's unit is back; the four guards are untouched.
        assert_eq!(sup.count(), 4);
        let mut live = sup.which_children();
        live.sort();
        let mut expected = guard_ids.clone();
        expected.sort();
        assert!(expected.iter().all(|id| live.contains(id)));
        assert_eq!(live.len(), 4);
        let stats = sup.stats();
        assert_eq!((stats.completed, stats.panicked), (40, 0));

        // Nothing is left to abort.
        assert_eq!(sup.abort_all(), 0);
        in_task_tx.send(()).unwrap();
        rt.block_on(guarded).unwrap();
        drop(guards);
        rt.block_on(sup.wait_idle_async());
        assert_eq!(sup.count(), 0);
    }

    #[test]
    fn tasks_spawned_after_abort_all_run_normally() {
        let rt = current_thread_runtime();
        let sup = Supervisor::new(4).unwrap();
        let first = sup
            .spawn_task_on(rt.handle(), std::future::pending::<u32>())
            .unwrap();
        assert_eq!(sup.abort_all(), 1);
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let second = sup
            .spawn_task_on(rt.handle(), async move { rx.await.unwrap() + 1 })
            .unwrap();
        assert!(rt.block_on(first).unwrap_err().is_cancelled());
        tx.send(41).unwrap();
        assert_eq!(rt.block_on(second).unwrap(), 42);
        assert_eq!(sup.count(), 0);
    }

    #[test]
    fn finished_tasks_are_not_counted_and_slots_are_reused_cleanly() {
        let rt = current_thread_runtime();
        // One shard, two slots: finished tasks' slots are reused by new
        // tasks, and abort_all aborts exactly the running ones.
        let sup = Supervisor::builder().capacity(2).shards(1).build().unwrap();
        for round in 0..5u32 {
            let done = sup
                .spawn_task_on(rt.handle(), async move { round })
                .unwrap();
            assert_eq!(rt.block_on(done).unwrap(), round);
        }
        let pending = sup
            .spawn_task_on(rt.handle(), std::future::pending::<()>())
            .unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let finishing = sup
            .spawn_task_on(rt.handle(), async move { rx.await.unwrap() })
            .unwrap();
        tx.send(()).unwrap();
        rt.block_on(finishing).unwrap();
        assert_eq!(sup.abort_all(), 1);
        assert!(rt.block_on(pending).unwrap_err().is_cancelled());
        assert_eq!(sup.count(), 0);
    }

    #[test]
    fn abort_all_and_close_stop_a_busy_supervisor() {
        // A task that keeps spawning tasks: close stops new ones, abort_all
        // ends the running ones, wait_idle_async sees the end.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let sup = Supervisor::builder()
            .capacity(16)
            .shards(2)
            .build()
            .unwrap();
        let (started_tx, started_rx) = mpsc::channel::<()>();
        let spawner = {
            let sup = sup.clone();
            rt.spawn(async move {
                let mut spawned = 0u32;
                loop {
                    match sup.spawn_task(std::future::pending::<()>()) {
                        Ok(_detached) => spawned += 1,
                        Err(Error::Overload) => tokio::task::yield_now().await,
                        Err(Error::Shutdown) => return spawned,
                        Err(other) => panic!("{other}"),
                    }
                    if spawned == 16 {
                        let _ = started_tx.send(());
                    }
                }
            })
        };
        started_rx.recv().unwrap();
        sup.close();
        let spawned = rt.block_on(spawner).unwrap();
        assert_eq!(spawned, 16, "no room for more, then shut down");
        assert_eq!(sup.abort_all(), 16);
        rt.block_on(sup.wait_idle_async());
        assert_eq!(sup.count(), 0);
        assert_eq!(sup.stats().completed, 16);
    }

    #[test]
    fn abort_all_without_tasks_leaves_threads_alone() {
        let sup = Supervisor::new(2).unwrap();
        let (tx, rx) = mpsc::channel::<()>();
        let child = sup.spawn(move || rx.recv().unwrap()).unwrap();
        assert_eq!(sup.abort_all(), 0);
        assert_eq!(sup.count(), 1);
        tx.send(()).unwrap();
        child.join().unwrap();
        assert_eq!(sup.count(), 0);
    }
}
