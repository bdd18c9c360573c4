//! Public behaviour of `Supervisor`: the bound, the listing, panics, exact
//! accounting under concurrency, guards in tokio tasks, `spawn_task`, bad
//! configuration, auto traits. Synchronised with barriers and channels;
//! nothing sleeps and nothing asserts on time.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use sidejob::{ChildGuard, ChildId, ChildKind, Error, Supervisor};

/// Long enough never to be reached by a passing test.
const FOREVER: Duration = Duration::from_secs(120);

fn sorted(mut ids: Vec<ChildId>) -> Vec<ChildId> {
    ids.sort();
    ids
}

#[test]
fn auto_traits() {
    fn send_sync<T: Send + Sync>() {}
    fn send_static<T: Send + 'static>() {}
    fn copy_key<T: Copy + Eq + std::hash::Hash + std::fmt::Debug + std::fmt::Display>() {}
    send_sync::<Supervisor>();
    send_static::<ChildGuard>();
    send_sync::<sidejob::Child<u32>>();
    send_sync::<sidejob::ChildInfo>();
    copy_key::<ChildId>();
    fn clone<T: Clone>() {}
    clone::<Supervisor>();
    clone::<sidejob::SupervisorBuilder>();
}

#[test]
fn bound_is_exact_across_shards() {
    for (capacity, shards) in [(1, 1), (3, 2), (7, 3), (8, 8), (2, 8)] {
        let sup = Supervisor::builder()
            .capacity(capacity)
            .shards(shards)
            .build()
            .unwrap();
        let guards: Vec<_> = (0..capacity).map(|_| sup.reserve().unwrap()).collect();
        assert_eq!(sup.count(), capacity);
        assert_eq!(sup.reserve().unwrap_err(), Error::Overload);
        assert!(matches!(sup.spawn(|| ()), Err(Error::Overload)));
        let stats = sup.stats();
        assert_eq!(stats.accepted, capacity as u64);
        assert_eq!(stats.rejected, 2);
        drop(guards);
        assert_eq!(sup.count(), 0);
        assert_eq!(sup.stats().completed, capacity as u64);
    }
}

#[test]
fn spawned_threads_hold_their_unit_until_they_end() {
    let sup = Supervisor::builder()
        .name("bound")
        .capacity(2)
        .build()
        .unwrap();
    let gate = Arc::new(Barrier::new(3));
    let children: Vec<_> = (0..2)
        .map(|i| {
            let gate = Arc::clone(&gate);
            sup.spawn(move || {
                gate.wait();
                i
            })
            .unwrap()
        })
        .collect();
    assert_eq!(sup.count(), 2);
    assert!(matches!(sup.spawn(|| 9), Err(Error::Overload)));
    gate.wait();
    let got: Vec<_> = children.into_iter().map(|c| c.join().unwrap()).collect();
    assert_eq!(got, [0, 1]);
    assert_eq!(sup.count(), 0);
    assert_eq!(sup.spawn(|| 9).unwrap().join().unwrap(), 9);
}

