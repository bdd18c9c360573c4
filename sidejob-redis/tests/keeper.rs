//! The keeper against the in-memory store: growth on refusals, shutdown,
//! config errors. No Redis needed.

use std::sync::Arc;
use std::time::Duration;

use sidejob::Limiter;
use sidejob_redis::{Budget, Fallback, LeaseStore, MemoryStore};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn budget(capacity: usize) -> Budget {
    Budget::builder()
        .name("mem")
        .capacity(capacity)
        .fresh(true)
        .ttl(ms(1000))
        .renew_every(ms(200))
        .grace(ms(300))
        .max_hold(ms(200))
        .pause_margin(ms(50))
        .build()
        .unwrap()
}

#[test]
fn refusals_grow_the_lease_and_shutdown_gives_it_back() {
    let store = MemoryStore::new();
    let limiter = Arc::new(Limiter::new(1).unwrap());
    let keeper = budget(8).attach_store(store.clone(), limiter.clone());
    // Callers hold what they get; refusals make the keeper grow early.
    let (mut tries, mut held) = (0, Vec::new());
    while !keeper.wait_for(ms(20), |s| s.leased >= 4) {
        held.extend(limiter.try_acquire());
        tries += 1;
        assert!(tries < 500, "no growth: {:?}", keeper.stats());
    }
    assert!(limiter.capacity() >= 4 && limiter.capacity() <= 8);
    assert!(keeper.stats().early_grows > 0, "{:?}", keeper.stats());
    drop(held);
    let granted = keeper.stats().grant;
    assert_eq!(keeper.shutdown(), Some(granted));
    assert_eq!(limiter.capacity(), 0);
    assert_eq!(store.clone().status().unwrap().unwrap().granted, 0);
}

#[test]
fn fail_closed_without_a_store() {
    let limiter = Arc::new(Limiter::new(5).unwrap());
    let mut b = Budget::builder();
    b.url("redis://127.0.0.1:1/") // nothing listens on port 1
        .name("closed")
        .capacity(10)
        .max_hold(ms(200))
        .ttl(ms(1000))
        .renew_every(ms(200))
        .pause_margin(ms(50));
    let keeper = b.build().unwrap().attach(limiter.clone()).unwrap();
    assert!(keeper.wait_for(ms(5000), |s| s.failures >= 2));
    assert_eq!(limiter.capacity(), 0, "no lease, no admission");
    assert!(limiter.try_acquire().is_err());
    assert_eq!(
        keeper.shutdown(),
        None,
        "nothing to release: the store is unreachable"
    );
}

#[test]
fn a_reserved_floor_is_local_and_redis_manages_the_rest() {
    let store = MemoryStore::new();
    let budget = Budget::builder()
        .name("floor")
        .capacity(10)
        .fresh(true)
        .fallback(Fallback::ReservedFloor {
            per_node: 2,
            max_nodes: 3,
        })
        .ttl(ms(1000))
        .renew_every(ms(200))
        .grace(ms(300))
        .max_hold(ms(200))
        .pause_margin(ms(50))
        .build()
        .unwrap();
    assert_eq!((budget.floor(), budget.leased_capacity()), (2, 4));
    // Redis unreachable (nothing listens on port 1): the floor stays local.
    let cut_off = Arc::new(Limiter::new(1).unwrap());
    let keeper = Budget::builder()
        .url("redis://127.0.0.1:1/")
        .name("floor")
        .capacity(10)
        .fallback(Fallback::ReservedFloor {
            per_node: 2,
            max_nodes: 3,
        })
        .max_hold(ms(200))
        .ttl(ms(1000))
        .renew_every(ms(200))
        .pause_margin(ms(50))
        .build()
        .unwrap()
        .attach(cut_off.clone())
        .unwrap();
    assert!(keeper.wait_for(ms(5000), |s| s.failures >= 2));
    assert_eq!(cut_off.capacity(), 2, "the floor needs no Redis");
    drop(keeper);
    assert_eq!(cut_off.capacity(), 2);

    let limiter = Arc::new(Limiter::new(1).unwrap());
    let keeper = budget.attach_store(store.clone(), limiter.clone());
    assert!(keeper.wait_for(ms(5000), |s| s.renewals > 0));
    assert!(limiter.capacity() >= 2);
    assert_eq!(store.clone().status().unwrap().unwrap().capacity, 4);
    drop(keeper);
    assert_eq!(limiter.capacity(), 2, "shutdown keeps the floor");
}

