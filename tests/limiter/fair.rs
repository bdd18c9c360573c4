//! Fair shares across tenant keys (issue 37): the fair line for a
//! fail-fast tenant over its share; the room's fair order (a flood does not
//! go first, weights share the grants, ten busy tenants on two units each
//! get a tenth in every window: CockroachDB#91533 as a test); a full room
//! sheds the flood for a light tenant; exact caps; every guard carrying its
//! key (split, merge, forget, a cancelled wait); bad settings; bounded
//! memory; and a stress test with a shadow ledger per key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use sidejob::units::Ask;
use sidejob::{Class, Error, Limiter, QueueOrder};

use super::common::until;
use super::LONG;

fn keyed(key: &str) -> Ask {
    Ask::new().key(key).fail_fast()
}

#[test]
fn a_tenant_over_its_share_stops_at_the_fair_line_and_a_light_one_gets_in() {
    for shards in [1, 2, 4] {
        let limiter = Limiter::builder()
            .capacity(10)
            .shards(shards)
            .build()
            .unwrap();
        // Alone, tenant a's share is everything: the line does not stop it.
        let mut flood: Vec<_> = (0..9)
            .map(|_| limiter.acquire_with(keyed("a")).unwrap())
            .collect();
        flood.push(limiter.acquire_with(keyed("a")).unwrap());
        assert_eq!(limiter.usage(), 10, "{shards} shards");
        // Full: a light tenant is refused by the capacity, as anyone.
        assert_eq!(
            limiter.acquire_with(keyed("b")).unwrap_err(),
            Error::Overload
        );
        // Two units back: tenant b gets one (within its share of 5)...
        flood.truncate(8);
        let light = limiter.acquire_with(keyed("b")).unwrap();
        // ...and tenant a, over its share, may not take the last one above
        // the line of 9; tenant c, within its share, may.
        assert_eq!(
            limiter.acquire_with(keyed("a")).unwrap_err(),
            Error::Overload
        );
        let third = limiter.acquire_with(keyed("c")).unwrap();
        assert_eq!(
            (
                limiter.key_usage("a"),
                limiter.key_usage("b"),
                limiter.key_usage("c")
            ),
            (8, 1, 1)
        );
        assert_eq!(limiter.active_keys(), 3);
        drop((flood, light, third));
        assert_eq!((limiter.active_keys(), limiter.tracked_keys()), (0, 0));
    }
}

#[test]
fn two_busy_tenants_can_use_the_whole_capacity() {
    let limiter = Limiter::builder().capacity(64).shards(2).build().unwrap();
    let a: Vec<_> = (0..32)
        .map(|_| limiter.acquire_with(keyed("a")).unwrap())
        .collect();
    let b: Vec<_> = (0..32)
        .map(|_| limiter.acquire_with(keyed("b")).unwrap())
        .collect();
    assert_eq!(limiter.usage(), 64);
    drop((a, b));
}

#[test]
fn a_weight_moves_the_share() {
    let limiter = Limiter::builder()
        .capacity(12)
        .shards(1)
        .fair_line(0.5)
        .key_weight("gold", 2)
        .build()
        .unwrap();
    // Gold holds 6 (alone: everything is its share); free holds 1.
    let gold: Vec<_> = (0..6)
        .map(|_| limiter.acquire_with(keyed("gold")).unwrap())
        .collect();
    let free = limiter.acquire_with(keyed("free")).unwrap();
    // Gold's share is 12 × 2 / 3 = 8: within it, it takes above the line.
    let more: Vec<_> = (0..2)
        .map(|_| limiter.acquire_with(keyed("gold")).unwrap())
        .collect();
    assert_eq!(
        limiter.acquire_with(keyed("gold")).unwrap_err(),
        Error::Overload
    );
    // At run time: weight 1, share 6; it holds 8, over it, and above the line.
    limiter.set_key_weight("gold", 1).unwrap();
    drop(more);
    assert_eq!(
        limiter.acquire_with(keyed("gold")).unwrap_err(),
        Error::Overload
    );
    assert_eq!(limiter.key_weight("gold"), 1);
    drop((gold, free));
}

