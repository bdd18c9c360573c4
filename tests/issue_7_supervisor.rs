//! Regression tests for issue 7 (adversarial review), the Limiter part:
//! `close`, `Permit::forget`. (Its Supervisor part is in tests/supervisor/.)

use std::sync::Arc;
use std::thread;

use sidejob::{Error, Limiter};

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