#[test]
fn config_errors_name_the_field() {
    let ok = || {
        let mut b = Budget::builder();
        b.name("n")
            .capacity(10)
            .max_hold(ms(200))
            .ttl(ms(1000))
            .renew_every(ms(200))
            .pause_margin(ms(50));
        b
    };
    assert!(ok().build().is_ok());
    let cases: Vec<(&str, sidejob_redis::BudgetBuilder)> = vec![
        ("name", {
            let mut b = Budget::builder();
            b.capacity(1).max_hold(ms(1));
            b
        }),
        ("name", {
            let mut b = ok();
            b.name("");
            b
        }),
        ("capacity", {
            let mut b = Budget::builder();
            b.name("n").max_hold(ms(1));
            b
        }),
        ("capacity", {
            let mut b = ok();
            b.capacity(0);
            b
        }),
        ("ttl", {
            let mut b = ok();
            b.ttl(Duration::ZERO);
            b
        }),
        ("renew_every", {
            let mut b = ok();
            b.renew_every(Duration::ZERO);
            b
        }),
        ("clock_margin", {
            let mut b = ok();
            b.clock_margin(0.5);
            b
        }),
        ("max_hold", {
            let mut b = Budget::builder();
            b.name("n").capacity(1);
            b
        }),
        ("renew_timeout", {
            let mut b = ok();
            b.renew_timeout(Duration::ZERO);
            b
        }),
        ("min_block", {
            let mut b = ok();
            b.min_block(0);
            b
        }),
        ("headroom", {
            let mut b = ok();
            b.headroom(f64::NAN);
            b
        }),
        ("fallback", {
            let mut b = ok();
            b.fallback(Fallback::ReservedFloor {
                per_node: 5,
                max_nodes: 2,
            });
            b
        }),
        // The safety inequality: T(1−2ρ) − ε − H must exceed R + timeout.
        ("ttl", {
            let mut b = ok();
            b.max_hold(ms(700));
            b
        }),
        ("ttl", {
            let mut b = ok();
            b.renew_every(ms(700));
            b
        }),
    ];
    for (field, b) in cases {
        let err = b.build().unwrap_err();
        assert_eq!(err.field(), field, "{err}");
        assert!(
            err.to_string().starts_with(&format!("invalid `{field}`")),
            "{err}"
        );
    }
    let no_url = ok()
        .build()
        .unwrap()
        .attach(Arc::new(Limiter::new(1).unwrap()))
        .unwrap_err();
    assert_eq!(no_url.field(), "url");
}

#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<sidejob_redis::Keeper>();
    send_sync::<Budget>();
    send_sync::<MemoryStore>();
    send_sync::<sidejob_redis::ConfigError>();
    send::<sidejob_redis::RedisStore>();
    send::<sidejob_redis::Core>();
}