#[test]
fn listing_equals_the_live_set() {
    let sup = Supervisor::builder()
        .name("list")
        .capacity(16)
        .shards(4)
        .build()
        .unwrap();
    let mut guards: Vec<ChildGuard> = (0..6).map(|_| sup.reserve().unwrap()).collect();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Arc::new(Mutex::new(release_rx));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let rx = Arc::clone(&release_rx);
            sup.spawn(move || rx.lock().unwrap().recv().unwrap())
                .unwrap()
        })
        .collect();

    let mut expected: Vec<ChildId> = guards.iter().map(ChildGuard::id).collect();
    expected.extend(threads.iter().map(|c| c.id()));
    assert_eq!(sorted(sup.which_children()), sorted(expected.clone()));
    assert_eq!(
        expected.iter().collect::<HashSet<_>>().len(),
        9,
        "ids unique"
    );

    // Drop every other guard: exactly those leave the listing.
    let dropped: Vec<ChildId> = (0..3).map(|i| guards.remove(i).id()).collect();
    expected.retain(|id| !dropped.contains(id));
    assert_eq!(sorted(sup.which_children()), sorted(expected.clone()));

    let infos = sup.children();
    assert_eq!(
        sorted(infos.iter().map(|i| i.id).collect()),
        sorted(expected)
    );
    for info in &infos {
        match info.kind {
            ChildKind::Thread => assert_eq!(info.name.as_deref(), Some("list-child")),
            ChildKind::Reserved => assert_eq!(info.name, None),
            other => panic!("unexpected kind {other:?}"),
        }
    }

    for _ in &threads {
        release_tx.send(()).unwrap();
    }
    for child in threads {
        child.join().unwrap();
    }
    drop(guards);
    assert!(sup.which_children().is_empty());
    assert!(sup.children().is_empty());
    assert!(sup.wait_idle(Duration::ZERO));
}

#[test]
fn a_panicking_child_releases_its_unit_and_is_counted() {
    let sup = Supervisor::new(1).unwrap();
    let child = sup.spawn(|| -> u32 { panic!("child crashed") }).unwrap();
    let payload = child.join().unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"child crashed"));
    assert_eq!(sup.count(), 0);
    assert!(sup.which_children().is_empty());
    let stats = sup.stats();
    assert_eq!((stats.accepted, stats.completed, stats.panicked), (1, 0, 1));
    // The unit is free again.
    assert_eq!(sup.spawn(|| 1).unwrap().join().unwrap(), 1);
}

#[test]
fn a_guard_dropped_by_unwinding_counts_as_panicked() {
    let sup = Supervisor::new(2).unwrap();
    let guard = sup.reserve().unwrap();
    let result = thread::spawn(move || {
        let _guard = guard;
        panic!("job failed");
    })
    .join();
    assert!(result.is_err());
    assert_eq!(sup.stats().panicked, 1);
    assert_eq!(sup.count(), 0);
}

#[test]
fn os_refusal_is_a_spawn_error_not_overload() {
    // No OS gives a thread a stack of 2^60 bytes.
    let sup = Supervisor::builder()
        .capacity(1)
        .stack_size(1 << 60)
        .build()
        .unwrap();
    let err = sup.spawn(|| ()).unwrap_err();
    assert!(matches!(err, Error::Spawn(_)), "{err:?}");
    assert!(!err.is_overload());
    assert_eq!(sup.count(), 0);
    assert!(sup.which_children().is_empty());
    assert!(sup.reserve().is_ok());
}

#[test]
fn many_short_children_from_several_threads_are_accounted_exactly() {
    const THREADS: usize = 4;
    const ATTEMPTS: usize = 2_000;
    let sup = Supervisor::builder().capacity(8).shards(3).build().unwrap();
    let active = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(THREADS));
    let callers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (sup, active, start) = (sup.clone(), Arc::clone(&active), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                let (mut accepted, mut rejected) = (0usize, 0usize);
                let mut held = Vec::new();
                for i in 0..ATTEMPTS {
                    match sup.reserve() {
                        Ok(guard) => {
                            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                            assert!(now <= 8, "{now} children alive, capacity 8");
                            accepted += 1;
                            held.push(guard);
                        }
                        Err(Error::Overload) => rejected += 1,
                        Err(other) => panic!("{other}"),
                    }
                    // Hold a few children for a while, to reach the bound.
                    if held.len() > (t + i) % 3 {
                        active.fetch_sub(1, Ordering::SeqCst);
                        drop(held.remove(0));
                    }
                    // A real thread child now and then.
                    if i % 250 == 0 {
                        if let Ok(child) = sup.spawn(move || i) {
                            accepted += 1;
                            assert_eq!(child.join().unwrap(), i);
                        } else {
                            rejected += 1;
                        }
                    }
                }
                active.fetch_sub(held.len(), Ordering::SeqCst);
                drop(held);
                (accepted, rejected)
            })
        })
        .collect();
    let (mut accepted, mut rejected) = (0, 0);
    for caller in callers {
        let (a, r) = caller.join().unwrap();
        accepted += a;
        rejected += r;
    }
    let attempts = THREADS * (ATTEMPTS + ATTEMPTS / 250);
    assert_eq!(accepted + rejected, attempts);
    assert!(sup.wait_idle(FOREVER));
    assert_eq!(sup.count(), 0);
    assert!(sup.which_children().is_empty());
    let stats = sup.stats();
    assert_eq!(stats.accepted, accepted as u64);
    assert_eq!(stats.rejected, rejected as u64);
    assert_eq!(stats.completed, accepted as u64);
    assert_eq!(stats.panicked, 0);
    assert!(stats.peak_usage <= 8);
}

