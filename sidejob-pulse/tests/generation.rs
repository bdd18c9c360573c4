//! The pool's generation (issue 38, item 1): acknowledgements carry it, a
//! node reports it, and after Redis restarts empty it changes and every
//! watcher is told, so that a producer can dispatch again what was queued
//! and not started (which no worker knew of, and which the restart lost).
//! Before, `dispatch` answered a bare `Ok` and nothing told a producer
//! that Redis had lost its jobs.

#[path = "../../sidejob-redis/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

use sidejob_pulse::{Error, Generation, Handler, Job, Node, StopReason, Token};

struct Started(Sender<(String, Token)>);

impl Handler for Started {
    fn start(&mut self, job: Job) {
        let _ = self.0.send((job.key, job.token));
    }
    fn stop(&mut self, _: &str, _: Token, _: StopReason) {}
}

const TTL: Duration = Duration::from_millis(1000);

fn builder(url: &str) -> sidejob_pulse::NodeBuilder {
    let mut b = Node::builder();
    b.name("gen")
        .url(url)
        .worker_ttl(TTL)
        .worker_shutdown_ttl(Duration::from_secs(10));
    b
}

/// The next start, within a bound.
fn started(rx: &Receiver<(String, Token)>) -> (String, Token) {
    rx.recv_timeout(Duration::from_secs(15))
        .expect("a start within 15 s")
}

/// Retries `f` while Redis is coming back (a dropped connection, a pool
/// not re-created yet), up to a deadline.
fn retry<T>(what: &str, mut f: impl FnMut() -> Result<T, Error>) -> T {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) => {
                assert!(Instant::now() < deadline, "{what}: {e}");
                // Polling Redis with a deadline while it restarts.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[test]
fn an_empty_restart_changes_the_generation_and_watchers_are_told() {
    let Some(mut redis) = redis_support::start(false) else {
        return;
    };
    let url = redis.url();
    // A worker node with no worker yet, and a client-only producer.
    let host = builder(&url).join().unwrap();
    let client = builder(&url).client_only(true).join().unwrap();
    let g0 = client.generation().unwrap();
    assert_eq!(host.generation().unwrap(), g0);
    let client_changes = client.watch_generation();
    let host_changes = host.watch_generation();

    // Acknowledged under g0, queued: no worker lives, so only Redis has it.
    assert_eq!(client.dispatch_acked("queued", b"q").unwrap(), g0);
    assert_eq!(client.dispatch_acked("queued", b"q"), Err(Error::Exists));
    // Nothing changed, so nobody was told.
    assert_eq!(client_changes.try_recv(), Err(TryRecvError::Empty));

    redis.restart(); // killed and started again, empty, on the same port

    // Until a worker node re-creates the pool it is missing, and says so.
    retry("generation of a missing pool", || {
        match client.generation() {
            Err(Error::NoPool) => Ok(()),
            Ok(g) => panic!("a generation {g} for a pool Redis lost"),
            Err(e) => Err(e),
        }
    });
    assert_eq!(client.dispatch("other", b""), Err(Error::NoPool));

    // A worker joins: its node re-creates the pool, a new generation.
    let (tx, rx) = channel();
    let _w = retry("add a worker", || host.add_worker(10, Started(tx.clone())));
    let on_host = host_changes
        .recv_timeout(Duration::from_secs(10))
        .expect("the worker node's watcher is told");
    let on_client = client_changes
        .recv_timeout(Duration::from_secs(10))
        .expect("the client-only node's watcher is told (its own keeper reads it)");
    assert_ne!(on_host, g0, "the generation changed");
    assert_eq!(on_client, on_host);
    assert_eq!(client.generation().unwrap(), on_host);
    // Told once: no second message for the same change.
    assert_eq!(client_changes.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(host_changes.try_recv(), Err(TryRecvError::Empty));

    // The queued job was lost with Redis' state...
    assert_eq!(client.stop("queued"), Err(Error::NotFound));
    // ...so the producer, told, dispatches again what g0 acknowledged; the
    // new acknowledgement carries the new generation, and the job starts
    // (once learning mode ends: ttl + grace after Redis started).
    let acked: Vec<(&str, Generation)> = vec![("queued", g0.clone())];
    for (key, g) in &acked {
        if *g != on_client {
            assert_eq!(client.dispatch_acked(key, b"q").unwrap(), on_client);
        }
    }
    let (key, _) = started(&rx);
    assert_eq!(key, "queued");
    assert_eq!(client.dispatch_acked("queued", b"q"), Err(Error::Exists));

    // A closed node's watchers see the end.
    client.close();
    assert_eq!(
        client_changes.recv_timeout(Duration::from_secs(5)),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected)
    );
    // The host's own connection last served the Redis that was killed:
    // its first call after the restart fails once (Error::Redis), the
    // next reconnects.
    retry("shutdown", || host.shutdown());
}
