//! Tenant keys through the pool (issue 37): a keyed request's units count
//! to its tenant from admission until its handler has finished (calls and
//! casts, a panic too); a tenant's cap is exact and says `KeyBusy`; the
//! fair line stops a tenant over its share; the async pool the same.

use std::thread;

use sidejob::{units::Ask, Error};

use crate::weighted::{held, next_start};

#[test]
fn a_tenants_units_count_until_its_handler_has_finished() {
    let (pool, started, open) = held(|b| {
        b.capacity(8).workers(2).per_key_cap(3);
    });
    let caller = {
        let pool = pool.clone();
        thread::spawn(move || pool.call_with(Ask::new().key("a").units(2), 7))
    };
    assert_eq!(next_start(&started), 7);
    pool.cast_with(Ask::new().key("a"), 8).unwrap();
    assert_eq!(pool.key_usage("a"), 3);
    // At its cap: refused by its key, nothing taken.
    assert_eq!(
        pool.cast_with(Ask::new().key("a").fail_fast(), 9),
        Err(Error::KeyBusy)
    );
    assert_eq!(
        pool.call_with(Ask::new().key("a").units(4), 9),
        Err(Error::TooLarge)
    );
    assert_eq!(pool.usage(), 3);
    // Another tenant has its own.
    pool.cast_with(Ask::new().key("b").units(3), 10).unwrap();
    for _ in 0..3 {
        open.send(()).unwrap();
    }
    assert_eq!(caller.join().unwrap(), Ok(7));
    crate::common::until(|| pool.usage() == 0);
    assert_eq!((pool.key_usage("a"), pool.key_usage("b")), (0, 0));
}

#[test]
fn a_panicking_handler_gives_its_tenants_units_back() {
    let (pool, started, open) = held(|b| {
        b.capacity(4).workers(1);
    });
    // Request 0 panics once let through.
    let caller = {
        let pool = pool.clone();
        thread::spawn(move || pool.call_with(Ask::new().key("a").units(2), 0))
    };
    assert_eq!(next_start(&started), 0);
    assert_eq!(pool.key_usage("a"), 2);
    open.send(()).unwrap();
    assert_eq!(caller.join().unwrap(), Err(Error::WorkerPanicked));
    crate::common::until(|| pool.usage() == 0);
    assert_eq!(pool.key_usage("a"), 0);
}

#[test]
fn a_tenant_over_its_share_stops_at_the_fair_line() {
    let (pool, started, open) = held(|b| {
        b.capacity(10)
            .workers(1)
            .fair_line(0.5)
            .key_weight("gold", 3);
    });
    assert_eq!(pool.key_weight("gold"), 3);
    // Tenant a alone takes 4 (its share is everything); b then takes 1.
    pool.cast_with(Ask::new().key("a").units(4), 1).unwrap();
    assert_eq!(next_start(&started), 1);
    pool.cast_with(Ask::new().key("b"), 2).unwrap();
    // a's share is now 5: 2 more would be over it, and past the line of 5.
    assert_eq!(
        pool.cast_with(Ask::new().key("a").units(2).fail_fast(), 3),
        Err(Error::Overload)
    );
    // gold, of weight 3 (share 6 of 10), is within it: admitted.
    pool.cast_with(Ask::new().key("gold").units(2).fail_fast(), 4)
        .unwrap();
    pool.set_key_weight("gold", 1).unwrap();
    assert_eq!(pool.key_weight("gold"), 1);
    for _ in 0..3 {
        open.send(()).unwrap();
    }
    crate::common::until(|| pool.usage() == 0);
    assert_eq!(pool.key_usage("gold"), 0);
    assert_eq!(pool.set_key_cap("gold", 0).unwrap_err().field(), "key_cap");
}

#[cfg(feature = "tokio")]
#[test]
fn the_async_pool_counts_a_tenants_units_until_handled() {
    use sidejob::{AsyncWorker, Pool};

    struct Echo;
    impl AsyncWorker for Echo {
        type Request = u32;
        type Reply = u32;
        type Message = ();
        async fn handle_call(&mut self, n: u32) -> u32 {
            tokio::task::yield_now().await;
            n
        }
        async fn handle_cast(&mut self, _: ()) {}
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = Pool::builder()
            .capacity(4)
            .key_cap("a", 2)
            .build_async(|_| Echo)
            .unwrap();
        let ask = Ask::new().key("a").units(2);
        assert_eq!(pool.call_with_async(ask, 5).await, Ok(5));
        assert_eq!(pool.key_usage("a"), 0);
        assert_eq!(
            pool.call_with_async(ask.units(3), 5).await,
            Err(Error::TooLarge)
        );
        let calls: Vec<_> = (0..8)
            .map(|i| {
                let pool = pool.clone();
                tokio::spawn(async move { pool.call_with_async(Ask::new().key("a"), i).await })
            })
            .collect();
        for call in calls {
            match call.await.unwrap() {
                Ok(_) | Err(Error::KeyBusy) | Err(Error::Overload) => {}
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!((pool.usage(), pool.key_usage("a")), (0, 0));
    });
}
