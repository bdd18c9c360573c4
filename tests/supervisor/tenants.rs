//! Tenant keys through the supervisor (issue 37): a keyed child's units
//! count to its tenant until it ends (reserved, spawned, panicked, a task
//! too); the cap says `KeyBusy`; the fair line stops a tenant over its
//! share; a cancelled keyed wait gives its tenant's count back.

use sidejob::{units::Ask, Error, Supervisor};

#[test]
fn a_keyed_childs_units_count_until_it_ends() {
    let sup = Supervisor::builder()
        .capacity(8)
        .per_key_cap(3)
        .build()
        .unwrap();
    let one = sup.reserve_with(Ask::new().key("a")).unwrap();
    let two = sup.reserve_with(Ask::new().key("a").units(2)).unwrap();
    assert_eq!((sup.key_usage("a"), sup.usage()), (3, 3));
    assert_eq!(
        sup.reserve_with(Ask::new().key("a").fail_fast())
            .unwrap_err(),
        Error::KeyBusy
    );
    assert_eq!(
        sup.reserve_with(Ask::new().key("a").units(4)).unwrap_err(),
        Error::TooLarge
    );
    drop(one);
    assert_eq!(sup.key_usage("a"), 2);
    drop(two);
    assert_eq!((sup.key_usage("a"), sup.usage()), (0, 0));
    // Spawned children, one of them panicking: every unit back.
    let fine = sup.spawn_with(Ask::new().key("b").units(2), || 7).unwrap();
    let bad = sup
        .spawn_with(Ask::new().key("b"), || panic!("the child panics"))
        .unwrap();
    assert_eq!(fine.join().unwrap(), 7);
    assert!(bad.join().is_err());
    crate::common::until(|| sup.usage() == 0);
    assert_eq!(sup.key_usage("b"), 0);
}

#[test]
fn a_tenant_over_its_share_stops_at_the_fair_line() {
    let sup = Supervisor::builder()
        .capacity(10)
        .shards(1)
        .fair_line(0.5)
        .build()
        .unwrap();
    let a = sup.reserve_with(Ask::new().key("a").units(4)).unwrap();
    let b = sup.reserve_with(Ask::new().key("b")).unwrap();
    let over = sup.reserve_with(Ask::new().key("a").units(2).fail_fast());
    assert_eq!(over.unwrap_err(), Error::Overload);
    sup.set_key_weight("a", 4).unwrap();
    // Weight 4 of 5: a share of 8, within it.
    let more = sup
        .reserve_with(Ask::new().key("a").units(2).fail_fast())
        .unwrap();
    assert_eq!(sup.key_usage("a"), 6);
    drop((a, b, more));
    assert_eq!(sup.usage(), 0);
}

#[cfg(feature = "tokio")]
#[test]
fn a_cancelled_keyed_wait_gives_its_tenants_count_back() {
    let sup = Supervisor::builder()
        .capacity(1)
        .max_waiters(4)
        .build()
        .unwrap();
    let held = sup.reserve().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let wait = sup.reserve_with_async(Ask::new().key("a"));
        let out = tokio::time::timeout(std::time::Duration::from_millis(1), wait).await;
        assert!(out.is_err(), "it waits: the unit is held");
    });
    assert_eq!((sup.key_usage("a"), sup.waiting()), (0, 0));
    drop(held);
    let task = runtime.block_on(async {
        sup.spawn_task_with(Ask::new().key("a"), async { 3 })
            .await
            .unwrap()
            .await
    });
    assert_eq!(task.unwrap(), 3);
    crate::common::until(|| sup.usage() == 0);
    assert_eq!(sup.key_usage("a"), 0);
}
