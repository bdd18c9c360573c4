//! The reporter's metrics, read back from the page of a real exporter
//! (`metrics-exporter-prometheus`, one recorder per test, installed
//! locally): after a known sequence the series equal `stats()`; each
//! front-end's series are its own; counters keep rising across rebuilds
//! and reporters; each priority class's figures are series of their own,
//! labelled `class`; and the page passes `promtool check metrics`.

use std::future::Future;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};
use sidejob::observe::{Alarm, Reporter, Watched};
use sidejob::shepherd::{Handler, RetryPolicy, Shepherd};
use sidejob::units::Ask;
use sidejob::{Class, Error, Limiter, Pool, Stats, Supervisor, Worker};

mod common;
use common::noop_waker;

/// A Prometheus recorder of the test's own, and the handle rendering its
/// page. Install it around a reporter's build with
/// `metrics::with_local_recorder(&recorder, ..)`: the handles are
/// registered then, and keep writing to it from any thread.
fn prometheus() -> (PrometheusRecorder, PrometheusHandle) {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    (recorder, handle)
}

/// The value of one series on a page, by name and (some of its) labels.
fn sample(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, set) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            let matches = metric == name
                && labels.iter().all(|(k, v)| {
                    let want = format!("{k}=\"{v}\"");
                    set.split(',').any(|pair| pair == want)
                });
            matches.then(|| value.parse().ok()).flatten()
        })
}

/// [`sample`], which must be there.
fn value(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    sample(page, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?} on\n{page}"))
}

/// How many series of `name` the page holds.
fn series(page: &str, name: &str) -> usize {
    page.lines()
        .filter(|line| {
            line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} "))
        })
        .count()
}

fn assert_exported(page: &str, labels: &[(&str, &str)], stats: &Stats) {
    assert_eq!(
        value(page, "sidejob_capacity", labels),
        stats.capacity as f64
    );
    assert_eq!(value(page, "sidejob_in_flight", labels), stats.usage as f64);
    assert_eq!(
        value(page, "sidejob_accepted_total", labels),
        stats.accepted as f64
    );
    assert_eq!(
        value(page, "sidejob_rejected_total", labels),
        stats.rejected as f64
    );
    assert_eq!(
        value(page, "sidejob_completed_total", labels),
        stats.completed as f64
    );
    assert_eq!(
        value(page, "sidejob_panicked_total", labels),
        stats.panicked as f64
    );
    assert_eq!(value(page, "sidejob_waiting", labels), stats.waiting as f64);
    assert_eq!(
        value(page, "sidejob_waited_total", labels),
        stats.waited as f64
    );
    assert_eq!(
        value(page, "sidejob_timed_out_total", labels),
        stats.timed_out as f64
    );
    let seconds = value(page, "sidejob_waited_seconds", labels);
    assert!(
        (seconds - stats.waited_time.as_secs_f64()).abs() < 1e-9,
        "{seconds} vs {:?}",
        stats.waited_time
    );
}

#[test]
fn a_tick_exports_exactly_the_stats_of_a_limiter() {
    let (recorder, page) = prometheus();
    let limiter = Arc::new(
        Limiter::builder()
            .name("api")
            .capacity(3)
            .shards(1)
            .build()
            .unwrap(),
    );
    // The limiter's own name: no need to repeat it to the reporter.
    let mut reporter =
        metrics::with_local_recorder(&recorder, || Reporter::builder().build(&limiter)).unwrap();
    assert_eq!((reporter.name(), reporter.kind()), ("api", "limiter"));

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
        &page.render(),
        &[("name", "api"), ("kind", "limiter")],
        &stats,
    );

    // A second tick with nothing new adds nothing: the counters are
    // raised by increments, not set.
    reporter.tick(Instant::now()).unwrap();
    assert_exported(
        &page.render(),
        &[("name", "api"), ("kind", "limiter")],
        &stats,
    );
}

