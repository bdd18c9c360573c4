//! Children of many units (issue 35): `reserve_many`, `try_reserve_many`,
//! `reserve_many_async`; one listing per child, every unit counted and
//! given back, across shards within each shard's registry slots.

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use sidejob::{Error, Supervisor};

use crate::common::poll_once;

fn sup(capacity: usize, shards: usize) -> Supervisor {
    Supervisor::builder()
        .capacity(capacity)
        .shards(shards)
        .build()
        .unwrap()
}

#[test]
fn a_child_of_many_units_is_listed_once_and_gives_every_unit_back() {
    let sup = sup(16, 4); // 4 a shard
    let big = sup.try_reserve_many(7).unwrap(); // across shards
    let small = sup.try_reserve().unwrap();
    assert_eq!((big.units(), small.units(), sup.usage()), (7, 1, 8));
    let mut ids = sup.which_children();
    ids.sort_unstable();
    let mut want = vec![big.id(), small.id()];
    want.sort_unstable();
    assert_eq!(ids, want);
    assert_eq!(sup.try_reserve_many(9).unwrap_err(), Error::Overload);
    assert_eq!(sup.try_reserve_many(17).unwrap_err(), Error::TooLarge);
    assert_eq!(sup.try_reserve_many(0).unwrap_err(), Error::TooLarge);
    drop(big);
    assert_eq!(sup.usage(), 1);
    let rest = sup.try_reserve_many(15).unwrap();
    assert_eq!(sup.usage(), 16);
    drop((rest, small));
    let stats = sup.stats();
    assert_eq!((stats.usage, stats.accepted, stats.completed), (0, 23, 23));
}

#[test]
fn a_supervisor_at_its_maximum_still_admits_a_child_wider_than_a_shard() {
    // Each shard's registry has max_capacity / shards slots (2 here): a
    // child of 6 holds one slot and units on several shards.
    let sup = Supervisor::builder()
        .capacity(8)
        .shards(4)
        .max_capacity(8)
        .build()
        .unwrap();
    let wide = sup.try_reserve_many(6).unwrap();
    let a = sup.try_reserve().unwrap();
    let b = sup.try_reserve().unwrap();
    assert_eq!(sup.try_reserve().unwrap_err(), Error::Overload);
    assert_eq!(sup.which_children().len(), 3);
    drop((wide, a, b));
    // Eight children of one unit fill every slot again.
    let all: Vec<_> = (0..8).map(|_| sup.try_reserve().unwrap()).collect();
    assert_eq!(sup.which_children().len(), 8);
    drop(all);
    assert_eq!(sup.usage(), 0);
}

#[test]
fn wait_idle_sees_a_child_of_many_leave() {
    let sup = Arc::new(sup(8, 2));
    let guard = sup.try_reserve_many(6).unwrap();
    let (go, gone) = mpsc::channel();
    let child = thread::spawn(move || {
        gone.recv().unwrap();
        drop(guard);
    });
    let waiter = {
        let sup = Arc::clone(&sup);
        thread::spawn(move || sup.wait_idle(Duration::from_secs(30)))
    };
    go.send(()).unwrap();
    child.join().unwrap();
    assert!(waiter.join().unwrap(), "the child's exit woke wait_idle");
    assert_eq!(sup.usage(), 0);
}

#[test]
fn a_child_of_many_that_panics_counts_its_units_as_panicked() {
    let sup = Arc::new(sup(8, 2));
    let guard = sup.try_reserve_many(5).unwrap();
    let died = thread::spawn(move || {
        let _guard = guard;
        panic!("the child failed");
    })
    .join();
    assert!(died.is_err());
    let stats = sup.stats();
    assert_eq!((stats.usage, stats.panicked), (0, 5));
}

#[test]
fn reserve_many_waits_and_its_future_gives_up_cleanly() {
    let sup = Supervisor::builder()
        .capacity(4)
        .shards(2)
        .max_waiters(4)
        .max_wait(Duration::from_secs(30))
        .build()
        .unwrap();
    let held: Vec<_> = (0..4).map(|_| sup.try_reserve().unwrap()).collect();
    let mut wait = Box::pin(sup.reserve_many_async(3));
    assert!(poll_once(&mut wait).is_pending());
    assert_eq!(sup.waiting(), 1);
    drop(wait); // gives up: nothing registered, nothing lost
    assert_eq!((sup.waiting(), sup.usage()), (0, 4));
    let mut wait = Box::pin(sup.reserve_many_async(3));
    assert!(poll_once(&mut wait).is_pending());
    drop(held);
    let std::task::Poll::Ready(Ok(guard)) = poll_once(&mut wait) else {
        panic!("three units came");
    };
    assert_eq!(
        (guard.units(), sup.usage(), sup.which_children().len()),
        (3, 3, 1)
    );
}

