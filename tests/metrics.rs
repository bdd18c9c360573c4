//! The reporter's metrics, read back through metrics-util's debugging
//! recorder: after a known sequence they equal `stats()`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use metrics::{SharedString, Unit};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};
use sidejob::observe::{Alarm, Reporter};
use sidejob::shepherd::{Handler, RetryPolicy, Shepherd};
use sidejob::{Error, Limiter, Pool, Stats, Supervisor, Worker};

mod common;
use common::noop_waker;

/// One snapshot: the debugging recorder's snapshots drain the values, so
/// each check takes one and reads every series from it.
type Snap = Vec<(CompositeKey, Option<Unit>, Option<SharedString>, DebugValue)>;

fn snap(snapshotter: &Snapshotter) -> Snap {
    snapshotter.snapshot().into_vec()
}

/// One series' value, by name and labels.
fn value<'a>(snap: &'a Snap, name: &str, labels: &[(&str, &str)]) -> Option<&'a DebugValue> {
    snap.iter()
        .find(|(key, _, _, _)| {
            let key = key.key();
            key.name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(_, _, _, value)| value)
}

fn counter(s: &Snap, name: &str, labels: &[(&str, &str)]) -> u64 {
    match value(s, name, labels) {
        Some(DebugValue::Counter(v)) => *v,
        other => panic!("{name}: {other:?}"),
    }
}

fn gauge(s: &Snap, name: &str, labels: &[(&str, &str)]) -> f64 {
    match value(s, name, labels) {
        Some(DebugValue::Gauge(v)) => v.into_inner(),
        other => panic!("{name}: {other:?}"),
    }
}

fn assert_exported(snapshotter: &Snapshotter, labels: &[(&str, &str)], stats: &Stats) {
    let s = &snap(snapshotter);
    assert_eq!(gauge(s, "sidejob_capacity", labels), stats.capacity as f64);
    assert_eq!(gauge(s, "sidejob_in_flight", labels), stats.usage as f64);
    assert_eq!(counter(s, "sidejob_accepted_total", labels), stats.accepted);
    assert_eq!(counter(s, "sidejob_rejected_total", labels), stats.rejected);
    assert_eq!(
        counter(s, "sidejob_completed_total", labels),
        stats.completed
    );
    assert_eq!(counter(s, "sidejob_panicked_total", labels), stats.panicked);
    assert_eq!(gauge(s, "sidejob_waiting", labels), stats.waiting as f64);
    assert_eq!(counter(s, "sidejob_waited_total", labels), stats.waited);
    assert_eq!(
        counter(s, "sidejob_timed_out_total", labels),
        stats.timed_out
    );
    assert_eq!(
        gauge(s, "sidejob_waited_seconds_total", labels),
        stats.waited_time.as_secs_f64()
    );
}

#[test]
fn a_tick_exports_exactly_the_stats_of_a_limiter() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let limiter = Arc::new(Limiter::builder().capacity(3).shards(1).build().unwrap());
    // Handles are registered with the recorder in force at build time.
    let mut reporter = metrics::with_local_recorder(&recorder, || {
        Reporter::builder().name("api").build(&limiter)
    })
    .unwrap();

    // A known sequence: 3 admitted and held, 2 refused, 2 released, one
    // released by a panic.
    let held: Vec<_> = (0..3).map(|_| limiter.try_acquire().unwrap()).collect();
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    assert_eq!(limiter.try_acquire().unwrap_err(), Error::Overload);
    let mut held = held.into_iter();
    drop(held.next());
    drop(held.next());
    let last = held.next().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            let _dies_with = last;
            std::panic::resume_unwind(Box::new("boom"));
        })
        .join()
        .unwrap_err();
    });
    let _one_more = limiter.try_acquire().unwrap();

    let ticked = reporter.tick(Instant::now()).unwrap();
    let stats = limiter.stats();
    assert_eq!(ticked, stats);
    assert_eq!(
        (
            stats.accepted,
            stats.rejected,
            stats.completed,
            stats.panicked,
            stats.usage
        ),
        (4, 2, 2, 1, 1)
    );
    assert_exported(
        &snapshotter,
        &[("name", "api"), ("kind", "limiter")],
        &stats,
    );
}