/// Every class's series equal its figures in `stats`, under `labels` and
/// the class's own label.
fn assert_classes_exported(page: &str, labels: &[(&str, &str)], stats: &Stats) {
    assert_eq!(stats.classes.len(), Class::ALL.len());
    for class in &stats.classes {
        let mut labels = labels.to_vec();
        labels.push(("class", class.class.as_str()));
        let figures = [
            ("sidejob_class_accepted_total", class.accepted as f64),
            ("sidejob_class_rejected_total", class.rejected as f64),
            ("sidejob_class_timed_out_total", class.timed_out as f64),
            ("sidejob_class_waiting", class.waiting as f64),
        ];
        for (name, want) in figures {
            assert_eq!(value(page, name, &labels), want, "{name} {labels:?}");
        }
    }
}

#[test]
fn a_tick_exports_each_classs_figures_under_a_class_label() {
    let (recorder, page) = prometheus();
    // One shard, 4 units: the sheddable classes may fill 3 (80 % and 90 %,
    // rounded down); a room for 2 waiters.
    let limiter = Arc::new(
        Limiter::builder()
            .name("prio")
            .capacity(4)
            .shards(1)
            .max_waiters(2)
            .build()
            .unwrap(),
    );
    let mut reporter =
        metrics::with_local_recorder(&recorder, || Reporter::builder().build(&limiter)).unwrap();
    let labels = [("name", "prio"), ("kind", "limiter")];
    let sheddable = Ask::new().class(Class::Sheddable);

    // Before any request: every class's series, at 0.
    let stats = reporter.tick(Instant::now()).unwrap();
    assert_classes_exported(&page.render(), &labels, &stats);
    assert_eq!(
        sample(
            &page.render(),
            "sidejob_class_accepted_total",
            &[("name", "prio"), ("class", "sheddable_plus")]
        ),
        Some(0.0)
    );

    // Three prefetches fill their share; a fourth and a SheddablePlus
    // request are refused; the default class takes the last unit.
    let prefetches: Vec<_> = (0..3)
        .map(|_| limiter.acquire_with(sheddable.fail_fast()).unwrap())
        .collect();
    assert_eq!(
        limiter.acquire_with(sheddable.fail_fast()).unwrap_err(),
        Error::Overload
    );
    let report = Ask::new().class(Class::SheddablePlus).fail_fast();
    assert_eq!(limiter.acquire_with(report).unwrap_err(), Error::Overload);
    let user = limiter.try_acquire().unwrap();
    // Full: a CriticalPlus caller waits, and its own deadline ends the
    // wait (the units stay held throughout).
    let soon = Instant::now() + Duration::from_millis(5);
    let probe = Ask::new().class(Class::CriticalPlus).wait_until(soon);
    assert_eq!(limiter.acquire_with(probe).unwrap_err(), Error::Timeout);
    // A prefetch waits, polled by hand: queued on its first poll.
    let mut waiter = Box::pin(limiter.acquire_with_async(sheddable));
    assert!(common::poll_once(&mut waiter).is_pending());

    let stats = reporter.tick(Instant::now()).unwrap();
    let figures: Vec<(Class, u64, u64, u64, usize)> = stats
        .classes
        .iter()
        .map(|c| (c.class, c.accepted, c.rejected, c.timed_out, c.waiting))
        .collect();
    assert_eq!(
        figures,
        [
            (Class::CriticalPlus, 0, 0, 1, 0),
            (Class::Critical, 1, 0, 0, 0),
            (Class::SheddablePlus, 0, 1, 0, 0),
            (Class::Sheddable, 3, 1, 0, 1),
        ]
    );
    let p = page.render();
    assert_classes_exported(&p, &labels, &stats);
    assert_exported(&p, &labels, &stats);
    // Summed over the classes, the totals.
    let sum = |name: &str| -> f64 {
        Class::ALL
            .iter()
            .map(|class| value(&p, name, &[("name", "prio"), ("class", class.as_str())]))
            .sum()
    };
    assert_eq!(sum("sidejob_class_accepted_total"), stats.accepted as f64);
    assert_eq!(sum("sidejob_class_rejected_total"), stats.rejected as f64);
    assert_eq!(sum("sidejob_class_timed_out_total"), stats.timed_out as f64);

    // The waiter is handed a freed unit (a prefetch's: under its line).
    drop(prefetches);
    let permit = match common::poll_once(&mut waiter) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("expected the handed-over unit, got {other:?}"),
    };
    drop((permit, user));
    let stats = reporter.tick(Instant::now()).unwrap();
    assert_eq!(stats.classes[Class::Sheddable.rank()].accepted, 4);
    assert_eq!(stats.classes[Class::Sheddable.rank()].waiting, 0);
    assert_classes_exported(&page.render(), &labels, &stats);
}