#[test]
fn caps_are_exact_and_say_why() {
    let limiter = Limiter::builder()
        .capacity(20)
        .per_key_cap(3)
        .key_cap("big", 6)
        .build()
        .unwrap();
    let a = limiter.acquire_with(keyed("a").units(3)).unwrap();
    assert_eq!(
        limiter.acquire_with(keyed("a")).unwrap_err(),
        Error::KeyBusy
    );
    assert_eq!(
        limiter.acquire_with(keyed("z").units(4)).unwrap_err(),
        Error::TooLarge
    );
    let big = limiter.acquire_with(keyed("big").units(6)).unwrap();
    assert_eq!(
        limiter.acquire_with(keyed("big")).unwrap_err(),
        Error::KeyBusy
    );
    // A refusal by the key leaves no unit taken.
    assert_eq!(limiter.usage(), 9);
    // Lowered at run time: kept, and no more until under it.
    limiter.set_key_cap("big", 2).unwrap();
    let mut big = big;
    let back = big.split(3).unwrap();
    drop(back);
    assert_eq!(
        limiter.acquire_with(keyed("big")).unwrap_err(),
        Error::KeyBusy
    );
    drop(big);
    assert!(limiter.acquire_with(keyed("big").units(2)).is_ok());
    limiter.set_per_key_cap(None).unwrap();
    assert_eq!(limiter.per_key_cap(), None);
    drop(a);
    // A waiting ask at its cap is refused too: it does not wait for its key.
    let room = Limiter::builder()
        .capacity(4)
        .max_waiters(4)
        .max_wait(LONG)
        .per_key_cap(1)
        .build()
        .unwrap();
    let held = room.acquire_with(Ask::new().key("a")).unwrap();
    assert_eq!(
        room.acquire_with(Ask::new().key("a")).unwrap_err(),
        Error::KeyBusy
    );
    drop(held);
}

#[test]
fn bad_key_settings_are_config_errors_naming_the_field() {
    let field = |b: &mut sidejob::LimiterBuilder| b.capacity(4).build().unwrap_err().field();
    assert_eq!(field(Limiter::builder().key_weight("a", 0)), "key_weight");
    assert_eq!(field(Limiter::builder().key_cap("a", 0)), "key_cap");
    assert_eq!(field(Limiter::builder().per_key_cap(0)), "per_key_cap");
    for line in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
        assert_eq!(
            field(Limiter::builder().fair_line(line)),
            "fair_line",
            "{line}"
        );
    }
    let limiter = Limiter::new(4).unwrap();
    assert_eq!(
        limiter.set_key_weight("a", 0).unwrap_err().field(),
        "key_weight"
    );
    assert_eq!(limiter.set_key_cap("a", 0).unwrap_err().field(), "key_cap");
    assert_eq!(
        limiter.set_per_key_cap(Some(0)).unwrap_err().field(),
        "per_key_cap"
    );
    // None of them left a rule behind.
    assert_eq!(limiter.tracked_keys(), 0);
    // A huge key is hashed, and nothing of it kept.
    let huge = "k".repeat(1 << 20);
    let held = limiter.acquire_with(Ask::new().key(huge.as_str())).unwrap();
    assert_eq!(limiter.key_usage(huge.as_str()), 1);
    drop(held);
    assert_eq!(limiter.tracked_keys(), 0);
}

#[test]
fn every_guard_carries_its_key() {
    let limiter = Limiter::builder().capacity(16).shards(2).build().unwrap();
    let mut a = limiter.acquire_with(keyed("a").units(4)).unwrap();
    let part = a.split(1).unwrap();
    assert_eq!(limiter.key_usage("a"), 4);
    drop(part);
    assert_eq!(limiter.key_usage("a"), 3);
    // Merged into tenant b's permit, a's units become b's.
    let mut b = limiter.acquire_with(keyed("b")).unwrap();
    b.merge(a).unwrap();
    assert_eq!((limiter.key_usage("a"), limiter.key_usage("b")), (0, 4));
    // An unkeyed permit merged in becomes b's too.
    b.merge(limiter.try_acquire().unwrap()).unwrap();
    assert_eq!(limiter.key_usage("b"), 5);
    drop(b);
    assert_eq!((limiter.usage(), limiter.tracked_keys()), (0, 0));
    // Forgotten: held for good, by the key too.
    limiter.acquire_with(keyed("c").units(2)).unwrap().forget();
    assert_eq!((limiter.usage(), limiter.key_usage("c")), (2, 2));
}