#[test]
fn wait_idle_wakes_when_the_last_child_leaves() {
    let sup = Supervisor::builder().capacity(4).shards(2).build().unwrap();
    let guards: Vec<_> = (0..4).map(|_| sup.reserve().unwrap()).collect();
    assert!(!sup.wait_idle(Duration::ZERO));
    let (waiting_tx, waiting_rx) = mpsc::channel();
    let waiter = {
        let sup = sup.clone();
        thread::spawn(move || {
            waiting_tx.send(()).unwrap();
            sup.wait_idle(FOREVER)
        })
    };
    waiting_rx.recv().unwrap();
    drop(guards);
    assert!(waiter.join().unwrap());
    assert_eq!(sup.count(), 0);
}

#[test]
fn bad_configuration_names_the_field() {
    let err = Supervisor::builder()
        .name("fsm\0")
        .capacity(1)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "name");
    assert_eq!(
        err.to_string(),
        "invalid `name`: must not contain a NUL byte"
    );
    assert_eq!(Supervisor::new(0).unwrap_err().field(), "capacity");
    assert_eq!(
        Supervisor::builder().build().unwrap_err().to_string(),
        "invalid `capacity`: must be set"
    );
    assert_eq!(
        Supervisor::builder()
            .capacity(1)
            .shards(0)
            .build()
            .unwrap_err()
            .field(),
        "shards"
    );
    // Setters never panic; every shard is kept, most with a share of 0.
    let sup = Supervisor::builder()
        .capacity(2)
        .shards(64)
        .build()
        .unwrap();
    assert_eq!(sup.shards(), 64);
    assert_eq!(sup.name(), "sidejob");
    assert_eq!(sup.stats().shards.iter().filter(|s| s.limit > 0).count(), 2);
    // A max_capacity below the capacity, or past the registry's limit.
    let err = Supervisor::builder()
        .capacity(5)
        .max_capacity(4)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "capacity");
    let err = Supervisor::builder()
        .capacity(5)
        .max_capacity(usize::MAX)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "max_capacity");
}

#[test]
fn reserve_bounds_tokio_tasks() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
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
mod tasks {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn spawn_task_completes_and_releases() {
        let rt = runtime();
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

    #[test]
    fn spawn_task_panic_releases_and_is_counted() {
        let rt = runtime();
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

    #[test]
    fn spawn_task_abort_releases() {
        let rt = runtime();
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

    #[test]
    fn spawn_task_on_a_handle_and_outside_a_runtime() {
        let rt = runtime();
        let sup = Supervisor::new(1).unwrap();
        let err = sup.spawn_task(async {}).unwrap_err();
        assert_eq!(err, Error::Spawn(std::io::ErrorKind::NotFound));
        assert_eq!(sup.stats().accepted, 0);
        let task = sup.spawn_task_on(rt.handle(), async { 11 }).unwrap();
        assert_eq!(rt.block_on(task).unwrap(), 11);
        assert_eq!(sup.count(), 0);
    }

    #[test]
    fn many_tasks_are_accounted_exactly() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
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