#[test]
fn the_waiting_figures_are_exported_exactly() {
    let (recorder, page) = prometheus();
    // One shard, one unit, room for one waiter, who waits 200 ms at most
    // (the second waiter below is handed its unit after 10 ms: ample room
    // on a loaded machine).
    let limiter = Arc::new(
        Limiter::builder()
            .name("queue")
            .capacity(1)
            .shards(1)
            .max_waiters(1)
            .max_wait(Duration::from_millis(200))
            .build()
            .unwrap(),
    );
    let mut reporter =
        metrics::with_local_recorder(&recorder, || Reporter::builder().build(&limiter)).unwrap();
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
    assert_exported(&page.render(), &labels, &stats);

    // The held unit is handed to the waiter after 10 ms: waits are timed
    // on the coarse clock (ticks of 1 to 4 ms), so a wait this long counts
    // at least 6 ms whatever the tick. (The sleep makes a wait to
    // measure; nothing is synchronised by it.)
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
    assert_exported(&page.render(), &labels, &stats);
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

fn echo_pool(name: &str, capacity: usize) -> Pool<Echo> {
    Pool::builder()
        .name(name)
        .capacity(capacity)
        .workers(2)
        .build(|_| Echo)
        .unwrap()
}

#[test]
fn stopping_a_spawned_reporter_exports_a_last_report() {
    let (recorder, page) = prometheus();
    let pool = echo_pool("echo", 4);
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
    // The cast may still be queued at stop; everything else is settled.
    assert_eq!(last.accepted, 11);
    assert_eq!(pool.stats().accepted, 11);
    assert_exported(&page.render(), &[("name", "echo"), ("kind", "pool")], &last);
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
    assert!(reporter.is_empty());

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
    let (recorder, page) = prometheus();
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
    assert_eq!(value(&page.render(), "sidejob_alarm", &labels), 0.0);
    reporter.tick(at(10));
    assert!(alarm.is_raised());
    assert_eq!(value(&page.render(), "sidejob_alarm", &labels), 1.0);
    drop(held);
    reporter.tick(at(11));
    assert!(!alarm.is_raised());
    assert_eq!(value(&page.render(), "sidejob_alarm", &labels), 0.0);
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

fn flaky_shepherd(name: &str) -> Shepherd<FlakyEven> {
    Shepherd::builder()
        .name(name)
        .capacity(8)
        .workers(2)
        .retry(
            RetryPolicy::new()
                .max_attempts(3)
                .backoff(Duration::ZERO, Duration::ZERO)
                .budget(None),
        )
        .build(|_| FlakyEven)
        .unwrap()
}

#[test]
fn a_tick_exports_a_shepherds_own_figures() {
    let (recorder, page) = prometheus();
    let shepherd = flaky_shepherd("mailer");
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
    let p = &page.render();
    assert_eq!(value(p, "sidejob_shepherd_due", labels), 0.0);
    assert_eq!(value(p, "sidejob_shepherd_delayed", labels), 1.0);
    assert_eq!(value(p, "sidejob_shepherd_running", labels), 0.0);
    assert_eq!(value(p, "sidejob_shepherd_busy_workers", labels), 0.0);
    assert_eq!(value(p, "sidejob_shepherd_idle_workers", labels), 2.0);
    assert_eq!(value(p, "sidejob_shepherd_attempts_total", labels), 9.0);
    assert_eq!(value(p, "sidejob_shepherd_retries_total", labels), 4.0);
    assert_eq!(value(p, "sidejob_shepherd_failures_total", labels), 1.0);
    assert_eq!(value(p, "sidejob_shepherd_processed_total", labels), 9.0);
    let seconds = value(p, "sidejob_shepherd_processing_seconds", labels);
    assert!((seconds - stats.processing_time.as_secs_f64()).abs() < 1e-9);
    // The admission series are there too, under the same labels: the
    // delayed operation holds its unit.
    assert_eq!(value(p, "sidejob_in_flight", labels), 1.0);
    assert_eq!(value(p, "sidejob_accepted_total", labels), 6.0);

    // Held weakly: once the shepherd is gone, nothing more is read.
    drop(shepherd);
    assert!(reporter.tick(Instant::now()).is_none());
}

#[test]
fn only_a_shepherd_gets_the_shepherd_series() {
    let (recorder, page) = prometheus();
    let limiter = Arc::new(Limiter::new(2).unwrap());
    let mut reporter =
        metrics::with_local_recorder(&recorder, || Reporter::builder().build(&limiter)).unwrap();
    reporter.tick(Instant::now()).unwrap();
    let p = page.render();
    assert!(!p.contains("sidejob_shepherd_"), "{p}");
    assert_eq!(value(&p, "sidejob_capacity", &[("kind", "limiter")]), 2.0);
}

/// Issue 27: two unnamed front-ends both exported as `sidejob`, and the
/// exporter kept the larger of the two values (accepted 100 + 5 read 100,
/// capacity 4 and 6 read 6). Each now has series of its own.
#[test]
fn two_unnamed_front_ends_export_two_series() {
    let (recorder, page) = prometheus();
    let a = Arc::new(Limiter::new(4).unwrap());
    let b = Arc::new(Limiter::new(6).unwrap());
    let (mut ra, mut rb) = metrics::with_local_recorder(&recorder, || {
        (
            Reporter::builder().build(&a).unwrap(),
            Reporter::builder().build(&b).unwrap(),
        )
    });
    assert_eq!((ra.name(), rb.name()), ("sidejob", "sidejob-2"));
    for _ in 0..100 {
        drop(a.try_acquire().unwrap());
    }
    for _ in 0..5 {
        drop(b.try_acquire().unwrap());
    }
    ra.tick(Instant::now()).unwrap();
    rb.tick(Instant::now()).unwrap();
    let p = page.render();
    assert_eq!(series(&p, "sidejob_accepted_total"), 2, "{p}");
    let a_labels = [("name", "sidejob"), ("kind", "limiter")];
    let b_labels = [("name", "sidejob-2"), ("kind", "limiter")];
    assert_eq!(value(&p, "sidejob_accepted_total", &a_labels), 100.0);
    assert_eq!(value(&p, "sidejob_accepted_total", &b_labels), 5.0);
    assert_eq!(value(&p, "sidejob_capacity", &a_labels), 4.0);
    assert_eq!(value(&p, "sidejob_capacity", &b_labels), 6.0);
}

/// A front-end named `sidejob` on purpose was exported as `sidejob-3`
/// (taken for unnamed) without a word. Named, it is refused like any
/// other name two live front-ends share.
#[test]
fn a_front_end_named_like_the_default_is_named() {
    let (recorder, _page) = prometheus();
    let a = Arc::new(Limiter::new(4).unwrap());
    let b = Arc::new(Limiter::new(4).unwrap());
    let named = |name: &str| {
        let limiter = Limiter::builder().name(name).capacity(1).build();
        Arc::new(limiter.unwrap())
    };
    let sidejob = named("sidejob");
    metrics::with_local_recorder(&recorder, || {
        let ra = Reporter::builder().build(&a).unwrap();
        let rb = Reporter::builder().build(&b).unwrap();
        assert_eq!((ra.name(), rb.name()), ("sidejob", "sidejob-2"));
        let err = Reporter::builder().build(&sidejob).unwrap_err();
        assert_eq!(err.field(), "name");
        assert!(err.to_string().contains("\"sidejob\""), "{err}");
        // Once the unnamed one is gone, the name is the named one's.
        drop((ra, a));
        assert_eq!(
            Reporter::builder().build(&sidejob).unwrap().name(),
            "sidejob"
        );
    });
}

/// Two live front-ends given one name: the second reporter is refused,
/// naming the field, rather than merged into the first one's series.
#[test]
fn a_name_two_live_front_ends_share_is_refused() {
    let (recorder, _page) = prometheus();
    let a = echo_pool("orders", 4);
    let b = echo_pool("orders", 6);
    metrics::with_local_recorder(&recorder, || {
        let first = Reporter::builder().build(&a).unwrap();
        let err = Reporter::builder().build(&b).unwrap_err();
        assert_eq!(err.field(), "name");
        assert!(err.to_string().contains("\"orders\""), "{err}");
        // Another reporter for the same live front-end would count it
        // twice: refused too.
        assert_eq!(Reporter::builder().build(&a).unwrap_err(), err);
        // Under a name of its own, or of another kind, it is free.
        let limiter = Arc::new(
            Limiter::builder()
                .name("orders")
                .capacity(1)
                .build()
                .unwrap(),
        );
        assert!(Reporter::builder().build(&limiter).is_ok());
        assert!(Reporter::builder().name("orders-b").build(&b).is_ok());
        // An empty name would be no label at all.
        let err = Reporter::builder().name("").build(&b).unwrap_err();
        assert_eq!(err.to_string(), "invalid `name`: must not be empty");
        drop(first);
        // The first front-end is alive but unreported: its name is still
        // its own.
        assert_eq!(Reporter::builder().build(&b).unwrap_err().field(), "name");
    });
}

/// Issue 27: a front-end rebuilt under its name read the old total until
/// the new one passed it (the exporter's `fetch_max`), so `rate()` read 0
/// in between. The counters now carry on from where the old one left them.
#[test]
fn a_front_end_rebuilt_under_its_name_carries_its_counters_on() {
    let (recorder, page) = prometheus();
    let labels = [("name", "api"), ("kind", "limiter")];
    let build = || Arc::new(Limiter::builder().name("api").capacity(8).build().unwrap());

    let old = build();
    let mut reporter =
        metrics::with_local_recorder(&recorder, || Reporter::builder().build(&old)).unwrap();
    for _ in 0..100 {
        drop(old.try_acquire().unwrap());
    }
    reporter.tick(Instant::now()).unwrap();
    assert_eq!(
        value(&page.render(), "sidejob_accepted_total", &labels),
        100.0
    );

    // Rebuilt (a new capacity, say) while the old reporter still lives:
    // it finds its front-end gone at its next tick, and the new one's
    // claim takes the series over.
    drop(old);
    let new = build();
    let mut rebuilt =
        metrics::with_local_recorder(&recorder, || Reporter::builder().build(&new)).unwrap();
    for _ in 0..5 {
        drop(new.try_acquire().unwrap());
    }
    assert!(reporter.tick(Instant::now()).is_none());
    rebuilt.tick(Instant::now()).unwrap();
    let p = page.render();
    assert_eq!(value(&p, "sidejob_accepted_total", &labels), 105.0);
    assert_eq!(value(&p, "sidejob_completed_total", &labels), 105.0);
    assert_eq!(series(&p, "sidejob_accepted_total"), 1);
}

/// A reporter stopped and another built for the same front-end: the new
/// one carries on from what the old one exported, instead of adding the
/// front-end's whole total a second time.
#[test]
fn a_new_reporter_for_the_same_front_end_does_not_count_it_twice() {
    let (recorder, page) = prometheus();
    let labels = [("name", "jobs"), ("kind", "supervisor")];
    let sup = Supervisor::builder()
        .name("jobs")
        .capacity(4)
        .build()
        .unwrap();
    let build = || {
        metrics::with_local_recorder(&recorder, || {
            Reporter::builder()
                .interval(Duration::from_secs(3600))
                .build(&sup)
        })
        .unwrap()
    };
    for _ in 0..3 {
        sup.spawn(|| ()).unwrap().join().unwrap();
    }
    let last = build().spawn().unwrap().stop().unwrap();
    assert_eq!(last.accepted, 3);
    for _ in 0..2 {
        sup.spawn(|| ()).unwrap().join().unwrap();
    }
    let last = build().spawn().unwrap().stop().unwrap();
    assert_eq!(last.accepted, 5);
    assert_eq!(
        value(&page.render(), "sidejob_accepted_total", &labels),
        5.0
    );
}

/// One reporter, one thread, four front-ends of four kinds, each under its
/// own name and with its own alarm.
#[test]
fn one_reporter_serves_many_front_ends() {
    let (recorder, page) = prometheus();
    let limiter = Arc::new(Limiter::builder().name("api").capacity(2).build().unwrap());
    let pool = echo_pool("db", 4);
    let sup = Supervisor::builder()
        .name("jobs")
        .capacity(4)
        .build()
        .unwrap();
    let shepherd = flaky_shepherd("mail");
    let busy = Alarm::builder()
        .name("api_busy")
        .threshold(0)
        .raise_after(Duration::ZERO)
        .build()
        .unwrap();
    let handle = metrics::with_local_recorder(&recorder, || {
        let one = |r: Result<Reporter, sidejob::ConfigError>| r.unwrap();
        one(Reporter::builder()
            .interval(Duration::from_secs(3600))
            .alarm(busy.clone())
            .build(&limiter))
        .merge(one(Reporter::builder().build(&pool)))
        .merge(one(Reporter::builder().build(&sup)))
        .merge(one(Reporter::builder().build(&shepherd)))
    })
    .spawn()
    .unwrap();

    let _held = limiter.try_acquire().unwrap();
    assert_eq!(pool.call(7).unwrap(), 7);
    sup.spawn(|| ()).unwrap().join().unwrap();
    assert_eq!(shepherd.submit(1).unwrap().wait(), Ok(1));
    let last = handle.stop().expect("the limiter is alive");
    // `stop` answers for the front-end the reporter was built for.
    assert_eq!((last.capacity, last.usage), (2, 1));
    assert!(busy.is_raised());

    let p = page.render();
    for (name, kind) in [
        ("api", "limiter"),
        ("db", "pool"),
        ("jobs", "supervisor"),
        ("mail", "shepherd"),
    ] {
        assert_eq!(
            value(
                &p,
                "sidejob_accepted_total",
                &[("name", name), ("kind", kind)]
            ),
            1.0,
            "{name}"
        );
    }
    assert_eq!(
        value(&p, "sidejob_shepherd_processed_total", &[("name", "mail")]),
        1.0
    );
    assert_eq!(
        value(
            &p,
            "sidejob_alarm",
            &[("name", "api"), ("alarm", "api_busy")]
        ),
        1.0
    );
}

/// Renders a page with every series the crate exports (every kind, a
/// waiting room, an alarm, a shepherd's own, the tower layer's histogram)
/// and runs `promtool check metrics` on it: no lint may fire.
///
/// Without `promtool` this test says so and passes, unless `CI` is set:
/// `.ci/run` installs it (Debian's `prometheus` package) and sets `CI`.
#[test]
fn the_exporters_page_passes_promtool() {
    let (recorder, page) = prometheus();
    let limiter = Arc::new(
        Limiter::builder()
            .name("api")
            .capacity(1)
            .max_waiters(1)
            .build()
            .unwrap(),
    );
    let pool = echo_pool("db", 4);
    let sup = Supervisor::builder()
        .name("jobs")
        .capacity(4)
        .build()
        .unwrap();
    let shepherd = flaky_shepherd("mail");
    let queueing = Alarm::builder()
        .watch(Watched::Waiting)
        .threshold(0)
        .raise_after(Duration::ZERO)
        .build()
        .unwrap();
    let mut reporter = metrics::with_local_recorder(&recorder, || {
        Reporter::builder()
            .alarm(queueing)
            .build(&limiter)
            .unwrap()
            .merge(Reporter::builder().build(&pool).unwrap())
            .merge(Reporter::builder().build(&sup).unwrap())
            .merge(Reporter::builder().build(&shepherd).unwrap())
    });
    #[cfg(feature = "tower")]
    let hold_seconds = {
        use tower::{Layer, Service, ServiceExt};
        let layer = metrics::with_local_recorder(&recorder, || {
            sidejob::tower::LimitLayer::new(Arc::clone(&limiter)).record_time()
        });
        let mut service = layer.layer(tower::service_fn(|n: u32| async move {
            Ok::<_, std::convert::Infallible>(n)
        }));
        let runtime = common::current_thread();
        runtime.block_on(async {
            let ready = service.ready().await.unwrap();
            assert_eq!(ready.call(7).await.unwrap(), 7);
        });
        "sidejob_hold_seconds"
    };
    assert_eq!(pool.call(1).unwrap(), 1);
    sup.spawn(|| ()).unwrap().join().unwrap();
    assert_eq!(shepherd.submit(2).unwrap().wait(), Ok(2));
    let _held = limiter.try_acquire().unwrap();
    let mut waiter = Box::pin(limiter.acquire_async());
    assert!(common::poll_once(&mut waiter).is_pending());
    let probe = Ask::new().class(Class::CriticalPlus).fail_fast();
    assert_eq!(limiter.acquire_with(probe).unwrap_err(), Error::Overload);
    reporter.tick(Instant::now()).unwrap();

    let p = page.render();
    // Every name the crate exports is on the page, under its type.
    let mut expected = vec![
        ("sidejob_capacity", "gauge"),
        ("sidejob_in_flight", "gauge"),
        ("sidejob_accepted_total", "counter"),
        ("sidejob_rejected_total", "counter"),
        ("sidejob_completed_total", "counter"),
        ("sidejob_panicked_total", "counter"),
        ("sidejob_waiting", "gauge"),
        ("sidejob_waited_total", "counter"),
        ("sidejob_timed_out_total", "counter"),
        ("sidejob_waited_seconds", "gauge"),
        ("sidejob_alarm", "gauge"),
        ("sidejob_shepherd_due", "gauge"),
        ("sidejob_shepherd_delayed", "gauge"),
        ("sidejob_shepherd_running", "gauge"),
        ("sidejob_shepherd_busy_workers", "gauge"),
        ("sidejob_shepherd_idle_workers", "gauge"),
        ("sidejob_shepherd_attempts_total", "counter"),
        ("sidejob_shepherd_retries_total", "counter"),
        ("sidejob_shepherd_failures_total", "counter"),
        ("sidejob_shepherd_processed_total", "counter"),
        ("sidejob_shepherd_processing_seconds", "gauge"),
        ("sidejob_class_accepted_total", "counter"),
        ("sidejob_class_rejected_total", "counter"),
        ("sidejob_class_timed_out_total", "counter"),
        ("sidejob_class_waiting", "gauge"),
    ];
    #[cfg(feature = "tower")]
    expected.push((hold_seconds, "summary"));
    for (name, kind) in expected {
        assert!(
            p.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} {kind}:\n{p}"
        );
    }
    assert_eq!(value(&p, "sidejob_waiting", &[("name", "api")]), 1.0);
    // Four classes for each of the four front-ends; the refused
    // CriticalPlus request and the waiter on the limiter's.
    for name in [
        "sidejob_class_accepted_total",
        "sidejob_class_rejected_total",
        "sidejob_class_timed_out_total",
        "sidejob_class_waiting",
    ] {
        assert_eq!(series(&p, name), 16, "{name}:\n{p}");
    }
    let api = |class: &'static str| [("name", "api"), ("class", class)];
    assert_eq!(
        value(&p, "sidejob_class_rejected_total", &api("critical_plus")),
        1.0
    );
    assert_eq!(value(&p, "sidejob_class_waiting", &api("critical")), 1.0);

    let Some(lint) = promtool_check_metrics(&p) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but `promtool` is missing: .ci/run installs it (Debian's `prometheus`)"
        );
        eprintln!(
            "SKIPPED: `promtool` is not installed, so the page was not linted \
             (apt-get install prometheus; CI installs it)"
        );
        return;
    };
    let (ok, output) = lint;
    assert!(ok, "promtool check metrics:\n{output}\non the page:\n{p}");
    assert!(output.trim().is_empty(), "promtool has lints:\n{output}");
}