#[test]
fn a_cancelled_keyed_wait_gives_its_key_back() {
    let limiter = Limiter::builder()
        .capacity(1)
        .max_waiters(4)
        .max_wait(LONG)
        .build()
        .unwrap();
    let held = limiter.try_acquire().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let wait = limiter.acquire_with_async(Ask::new().key("a"));
        let polled = tokio::time::timeout(std::time::Duration::from_millis(1), wait).await;
        assert!(polled.is_err(), "it waits: the unit is held");
    });
    assert_eq!((limiter.key_usage("a"), limiter.waiting()), (0, 0));
    drop(held);
    assert_eq!(limiter.tracked_keys(), 0);
}

/// A room of capacity 1 whose unit is held; waiters of `keys` (in that
/// order, each queued before the next) wait in it. Releasing the unit lets
/// each granted waiter report its key and give its unit on: the order the
/// room serves. `weights` are set first.
fn service_order(
    keys: &[&'static str],
    weights: &[(&str, u32)],
    order: QueueOrder,
) -> Vec<&'static str> {
    let mut builder = Limiter::builder();
    builder
        .capacity(1)
        .shards(1)
        .max_waiters(keys.len())
        .max_wait(LONG)
        .queue_order(order);
    for &(key, weight) in weights {
        builder.key_weight(key, weight);
    }
    let limiter = Arc::new(builder.build().unwrap());
    let held = limiter.try_acquire_owned().unwrap();
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for (i, &key) in keys.iter().enumerate() {
        let (shared, tx) = (Arc::clone(&limiter), tx.clone());
        threads.push(thread::spawn(move || {
            let permit = shared.acquire_with(Ask::new().key(key)).unwrap();
            tx.send(key).unwrap();
            drop(permit);
        }));
        until(|| limiter.waiting() == i + 1);
    }
    drop(held);
    let order: Vec<_> = rx.iter().take(keys.len()).collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(
        (limiter.usage(), limiter.tracked_keys()),
        (0, weights.len())
    );
    order
}

#[test]
fn a_flood_queued_first_does_not_go_first() {
    let mut keys = vec!["flood"; 20];
    for light in ["l1", "l2", "l3", "l4", "l5"] {
        keys.extend([light, light]);
    }
    let order = service_order(&keys, &[], QueueOrder::Fifo);
    // Round robin: the flood is served once, then each light tenant, then
    // the flood again...
    let first_twelve: Vec<_> = order[..12].to_vec();
    assert_eq!(
        first_twelve,
        ["flood", "l1", "l2", "l3", "l4", "l5", "flood", "l1", "l2", "l3", "l4", "l5"]
    );
    assert!(order[12..].iter().all(|&k| k == "flood"));
    // In a LIFO room keys keep the room's order: the newest first.
    let lifo = service_order(&keys, &[], QueueOrder::Lifo);
    assert_eq!(&lifo[..2], ["l5", "l5"]);
}

#[test]
fn weights_share_the_grants() {
    let mut keys = Vec::new();
    for key in ["w1", "w2", "w5"] {
        keys.extend([key; 24]);
    }
    let order = service_order(&keys, &[("w2", 2), ("w5", 5)], QueueOrder::Fifo);
    // Over the first 24 grants (all three busy): 3, 6 and 15 of them.
    let count = |key| order[..24].iter().filter(|&&k| k == key).count();
    for (key, want) in [("w1", 3), ("w2", 6), ("w5", 15)] {
        let got = count(key);
        assert!(
            got.abs_diff(want) <= 1,
            "{key}: {got} of 24, want {want}: {order:?}"
        );
    }
}

