//! A limiter with a waiting room while a controller moves its limit:
//! waiters are served when the limit leaves room (after a shrink only once
//! the in-flight is below the new limit; at once when it grows), time out
//! when it never does, and fail-fast callers are refused at the limit in
//! force. The controller's algorithm is a script and its clock virtual:
//! each tick applies the next limit.

use std::collections::VecDeque;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use sidejob::adaptive::{Algorithm, Controller, Window};
use sidejob::{Error, Limiter};

/// Answers the next limit of its script.
struct Script(VecDeque<usize>);

impl Algorithm for Script {
    fn update(&mut self, window: &Window) -> usize {
        self.0.pop_front().unwrap_or(window.limit())
    }
}

fn controlled(limiter: &Arc<Limiter>, script: &[usize]) -> Controller {
    Controller::builder()
        .floor(1)
        .ceiling(16)
        .min_samples(0)
        .interval(Duration::from_secs(3_600))
        .build(
            Arc::clone(limiter),
            Script(script.iter().copied().collect()),
        )
        .unwrap()
}

/// A thread waiting for a permit in `acquire`; it reports the outcome on
/// `served` and holds the permit until `release` says (or is dropped).
fn waiter(
    limiter: &Arc<Limiter>,
    served: &mpsc::Sender<Result<(), Error>>,
    release: mpsc::Receiver<()>,
) -> thread::JoinHandle<()> {
    let limiter = Arc::clone(limiter);
    let served = served.clone();
    thread::spawn(move || {
        let permit = limiter.acquire();
        let _ = served.send(permit.as_ref().map(drop).map_err(|err| *err));
        let _ = release.recv();
        drop(permit);
    })
}

/// Until `n` callers wait (each is a thread blocked in `acquire`).
fn until_waiting(limiter: &Limiter, n: usize) {
    while limiter.waiting() < n {
        thread::yield_now();
    }
}

#[test]
fn waiters_are_served_as_the_limit_shrinks_then_grows() {
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(4)
            .shards(1)
            .max_waiters(8)
            .max_wait(Duration::MAX)
            .build()
            .unwrap(),
    );
    let controller = controlled(&limiter, &[2, 6]);
    let mut held: Vec<_> = (0..4)
        .map(|_| limiter.try_acquire_owned().unwrap())
        .collect();
    let (served_tx, served) = mpsc::channel();
    let (releases, waiters): (Vec<_>, Vec<_>) = (0..3)
        .map(|_| {
            let (release, on_release) = mpsc::channel::<()>();
            (release, waiter(&limiter, &served_tx, on_release))
        })
        .unzip();
    until_waiting(&limiter, 3);

    // Shrink to 2 with 4 held: fail-fast is refused, and two releases
    // (down to 2 in flight, the new limit) serve nobody.
    controller.tick_at(Duration::from_millis(100)).unwrap();
    assert_eq!(limiter.capacity(), 2);
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    held.truncate(2);
    assert_eq!((limiter.usage(), limiter.waiting()), (2, 3));
    // One more: 1 in flight, below the limit: the first waiter is served.
    held.truncate(1);
    assert_eq!(served.recv().unwrap(), Ok(()));
    assert_eq!((limiter.usage(), limiter.waiting()), (2, 2));

    // Grow to 6: the two others are served at once, and fail-fast has
    // the room left (one unit), then is refused.
    controller.tick_at(Duration::from_millis(200)).unwrap();
    assert_eq!(limiter.capacity(), 6);
    for _ in 0..2 {
        assert_eq!(served.recv().unwrap(), Ok(()));
    }
    assert_eq!(limiter.usage(), 4);
    let last = limiter.try_acquire_owned().unwrap();
    let fifth = limiter.try_acquire_owned().unwrap();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    drop((held, releases, last, fifth));
    for waiter in waiters {
        waiter.join().unwrap();
    }
    assert_eq!(limiter.usage(), 0);
    assert_eq!(limiter.stats().waited, 3);
}

#[test]
fn a_waiter_times_out_when_the_shrunk_limit_never_leaves_room() {
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(4)
            .shards(1)
            .max_waiters(8)
            .max_wait(Duration::from_millis(200))
            .build()
            .unwrap(),
    );
    let controller = controlled(&limiter, &[2]);
    let mut held: Vec<_> = (0..4)
        .map(|_| limiter.try_acquire_owned().unwrap())
        .collect();
    let (served_tx, served) = mpsc::channel();
    let (release, on_release) = mpsc::channel::<()>();
    let waiting = waiter(&limiter, &served_tx, on_release);
    until_waiting(&limiter, 1);
    controller.tick_at(Duration::from_millis(100)).unwrap();
    assert_eq!(limiter.capacity(), 2);
    // Under the old limit this release would serve the waiter; under the
    // new one (3 in flight, limit 2) it does not.
    held.pop();
    assert_eq!(served.recv().unwrap(), Err(Error::Timeout));
    drop(release);
    waiting.join().unwrap();
    let stats = limiter.stats();
    assert_eq!((stats.timed_out, stats.waited, stats.usage), (1, 0, 3));
    drop(held);
}