#[test]
fn reserve_with_takes_what_the_ask_says() {
    use sidejob::units::Ask;
    let sup = Supervisor::builder()
        .capacity(8)
        .shards(2)
        .max_waiters(4)
        .build()
        .unwrap();
    let one = sup.reserve_with(Ask::new()).unwrap();
    let wide = sup.reserve_with(Ask::new().units(5)).unwrap(); // across shards
    assert_eq!((one.units(), wide.units(), sup.usage()), (1, 5, 6));
    assert_eq!(sup.which_children().len(), 2);
    let refused = sup.reserve_with(Ask::new().units(3).fail_fast());
    assert_eq!(refused.map(|g| g.units()), Err(Error::Overload));
    assert_eq!(
        sup.reserve_with(Ask::new().units(0)).map(|g| g.units()),
        Err(Error::TooLarge)
    );
    assert_eq!(
        sup.reserve_with(Ask::new().units(9)).map(|g| g.units()),
        Err(Error::TooLarge)
    );
    let deadline = std::time::Instant::now() + Duration::from_millis(10);
    let late = sup.reserve_with(Ask::new().units(3).wait_until(deadline));
    assert_eq!(late.map(|g| g.units()), Err(Error::Timeout));
    drop((one, wide));
    assert_eq!(sup.usage(), 0);
    assert!(sup.which_children().is_empty());
}

#[test]
fn reserve_with_async_waits_for_its_units() {
    use sidejob::units::Ask;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sup = sup_waiting(4);
    rt.block_on(async {
        let held = sup.try_reserve_many(3).unwrap();
        let mut wait = Box::pin(sup.reserve_with_async(Ask::new().units(2)));
        assert!(poll_once(&mut wait).is_pending());
        drop(held);
        let child = wait.await.unwrap();
        assert_eq!((child.units(), sup.usage()), (2, 2));
    });
    assert_eq!(sup.usage(), 0);
}

fn sup_waiting(capacity: usize) -> Supervisor {
    Supervisor::builder()
        .capacity(capacity)
        .shards(2)
        .max_waiters(4)
        .build()
        .unwrap()
}

/// A waiting child of two units, a waiting child of one behind it, and
/// one unit freed: with the default pass budget the small child passes
/// the large one; with a budget of 0 (strict FIFO) the unit is kept for
/// the large child and the small one waits.
#[test]
fn the_pass_budget_decides_whether_a_small_child_passes_a_large_one() {
    for (budget, passes) in [(None, true), (Some(0), false)] {
        let mut builder = Supervisor::builder();
        builder.capacity(4).shards(1).max_waiters(4);
        if let Some(budget) = budget {
            builder.pass_budget(budget);
        }
        let sup = Arc::new(builder.build().unwrap());
        let mut held: Vec<_> = (0..4).map(|_| sup.try_reserve().unwrap()).collect();
        let large = {
            let sup = Arc::clone(&sup);
            thread::spawn(move || sup.reserve_many(2).map(|g| g.units()))
        };
        crate::common::until(|| sup.waiting() == 1);
        let small = {
            let sup = Arc::clone(&sup);
            thread::spawn(move || sup.reserve().map(|g| g.units()))
        };
        crate::common::until(|| sup.waiting() == 2);
        drop(held.pop()); // one unit: handed on before drop returns
        let still_waiting = sup.waiting();
        assert_eq!(
            still_waiting,
            if passes { 1 } else { 2 },
            "budget {budget:?}"
        );
        drop(held); // the rest: everyone is served
        assert_eq!(large.join().unwrap(), Ok(2));
        assert_eq!(small.join().unwrap(), Ok(1));
        assert_eq!(sup.usage(), 0);
    }
}

#[test]
fn spawn_with_holds_every_unit_until_the_child_returns() {
    use sidejob::units::Ask;
    let sup = sup(8, 2);
    let (started_tx, started_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let child = sup
        .spawn_with(Ask::new().units(5), move || {
            started_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            7
        })
        .unwrap();
    started_rx.recv().unwrap();
    assert_eq!(sup.usage(), 5);
    assert_eq!(
        sup.spawn_with(Ask::new().units(4), || 0).map(|c| c.id()),
        Err(Error::Overload)
    );
    assert_eq!(
        sup.spawn_with(Ask::new().units(0), || 0).map(|c| c.id()),
        Err(Error::TooLarge)
    );
    go_tx.send(()).unwrap();
    assert_eq!(child.join().unwrap(), 7);
    assert_eq!(sup.usage(), 0);
}

#[cfg(feature = "tokio")]
#[test]
fn spawn_task_with_waits_then_holds_every_unit_until_the_task_ends() {
    use sidejob::units::Ask;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sup = sup_waiting(4);
    rt.block_on(async {
        let held = sup.try_reserve_many(3).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let mut spawn =
            Box::pin(sup.spawn_task_with(Ask::new().units(2), async move { rx.await.unwrap() }));
        assert!(poll_once(&mut spawn).is_pending());
        drop(held);
        let task = spawn.await.unwrap();
        assert_eq!(sup.usage(), 2);
        tx.send(9).unwrap();
        assert_eq!(task.await.unwrap(), 9);
        assert_eq!(sup.usage(), 0);
    });
}
