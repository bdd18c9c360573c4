//! A controller attached to a pool (`Controller::attach`) is fed by the
//! pool's workers, which time each handler, and one attached to a
//! supervisor by its children, which time their own lives: no user code
//! records a sample. The handler's speed is real (a slow backend is a handler that
//! sleeps as its work); the controller's clock is virtual (ticks at
//! `tick_at`, an interval too long for any sample to tick), so each window
//! holds a known number of requests and the assertions are on the
//! direction of the limit only, never on durations.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use sidejob::adaptive::{Controller, Guarded, Window};
use sidejob::{Pool, Supervisor, Worker};

/// Requests per window.
const PER_WINDOW: u64 = 32;
/// The work of a slow request.
const SLOW: Duration = Duration::from_millis(5);

/// A backend that turns slow when told.
struct Backend(Arc<AtomicBool>);

impl Worker for Backend {
    type Request = ();
    type Reply = ();
    type Message = ();

    fn handle_call(&mut self, (): ()) {
        if self.0.load(SeqCst) {
            std::thread::sleep(SLOW); // the backend's work, not a wait for anything
        }
    }

    fn handle_cast(&mut self, (): ()) {}
}

fn controller<T: sidejob::adaptive::Target>(target: T) -> Arc<Controller> {
    Arc::new(
        Controller::builder()
            .floor(1)
            .ceiling(64)
            .min_samples(PER_WINDOW)
            .sample_every(1)
            .interval(Duration::from_secs(3_600))
            .build(target, Guarded::default())
            .unwrap(),
    )
}

/// Closes the window at `at` ms: it must hold the `PER_WINDOW` timed samples.
fn close(controller: &Controller, at: u64) -> Window {
    let window = controller
        .tick_at(Duration::from_millis(at))
        .expect("a window of PER_WINDOW completions closes");
    assert_eq!(
        window.samples(),
        PER_WINDOW,
        "every handler timed, by the pool"
    );
    window
}

#[test]
fn a_pool_whose_handler_slows_has_its_limit_brought_down() {
    let slow = Arc::new(AtomicBool::new(false));
    let pool = Pool::builder()
        .workers(2)
        .capacity(16)
        .build({
            let slow = Arc::clone(&slow);
            move |_| Backend(Arc::clone(&slow))
        })
        .unwrap();
    let controller = controller(pool.clone());
    assert!(Controller::attach(&controller));

    // One fast window: the no-load latency; nothing to cut.
    for _ in 0..PER_WINDOW {
        pool.call(()).unwrap();
    }
    close(&controller, 100);
    assert_eq!(pool.capacity(), 16);

    // Slow windows: far above the no-load latency, the limit comes down.
    slow.store(true, SeqCst);
    for window in 2..=3 {
        for _ in 0..PER_WINDOW {
            pool.call(()).unwrap();
        }
        close(&controller, window * 100);
    }
    assert!(pool.capacity() < 16, "limit {}", pool.capacity());
    pool.shutdown();
}

#[test]
fn an_unattached_pool_feeds_nothing() {
    let pool = Pool::builder()
        .workers(1)
        .capacity(4)
        .build(|_| Backend(Arc::new(AtomicBool::new(false))))
        .unwrap();
    let controller = Arc::new(
        Controller::builder()
            .min_samples(0)
            .sample_every(1)
            .build(pool.clone(), Guarded::default())
            .unwrap(),
    );
    pool.call(()).unwrap();
    let window = controller.tick_at(Duration::from_millis(100)).unwrap();
    assert_eq!((window.samples(), window.completed()), (0, 1));
    // Attached once; a second controller finds the pool taken.
    assert!(Controller::attach(&controller));
    let other = Arc::new(
        Controller::builder()
            .build(pool.clone(), Guarded::default())
            .unwrap(),
    );
    assert!(!Controller::attach(&other));
    pool.call(()).unwrap();
    assert_eq!(
        controller
            .tick_at(Duration::from_millis(200))
            .unwrap()
            .samples(),
        1
    );
    drop((controller, other));
    pool.shutdown();
}

/// A child's work: slow when told (the work itself, not a wait for
/// anything).
fn child_work(slow: &AtomicBool) {
    if slow.load(SeqCst) {
        std::thread::sleep(SLOW);
    }
}

#[test]
fn a_supervisor_whose_children_slow_has_its_limit_brought_down() {
    let slow = Arc::new(AtomicBool::new(false));
    let sup = Supervisor::builder().capacity(64).build().unwrap();
    let controller = controller(sup.clone());
    assert!(Controller::attach(&controller));
    assert!(!Controller::attach(&controller), "once");
    let window = |at: u64| {
        let children: Vec<_> = (0..PER_WINDOW)
            .map(|_| {
                let slow = Arc::clone(&slow);
                sup.spawn(move || child_work(&slow)).unwrap()
            })
            .collect();
        for child in children {
            child.join().unwrap();
        }
        close(&controller, at)
    };

    // One fast window: the no-load latency; nothing to cut.
    window(100);
    assert_eq!(sup.capacity(), 64);

    // Slow windows: far above the no-load latency, the limit comes down.
    slow.store(true, SeqCst);
    for at in [200, 300] {
        window(at);
    }
    assert!(sup.capacity() < 64, "limit {}", sup.capacity());
}

