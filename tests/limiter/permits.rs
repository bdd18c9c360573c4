//! The `Limiter`'s admission: shard limits add up to the capacity, overload
//! is immediate and counted, both probes admit exactly the capacity, owned
//! permits move across threads, stats and rates, panics, configuration
//! errors, `Debug`, auto traits; `close` and `forget` (issue 7).

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use sidejob::probe::Probe;
use sidejob::{Error, Limiter, OwnedPermit, Permit};

use super::limiter;

/// For every capacity and shard count, the shard limits add up to the
/// capacity, differ by one at most, and exactly that many permits are taken.
#[test]
fn shard_limits_sum_to_capacity_exactly() {
    for capacity in 1..=24 {
        for shards in 1..=9 {
            let limiter = limiter(capacity, shards);
            assert_eq!(limiter.capacity(), capacity);
            // Every shard is kept, whatever the capacity.
            assert_eq!(limiter.shards(), shards);
            let stats = limiter.stats();
            let limits: Vec<usize> = stats.shards.iter().map(|s| s.limit).collect();
            assert_eq!(limits.iter().sum::<usize>(), capacity, "{limits:?}");
            let (min, max) = (limits.iter().min().unwrap(), limits.iter().max().unwrap());
            assert!(max - min <= 1, "uneven split {limits:?}");

            // Exactly `capacity` permits can be taken, then Overload.
            let held: Vec<Permit<'_>> = (0..capacity)
                .map(|_| limiter.try_acquire().unwrap())
                .collect();
            assert_eq!(limiter.usage(), capacity);
            assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
            // Each shard holds exactly its limit.
            for (i, shard) in limiter.stats().shards.iter().enumerate() {
                assert_eq!(shard.usage, shard.limit, "shard {i}");
                let on_shard = held.iter().filter(|p| p.shard() == i).count();
                assert_eq!(on_shard, shard.limit, "shard {i}");
            }
            drop(held);
            assert_eq!(limiter.usage(), 0);
        }
    }
}

/// A capacity below the shard count keeps every shard, the extra ones with a
/// share of 0.
#[test]
fn capacity_below_shard_count_keeps_every_shard_at_a_share_of_zero() {
    let limiter = limiter(3, 8);
    assert_eq!(limiter.shards(), 8);
    let held: Vec<_> = (0..3).map(|_| limiter.try_acquire().unwrap()).collect();
    let mut shards: Vec<usize> = held.iter().map(Permit::shard).collect();
    shards.sort_unstable();
    assert_eq!(shards, vec![0, 1, 2]);
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    let limits: Vec<usize> = limiter.stats().shards.iter().map(|s| s.limit).collect();
    assert_eq!(limits, [1, 1, 1, 0, 0, 0, 0, 0]);
}

/// `Overload` is immediate and counted, and a released unit is found
/// again.
#[test]
fn overload_is_immediate_counted_and_recovers() {
    let limiter = limiter(2, 2);
    let a = limiter.try_acquire().unwrap();
    let b = limiter.try_acquire().unwrap();
    for _ in 0..5 {
        let err = limiter.try_acquire().unwrap_err();
        assert_eq!(err, Error::Overload);
        assert!(err.is_overload());
    }
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.rejected, stats.usage), (2, 5, 2));
    drop(a);
    let c = limiter
        .try_acquire()
        .expect("a released unit is found again");
    assert_eq!(limiter.usage(), 2);
    drop((b, c));
    assert_eq!(limiter.usage(), 0);
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.rejected, stats.completed), (3, 5, 3));
}

/// Both probes (`Thread`, `Cpu`) admit exactly the capacity.
#[test]
fn both_probes_admit_exactly_capacity() {
    for probe in [Probe::Thread, Probe::Cpu] {
        let limiter = Limiter::builder()
            .capacity(5)
            .shards(3)
            .probe(probe)
            .build()
            .unwrap();
        let held: Vec<_> = (0..5).map(|_| limiter.try_acquire().unwrap()).collect();
        assert_eq!(
            limiter.try_acquire().unwrap_err(),
            Error::Overload,
            "{probe:?}"
        );
        drop(held);
        assert_eq!(limiter.usage(), 0);
    }
}