#[test]
fn the_waiting_figures_are_exported_exactly() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // One shard, one unit, room for one waiter, who waits 200 ms at most
    // (the second waiter below is handed its unit after 10 ms: ample room
    // on a loaded machine).
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(1)
            .shards(1)
            .max_waiters(1)
            .max_wait(Duration::from_millis(200))
            .build()
            .unwrap(),
    );
    let mut reporter = metrics::with_local_recorder(&recorder, || {
        Reporter::builder().name("queue").build(&limiter)
    })
    .unwrap();
    let labels = [("name", "queue"), ("kind", "limiter")];

    let held = limiter.try_acquire().unwrap();
    // A blocking waiter times out: the unit stays held throughout, so its
    // own deadline is the only way out.
    assert_eq!(limiter.acquire().unwrap_err(), Error::Timeout);

    // A waiter polled by hand: queued on its first poll.
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut waiter = Box::pin(limiter.acquire_async());
    assert!(waiter.as_mut().poll(&mut cx).is_pending());
    // The room is full: the next one is refused at once.
    let mut refused = Box::pin(limiter.acquire_async());
    assert!(matches!(
        refused.as_mut().poll(&mut cx),
        Poll::Ready(Err(Error::Overload))
    ));
    let stats = reporter.tick(Instant::now()).unwrap();
    assert_eq!(
        (stats.waiting, stats.timed_out, stats.waited, stats.rejected),
        (1, 1, 0, 1)
    );
    assert_exported(&snapshotter, &labels, &stats);

    // The held unit is handed to the waiter after 10 ms: waits are timed
    // on the coarse clock (ticks of 1 to 4 ms), so a wait this long counts
    // at least 6 ms whatever the tick.
    std::thread::sleep(Duration::from_millis(10));
    drop(held);
    let permit = match waiter.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("expected the handed-over unit, got {other:?}"),
    };
    drop(permit);
    let stats = reporter.tick(Instant::now()).unwrap();
    assert_eq!(stats, limiter.stats());
    assert_eq!(
        (stats.waiting, stats.timed_out, stats.waited, stats.rejected),
        (0, 1, 1, 1)
    );
    assert_eq!((stats.accepted, stats.completed, stats.usage), (2, 2, 0));
    assert!(stats.waited_time >= Duration::from_millis(6), "{stats:?}");
    assert_exported(&snapshotter, &labels, &stats);
}

struct Echo;
impl Worker for Echo {
    type Request = u32;
    type Reply = u32;
    type Message = ();
    fn handle_call(&mut self, n: u32) -> u32 {
        n
    }
    fn handle_cast(&mut self, _: ()) {}
}

#[test]
fn stopping_a_spawned_reporter_exports_a_last_report() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let pool = Pool::builder()
        .name("echo")
        .capacity(4)
        .workers(2)
        .build(|_| Echo)
        .unwrap();
    // An hour between ticks: only the first tick (at spawn) and the last
    // (at stop) can run in this test.
    let handle = metrics::with_local_recorder(&recorder, || {
        Reporter::builder()
            .interval(Duration::from_secs(3600))
            .build(&pool)
    })
    .unwrap()
    .spawn()
    .unwrap();
    for n in 0..10 {
        assert_eq!(pool.call(n).unwrap(), n);
    }
    pool.cast(()).unwrap();
    let last = handle.stop().expect("the pool is alive");
    let stats = pool.stats();
    // The cast may still be queued at stop; everything else is settled.
    assert_eq!(last.accepted, 11);
    assert_eq!(stats.accepted, 11);
    assert_exported(&snapshotter, &[("name", "echo"), ("kind", "pool")], &last);
}

/// Sets a flag when its worker is terminated (the pool shut down).
struct Flagged(Arc<AtomicBool>);
impl Worker for Flagged {
    type Request = ();
    type Reply = ();
    type Message = ();
    fn handle_call(&mut self, _: ()) {}
    fn handle_cast(&mut self, _: ()) {}
    fn terminate(&mut self) {
        self.0.store(true, SeqCst);
    }
}

#[test]
fn a_reporter_never_keeps_its_front_end_alive() {
    let terminated = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&terminated);
    let pool = Pool::builder()
        .capacity(2)
        .workers(1)
        .build(move |_| Flagged(Arc::clone(&flag)))
        .unwrap();
    let mut reporter = Reporter::builder().build(&pool).unwrap();
    assert!(reporter.tick(Instant::now()).is_some());
    drop(pool);
    // The last handle's drop shut the pool down: the reporter held none.
    assert!(terminated.load(SeqCst));
    assert!(reporter.tick(Instant::now()).is_none());

    // A spawned reporter's thread ends by itself once its front-end is
    // gone; stop then joins it and hands back the last figures read.
    let sup = Supervisor::new(2).unwrap();
    let handle = Reporter::builder()
        .interval(Duration::from_millis(1))
        .build(&sup)
        .unwrap()
        .spawn()
        .unwrap();
    sup.spawn(|| ()).unwrap().join().unwrap();
    drop(sup);
    let last = handle.stop().expect("ticked at least once");
    assert_eq!(last.capacity, 2);
}

