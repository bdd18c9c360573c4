//! Durable acknowledgements (issue 38): `Durability::Replicas` (Redis
//! `WAIT`) and `Durability::Fsync` (AOF, `appendfsync always`), against a
//! real primary, replica and `redis-sentinel`, all started here on
//! loopback.
//!
//! The crate's `Endpoint` names one Redis address (no `redis+sentinel://`):
//! the nodes reach Redis through a loopback proxy that the test points at
//! whichever server the Sentinel names as primary, as a deployment's
//! virtual IP or TCP proxy that follows Sentinel would. The Sentinel alone
//! decides the failover: the test kills the primary and only reads the
//! Sentinel's answer.

#[path = "../../sidejob-redis/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

#[path = "../../sidejob-redis/tests/support/proxy.rs"]
#[allow(dead_code)]
mod proxy;

#[allow(dead_code)]
mod support;
use support::sentinel;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sidejob_pulse::{Durability, Error, Handler, Job, Node, NodeBuilder, StopReason, Token};

/// Who runs which key, across every worker of the test: a start of a key
/// another worker still runs is a second owner.
#[derive(Default)]
struct Owners {
    running: HashMap<String, usize>,
    violations: Vec<String>,
    starts: usize,
}

struct Tracked {
    worker: usize,
    owners: Arc<Mutex<Owners>>,
}

impl Handler for Tracked {
    fn start(&mut self, job: Job) {
        let mut o = self.owners.lock().unwrap();
        o.starts += 1;
        if let Some(other) = o.running.insert(job.key.clone(), self.worker) {
            let v = format!(
                "{} started on worker {} while worker {other} runs it",
                job.key, self.worker
            );
            o.violations.push(v);
        }
    }
    fn stop(&mut self, key: &str, _: Token, _: StopReason) {
        let mut o = self.owners.lock().unwrap();
        if o.running.get(key) == Some(&self.worker) {
            o.running.remove(key);
        }
    }
}

const TTL: Duration = Duration::from_millis(2000);

fn builder(url: &str, pool: &str, durability: Durability) -> NodeBuilder {
    let mut b = Node::builder();
    b.name(pool)
        .url(url)
        .worker_ttl(TTL)
        .pending_job_ttl(Duration::from_secs(4))
        .worker_shutdown_ttl(Duration::from_secs(5))
        .durability(durability);
    b
}

fn replicas(timeout: Duration) -> Durability {
    Durability::Replicas {
        replicas: 1,
        timeout,
    }
}

/// Polls `cond` every 20 ms until it holds, or panics after `limit`.
fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        // Polling a condition that other threads and processes make true.
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn info(server: &redis_support::Server, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query(&mut server.conn())
        .expect("INFO")
}

/// Waits until `replica` has copied its primary's data set once.
fn wait_linked(replica: &redis_support::Server) {
    wait_until(Duration::from_secs(10), "replica linked", || {
        info(replica, "replication").contains("master_link_status:up")
    });
}

/// The primary sends its data set to a replica at once (Redis waits 5 s
/// by default for more replicas to share a diskless transfer).
fn sync_at_once(primary: &redis_support::Server) {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync-delay")
        .arg(0)
        .query::<()>(&mut primary.conn())
        .expect("CONFIG SET");
}

fn is_primary(server: &redis_support::Server) -> bool {
    server
        .client()
        .get_connection_with_timeout(Duration::from_millis(200))
        .ok()
        .and_then(|mut c| {
            redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut c)
                .ok()
        })
        .is_some_and(|i| i.contains("role:master"))
}

