//! Builders configured from environment variables (issue 27, part 4): the
//! HTTP worker's `WORKER_*` settings with their `WORKER_DEFAULT_*`
//! fallbacks, `null` as unlimited, "missing means skip", and errors that
//! name the variable and its value.
//!
//! The process environment is shared by every test of this file, so each
//! test sets variables under a prefix of its own and never touches
//! another's.

use sidejob::env::{Env, Setting};
use sidejob::{Error, LimiterBuilder, PoolBuilder, SupervisorBuilder, Worker};

mod common;
use common::poll_once;

fn set(vars: &[(&str, &str)]) {
    for (name, value) in vars {
        std::env::set_var(name, value);
    }
}

/// The worker of the seed, under a prefix of the test's own: the tenant's
/// variables first, the worker's defaults second, under the worker's names.
fn worker_env(prefix: &str) -> Env {
    Env::new(format!("{prefix}_WORKER_"))
        .fallback(format!("{prefix}_WORKER_DEFAULT_"))
        .rename(Setting::Capacity, "REQUEST_CONCURRENCY")
        .rename(Setting::MaxWaiters, "MAX_QUEUE_LENGTH")
        .rename(Setting::SingleThread, "USE_SINGLE_THREAD")
}

#[test]
fn missing_everywhere_means_skip() {
    let env = worker_env("T1");
    // Other settings alone do not make a limit.
    set(&[("T1_WORKER_DEFAULT_MAX_QUEUE_LENGTH", "20")]);
    assert!(LimiterBuilder::from_env(&env).unwrap().is_none());
    assert!(PoolBuilder::from_env(&env).unwrap().is_none());
    assert!(SupervisorBuilder::from_env(&env).unwrap().is_none());
    // A blank value is no value.
    set(&[("T1_WORKER_REQUEST_CONCURRENCY", "  ")]);
    assert!(LimiterBuilder::from_env(&env).unwrap().is_none());
}

#[test]
fn the_tenants_value_wins_and_the_default_fills_in() {
    let env = worker_env("T2");
    set(&[
        ("T2_WORKER_DEFAULT_REQUEST_CONCURRENCY", "10"),
        ("T2_WORKER_DEFAULT_MAX_QUEUE_LENGTH", "20"),
    ]);
    let limiter = LimiterBuilder::from_env(&env)
        .unwrap()
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(limiter.capacity(), 10);

    // The tenant's own concurrency and queue: one at once, one waiting.
    set(&[
        ("T2_WORKER_REQUEST_CONCURRENCY", "1"),
        ("T2_WORKER_MAX_QUEUE_LENGTH", "1"),
        ("T2_WORKER_NAME", "tenant"),
    ]);
    let limiter = LimiterBuilder::from_env(&env)
        .unwrap()
        .unwrap()
        .build()
        .unwrap();
    assert_eq!((limiter.capacity(), limiter.name()), (1, "tenant"));
    let _held = limiter.try_acquire().unwrap();
    let mut first = Box::pin(limiter.acquire_async());
    assert!(poll_once(&mut first).is_pending(), "the one waiting place");
    let mut second = Box::pin(limiter.acquire_async());
    assert!(matches!(
        poll_once(&mut second),
        std::task::Poll::Ready(Err(Error::Overload))
    ));
}

