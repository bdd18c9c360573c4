//! Start-up on a fresh Redis (issue 38, item 3). A pool created on a Redis
//! up for less than worker TTL + grace learns for ttl + grace from Redis'
//! start: no job starts before every lease a lost pool could have granted
//! has lapsed.
//!
//! * Redis' `uptime_in_seconds` is whole seconds (it reads 1 a few ms
//!   after start when a second boundary passes), so learning has to take
//!   the reading as the worst case: it never ends before ttl + grace after
//!   the true start. Before, it could end a second early.
//! * Waiting jobs start the moment learning ends, not at the keeper's next
//!   heartbeat (up to a fifth of the TTL later).
//! * A node says how long learning lasts, and a deployment that knows its
//!   Redis is new can opt out.

#[path = "../../sidejob-redis/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sidejob_pulse::{Handler, Job, Node, NodeBuilder, StopReason, Token};

struct Started(Sender<(String, Instant)>);

impl Handler for Started {
    fn start(&mut self, job: Job) {
        let _ = self.0.send((job.key, Instant::now()));
    }
    fn stop(&mut self, _: &str, _: Token, _: StopReason) {}
}

fn builder(url: &str, pool: &str, ttl: Duration) -> NodeBuilder {
    let mut b = Node::builder();
    b.name(pool)
        .url(url)
        .worker_ttl(ttl)
        .worker_shutdown_ttl(Duration::from_secs(10));
    b
}

/// The next start, within a bound.
fn started(rx: &Receiver<(String, Instant)>) -> (String, Instant) {
    rx.recv_timeout(Duration::from_secs(20))
        .expect("a start within 20 s")
}

fn uptime(c: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("server").query(c).expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
        .and_then(|s| s.trim().parse().ok())
        .expect("uptime_in_seconds")
}

/// A Redis started at `t0` (an instant before the process was spawned)
/// that already reads an uptime of 1 s less than 0.5 s later: the case
/// where whole seconds overstate the uptime. Tries a few servers, each
/// spawned just before a second boundary of the wall clock.
fn redis_reading_one_second_early() -> Option<(redis_support::Server, Instant)> {
    for _ in 0..8 {
        // Polling the wall clock (not a synchronisation): spawn at .75 s.
        while !(750..850).contains(
            &SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .expect("clock")
                .subsec_millis(),
        ) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let t0 = Instant::now();
        let redis = redis_support::start(false)?;
        let mut c = redis.conn();
        while uptime(&mut c) == 0 && t0.elapsed() < Duration::from_millis(500) {
            std::thread::sleep(Duration::from_millis(2));
        }
        if uptime(&mut c) == 1 && t0.elapsed() < Duration::from_millis(500) {
            return Some((redis, t0));
        }
    }
    panic!("no Redis read an uptime of 1 s within 0.5 s of its start in 8 tries")
}

#[test]
fn learning_never_ends_before_ttl_and_grace_after_redis_started() {
    let Some((redis, t0)) = redis_reading_one_second_early() else {
        return;
    };
    let ttl = Duration::from_millis(1000);
    let learning = ttl + ttl / 10;
    let node = builder(&redis.url(), "early", ttl).join().unwrap();
    let (tx, rx) = channel();
    let _w = node.add_worker(10, Started(tx)).unwrap();
    node.dispatch("k", b"").unwrap();
    let (key, at) = started(&rx);
    assert_eq!(key, "k");
    // Redis started after t0, so a start before t0 + ttl + grace is a
    // start inside learning mode. (Before: learning took the uptime of
    // 1 s at face value and ended about 0.3 s after t0 + 0.2 s; the job
    // started well before t0 + 1.1 s.)
    assert!(
        at >= t0 + learning,
        "started {:?} after Redis was spawned, inside learning mode ({learning:?})",
        at - t0
    );
    node.shutdown().unwrap();
}

#[test]
fn waiting_jobs_start_the_moment_learning_ends() {
    let Some(redis) = redis_support::start(false) else {
        return;
    };
    // A 5 s TTL: heartbeats every second, learning 5.5 s from the join on
    // a Redis this fresh, so learning ends half a period away from any
    // heartbeat.
    let ttl = Duration::from_secs(5);
    let node = builder(&redis.url(), "moment", ttl).join().unwrap();
    let (tx, rx) = channel();
    let w = node.add_worker(10, Started(tx)).unwrap();
    let t_dispatch = Instant::now();
    node.dispatch("k", b"").unwrap();
    let (key, at) = started(&rx);
    assert_eq!(key, "k");
    let mut c = redis.conn();
    let expiry: u64 = redis::cmd("ZSCORE")
        .arg("{sjp:moment}:members")
        .arg(w.id())
        .query(&mut c)
        .unwrap();
    let learn_until: u64 = redis::cmd("HGET")
        .arg("{sjp:moment}:meta")
        .arg("learn")
        .query(&mut c)
        .unwrap();
    let last_heartbeat = expiry - ttl.as_millis() as u64;
    eprintln!(
        "dispatch -> start on a fresh Redis: {:?} (TTL {ttl:?}); last heartbeat {} ms before learning ended",
        at - t_dispatch,
        learn_until as i64 - last_heartbeat as i64
    );
    // The job was placed before any heartbeat after learning ended: by the
    // keeper woken for the end of learning, not by its next heartbeat
    // (which, before, was the first chance: it renewed the lease at or
    // after the end, then placed).
    assert!(
        last_heartbeat < learn_until,
        "placed only by a heartbeat {} ms after learning ended",
        last_heartbeat - learn_until
    );
    node.shutdown().unwrap();
}

#[test]
fn a_node_says_how_long_learning_lasts_and_a_fresh_redis_can_skip_it() {
    let Some(redis) = redis_support::start(false) else {
        return;
    };
    let ttl = Duration::from_secs(5);
    let learning = ttl + ttl / 10;
    // Learning, as the node reports it: ttl + grace from a Redis this
    // young (up to a second more, the uptime's whole seconds).
    let learner = builder(&redis.url(), "learns", ttl).join().unwrap();
    let left = learner.learning_remaining().unwrap();
    assert!(
        left > Duration::from_secs(1) && left <= learning + Duration::from_secs(1),
        "{left:?}"
    );
    // A deployment that knows its Redis is new: no learning, and a job
    // dispatched now starts long before the learning above would end.
    let fresh = builder(&redis.url(), "fresh", ttl)
        .assume_fresh_redis(true)
        .join()
        .unwrap();
    assert_eq!(fresh.learning_remaining().unwrap(), Duration::ZERO);
    let (tx, rx) = channel();
    let _w = fresh.add_worker(10, Started(tx)).unwrap();
    let t_dispatch = Instant::now();
    fresh.dispatch("k", b"").unwrap();
    let (key, at) = started(&rx);
    assert_eq!(key, "k");
    eprintln!(
        "dispatch -> start on a fresh Redis with assume_fresh_redis: {:?}",
        at - t_dispatch
    );
    // An order, not a speed: the pool that learns still learns.
    assert!(learner.learning_remaining().unwrap() > Duration::ZERO);
    // The flag is the joiner's word for a pool it creates: a pool already
    // there keeps its learning.
    let late = builder(&redis.url(), "learns", ttl)
        .assume_fresh_redis(true)
        .join()
        .unwrap();
    assert!(late.learning_remaining().unwrap() > Duration::ZERO);
    fresh.shutdown().unwrap();
    learner.shutdown().unwrap();
}
