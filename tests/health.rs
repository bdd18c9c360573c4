//! Health alarms, driven through a reporter's ticks with made-up instants:
//! no sleeps, no real clock.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Context;
use std::time::{Duration, Instant};

use sidejob::observe::{Alarm, AlarmEvent, AlarmState, Reporter, Watched};
use sidejob::Limiter;

mod common;
use common::noop_waker;

/// An alarm on usage above 2 held for 30 s, cleared after 5 s back down,
/// recording its events; and a reporter on a limiter of 4 feeding it.
fn watched() -> (Arc<Limiter>, Reporter, Alarm, Arc<Mutex<Vec<AlarmEvent>>>) {
    let limiter = Arc::new(Limiter::new(4).unwrap());
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&events);
    let alarm = Alarm::builder()
        .name("above_two")
        .threshold(2)
        .raise_after(Duration::from_secs(30))
        .clear_after(Duration::from_secs(5))
        .on_change(move |event| seen.lock().unwrap().push(event.clone()))
        .build()
        .unwrap();
    let reporter = Reporter::builder()
        .alarm(alarm.clone())
        .build(&limiter)
        .unwrap();
    (limiter, reporter, alarm, events)
}

#[test]
fn fires_after_the_duration_above_and_clears_after_the_duration_below() {
    let (limiter, mut reporter, alarm, events) = watched();
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);

    // At the threshold (2): not above, nothing starts.
    let two: Vec<_> = (0..2).map(|_| limiter.try_acquire().unwrap()).collect();
    reporter.tick(at(0));
    reporter.tick(at(100));
    assert_eq!(alarm.state(), AlarmState::Clear);

    // Above from t=100; still clear at t=129, raised at t=130.
    let third = limiter.try_acquire().unwrap();
    reporter.tick(at(100));
    reporter.tick(at(129));
    assert_eq!(alarm.state(), AlarmState::Clear);
    assert!(events.lock().unwrap().is_empty());
    reporter.tick(at(130));
    assert_eq!(alarm.state(), AlarmState::Raised);
    {
        let events = events.lock().unwrap();
        assert_eq!(events.len(), 1);
        let raised = &events[0];
        assert_eq!(raised.state, AlarmState::Raised);
        assert_eq!((raised.value, raised.threshold), (3, 2));
        assert_eq!((raised.since, raised.at), (at(100), at(130)));
    }

    // Back down at t=140; a blip above at t=142 restarts the clear clock.
    drop(third);
    reporter.tick(at(140));
    let blip = limiter.try_acquire().unwrap();
    reporter.tick(at(142));
    drop(blip);
    reporter.tick(at(143));
    reporter.tick(at(147));
    assert_eq!(
        alarm.state(),
        AlarmState::Raised,
        "only 4 s down since the blip"
    );
    reporter.tick(at(148));
    assert_eq!(alarm.state(), AlarmState::Clear);
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].state, AlarmState::Clear);
    assert_eq!(
        (events[1].since, events[1].at, events[1].value),
        (at(143), at(148), 2)
    );
    drop(two);
}

#[test]
fn a_dip_restarts_the_raise_clock() {
    let (limiter, mut reporter, alarm, events) = watched();
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let three: Vec<_> = (0..3).map(|_| limiter.try_acquire().unwrap()).collect();
    reporter.tick(at(0));
    reporter.tick(at(29));
    let mut three = three.into_iter();
    drop(three.next()); // down to 2 at t=29.5
    reporter.tick(at(29) + Duration::from_millis(500));
    let back = limiter.try_acquire().unwrap();
    reporter.tick(at(30));
    reporter.tick(at(59));
    assert_eq!(alarm.state(), AlarmState::Clear, "29 s above since the dip");
    reporter.tick(at(60));
    assert_eq!(alarm.state(), AlarmState::Raised);
    assert_eq!(events.lock().unwrap()[0].since, at(30));
    drop(back);
}