#[test]
fn a_primary_killed_under_sentinel_loses_no_durably_acknowledged_job() {
    let Some(mut primary) = redis_support::start(false) else {
        return;
    };
    if !sentinel::available() {
        return;
    }
    sync_at_once(&primary);
    let replica = redis_support::start_replica(primary.port).expect("replica");
    wait_linked(&replica);
    let sentinel =
        sentinel::start(Some(primary.port), Duration::from_millis(1000)).expect("redis-sentinel");
    sentinel.wait_for(
        Duration::from_secs(15),
        "the sentinel knows the replica",
        |s| s.knows_replica(replica.port),
    );
    assert_eq!(sentinel.primary(), Some(primary.port));
    let proxy = proxy::Proxy::start(primary.port);
    let url = proxy.url();
    let durable = replicas(Duration::from_secs(1));

    let owners = Arc::new(Mutex::new(Owners::default()));
    let host = |i: usize, fresh: bool| {
        let node = builder(&url, "failover", durable)
            .assume_fresh_redis(fresh)
            .join()
            .unwrap();
        let w = node
            .add_worker(
                1000,
                Tracked {
                    worker: i,
                    owners: owners.clone(),
                },
            )
            .unwrap();
        (node, w)
    };
    let (n1, _w1) = host(1, true);
    let (n2, _w2) = host(2, false);
    let client = builder(&url, "failover", durable)
        .client_only(true)
        .join()
        .unwrap();

    // Before the failure: every dispatch reaches the replica.
    let mut acked: Vec<String> = Vec::new();
    for i in 0..40 {
        let key = format!("before-{i}");
        client.dispatch(&key, b"p").unwrap();
        acked.push(key);
    }
    wait_until(Duration::from_secs(15), "40 jobs running", || {
        owners.lock().unwrap().running.len() == 40
    });

    // A producer dispatches through the failure; what it was told is
    // acknowledged, it keeps.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (client, stop) = (client.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut ok, mut refused) = (Vec::new(), Vec::new());
            let mut i = 0;
            while !stop.load(SeqCst) {
                let key = format!("during-{i}");
                i += 1;
                match client.dispatch(&key, b"p") {
                    Ok(()) => ok.push(key),
                    Err(e) => refused.push(e),
                }
                // Pacing the producer (not a synchronisation).
                std::thread::sleep(Duration::from_millis(5));
            }
            (ok, refused)
        })
    };
    wait_until(Duration::from_secs(5), "the producer is acked", || {
        owners.lock().unwrap().starts > 80
    });

    // kill -9 of the primary: the Sentinel alone promotes the replica.
    let killed = Instant::now();
    primary.kill();
    sentinel.wait_for(
        Duration::from_secs(30),
        "the sentinel names the replica as primary",
        |s| s.primary() == Some(replica.port),
    );
    wait_until(Duration::from_secs(10), "the replica is promoted", || {
        is_primary(&replica)
    });
    let promoted = killed.elapsed();
    proxy.retarget(replica.port);

    // A dispatch after the failover has no replica to wait for: recorded
    // on the new primary, refused as not durable, naming the count.
    let after = "after-failover";
    let mut e = Err(Error::Closed);
    wait_until(
        Duration::from_secs(15),
        "a dispatch reaches the new primary",
        || {
            e = client.dispatch(after, b"p");
            !matches!(e, Err(Error::Redis(_)) | Err(Error::NoPool))
        },
    );
    let Err(Error::NotDurable {
        replicas_acked: 0,
        replicas_asked: 1,
        within,
    }) = e
    else {
        panic!("a dispatch with no replica left: {e:?}");
    };
    assert_eq!(within, Duration::from_secs(1));
    let text = e.unwrap_err().to_string();
    assert!(text.contains("0 of the 1 replicas"), "{text}");
    // Recorded all the same: it stands while this primary lives.
    assert_eq!(client.dispatch(after, b"p"), Err(Error::Exists));
    stop.store(true, SeqCst);
    let (during, refused) = producer.join().unwrap();
    assert!(!during.is_empty(), "nothing acknowledged while dispatching");
    // While the primary was down, dispatches were refused (and so not
    // counted as acknowledged), not answered Ok.
    assert!(
        !refused.is_empty(),
        "no dispatch was refused during the failover"
    );
    acked.extend(during);
    acked.push(after.to_string()); // refused as not durable, yet on the new primary

    // Every acknowledged job runs again, on one worker.
    let wanted: HashSet<&String> = acked.iter().collect();
    let mut missing = Vec::new();
    wait_until(
        Duration::from_secs(30),
        "every acknowledged job runs after the failover",
        || {
            let o = owners.lock().unwrap();
            missing = wanted
                .iter()
                .filter(|k| !o.running.contains_key(k.as_str()))
                .map(|k| k.to_string())
                .collect();
            missing.is_empty()
        },
    );
    let o = owners.lock().unwrap();
    assert!(o.violations.is_empty(), "two owners: {:?}", o.violations);
    eprintln!(
        "failover: promoted {promoted:?} after the kill; {} jobs acknowledged, 0 lost; {} dispatches refused meanwhile (e.g. {:?}); {} starts",
        wanted.len(),
        refused.len(),
        refused.first().map(|e| e.to_string()),
        o.starts
    );
    drop(o);
    drop((n1, n2, client));
}

