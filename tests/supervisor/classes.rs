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
