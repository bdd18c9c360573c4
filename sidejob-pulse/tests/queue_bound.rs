//! The queue bound is exact on every path into the pending set (issue 38,
//! item 4): a key dispatched again while its job is still stopping counts
//! as queued from the moment the dispatch is acknowledged, so a dispatch
//! past `max_queued_jobs` is refused whichever path it takes. It used to
//! be acknowledged without entering the pending set, and `done.lua` put it
//! there later without looking at the bound.

#[path = "../../sidejob-redis/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sidejob_pulse::{Error, Handler, Job, Node, StopReason, Token};

#[derive(Debug, PartialEq)]
enum Ev {
    Start(String, Token),
    Stopping(String),
    Stopped(String, Token, StopReason),
}

/// A handler whose `stop` holds its worker's thread until the test opens
/// the gate (one message per stop): the job stays "stopping" in Redis as
/// long as the test wants, and nothing assigned to the worker is claimed
/// meanwhile.
struct GatedStop {
    events: Sender<Ev>,
    gate: Arc<Mutex<Receiver<()>>>,
}

impl Handler for GatedStop {
    fn start(&mut self, job: Job) {
        let _ = self.events.send(Ev::Start(job.key, job.token));
    }
    fn stop(&mut self, key: &str, token: Token, why: StopReason) {
        let _ = self.events.send(Ev::Stopping(key.into()));
        // Bounded, so that a failing test cannot hang the worker forever.
        let _ = self
            .gate
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(30));
        let _ = self.events.send(Ev::Stopped(key.into(), token, why));
    }
}

fn next(rx: &Receiver<Ev>) -> Ev {
    rx.recv_timeout(Duration::from_secs(15))
        .expect("an event within 15 s")
}

/// Polls Redis (with a deadline) until the job `key` is recorded as
/// stopping.
fn wait_stopping(redis: &redis_support::Server, pool: &str, key: &str) {
    let mut c = redis.conn();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let st: Option<String> = redis::cmd("HGET")
            .arg(format!("{{sjp:{pool}}}:st"))
            .arg(key)
            .query(&mut c)
            .unwrap();
        if st.as_deref() == Some("S") {
            return;
        }
        assert!(Instant::now() < deadline, "{key} never stopping: {st:?}");
        std::thread::sleep(Duration::from_millis(20)); // polling Redis
    }
}

fn node(url: &str, pool: &str, max: usize) -> Node {
    Node::builder()
        .name(pool)
        .url(url)
        .worker_ttl(Duration::from_millis(2000))
        .max_queued_jobs(max)
        .worker_shutdown_ttl(Duration::from_secs(10))
        .join()
        .expect("join")
}

#[test]
fn a_re_dispatch_of_a_stopping_key_counts_against_the_bound() {
    let Some(redis) = redis_support::start(false) else {
        return;
    };
    let url = redis.url();
    let (tx, rx) = channel();
    let (open, gate) = channel();
    let host = node(&url, "bound", 1);
    let _w = host
        .add_worker(
            10,
            GatedStop {
                events: tx,
                gate: Arc::new(Mutex::new(gate)),
            },
        )
        .unwrap();

    // 1. The bound full with a pending job: a re-dispatch of the stopping
    //    key is refused (this order held before too).
    host.dispatch("a", b"1").unwrap();
    let Ev::Start(k, t_a1) = next(&rx) else {
        panic!("a start first")
    };
    assert_eq!(k, "a");
    host.stop("a").unwrap();
    assert_eq!(next(&rx), Ev::Stopping("a".into()));
    wait_stopping(&redis, "bound", "a");
    // The worker's thread is held in `stop`: "b" is assigned, not claimed.
    host.dispatch("b", b"").unwrap();
    assert_eq!(
        host.dispatch("a", b"2"),
        Err(Error::Full { max_queued_jobs: 1 }),
        "a re-dispatch of a stopping key past the bound is refused"
    );

    // 2. The other order, the side door: once "b" is stopped (dropped,
    //    never started), the re-dispatch of "a" is acknowledged and fills
    //    the bound, and a new key is refused (it used to be accepted).
    host.stop("b").unwrap();
    host.dispatch("a", b"2").unwrap();
    assert_eq!(
        host.dispatch("c", b""),
        Err(Error::Full { max_queued_jobs: 1 }),
        "the stopping key's second run is queued"
    );

    // 3. The second run stopped before it started: no longer queued, so
    //    "c" fits, and fills the bound again.
    host.stop("a").unwrap();
    host.dispatch("c", b"").unwrap();
    assert_eq!(
        host.dispatch("a", b"3"),
        Err(Error::Full { max_queued_jobs: 1 })
    );
    host.stop("c").unwrap();
    host.dispatch("a", b"3").unwrap();

    // The stop completes: "a" runs again, once, with a larger token, and
    // then nothing is queued any more.
    open.send(()).unwrap();
    assert_eq!(
        next(&rx),
        Ev::Stopped("a".into(), t_a1, StopReason::Requested)
    );
    let Ev::Start(k, t_a2) = next(&rx) else {
        panic!("a's second start")
    };
    assert_eq!(k, "a");
    assert!(t_a2 > t_a1);
    host.dispatch("d", b"").unwrap();
    let Ev::Start(k, _) = next(&rx) else {
        panic!("d's start")
    };
    assert_eq!(k, "d", "nothing else started");
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "no other event"
    );
    let mut c = redis.conn();
    let again: usize = redis::cmd("SCARD")
        .arg("{sjp:bound}:again")
        .query(&mut c)
        .unwrap();
    assert_eq!(again, 0);
    drop(open); // every later stop returns at once
    host.shutdown().unwrap();
}