#[test]
fn null_is_unlimited_and_overrides_the_default() {
    let env = worker_env("T3");
    set(&[
        ("T3_WORKER_DEFAULT_REQUEST_CONCURRENCY", "10"),
        ("T3_WORKER_REQUEST_CONCURRENCY", "null"),
        ("T3_WORKER_MAX_WAIT", "NULL"),
    ]);
    let limiter = LimiterBuilder::from_env(&env)
        .unwrap()
        .unwrap()
        .build()
        .unwrap();
    assert_eq!(limiter.capacity(), LimiterBuilder::MAX_CAPACITY);
    // Never full: a thousand at once.
    let held: Vec<_> = (0..1000).map(|_| limiter.try_acquire().unwrap()).collect();
    assert_eq!(limiter.usage(), 1000);
    drop(held);

    // A supervisor has no unlimited: it would allocate every slot.
    let err = SupervisorBuilder::from_env(&env).unwrap_err();
    assert_eq!(
        (err.field(), err.variable(), err.value()),
        (
            "capacity",
            Some("T3_WORKER_REQUEST_CONCURRENCY"),
            Some("null")
        )
    );
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
fn a_single_threaded_pool_from_the_environment() {
    let env = worker_env("T4");
    set(&[
        ("T4_WORKER_DEFAULT_REQUEST_CONCURRENCY", "null"),
        ("T4_WORKER_DEFAULT_WORKERS", "4"),
        ("T4_WORKER_USE_SINGLE_THREAD", "true"),
    ]);
    let pool = PoolBuilder::from_env(&env)
        .unwrap()
        .unwrap()
        .build(|_| Echo)
        .unwrap();
    // One thread, whatever WORKERS says; unlimited: every cast is taken.
    assert_eq!(pool.workers(), 1);
    assert_eq!(pool.capacity(), LimiterBuilder::MAX_CAPACITY);
    for n in 0..100 {
        pool.cast(()).unwrap();
        assert_eq!(pool.call(n).unwrap(), n);
    }

    set(&[("T4_WORKER_USE_SINGLE_THREAD", "false")]);
    let pool = PoolBuilder::from_env(&env)
        .unwrap()
        .unwrap()
        .build(|_| Echo)
        .unwrap();
    assert_eq!(pool.workers(), 4);
}

#[test]
fn a_supervisor_from_the_environment() {
    let env = Env::new("T5_JOBS_");
    set(&[
        ("T5_JOBS_CAPACITY", "3"),
        ("T5_JOBS_SHARDS", "1"),
        ("T5_JOBS_MAX_WAITERS", "0"),
        ("T5_JOBS_MAX_WAIT", "250ms"),
        ("T5_JOBS_NAME", "jobs"),
    ]);
    let sup = SupervisorBuilder::from_env(&env)
        .unwrap()
        .unwrap()
        .build()
        .unwrap();
    assert_eq!((sup.capacity(), sup.shards(), sup.name()), (3, 1, "jobs"));
}

/// Every bad value: the error names the builder field, the variable and
/// the value, and says what the value must be.
#[test]
fn a_bad_value_names_its_variable_and_value() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "T6A_",
            "CAPACITY",
            "ten",
            "must be a whole number, or `null` for no limit",
        ),
        (
            "T6B_",
            "CAPACITY",
            "-1",
            "must be a whole number, or `null` for no limit",
        ),
        ("T6C_", "CAPACITY", "0", "must be at least 1"),
        (
            "T6D_",
            "WORKERS",
            "null",
            "cannot be `null` (unlimited): it has no unlimited value",
        ),
        ("T6E_", "WORKERS", "0", "must be at least 1"),
        ("T6F_", "WORKERS", "5000", "must be at most 4096"),
        (
            "T6G_",
            "SINGLE_THREAD",
            "yes",
            "must be `true` or `false` (or `1`, `0`)",
        ),
        (
            "T6H_",
            "MAX_WAIT",
            "250",
            "must be a duration in whole `ms` or `s` (`250ms`, `2s`), or `null` for no limit",
        ),
        ("T6I_", "MAX_WAITERS", "2000000", "must be at most 1048576"),
    ];
    for (prefix, suffix, value, rule) in cases {
        let field = suffix.to_ascii_lowercase();
        let variable = format!("{prefix}{suffix}");
        set(&[(&format!("{prefix}CAPACITY"), "4"), (&variable, value)]);
        let err = PoolBuilder::from_env(&Env::new(*prefix)).unwrap_err();
        assert_eq!(err.field(), field, "{variable}");
        assert_eq!(err.variable(), Some(variable.as_str()));
        assert_eq!(err.value(), Some(*value));
        assert_eq!(
            err.to_string(),
            format!("invalid `{field}` from {variable}={value:?}: {rule}")
        );
    }
}

#[test]
fn a_lookup_other_than_the_process_environment() {
    let tenant = |var: &str| match var {
        "APP_CAPACITY" => Some("8".to_string()),
        "APP_MAX_WAIT" => Some("2s".to_string()),
        _ => None,
    };
    set(&[("T7_DEFAULT_SHARDS", "2"), ("T7_DEFAULT_CAPACITY", "99")]);
    let env = Env::with_lookup("APP_", tenant).fallback("T7_DEFAULT_");
    let limiter = LimiterBuilder::from_env(&env)
        .unwrap()
        .unwrap()
        .build()
        .unwrap();
    assert_eq!((limiter.capacity(), limiter.shards()), (8, 2));
    assert_eq!(
        env.variables(Setting::MaxWait),
        ["APP_MAX_WAIT", "T7_DEFAULT_MAX_WAIT"]
    );
}