#[test]
fn an_alarm_gauge_follows_the_alarm() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let limiter = Arc::new(Limiter::new(4).unwrap());
    let alarm = Alarm::builder()
        .name("busy")
        .threshold(1)
        .raise_after(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut reporter = metrics::with_local_recorder(&recorder, || {
        Reporter::builder()
            .name("api")
            .alarm(alarm.clone())
            .build(&limiter)
    })
    .unwrap();
    let labels = [("name", "api"), ("kind", "limiter"), ("alarm", "busy")];
    let t0 = Instant::now();
    let at = |s| t0 + Duration::from_secs(s);

    let held: Vec<_> = (0..2).map(|_| limiter.try_acquire().unwrap()).collect();
    reporter.tick(at(0));
    assert_eq!(gauge(&snap(&snapshotter), "sidejob_alarm", &labels), 0.0);
    reporter.tick(at(10));
    assert!(alarm.is_raised());
    assert_eq!(gauge(&snap(&snapshotter), "sidejob_alarm", &labels), 1.0);
    drop(held);
    reporter.tick(at(11));
    assert!(!alarm.is_raised());
    assert_eq!(gauge(&snap(&snapshotter), "sidejob_alarm", &labels), 0.0);
    // Nothing is registered per call: only the series above exist.
    assert_eq!(
        snapshotter
            .snapshot()
            .into_vec()
            .iter()
            .filter(|(key, ..)| key.kind() == MetricKind::Counter)
            .count(),
        6
    );
}

/// Fails the first attempt of every even operation; operation 9 always
/// fails.
struct FlakyEven;

impl Handler for FlakyEven {
    type Op = u32;
    type Output = u32;
    type Error = &'static str;
    fn handle(&mut self, op: &u32, attempt: u32) -> Result<u32, &'static str> {
        match (*op, attempt) {
            (9, _) => Err("down"),
            (n, 1) if n % 2 == 0 => Err("busy"),
            (n, _) => Ok(n),
        }
    }
}

#[test]
fn a_tick_exports_a_shepherds_own_figures() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let shepherd = Shepherd::builder()
        .name("mailer")
        .capacity(8)
        .workers(2)
        .retry(
            RetryPolicy::new()
                .max_attempts(3)
                .backoff(Duration::ZERO, Duration::ZERO)
                .budget(None),
        )
        .build(|_| FlakyEven)
        .unwrap();
    let mut reporter =
        metrics::with_local_recorder(&recorder, || Reporter::builder().build(&shepherd)).unwrap();
    assert_eq!((reporter.name(), reporter.kind()), ("mailer", "shepherd"));

    // A known sequence: 1 and 3 succeed at once, 2 and 4 on the second
    // attempt, 9 fails three times; one more waits an hour.
    for op in [1, 2, 3, 4] {
        assert_eq!(shepherd.submit(op).unwrap().wait(), Ok(op));
    }
    assert_eq!(
        shepherd.submit(9).unwrap().wait().unwrap_err().attempts(),
        3
    );
    let _later = shepherd.submit_after(5, Duration::from_secs(3600)).unwrap();
    assert!(shepherd.wait_idle(Duration::from_secs(60)));

    let ticked = reporter.tick(Instant::now()).unwrap();
    let stats = shepherd.stats();
    assert_eq!(ticked, stats.admission);
    assert_eq!(
        (
            stats.due,
            stats.delayed,
            stats.running,
            stats.busy,
            stats.idle
        ),
        (0, 1, 0, 0, 2)
    );
    assert_eq!(
        (stats.attempts, stats.retries, stats.failed, stats.processed),
        (9, 4, 1, 9)
    );
    let labels = &[("name", "mailer"), ("kind", "shepherd")];
    let s = &snap(&snapshotter);
    assert_eq!(gauge(s, "sidejob_shepherd_due", labels), 0.0);
    assert_eq!(gauge(s, "sidejob_shepherd_delayed", labels), 1.0);
    assert_eq!(gauge(s, "sidejob_shepherd_running", labels), 0.0);
    assert_eq!(gauge(s, "sidejob_shepherd_busy_workers", labels), 0.0);
    assert_eq!(gauge(s, "sidejob_shepherd_idle_workers", labels), 2.0);
    assert_eq!(counter(s, "sidejob_shepherd_attempts_total", labels), 9);
    assert_eq!(counter(s, "sidejob_shepherd_retries_total", labels), 4);
    assert_eq!(counter(s, "sidejob_shepherd_failures_total", labels), 1);
    assert_eq!(counter(s, "sidejob_shepherd_processed_total", labels), 9);
    assert_eq!(
        gauge(s, "sidejob_shepherd_processing_seconds_total", labels),
        stats.processing_time.as_secs_f64()
    );
    // The admission series are there too, under the same labels: the
    // delayed operation holds its unit.
    assert_eq!(gauge(s, "sidejob_in_flight", labels), 1.0);
    assert_eq!(counter(s, "sidejob_accepted_total", labels), 6);

    // Held weakly: once the shepherd is gone, nothing more is read.
    drop(shepherd);
    assert!(reporter.tick(Instant::now()).is_none());
}

#[test]
fn only_a_shepherd_gets_the_shepherd_series() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let limiter = Arc::new(Limiter::new(2).unwrap());
    let mut reporter =
        metrics::with_local_recorder(&recorder, || Reporter::builder().build(&limiter)).unwrap();
    reporter.tick(Instant::now()).unwrap();
    let s = &snap(&snapshotter);
    assert!(s
        .iter()
        .all(|(key, _, _, _)| !key.key().name().starts_with("sidejob_shepherd_")));
    assert!(value(s, "sidejob_capacity", &[("kind", "limiter")]).is_some());
}
