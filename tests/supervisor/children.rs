//! A `Supervisor`'s children: the bound is exact across shards, a child
//! holds its unit until it ends, the listing is the live set, panics
//! release and are counted, an OS refusal is a spawn error, the books
//! balance under concurrency, bad configuration names its field.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use sidejob::{ChildGuard, ChildId, ChildKind, Error, Supervisor};

use crate::common::FOREVER;

fn sorted(mut ids: Vec<ChildId>) -> Vec<ChildId> {
    ids.sort();
    ids
}

/// The handles are `Send + Sync`, a guard `Send + 'static`, a `ChildId` a
/// copyable key; the supervisor and its builder are `Clone`.
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

/// Exactly `capacity` children are admitted however the shards split it;
/// the next reserve and spawn are `Overload`. `usage` reads them, as on
/// every other front-end, and `count` is its synonym (hardening 3, item
/// 14).
#[test]
fn bound_is_exact_across_shards() {
    for (capacity, shards) in [(1, 1), (3, 2), (7, 3), (8, 8), (2, 8)] {
        let sup = Supervisor::builder()
            .capacity(capacity)
            .shards(shards)
            .build()
            .unwrap();
        let guards: Vec<_> = (0..capacity).map(|_| sup.reserve().unwrap()).collect();
        assert_eq!(sup.usage(), capacity);
        assert_eq!(sup.count(), sup.usage());
        assert_eq!(sup.stats().usage, capacity);
        assert_eq!(sup.reserve().unwrap_err(), Error::Overload);
        assert!(matches!(sup.spawn(|| ()), Err(Error::Overload)));
        let stats = sup.stats();
        assert_eq!(stats.accepted, capacity as u64);
        assert_eq!(stats.rejected, 2);
        drop(guards);
        assert_eq!(sup.usage(), 0);
        assert_eq!(sup.count(), 0);
        assert_eq!(sup.stats().completed, capacity as u64);
    }
}

/// A spawned thread holds its unit until it ends; the unit is free again
/// after.
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

/// `which_children` and `children` list exactly the live children (guards
/// and threads), each once, with their kind and name.
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

/// A child thread that panics gives its unit back, is counted in
/// `panicked`, and its payload reaches `join`.
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

/// A guard dropped while its thread unwinds counts as panicked.
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

/// A thread the OS refuses is `Error::Spawn`, not `Overload`, and takes no
/// unit.
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

/// Four threads reserving and spawning at once: never more than the
/// capacity alive, and the books balance exactly.
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

/// Bad configuration is a `ConfigError` naming the field; the setters
/// never panic.
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
