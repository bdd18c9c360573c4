//! A shutdown stays shut (issue 38, item 2): after `Node::shutdown`, no
//! later join (client-only, worker node, or a read of the pool's state)
//! re-creates the pool; a node that joined before learns of the shutdown
//! (it can wait for it), and its dispatches get `Error::PoolShutDown`, not
//! the `NoPool` of a pool Redis lost. Only an explicit `reopen` brings the
//! pool back. It used to be re-created by the next join, and dispatches
//! were then acknowledged into a pool with no workers.

#[path = "../../sidejob-redis/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

use std::sync::mpsc::{channel, Sender};
use std::time::Duration;

use sidejob_pulse::{Error, Handler, Job, Node, PoolState, StopReason, Token};

struct Started(Sender<String>);

impl Handler for Started {
    fn start(&mut self, job: Job) {
        let _ = self.0.send(job.key);
    }
    fn stop(&mut self, _: &str, _: Token, _: StopReason) {}
}

const POOL: &str = "stays";

fn builder(url: &str) -> sidejob_pulse::NodeBuilder {
    let mut b = Node::builder();
    b.name(POOL)
        .url(url)
        .worker_ttl(Duration::from_millis(2000))
        .worker_shutdown_ttl(Duration::from_secs(10));
    b
}

fn keys(redis: &redis_support::Server) -> Vec<String> {
    let mut c = redis.conn();
    let mut k: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    k.sort();
    k
}

#[test]
fn a_shut_down_pool_joined_again_stays_shut() {
    let Some(redis) = redis_support::start(false) else {
        return;
    };
    let url = redis.url();
    let admin = builder(&url).join().unwrap();
    let host = builder(&url).join().unwrap();
    let (tx, rx) = channel();
    let _w = host.add_worker(10, Started(tx.clone())).unwrap();
    let client = builder(&url).client_only(true).join().unwrap();
    assert_eq!(client.pool_state(), Ok(PoolState::Open));
    client.dispatch("before", b"").unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(15)).unwrap(), "before");

    // Another node waits for the shutdown, from before it begins.
    let watcher = client.clone();
    let (waited_tx, waited) = channel();
    let wait = std::thread::spawn(move || {
        let r = watcher.wait_shutdown(Duration::from_secs(30));
        let _ = waited_tx.send(());
        r
    });
    assert!(
        waited.recv_timeout(Duration::from_millis(200)).is_err(),
        "the wait does not end before the shutdown"
    );
    admin.shutdown().unwrap();
    assert_eq!(wait.join().unwrap(), Ok(true));
    assert_eq!(client.pool_state(), Ok(PoolState::ShutDown));

    // A node that joined before: a distinct error, not NoPool.
    let e = client.dispatch("after", b"").unwrap_err();
    assert_eq!(e, Error::PoolShutDown);
    assert!(e.is_pool_shut_down());
    assert_eq!(client.stop("before"), Err(Error::PoolShutDown));

    // Later joins, client-only or not, create nothing.
    for client_only in [true, false] {
        assert_eq!(
            builder(&url).client_only(client_only).join().unwrap_err(),
            Error::PoolShutDown,
            "client_only {client_only}"
        );
    }
    // The worker node that joined before keeps heartbeating: two worker
    // TTLs' worth, and still only the shutdown's mark is in Redis.
    assert!(host.wait_shutdown(Duration::from_secs(10)).unwrap());
    assert_eq!(
        host.add_worker(1, Started(tx.clone())).unwrap_err(),
        Error::PoolShutDown
    );
    let until = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < until {
        assert_eq!(keys(&redis), vec![format!("{{sjp:{POOL}}}:closed")]);
        std::thread::sleep(Duration::from_millis(100)); // watching for a write
    }
    assert_eq!(host.dispatch("late", b""), Err(Error::PoolShutDown));

    // Reopened on purpose: the pool runs again.
    let again = builder(&url).reopen(true).join().unwrap();
    assert_eq!(again.pool_state(), Ok(PoolState::Open));
    let (tx2, rx2) = channel();
    let _w2 = again.add_worker(10, Started(tx2)).unwrap();
    again.dispatch("reopened", b"").unwrap();
    assert_eq!(
        rx2.recv_timeout(Duration::from_secs(15)).unwrap(),
        "reopened"
    );
    assert!(!keys(&redis).contains(&format!("{{sjp:{POOL}}}:closed")));
    again.shutdown().unwrap();
}
