//! Priority classes through the supervisor (issue 36): children of a gated
//! class stop at its share, on threads and in async waits; the default
//! class fills the rest.

use sidejob::{units::Ask, Class, Error, Supervisor};

use crate::common::poll_once;

#[test]
fn sheddable_children_stop_at_their_share() {
    let sup = Supervisor::builder()
        .capacity(10)
        .shards(3)
        .headroom(Class::SheddablePlus, 0.5)
        .build()
        .unwrap();
    // Sheddable follows SheddablePlus down to 0.5 (its default 0.8 would
    // be above it).
    let batch = Ask::new().class(Class::Sheddable).fail_fast();
    let first = sup.reserve_with(batch.units(3)).unwrap();
    let second = sup.reserve_with(batch.units(2)).unwrap();
    assert_eq!(sup.reserve_with(batch).unwrap_err(), Error::Overload);
    let spawned = sup.spawn_with(batch, || ()).map(|_| ());
    assert_eq!(spawned.unwrap_err(), Error::Overload);
    let users: Vec<_> = (0..5).map(|_| sup.reserve().unwrap()).collect();
    assert_eq!(sup.reserve().unwrap_err(), Error::Overload);
    assert_eq!(sup.usage(), 10);
    assert_eq!(
        sup.which_children().len(),
        7,
        "two children of many units, five of one"
    );
    drop((first, second, users));
    assert_eq!(sup.usage(), 0);
    let stats = sup.stats();
    assert_eq!(stats.classes[Class::Sheddable.rank()].accepted, 5);
    assert_eq!(stats.classes[Class::Sheddable.rank()].rejected, 2);
}

#[test]
fn an_async_sheddable_wait_is_served_only_under_its_line() {
    let sup = Supervisor::builder()
        .capacity(4)
        .shards(1)
        .max_waiters(2)
        .headroom(Class::Sheddable, 0.5)
        .build()
        .unwrap();
    let mut held: Vec<_> = (0..4).map(|_| sup.reserve().unwrap()).collect();
    let mut wait = Box::pin(sup.reserve_with_async(Ask::new().class(Class::Sheddable)));
    assert!(poll_once(&mut wait).is_pending());
    held.pop();
    held.pop();
    // Two held: at the line of 2, still waiting.
    assert!(poll_once(&mut wait).is_pending());
    held.pop();
    let child = match poll_once(&mut wait) {
        std::task::Poll::Ready(child) => child.unwrap(),
        std::task::Poll::Pending => panic!("a unit under its line was freed"),
    };
    assert_eq!(sup.usage(), 2);
    drop((child, held));
    assert_eq!(sup.usage(), 0);
}

/// A min share through the supervisor: a child of a sheddable class is
/// admitted above its line while within the share, and its units, the
/// slot's included, are counted out of the class when it ends, on a thread
/// or as a guard.
#[test]
fn a_min_share_admits_children_above_the_line_and_counts_them_out() {
    let sup = Supervisor::builder()
        .capacity(10)
        .shards(2)
        .headroom(Class::Sheddable, 0.5)
        .min_share(Class::Sheddable, 0.3)
        .build()
        .unwrap();
    let held = |sup: &Supervisor| sup.stats().classes[Class::Sheddable.rank()].held;
    let users: Vec<_> = (0..6).map(|_| sup.reserve().unwrap()).collect();
    let batch = Ask::new().class(Class::Sheddable).fail_fast();
    // Over the line of 5: the share of 3 admits a child of one, then one
    // of two, then nothing more.
    let one = sup.reserve_with(batch).unwrap();
    let two = sup.reserve_with(batch.units(2)).unwrap();
    assert_eq!(held(&sup), Some(3));
    assert_eq!(sup.reserve_with(batch).unwrap_err(), Error::Overload);
    drop(one);
    assert_eq!(held(&sup), Some(2));
    let child = sup.spawn_with(batch, || 7).unwrap();
    assert_eq!(child.join().unwrap(), 7);
    until_held(&sup, 2);
    drop((two, users));
    assert_eq!((held(&sup), sup.usage()), (Some(0), 0));
}

/// Waits until the sheddable class holds `units` (a joined child's guard
/// goes on its own thread's way out).
fn until_held(sup: &Supervisor, units: usize) {
    crate::common::until(|| sup.stats().classes[Class::Sheddable.rank()].held == Some(units));
}