/// Every keeper on one Redis address shares one thread, which stops with
/// the last of them; another address has its own. Nothing listens on port
/// 1, so the calls fail at once and the keepers fail closed meanwhile.
#[test]
fn one_keeper_thread_per_redis_address() {
    let url = "redis://127.0.0.1:1/7";
    let other = "redis://127.0.0.1:1/8";
    let budget = |name: &str, url: &str, every: u64| {
        Budget::builder()
            .url(url)
            .name(name)
            .capacity(10)
            .max_hold(ms(200))
            .ttl(ms(1000))
            .renew_every(ms(every))
            .pause_margin(ms(50))
            .build()
            .unwrap()
    };
    assert!(!sidejob_redis::keeper_thread_running(url));
    let limiters: Vec<_> = (0..3).map(|_| Arc::new(Limiter::new(1).unwrap())).collect();
    let a = budget("a", url, 200).attach(limiters[0].clone()).unwrap();
    let b = budget("b", url, 300).attach(limiters[1].clone()).unwrap();
    let c = budget("c", other, 200).attach(limiters[2].clone()).unwrap();
    assert!(sidejob_redis::keeper_thread_running(url));
    assert!(a.thread_id().is_some());
    assert_eq!(a.thread_id(), b.thread_id(), "one thread per address");
    assert_ne!(
        a.thread_id(),
        c.thread_id(),
        "another address, another thread"
    );
    // Each keeper keeps its own schedule on the shared thread.
    for k in [&a, &b, &c] {
        assert!(k.wait_for(ms(5000), |s| s.failures >= 2), "{:?}", k.stats());
    }
    for l in &limiters {
        assert_eq!(l.capacity(), 0, "fail closed without Redis");
    }
    drop(a);
    assert!(sidejob_redis::keeper_thread_running(url), "b still uses it");
    let before = b.stats().failures;
    assert!(b.wait_for(ms(5000), |s| s.failures > before), "b goes on");
    drop(b);
    assert!(
        !sidejob_redis::keeper_thread_running(url),
        "the last keeper stopped it"
    );
    assert!(sidejob_redis::keeper_thread_running(other));
    drop(c);
    assert!(!sidejob_redis::keeper_thread_running(other));
}

/// Keepers on their own stores share one thread too; a shutdown waiting
/// for its units to drain does not hold up the others' renewals.
#[test]
fn a_draining_keeper_does_not_stall_the_others() {
    let store = MemoryStore::new();
    let l1 = Arc::new(Limiter::new(1).unwrap());
    let l2 = Arc::new(Limiter::new(1).unwrap());
    let k1 = budget(8).attach_store(store.clone(), l1.clone());
    let other = Budget::builder()
        .name("mem2")
        .capacity(4)
        .fresh(true)
        .ttl(ms(1000))
        .renew_every(ms(200))
        .grace(ms(300))
        .max_hold(ms(200))
        .pause_margin(ms(50))
        .build()
        .unwrap();
    let k2 = other.attach_store(MemoryStore::new(), l2.clone());
    assert_eq!(k1.thread_id(), k2.thread_id());
    let mut held = Vec::new();
    while !k1.wait_for(ms(20), |s| s.leased >= 2) {
        held.extend(l1.try_acquire());
    }
    assert!(!held.is_empty());
    // k1 shuts down with units out: it drains (for up to its lease's
    // ~0.75 s left), while k2 keeps renewing on the same thread.
    let stopper = std::thread::spawn(move || k1.shutdown());
    let r = k2.stats().renewals;
    assert!(
        k2.wait_for(ms(5000), |s| s.renewals > r),
        "{:?}",
        k2.stats()
    );
    assert!(!stopper.is_finished(), "k1 waits for its units");
    drop(held);
    let released = stopper.join().unwrap();
    assert!(released.is_some(), "drained, then released");
    assert_eq!(l1.capacity(), 0);
    drop(k2);
}

/// `Budget::set_fleet_capacity` says what went wrong: no URL, a capacity
/// below the reserved floors (checked before connecting), an unreachable
/// Redis (nothing listens on port 1).
#[test]
fn set_fleet_capacity_errors_name_what_went_wrong() {
    let mut b = Budget::builder();
    b.name("admin")
        .capacity(10)
        .max_hold(ms(200))
        .ttl(ms(1000))
        .renew_every(ms(200))
        .pause_margin(ms(50));
    let err = b.build().unwrap().set_fleet_capacity(5).unwrap_err();
    assert!(err.to_string().contains("no url"), "{err}");
    b.url("redis://127.0.0.1:1/")
        .fallback(Fallback::ReservedFloor {
            per_node: 2,
            max_nodes: 3,
        });
    let budget = b.build().unwrap();
    let err = budget.set_fleet_capacity(5).unwrap_err();
    assert!(
        err.to_string()
            .contains("below the reserved floors (6 units)"),
        "{err}"
    );
    let err = budget.set_fleet_capacity(8).unwrap_err();
    assert!(
        err.to_string().starts_with("lease store call failed"),
        "{err}"
    );
}