/// A front-end with a min share exports its sheddable classes' units held
/// (`sidejob_class_held`), equal to `ClassStats::held`; one without
/// exports none (it counts nothing); and the page passes `promtool`.
#[test]
fn a_min_share_exports_the_units_each_sheddable_class_holds() {
    let (recorder, page) = prometheus();
    let counted = Arc::new(
        Limiter::builder()
            .name("shared")
            .capacity(10)
            .min_share(Class::Sheddable, 0.2)
            .build()
            .unwrap(),
    );
    let plain = Arc::new(
        Limiter::builder()
            .name("plain")
            .capacity(10)
            .build()
            .unwrap(),
    );
    let mut reporter = metrics::with_local_recorder(&recorder, || {
        let one = |r: Result<Reporter, sidejob::ConfigError>| r.unwrap();
        one(Reporter::builder().build(&counted)).merge(one(Reporter::builder().build(&plain)))
    });
    let export = Ask::new().class(Class::Sheddable).fail_fast();
    let held = counted.acquire_with(export.units(3)).unwrap();
    let _other = plain.acquire_with(export.units(3)).unwrap();
    reporter.tick(Instant::now()).unwrap();
    let p = page.render();
    assert!(p.contains("# TYPE sidejob_class_held gauge\n"), "{p}");
    assert_eq!(series(&p, "sidejob_class_held"), 2, "{p}");
    let of = |class: &'static str| [("name", "shared"), ("class", class)];
    assert_eq!(value(&p, "sidejob_class_held", &of("sheddable")), 3.0);
    assert_eq!(value(&p, "sidejob_class_held", &of("sheddable_plus")), 0.0);
    drop(held);
    reporter.tick(Instant::now()).unwrap();
    let p = page.render();
    assert_eq!(value(&p, "sidejob_class_held", &of("sheddable")), 0.0);
    if let Some((ok, output)) = promtool_check_metrics(&p) {
        assert!(
            ok && output.trim().is_empty(),
            "promtool:\n{output}\non\n{p}"
        );
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but `promtool` is missing"
        );
    }
}

/// Runs `promtool check metrics` on `page`: whether it passed and what it
/// said; `None` when there is no `promtool` to run.
fn promtool_check_metrics(page: &str) -> Option<(bool, String)> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(page.as_bytes())
        .expect("promtool reads its stdin");
    let out = child.wait_with_output().expect("promtool runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), said))
}
