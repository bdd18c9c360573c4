//! A thread the OS refuses to start is an error the builder returns, with
//! the threads it had already started shut down and joined; for the thread
//! pool (each dispatch mode), the shepherd (a worker, or its timer) and the
//! reporter. The refusal comes from the shim's seam
//! (`os_thread::refuse_spawns_after`), so no test exhausts the OS.
//!
//! "Joined" is checked twice over: every handler that was built was also
//! dropped (a worker drops its state as it exits), and the factory, which
//! only the worker threads hold, is gone (`Arc::strong_count` of a token it
//! captured is back to 1) by the time `build` returns.

use std::io::ErrorKind;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use crate::error::Error;
use crate::integrations::reporter::Reporter;
use crate::pool::worker::Worker;
use crate::pool::{KeyedMode, Pool};
use crate::shepherd::{Handler, Shepherd};
use crate::supervisor::Supervisor;
use crate::sync::os_thread::refuse_spawns_after;

/// Counts states built and dropped.
#[derive(Default)]
struct Counts {
    made: AtomicUsize,
    dropped: AtomicUsize,
}

struct Counted(Arc<Counts>);

impl Counted {
    fn new(counts: &Arc<Counts>) -> Self {
        counts.made.fetch_add(1, SeqCst);
        Counted(Arc::clone(counts))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, SeqCst);
    }
}

impl Worker for Counted {
    type Request = ();
    type Reply = ();
    type Message = ();
    fn handle_call(&mut self, _: ()) {}
    fn handle_cast(&mut self, _: ()) {}
}

impl Handler for Counted {
    type Op = ();
    type Output = ();
    type Error = ();
    fn handle(&mut self, _: &(), _: u32) -> Result<(), ()> {
        Ok(())
    }
}

const REFUSED: &str = "cannot start the `workers`: the OS refused a thread (operation would block)";

#[test]
fn a_pool_whose_third_worker_is_refused_joins_the_two_and_says_so() {
    for (steal, keyed) in [
        (false, KeyedMode::Pinned),
        (true, KeyedMode::Pinned),
        (false, KeyedMode::Ordered),
        (true, KeyedMode::Ordered),
    ] {
        let counts = Arc::new(Counts::default());
        let token = Arc::new(());
        let factory = {
            let (counts, token) = (Arc::clone(&counts), Arc::clone(&token));
            move |_| {
                let _ = &token;
                Counted::new(&counts)
            }
        };
        let refusing = refuse_spawns_after(2);
        let err = Pool::builder()
            .capacity(8)
            .workers(4)
            .steal(steal)
            .keyed(keyed)
            .build(factory)
            .unwrap_err();
        drop(refusing);
        let mode = format!("steal {steal}, {keyed:?}");
        assert_eq!(
            (err.field(), err.to_string().as_str()),
            ("workers", REFUSED),
            "{mode}"
        );
        assert_eq!(
            Arc::strong_count(&token),
            1,
            "{mode}: a worker thread still runs"
        );
        let made = counts.made.load(SeqCst);
        assert!(made <= 2, "{mode}: {made} states for 2 threads");
        assert_eq!(counts.dropped.load(SeqCst), made, "{mode}");
    }
}

#[test]
fn a_shepherd_whose_worker_or_timer_is_refused_joins_the_rest_and_says_so() {
    // 3 workers, then the timer: refuse the second worker, then the timer.
    for allowed in [1, 3] {
        let counts = Arc::new(Counts::default());
        let token = Arc::new(());
        let factory = {
            let (counts, token) = (Arc::clone(&counts), Arc::clone(&token));
            move |_| {
                let _ = &token;
                Counted::new(&counts)
            }
        };
        let refusing = refuse_spawns_after(allowed);
        let err = Shepherd::builder()
            .capacity(8)
            .workers(3)
            .build(factory)
            .unwrap_err();
        drop(refusing);
        assert_eq!(
            (err.field(), err.to_string().as_str()),
            ("workers", REFUSED),
            "{allowed}"
        );
        assert_eq!(
            Arc::strong_count(&token),
            1,
            "{allowed}: a thread still runs"
        );
        let made = counts.made.load(SeqCst);
        assert!(made <= allowed.min(3), "{allowed}: {made} handlers");
        assert_eq!(counts.dropped.load(SeqCst), made, "{allowed}");
    }
}

#[test]
fn a_refused_reporter_thread_is_a_spawn_error() {
    let sup = Supervisor::new(1).unwrap();
    let reporter = Reporter::builder().build(&sup).unwrap();
    let refusing = refuse_spawns_after(0);
    let err = reporter.spawn().unwrap_err();
    drop(refusing);
    assert_eq!(err, Error::Spawn(ErrorKind::WouldBlock));
}

#[test]
fn a_refused_child_thread_is_a_spawn_error_and_frees_its_unit() {
    let sup = Supervisor::new(1).unwrap();
    let refusing = refuse_spawns_after(0);
    let err = sup.spawn(|| ()).unwrap_err();
    drop(refusing);
    assert_eq!(err, Error::Spawn(ErrorKind::WouldBlock));
    assert_eq!(sup.count(), 0);
    assert_eq!(sup.spawn(|| 7).unwrap().join().unwrap(), 7);
}
