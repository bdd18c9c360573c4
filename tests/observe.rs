//! Reporters and alarms without the metrics feature: a detached reporter
//! keeps reporting, one callback tells its alarms apart by name, and a
//! limiter has a name of its own for its series.

use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use sidejob::observe::{Alarm, AlarmEvent, AlarmState, Reporter};
use sidejob::{Limiter, Supervisor};

mod common;

/// Issue 27: `AlarmEvent` did not say which alarm changed, so a callback
/// shared by several alarms could not tell them apart.
#[test]
fn alarm_events_carry_their_alarms_name() {
    let events: Arc<Mutex<Vec<AlarmEvent>>> = Arc::default();
    let alarm = |name: &str, threshold| {
        let seen = Arc::clone(&events);
        Alarm::builder()
            .name(name)
            .threshold(threshold)
            .raise_after(Duration::ZERO)
            .on_change(move |event| seen.lock().unwrap().push(event.clone()))
            .build()
            .unwrap()
    };
    let (busy, full) = (alarm("busy", 1), alarm("full", 2));
    let limiter = Arc::new(Limiter::builder().capacity(3).build().unwrap());
    let mut reporter = Reporter::builder()
        .alarm(busy)
        .alarm(full)
        .build(&limiter)
        .unwrap();
    let t0 = Instant::now();
    let held: Vec<_> = (0..3).map(|_| limiter.try_acquire().unwrap()).collect();
    reporter.tick(t0);
    drop(held);
    reporter.tick(t0 + Duration::from_secs(1));
    let seen: Vec<_> = events
        .lock()
        .unwrap()
        .iter()
        .map(|event| (event.name.to_string(), event.state))
        .collect();
    assert_eq!(
        seen,
        [
            ("busy".to_string(), AlarmState::Raised),
            ("full".to_string(), AlarmState::Raised),
            ("busy".to_string(), AlarmState::Clear),
            ("full".to_string(), AlarmState::Clear),
        ]
    );
}

/// Issue 27: `spawn()?;` dropped the handle, which stopped the reporter at
/// once. The handle is `#[must_use]` now (the `compile_fail` doctest on
/// `ReporterHandle`), and `detach` leaves the thread running: here it
/// still ticks, and feeds an alarm, after the handle is gone.
#[test]
fn a_detached_reporter_keeps_reporting() {
    let (raised, on_raise) = mpsc::channel();
    let raised = Mutex::new(raised);
    let alarm = Alarm::builder()
        .threshold(0)
        .raise_after(Duration::ZERO)
        .on_change(move |event: &AlarmEvent| {
            if event.state == AlarmState::Raised {
                let _ = raised.lock().unwrap().send(event.value);
            }
        })
        .build()
        .unwrap();
    let sup = Supervisor::new(4).unwrap();
    Reporter::builder()
        .interval(Duration::from_millis(1))
        .alarm(alarm.clone())
        .build(&sup)
        .unwrap()
        .spawn()
        .unwrap()
        .detach();
    // Nothing is in flight at the first tick (at spawn): the alarm can
    // only be raised by a tick of the detached thread.
    assert!(!alarm.is_raised());
    let _reserved = sup.try_reserve().unwrap();
    let value = on_raise
        .recv_timeout(common::FOREVER)
        .expect("the detached reporter ticked");
    assert_eq!(value, 1);
}

#[test]
fn a_limiter_has_a_name_for_its_series() {
    let named = Arc::new(Limiter::builder().name("api").capacity(1).build().unwrap());
    let unnamed = Arc::new(Limiter::new(1).unwrap());
    assert_eq!((named.name(), unnamed.name()), ("api", "sidejob"));
    assert_eq!(Reporter::builder().build(&named).unwrap().name(), "api");
    assert!(format!("{named:?}").contains("\"api\""));
    let err = Limiter::builder()
        .name("a\0b")
        .capacity(1)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "name");
}