#[test]
fn alarms_raise_at_once_with_a_zero_duration_and_report_once() {
    let alarm = Alarm::builder()
        .threshold(0)
        .raise_after(Duration::ZERO)
        .build()
        .unwrap();
    let now = Instant::now();
    assert_eq!(alarm.observe(0, now), None);
    let raised = alarm.observe(1, now).unwrap();
    assert_eq!(raised.state, AlarmState::Raised);
    assert_eq!(alarm.observe(5, now), None, "a change is reported once");
    assert_eq!(alarm.observe(0, now).unwrap().state, AlarmState::Clear);
}

#[test]
fn builders_name_the_bad_field() {
    let err = Alarm::builder()
        .raise_after(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "threshold");
    assert_eq!(err.to_string(), "invalid `threshold`: must be set");
    let err = Alarm::builder().threshold(1).build().unwrap_err();
    assert_eq!(err.field(), "raise_after");
    let err = Alarm::builder()
        .threshold(1)
        .raise_after(Duration::ZERO)
        .name("a\0b")
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "name");
    let limiter = Arc::new(Limiter::new(1).unwrap());
    let err = Reporter::builder()
        .interval(Duration::ZERO)
        .build(&limiter)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid `interval`: must be longer than zero"
    );
}

/// An interval past the end of time means no ticks on a timer: a spawned
/// reporter reads its front-end when spawned and when stopped. Its thread
/// used to panic adding the interval to `Instant::now()`, and `stop` lost
/// the last report.
#[test]
fn an_interval_past_the_end_of_time_reports_at_stop_only() {
    let limiter = Arc::new(Limiter::new(4).unwrap());
    let handle = Reporter::builder()
        .interval(Duration::MAX)
        .build(&limiter)
        .unwrap()
        .spawn()
        .unwrap();
    let permit = limiter.try_acquire().unwrap();
    // `stop` sets the flag under the lock the thread reads it under, and
    // the thread ticks after reading it: the permit is seen.
    let last = handle.stop().expect("the reporter's last report");
    assert_eq!((last.usage, last.accepted), (1, 1));
    drop(permit);
}

#[test]
fn a_waiting_alarm_watches_the_queue_not_the_usage() {
    // Capacity 1, room for 4: usage sits at 1 whenever anyone waits, so
    // only the queue tells a standing overload from a busy moment.
    let limiter = Arc::new(
        Limiter::builder()
            .capacity(1)
            .max_waiters(4)
            .max_wait(Duration::from_secs(3600))
            .build()
            .unwrap(),
    );
    let alarm = Alarm::builder()
        .watch(Watched::Waiting)
        .threshold(1)
        .raise_after(Duration::from_secs(10))
        .build()
        .unwrap();
    assert_eq!(
        (alarm.name(), alarm.watched()),
        ("waiting", Watched::Waiting)
    );
    let mut reporter = Reporter::builder()
        .alarm(alarm.clone())
        .build(&limiter)
        .unwrap();
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);

    // Waiters are futures polled once by hand: queued, never woken here.
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let held = limiter.try_acquire().unwrap();
    let mut queue: Vec<_> = (0..2).map(|_| Box::pin(limiter.acquire_async())).collect();
    for waiter in &mut queue {
        assert!(waiter.as_mut().poll(&mut cx).is_pending());
    }
    assert_eq!(limiter.waiting(), 2);
    reporter.tick(at(0));
    reporter.tick(at(9));
    assert_eq!(alarm.state(), AlarmState::Clear, "9 s above");
    reporter.tick(at(10));
    assert_eq!(alarm.state(), AlarmState::Raised, "10 s above");

    // One waiter gives up (its future dropped): 1 waiting, at the threshold.
    queue.pop();
    assert_eq!(limiter.waiting(), 1);
    reporter.tick(at(11));
    assert_eq!(alarm.state(), AlarmState::Clear);
    assert_eq!(limiter.usage(), 1, "usage never moved");

    // A usage alarm at the same threshold would never have fired: usage
    // is 1 throughout, not above 1.
    drop(queue);
    drop(held);
    assert_eq!((limiter.usage(), limiter.waiting()), (0, 0));
}