#[test]
fn an_unattached_supervisor_feeds_nothing_and_panicked_children_record_nothing() {
    let sup = Supervisor::builder().capacity(4).build().unwrap();
    let controller = Arc::new(
        Controller::builder()
            .min_samples(0)
            .sample_every(1)
            .interval(Duration::from_secs(3_600))
            .build(sup.clone(), Guarded::default())
            .unwrap(),
    );
    sup.spawn(|| ()).unwrap().join().unwrap();
    let window = controller.tick_at(Duration::from_millis(100)).unwrap();
    assert_eq!((window.samples(), window.completed()), (0, 1));

    assert!(Controller::attach(&controller));
    sup.spawn(|| ()).unwrap().join().unwrap();
    assert!(sup
        .spawn(|| panic!("a child's own failure"))
        .unwrap()
        .join()
        .is_err());
    let window = controller.tick_at(Duration::from_millis(200)).unwrap();
    assert_eq!(
        (window.samples(), window.dropped(), window.completed()),
        (1, 0, 2),
        "the panicked child is counted by the supervisor, not timed"
    );
}

#[cfg(feature = "tokio")]
mod asynchronous {
    use super::*;
    use sidejob::AsyncWorker;

    struct AsyncBackend(Arc<AtomicBool>);

    impl AsyncWorker for AsyncBackend {
        type Request = ();
        type Reply = ();
        type Message = ();

        async fn handle_call(&mut self, (): ()) {
            if self.0.load(SeqCst) {
                tokio::time::sleep(SLOW).await; // the backend's work
            }
        }

        async fn handle_cast(&mut self, (): ()) {}
    }

    #[test]
    fn an_async_pool_whose_handler_slows_has_its_limit_brought_down() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let slow = Arc::new(AtomicBool::new(false));
            let pool = sidejob::Pool::builder()
                .workers(2)
                .capacity(16)
                .build_async({
                    let slow = Arc::clone(&slow);
                    move |_| AsyncBackend(Arc::clone(&slow))
                })
                .unwrap();
            let controller = controller(pool.clone());
            assert!(Controller::attach(&controller));
            for _ in 0..PER_WINDOW {
                pool.call_async(()).await.unwrap();
            }
            close(&controller, 100);
            assert_eq!(pool.capacity(), 16);
            slow.store(true, SeqCst);
            for window in 2..=3 {
                for _ in 0..PER_WINDOW {
                    pool.call_async(()).await.unwrap();
                }
                close(&controller, window * 100);
            }
            assert!(pool.capacity() < 16, "limit {}", pool.capacity());
            drop(controller);
            pool.shutdown_async().await;
        });
    }
}

#[cfg(feature = "tokio")]
#[test]
fn a_supervisor_whose_tasks_slow_has_its_limit_brought_down() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let slow = Arc::new(AtomicBool::new(false));
        let sup = Supervisor::builder().capacity(64).build().unwrap();
        let controller = controller(sup.clone());
        assert!(Controller::attach(&controller));
        for at in [100, 200, 300] {
            if at == 200 {
                slow.store(true, SeqCst);
            }
            let tasks: Vec<_> = (0..PER_WINDOW)
                .map(|_| {
                    let slow = Arc::clone(&slow);
                    sup.spawn_task(async move {
                        if slow.load(SeqCst) {
                            tokio::time::sleep(SLOW).await; // the task's work
                        }
                    })
                    .unwrap()
                })
                .collect();
            for task in tasks {
                task.await.unwrap();
            }
            close(&controller, at);
            if at == 100 {
                assert_eq!(sup.capacity(), 64);
            }
        }
        assert!(sup.capacity() < 64, "limit {}", sup.capacity());
    });
}

mod ticker {
    use std::sync::mpsc;

    use sidejob::adaptive::{Algorithm, Controller, Window};
    use sidejob::Limiter;

    use super::*;

    /// Says each window it is given on a channel, and keeps the limit.
    struct Tell(mpsc::Sender<Window>);

    impl Algorithm for Tell {
        fn update(&mut self, window: &Window) -> usize {
            let _ = self.0.send(window.clone());
            window.limit()
        }
    }

    #[test]
    fn a_ticker_ticks_a_counts_only_controller_and_stops_when_dropped() {
        let limiter = Arc::new(Limiter::new(8).unwrap());
        let (tx, rx) = mpsc::channel();
        let controller = Arc::new(
            Controller::builder()
                .min_samples(1)
                .interval(Duration::from_millis(5))
                .build(Arc::clone(&limiter), Tell(tx))
                .unwrap(),
        );
        // Untimed permits: nothing but the ticker can close a window.
        for _ in 0..3 {
            drop(limiter.try_acquire().unwrap());
        }
        let ticker = Controller::spawn_ticker(&controller).unwrap();
        let window = rx.recv().expect("the ticker closed a window");
        assert_eq!((window.samples(), window.completed()), (0, 3));
        // Dropping it joins the thread. Stopped, no tick of its runs: a
        // tick of ours is not skipped as "another is running".
        drop(ticker);
        while rx.try_recv().is_ok() {}
        assert!(controller.tick_at(Duration::from_secs(3_600)).is_some());
    }

    #[test]
    fn a_ticker_ends_with_its_controller() {
        let limiter = Arc::new(Limiter::new(8).unwrap());
        let (tx, rx) = mpsc::channel();
        let controller = Arc::new(
            Controller::builder()
                .min_samples(0)
                .interval(Duration::from_millis(5))
                .build(limiter, Tell(tx))
                .unwrap(),
        );
        let ticker = Controller::spawn_ticker(&controller).unwrap();
        rx.recv().expect("a tick");
        drop(controller);
        // The thread holds the controller weakly: with it gone, the thread
        // ends and the algorithm (the sender) with it.
        while rx.recv().is_ok() {}
        drop(ticker);
    }
}
