//! The pool's timings live in the pool (issue 38, "pool timings"): the
//! worker TTL, grace and pending-job TTL are fixed when the pool is
//! created, and a node joining with other values is refused with a
//! `ConfigError` naming the field. Before, only the worker TTL was
//! checked: nodes with another pending-job TTL joined silently, and each
//! node's dispatches and hand-overs gave jobs its own deadline.

#[path = "../../sidejob-redis/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

use std::time::{Duration, Instant};

use sidejob_pulse::{Error, Handler, Job, Node, StopReason, Token};

const TTL: Duration = Duration::from_millis(2000);

fn join(url: &str, pending_ms: u64, client_only: bool) -> Result<Node, Error> {
    Node::builder()
        .name("timings")
        .url(url)
        .worker_ttl(TTL)
        .pending_job_ttl(Duration::from_millis(pending_ms))
        .worker_shutdown_ttl(Duration::from_secs(10))
        .client_only(client_only)
        .join()
}

fn refused(r: Result<Node, Error>, field: &str, pool: &str, ours: &str) {
    match r {
        Err(Error::Config(c)) => {
            assert_eq!(c.field(), field);
            let text = c.to_string();
            assert!(text.contains(pool) && text.contains(ours), "{text}");
        }
        other => panic!("joined with another {field}: {other:?}"),
    }
}

struct Idle;
impl Handler for Idle {
    fn start(&mut self, _: Job) {}
    fn stop(&mut self, _: &str, _: Token, _: StopReason) {}
}

#[test]
fn a_node_with_another_pending_ttl_than_the_pool_is_refused() {
    let Some(redis) = redis_support::start(false) else {
        return;
    };
    let url = redis.url();
    let first = join(&url, 4000, false).unwrap();
    for client_only in [false, true] {
        refused(join(&url, 6000, client_only), "pending_job_ttl", "4s", "6s");
    }
    // The pool's own timings are fine, on any node.
    let same = join(&url, 4000, true).unwrap();
    same.dispatch("k", b"").unwrap();
    drop(same);
    first.shutdown().unwrap();
}

#[test]
fn a_pool_re_created_after_a_state_loss_records_its_timings_again() {
    let Some(redis) = redis_support::start(false) else {
        return;
    };
    let url = redis.url();
    let node = join(&url, 4000, false).unwrap();
    let _w = node.add_worker(10, Idle).unwrap();
    let mut c = redis.conn();
    // Redis loses the pool; the worker node's next heartbeat re-creates
    // it (polling Redis with a deadline).
    let () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let pttl: Option<u64> = redis::cmd("HGET")
            .arg("{sjp:timings}:meta")
            .arg("pttl")
            .query(&mut c)
            .unwrap();
        if let Some(pttl) = pttl {
            assert_eq!(pttl, 4000);
            break;
        }
        assert!(Instant::now() < deadline, "the pool was not re-created");
        std::thread::sleep(Duration::from_millis(20));
    }
    refused(join(&url, 6000, true), "pending_job_ttl", "4s", "6s");
    // A pool created with another grace (another version of this crate):
    // refused, naming the grace.
    let () = redis::cmd("HSET")
        .arg("{sjp:timings}:meta")
        .arg("grace")
        .arg(300)
        .query(&mut c)
        .unwrap();
    refused(join(&url, 4000, true), "grace", "300ms", "200ms");
    node.shutdown().unwrap();
}