/// CockroachDB#91533 as a test: two units, ten busy tenants (three tasks
/// each, always asking again); in every window of 100 grants each tenant
/// gets between 8 and 12.
#[test]
fn ten_busy_tenants_on_two_units_each_get_a_tenth_in_every_window() {
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(2)
            .shards(1)
            .max_waiters(64)
            .max_wait(LONG)
            .build()
            .unwrap(),
    );
    let log = Arc::new(Mutex::new(Vec::new()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for key in 0..10_u32 {
            for _ in 0..3 {
                let (limiter, log) = (Arc::clone(&limiter), Arc::clone(&log));
                tasks.push(tokio::spawn(async move {
                    loop {
                        let permit = limiter
                            .acquire_with_async(Ask::new().key(&key))
                            .await
                            .unwrap();
                        {
                            let mut log = log.lock().unwrap();
                            if log.len() >= 3_000 {
                                return;
                            }
                            log.push(key);
                        }
                        tokio::task::yield_now().await;
                        drop(permit);
                    }
                }));
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
    let log = log.lock().unwrap();
    for window in log.windows(100).step_by(10) {
        let mut counts = HashMap::new();
        for &key in window {
            *counts.entry(key).or_insert(0) += 1;
        }
        for key in 0..10 {
            let got = counts.get(&key).copied().unwrap_or(0);
            assert!((8..=12).contains(&got), "tenant {key}: {got} of 100");
        }
    }
    assert_eq!((limiter.usage(), limiter.tracked_keys()), (0, 0));
}

#[test]
fn a_full_room_sheds_the_flood_for_a_light_tenant() {
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(1)
            .shards(1)
            .max_waiters(4)
            .max_wait(LONG)
            .build()
            .unwrap(),
    );
    let held = limiter.try_acquire_owned().unwrap();
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for i in 0..5 {
        let (shared, tx) = (Arc::clone(&limiter), tx.clone());
        let key = if i < 4 { "flood" } else { "light" };
        threads.push(thread::spawn(move || {
            let answer = shared.acquire_with(Ask::new().key(key)).map(drop);
            tx.send((key, answer)).unwrap();
        }));
        if i < 4 {
            until(|| limiter.waiting() == i + 1);
        }
    }
    // The light tenant took the flood's last place: the flood's newest
    // waiter is refused.
    assert_eq!(rx.recv().unwrap(), ("flood", Err(Error::Overload)));
    until(|| limiter.waiting() == 4);
    drop(held);
    let served: Vec<_> = rx.iter().take(4).collect();
    assert!(
        served.iter().all(|(_, answer)| answer.is_ok()),
        "{served:?}"
    );
    let light = served.iter().filter(|(key, _)| *key == "light").count();
    assert_eq!(light, 1, "{served:?}");
    for thread in threads {
        thread.join().unwrap();
    }
}

#[test]
fn a_sheddable_tenant_still_stops_at_its_class_line() {
    let limiter = Limiter::builder()
        .capacity(10)
        .shards(1)
        .headroom(Class::Sheddable, 0.5)
        .build()
        .unwrap();
    let ask = keyed("a").class(Class::Sheddable);
    let held: Vec<_> = (0..5).map(|_| limiter.acquire_with(ask).unwrap()).collect();
    assert_eq!(limiter.acquire_with(ask).unwrap_err(), Error::Overload);
    assert_eq!(limiter.key_usage("a"), 5);
    drop(held);
}

/// Four threads ask for random units for eight tenants (caps 2 to 5,
/// weights 1 to 3) of random classes, fail-fast, waiting, and waiting
/// with a deadline that runs out (a cancelled wait), on a limiter of 16
/// over two shards that a fifth thread resizes between 10 and 16; a
/// shadow ledger per tenant checks each grant against the cap, and the
/// total against the largest capacity, while held.
#[test]
fn caps_and_capacity_hold_under_stress_with_a_ledger_per_key() {
    const KEYS: usize = 8;
    let mut builder = Limiter::builder();
    builder.capacity(16).shards(2).max_waiters(8).max_wait(LONG);
    for key in 0..KEYS {
        builder
            .key_cap(&key, 2 + key % 4)
            .key_weight(&key, 1 + key as u32 % 3);
    }
    let limiter = Arc::new(builder.build().unwrap());
    let shadow: Arc<Vec<AtomicUsize>> = Arc::new((0..KEYS).map(|_| AtomicUsize::new(0)).collect());
    let total = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let resizer = {
        let (limiter, done) = (Arc::clone(&limiter), Arc::clone(&done));
        thread::spawn(move || {
            let mut resizes = 0;
            while !done.load(SeqCst) {
                limiter.set_capacity(10 + 6 * (resizes % 2)).unwrap();
                resizes += 1;
                thread::yield_now();
            }
            limiter.set_capacity(16).unwrap();
            resizes
        })
    };
    let threads: Vec<_> = (0..4_u64)
        .map(|seed| {
            let (limiter, shadow, total, granted) = (
                Arc::clone(&limiter),
                Arc::clone(&shadow),
                Arc::clone(&total),
                Arc::clone(&granted),
            );
            thread::spawn(move || {
                let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                for _ in 0..20_000 {
                    let r = next();
                    let key = (r % KEYS as u64) as usize;
                    let units = 1 + (r >> 8) as usize % 2;
                    let class = [Class::Critical, Class::SheddablePlus, Class::Sheddable]
                        [(r >> 24) as usize % 3];
                    let mut ask = Ask::new().key(&key).units(units).class(class);
                    match r >> 16 & 3 {
                        0 | 1 => ask = ask.fail_fast(),
                        2 => {
                            let soon =
                                std::time::Instant::now() + std::time::Duration::from_micros(50);
                            ask = ask.wait_until(soon);
                        }
                        _ => {}
                    }
                    match limiter.acquire_with(ask) {
                        Ok(permit) => {
                            let held = shadow[key].fetch_add(units, SeqCst) + units;
                            assert!(held <= 2 + key % 4, "tenant {key} holds {held}");
                            let all = total.fetch_add(units, SeqCst) + units;
                            assert!(all <= 16, "{all} of 16 held");
                            granted.fetch_add(1, SeqCst);
                            if r >> 20 & 3 == 0 {
                                thread::yield_now();
                            }
                            shadow[key].fetch_sub(units, SeqCst);
                            total.fetch_sub(units, SeqCst);
                            drop(permit);
                        }
                        Err(Error::Overload | Error::KeyBusy | Error::Timeout) => {}
                        Err(other) => panic!("tenant {key}: {other}"),
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    done.store(true, SeqCst);
    assert!(resizer.join().unwrap() > 0);
    assert!(granted.load(SeqCst) > 10_000);
    assert_eq!((limiter.usage(), limiter.active_keys()), (0, 0));
    for key in 0..KEYS {
        assert_eq!(limiter.key_usage(&key), 0);
    }
    // The eight rules stay; nothing else.
    assert_eq!(limiter.tracked_keys(), KEYS);
}

#[test]
fn a_hundred_thousand_tenants_leave_nothing_behind() {
    let limiter = Limiter::builder().capacity(64).shards(2).build().unwrap();
    let mut held = Vec::new();
    for tenant in 0..100_000_u64 {
        held.push(
            limiter
                .acquire_with(Ask::new().key(&tenant).fail_fast())
                .unwrap(),
        );
        if held.len() == 64 {
            assert!(limiter.tracked_keys() <= 64);
            held.clear();
        }
    }
    drop(held);
    assert_eq!(limiter.tracked_keys(), 0);
}

#[test]
fn tenants_gone_idle_never_shrink_a_share_into_a_refusal() {
    for shards in [1, 2] {
        let limiter = Limiter::builder()
            .capacity(10)
            .shards(shards)
            .build()
            .unwrap();
        // Fifty tenants each take a unit and give it back: each leaves an
        // idle word behind, which the ledger may still count as active.
        for i in 0..50 {
            drop(limiter.acquire_with(keyed(&format!("gone-{i}"))).unwrap());
        }
        assert_eq!(limiter.active_keys(), 0);
        // Alone now, tenant a's share is everything: it takes the whole
        // capacity, past the fair line. Were the gone tenants still
        // counted when its share is read above the line, it would be
        // refused there.
        let held: Vec<_> = (0..10)
            .map(|_| limiter.acquire_with(keyed("a")).unwrap())
            .collect();
        assert_eq!((limiter.usage(), held.len()), (10, 10), "{shards} shards");
        assert_eq!(limiter.key_usage("a"), 10);
        assert_eq!(limiter.stats().rejected, 0);
    }
}