#[test]
fn a_replica_that_does_not_confirm_makes_the_dispatch_not_durable() {
    let Some(primary) = redis_support::start(false) else {
        return;
    };
    // The replica's link to the primary runs through a proxy that can drop
    // everything (a frozen replica would still find the writes in its
    // socket buffer when it thaws).
    let link = proxy::Proxy::start(primary.port);
    sync_at_once(&primary);
    let replica = redis_support::start_replica(link.port).expect("replica");
    wait_linked(&replica);
    let url = primary.url();
    let timeout = Duration::from_millis(300);
    let durable = builder(&url, "wait", replicas(timeout))
        .assume_fresh_redis(true)
        .client_only(true)
        .join()
        .unwrap();
    let plain = builder(&url, "wait", Durability::Primary)
        .client_only(true)
        .join()
        .unwrap();
    durable.dispatch("copied", b"p").unwrap();

    // The replica's link blackholed: it gets nothing and confirms nothing.
    link.set(proxy::BLACKHOLE);
    let t = Instant::now();
    let e = durable.dispatch("uncopied", b"p").unwrap_err();
    let waited = t.elapsed();
    assert_eq!(
        e,
        Error::NotDurable {
            replicas_acked: 0,
            replicas_asked: 1,
            within: timeout
        }
    );
    assert!(waited >= timeout, "answered after {waited:?}");
    assert!(e.to_string().contains("0 of the 1 replicas"), "{e}");
    // Without durable acknowledgements, the same dispatch is acknowledged
    // at once, though no replica has it.
    plain.dispatch("acked-in-memory", b"p").unwrap();
    // A stop waits as a dispatch does.
    assert!(matches!(
        durable.stop("copied"),
        Err(Error::NotDurable { .. })
    ));

    // The primary dies before the replica copied them; the replica is
    // promoted (by hand here): the jobs acknowledged by the primary alone
    // are gone, the durably acknowledged one is not.
    let mut primary = primary;
    primary.kill();
    link.set(proxy::CUT);
    let mut c = replica.conn();
    redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query::<()>(&mut c)
        .unwrap();
    let jobs: HashMap<String, String> = redis::cmd("HGETALL")
        .arg("{sjp:wait}:jobs")
        .query(&mut c)
        .unwrap();
    assert!(jobs.contains_key("copied"), "{jobs:?}");
    assert!(!jobs.contains_key("acked-in-memory"), "{jobs:?}");
    assert!(!jobs.contains_key("uncopied"), "{jobs:?}");
}

#[test]
fn fsync_durability_is_checked_at_join_and_survives_a_kill_9() {
    let Some(volatile) = redis_support::start(false) else {
        return;
    };
    // A Redis without the AOF: refused at join, naming the setting.
    let e = builder(&volatile.url(), "fsync", Durability::Fsync)
        .join()
        .unwrap_err();
    let Error::Config(c) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(c.field(), "durability");
    assert!(c.to_string().contains("appendonly no"), "{c}");
    // The AOF on, but fsynced once a second: refused, naming appendfsync.
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("yes")
        .query::<()>(&mut volatile.conn())
        .unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendfsync")
        .arg("everysec")
        .query::<()>(&mut volatile.conn())
        .unwrap();
    let e = builder(&volatile.url(), "fsync", Durability::Fsync)
        .join()
        .unwrap_err();
    assert!(e.to_string().contains("appendfsync everysec"), "{e}");

    // appendonly yes, appendfsync always: joined; what it acknowledged
    // survives a kill -9 of Redis and runs after the restart.
    let mut redis = redis_support::start(true).expect("redis");
    let url = redis.url();
    let owners = Arc::new(Mutex::new(Owners::default()));
    let node = builder(&url, "fsync", Durability::Fsync)
        .worker_ttl(Duration::from_millis(1000))
        .assume_fresh_redis(true)
        .join()
        .unwrap();
    let _w = node
        .add_worker(
            100,
            Tracked {
                worker: 1,
                owners: owners.clone(),
            },
        )
        .unwrap();
    let client = builder(&url, "fsync", Durability::Fsync)
        .worker_ttl(Duration::from_millis(1000))
        .client_only(true)
        .join()
        .unwrap();
    for i in 0..20 {
        client.dispatch(&format!("job-{i}"), b"p").unwrap();
    }
    redis.restart(); // kill -9, then from the AOF on the same port
    wait_until(
        Duration::from_secs(20),
        "every acknowledged job runs after the restart",
        || {
            let o = owners.lock().unwrap();
            (0..20).all(|i| o.running.contains_key(&format!("job-{i}")))
        },
    );
    assert!(owners.lock().unwrap().violations.is_empty());
}

/// What `Replicas` does not cover: a primary without persistence that
/// restarts (no failover) comes back empty, and its replica copies the
/// empty data set, so the jobs it confirmed are gone there too. (The
/// pool's generation changes: a producer dispatches again, see
/// `generation.rs`.)
#[test]
fn replicas_copy_an_empty_restart_of_their_primary() {
    let Some(mut primary) = redis_support::start(false) else {
        return;
    };
    sync_at_once(&primary);
    let replica = redis_support::start_replica(primary.port).expect("replica");
    wait_linked(&replica);
    let client = builder(&primary.url(), "empty", replicas(Duration::from_secs(1)))
        .assume_fresh_redis(true)
        .client_only(true)
        .join()
        .unwrap();
    for i in 0..10 {
        client.dispatch(&format!("queued-{i}"), b"p").unwrap();
    }
    let jobs = |s: &redis_support::Server| -> usize {
        redis::cmd("HLEN")
            .arg("{sjp:empty}:jobs")
            .query(&mut s.conn())
            .unwrap()
    };
    assert_eq!(jobs(&replica), 10, "confirmed by the replica");
    primary.restart(); // kill -9, then up again, empty, on the same port
    sync_at_once(&primary);
    let t = Instant::now();
    wait_until(
        Duration::from_secs(30),
        "the replica resyncs with the empty primary",
        || jobs(&replica) == 0,
    );
    eprintln!("the replica emptied {:?} after the restart", t.elapsed());
    assert_eq!(jobs(&primary), 0);
}
