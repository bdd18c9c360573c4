//! The `Supervisor` and tokio tasks: a reserved guard bounds a task;
//! `spawn_task` (feature `tokio`) runs a bounded task, releasing its unit
//! when it completes, panics or is aborted; `abort_all` (issue 7) aborts
//! every `spawn_task` task and nothing else.

use sidejob::{Error, Supervisor};

use crate::common::multi_thread;

/// Guards reserved for tokio tasks bound them like any child, and are
/// listed while the tasks hold them.
#[test]
fn reserve_bounds_tokio_tasks() {
    let rt = multi_thread();
    let sup = Supervisor::new(3).unwrap();
    rt.block_on(async {
        let (release_tx, _) = tokio::sync::broadcast::channel::<()>(1);
        let mut tasks = Vec::new();
        let mut refused = 0;
        for _ in 0..5 {
            match sup.reserve() {
                Ok(guard) => {
                    let mut release = release_tx.subscribe();
                    tasks.push(tokio::spawn(async move {
                        let _guard = guard;
                        release.recv().await.unwrap();
                    }));
                }
                Err(Error::Overload) => refused += 1,
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!((tasks.len(), refused), (3, 2));
        assert_eq!(sup.which_children().len(), 3);
        release_tx.send(()).unwrap();
        for task in tasks {
            task.await.unwrap();
        }
        assert_eq!(sup.count(), 0);
        let stats = sup.stats();
        assert_eq!((stats.accepted, stats.rejected, stats.completed), (3, 2, 3));
    });
}

#[cfg(feature = "tokio")]
mod spawn_task {
    use sidejob::{ChildKind, Error, Supervisor};

    use crate::common::{current_thread, multi_thread};

    /// A `spawn_task` task is listed as a `Task` child, answers through its
    /// handle and releases its unit when it completes.
    #[test]
    fn spawn_task_completes_and_releases() {
        let rt = current_thread();
        let sup = Supervisor::new(2).unwrap();
        rt.block_on(async {
            let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
            let task = sup.spawn_task(async move { rx.await.unwrap() }).unwrap();
            assert_eq!(sup.which_children(), [task.id()]);
            assert_eq!(sup.children()[0].kind, ChildKind::Task);
            tx.send(5).unwrap();
            assert_eq!(task.await.unwrap(), 5);
            assert_eq!(sup.count(), 0);
            assert_eq!(sup.stats().completed, 1);
        });
    }

    /// A panicking task releases its unit, is counted in `panicked`, and its
    /// payload reaches the `JoinError`.
    #[test]
    fn spawn_task_panic_releases_and_is_counted() {
        let rt = current_thread();
        let sup = Supervisor::new(1).unwrap();
        rt.block_on(async {
            let task = sup
                .spawn_task(async {
                    tokio::task::yield_now().await;
                    panic!("task crashed")
                })
                .unwrap();
            let err: tokio::task::JoinError = task.await.unwrap_err();
            assert!(err.is_panic());
            let payload = err.into_panic();
            assert_eq!(payload.downcast_ref::<&str>(), Some(&"task crashed"));
            assert_eq!(sup.count(), 0);
            let stats = sup.stats();
            assert_eq!((stats.completed, stats.panicked), (0, 1));
            // The unit is free again.
            assert_eq!(sup.spawn_task(async { 3 }).unwrap().await.unwrap(), 3);
        });
    }

    /// An aborted task releases its unit and is counted as completed.
    #[test]
    fn spawn_task_abort_releases() {
        let rt = current_thread();
        let sup = Supervisor::new(1).unwrap();
        rt.block_on(async {
            let task = sup.spawn_task(std::future::pending::<()>()).unwrap();
            // Let it start, so the abort drops a future that has been polled.
            tokio::task::yield_now().await;
            assert_eq!(sup.count(), 1);
            assert!(matches!(sup.spawn_task(async {}), Err(Error::Overload)));
            task.abort();
            assert!(task.await.unwrap_err().is_cancelled());
            assert_eq!(sup.count(), 0);
            assert!(sup.which_children().is_empty());
            let stats = sup.stats();
            assert_eq!((stats.accepted, stats.rejected, stats.completed), (1, 1, 1));
        });
    }

    /// Outside a runtime `spawn_task` is `NoRuntime` and admits nothing;
    /// `spawn_task_on` a handle works from anywhere.
    #[test]
    fn spawn_task_on_a_handle_and_outside_a_runtime() {
        let rt = current_thread();
        let sup = Supervisor::new(1).unwrap();
        let err = sup.spawn_task(async {}).unwrap_err();
        assert_eq!(err, Error::NoRuntime);
        assert_eq!(sup.stats().accepted, 0);
        let task = sup.spawn_task_on(rt.handle(), async { 11 }).unwrap();
        assert_eq!(rt.block_on(task).unwrap(), 11);
        assert_eq!(sup.count(), 0);
    }

    /// 2,000 tasks through a capacity of 16 on a multi-threaded runtime: the
    /// books balance exactly.
    #[test]
    fn many_tasks_are_accounted_exactly() {
        let rt = multi_thread();
        let sup = Supervisor::builder()
            .capacity(16)
            .shards(2)
            .build()
            .unwrap();
        rt.block_on(async {
            let mut tasks = Vec::new();
            let (mut accepted, mut rejected) = (0u64, 0u64);
            for i in 0..2_000u64 {
                match sup.spawn_task(async move { i }) {
                    Ok(task) => {
                        accepted += 1;
                        tasks.push(task);
                    }
                    Err(Error::Overload) => rejected += 1,
                    Err(other) => panic!("{other}"),
                }
                if tasks.len() >= 8 {
                    for task in tasks.drain(..) {
                        task.await.unwrap();
                    }
                }
            }
            for task in tasks {
                task.await.unwrap();
            }
            assert_eq!(accepted + rejected, 2_000);
            assert_eq!(sup.count(), 0);
            let stats = sup.stats();
            assert_eq!((stats.accepted, stats.rejected), (accepted, rejected));
            assert_eq!(stats.completed, accepted);
        });
    }
}

#[cfg(feature = "tokio")]
mod abort_all {
    use std::sync::mpsc;

    use sidejob::{Error, Supervisor};

    use crate::common::{current_thread, multi_thread};

    /// Issue 7: `abort_all` aborts every `spawn_task` task, pending forever or
    /// not, and leaves reserved guards (even one inside a tokio task) alone.
    #[test]
    fn tasks_pending_forever_are_all_aborted_and_guards_are_not() {
        let rt = multi_thread();
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

    /// Issue 7: tasks spawned after `abort_all` run normally.
    #[test]
    fn tasks_spawned_after_abort_all_run_normally() {
        let rt = current_thread();
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

    /// Issue 7: finished tasks are not aborted (nor counted), and their slots
    /// are reused cleanly.
    #[test]
    fn finished_tasks_are_not_counted_and_slots_are_reused_cleanly() {
        let rt = current_thread();
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

    /// Issue 7: `close` stops a task that keeps spawning tasks, `abort_all`
    /// ends the running ones, `wait_idle_async` sees the end.
    #[test]
    fn abort_all_and_close_stop_a_busy_supervisor() {
        // A task that keeps spawning tasks: close stops new ones, abort_all
        // ends the running ones, wait_idle_async sees the end.
        let rt = multi_thread();
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

    /// Issue 7: `abort_all` leaves thread children alone.
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