/// Owned permits move across threads and release where they are dropped.
#[test]
fn owned_permits_move_across_threads() {
    let limiter = Arc::new(limiter(3, 2));
    let permits: Vec<OwnedPermit> = (0..3)
        .map(|_| limiter.try_acquire_owned().unwrap())
        .collect();
    assert_eq!(limiter.try_acquire_owned().unwrap_err(), Error::Overload);
    for permit in &permits {
        assert!(Arc::ptr_eq(permit.limiter(), &limiter));
    }

    // Hand each permit to a thread that holds it until told to let go.
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
    let handles: Vec<_> = permits
        .into_iter()
        .map(|permit| {
            let release_rx = Arc::clone(&release_rx);
            thread::spawn(move || {
                release_rx.lock().unwrap().recv().unwrap();
                drop(permit);
            })
        })
        .collect();
    assert_eq!(limiter.usage(), 3);
    release_tx.send(()).unwrap();
    // One released; the others still held by their threads.
    let one = loop {
        // The released thread may not have dropped yet: retry only on
        // Overload, without sleeping (each refusal is counted, not timed).
        match limiter.try_acquire_owned() {
            Ok(permit) => break permit,
            Err(Error::Overload) => thread::yield_now(),
            Err(other) => panic!("{other}"),
        }
    };
    assert_eq!(limiter.usage(), 3);
    drop(one);
    release_tx.send(()).unwrap();
    release_tx.send(()).unwrap();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(limiter.usage(), 0);
    let stats = limiter.stats();
    assert_eq!(stats.accepted, 4);
    assert_eq!(stats.completed, 4);
    assert!(stats.rejected >= 1);
}

/// The stats count admissions, refusals and completions per shard, and
/// `rates_since` divides them by the interval (zero for a zero interval).
#[test]
fn stats_count_and_rates() {
    let limiter = limiter(4, 2);
    let before = limiter.stats();
    assert_eq!(before.capacity, 4);
    assert_eq!(
        (before.accepted, before.rejected, before.completed),
        (0, 0, 0)
    );
    let held: Vec<_> = (0..4).map(|_| limiter.try_acquire().unwrap()).collect();
    for _ in 0..6 {
        assert!(limiter.try_acquire().is_err());
    }
    drop(held);
    for _ in 0..10 {
        drop(limiter.try_acquire().unwrap());
    }
    let after = limiter.stats();
    assert_eq!(after.accepted, 14);
    assert_eq!(after.rejected, 6);
    assert_eq!(after.completed, 14);
    assert_eq!(after.panicked, 0);
    assert_eq!(after.usage, 0);
    assert_eq!(after.peak_usage, 4);
    assert_eq!(after.shards.len(), 2);
    assert_eq!(after.shards.iter().map(|s| s.accepted).sum::<u64>(), 14);

    let rates = after.rates_since(&before, Duration::from_secs(2));
    assert_eq!(rates.accepted, 7.0);
    assert_eq!(rates.rejected, 3.0);
    assert_eq!(rates.completed, 7.0);
    let zero = after.rates_since(&before, Duration::ZERO);
    assert_eq!(
        (zero.accepted, zero.rejected, zero.completed),
        (0.0, 0.0, 0.0)
    );
}

/// A permit dropped while its thread unwinds counts as panicked.
#[test]
fn permit_dropped_while_panicking_counts_as_panicked() {
    let limiter = Arc::new(limiter(1, 1));
    let inner = Arc::clone(&limiter);
    let result = thread::spawn(move || {
        let _permit = inner.try_acquire().unwrap();
        panic!("boom while holding a permit");
    })
    .join();
    assert!(result.is_err());
    assert_eq!(limiter.usage(), 0);
    let stats = limiter.stats();
    assert_eq!((stats.accepted, stats.completed, stats.panicked), (1, 0, 1));
    assert!(limiter.try_acquire().is_ok());
}

/// Each bad setting is a `ConfigError` naming its field, a std error,
/// `Send + Sync`.
#[test]
fn config_errors_name_the_field() {
    let err = Limiter::builder().capacity(0).build().unwrap_err();
    assert_eq!(err.field(), "capacity");
    assert!(err.to_string().contains("`capacity`"), "{err}");

    let err = Limiter::new(0).unwrap_err();
    assert_eq!(err.field(), "capacity");

    let err = Limiter::builder().shards(2).build().unwrap_err();
    assert_eq!(err.field(), "capacity");
    assert!(err.to_string().contains("must be set"), "{err}");

    let err = Limiter::builder()
        .capacity(4)
        .shards(0)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "shards");
    assert!(err.to_string().contains("`shards`"), "{err}");

    let err = Limiter::builder().capacity(usize::MAX).build().unwrap_err();
    assert_eq!(err.field(), "capacity");

    let err = Limiter::builder()
        .capacity(4)
        .shards(usize::MAX)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "shards");

    // ConfigError is a std error, Send + Sync.
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(err);
    assert!(!boxed.to_string().is_empty());
}

/// The default shard count follows the CPUs whatever the capacity, so a
/// small limiter can grow into every shard.
#[test]
fn default_shards_follow_the_cpus_whatever_the_capacity() {
    let wide = Limiter::new(1 << 20).unwrap();
    assert!(wide.shards() >= 1);
    // Capacity 1 keeps every shard too, so it can grow into them.
    let narrow = Limiter::new(1).unwrap();
    assert_eq!(narrow.shards(), wide.shards());
    narrow.set_capacity(1 << 20).unwrap();
    let limits: Vec<usize> = narrow.stats().shards.iter().map(|s| s.limit).collect();
    assert_eq!(
        limits,
        wide.stats()
            .shards
            .iter()
            .map(|s| s.limit)
            .collect::<Vec<_>>()
    );
}

/// `Debug` names the capacity and the usage.
#[test]
fn debug_output_names_the_figures() {
    let limiter = limiter(2, 2);
    let permit = limiter.try_acquire().unwrap();
    let text = format!("{limiter:?}");
    assert!(
        text.contains("capacity: 2") && text.contains("usage: 1"),
        "{text}"
    );
    assert!(format!("{permit:?}").starts_with("Permit"));
}

/// Issue 7: `close` refuses every new permit with `Shutdown`, from any
/// thread, and keeps the held ones counted until they are dropped.
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

/// Issue 7: a full limiter, once closed, says `Shutdown`, not `Overload`.
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

/// Issue 7: a forgotten permit (`Permit::forget`, `OwnedPermit::forget`)
/// stays counted and shrinks the capacity for good; the owned one drops its
/// `Arc`.
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

/// Hardening 3, item 9: a guard leaked with `mem::forget` keeps its unit,
/// as `forget` does, but is not counted in `forgotten` (no code runs):
/// what `Stats::forgotten` documents.
#[test]
fn a_permit_leaked_with_mem_forget_is_in_usage_not_in_forgotten() {
    let limiter = Arc::new(Limiter::builder().capacity(2).shards(1).build().unwrap());
    std::mem::forget(limiter.try_acquire_owned().unwrap());
    let stats = limiter.stats();
    assert_eq!((stats.usage, stats.forgotten, stats.completed), (1, 0, 0));
}

/// Issue 7: forgetting every unit refuses everything after; `close` still
/// works.
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

/// Issue 7: an owned permit forgotten on another thread is counted once,
/// on its shard.
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

// Auto traits, checked at compile time.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send_static<T: Send + 'static>() {}
    const fn send<T: Send>() {}
    send_sync::<Limiter>();
    send_sync::<Error>();
    send_sync::<sidejob::ConfigError>();
    send_static::<OwnedPermit>();
    send::<Permit<'static>>();
};
