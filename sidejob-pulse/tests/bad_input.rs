//! Bad input (issue 38): keys and payloads at and past their limits, pool
//! names with braces, colons and newlines, a wrong password, a closed
//! port, a Sentinel that names no primary. Each gets a clear error, and no
//! text shows a secret.

#[path = "../../sidejob-redis/tests/support/secure.rs"]
#[allow(dead_code)]
mod secure;

#[allow(dead_code)]
mod support;
use support::sentinel;

use std::sync::mpsc::{channel, Sender};
use std::time::{Duration, Instant};

// The plain server, through `secure` (which loads it), as `sentinel`
// expects it.
use secure::plain as redis_support;
use secure::{ACL_PASSWORD, ACL_USER, PASSWORD};
use sidejob_pulse::{
    Endpoint, Error, Handler, Job, Node, NodeBuilder, StopReason, Token, MAX_KEY_LEN,
    MAX_PAYLOAD_LEN,
};

struct Started(Sender<Job>);

impl Handler for Started {
    fn start(&mut self, job: Job) {
        let _ = self.0.send(job);
    }
    fn stop(&mut self, _: &str, _: Token, _: StopReason) {}
}

fn builder(name: &str, url: &str) -> NodeBuilder {
    let mut b = Node::builder();
    b.name(name)
        .url(url)
        .worker_ttl(Duration::from_millis(1000))
        .assume_fresh_redis(true);
    b
}

fn no_secret(text: &str) {
    for s in [PASSWORD, ACL_PASSWORD] {
        assert!(!text.contains(s), "secret in {text:?}");
    }
}

#[test]
fn keys_and_payloads_at_their_limits_run_and_past_them_are_refused() {
    let Some(redis) = redis_support::start(false) else {
        return;
    };
    let node = builder("limits", &redis.url()).join().unwrap();
    let (tx, rx) = channel();
    let _w = node.add_worker(10, Started(tx)).unwrap();

    // At the limits: accepted, and the worker gets them whole.
    let long_key = "k".repeat(MAX_KEY_LEN);
    let big = vec![0xA5u8; MAX_PAYLOAD_LEN];
    node.dispatch(&long_key, &big).unwrap();
    let job = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(job.key, long_key);
    assert_eq!(job.payload, big);
    node.notify(&long_key, &big).unwrap();
    node.stop(&long_key).unwrap();
    // A key of multi-byte characters counts bytes: 1024 bytes is the
    // limit, whatever the characters.
    let wide = "é".repeat(MAX_KEY_LEN / 2);
    assert_eq!(wide.len(), MAX_KEY_LEN);
    node.dispatch(&wide, b"").unwrap();
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap().key, wide);

    // Past them: refused before Redis, by every call that takes them.
    let too_long = "k".repeat(MAX_KEY_LEN + 1);
    let too_big = vec![0u8; MAX_PAYLOAD_LEN + 1];
    assert_eq!(node.dispatch(&too_long, b""), Err(Error::InvalidKey));
    assert_eq!(node.dispatch("", b""), Err(Error::InvalidKey));
    assert_eq!(node.stop(&too_long), Err(Error::InvalidKey));
    assert_eq!(node.notify("", b""), Err(Error::InvalidKey));
    assert_eq!(node.dispatch("k", &too_big), Err(Error::InvalidPayload));
    assert_eq!(node.notify(&wide, &too_big), Err(Error::InvalidPayload));
    let e = node.dispatch(&too_long, b"").unwrap_err().to_string();
    assert!(e.contains("1024 bytes"), "{e}");
    let e = node.dispatch("k", &too_big).unwrap_err().to_string();
    assert!(e.contains("1048576 bytes"), "{e}");
    // Nothing of the refused calls reached the pool.
    assert_eq!(node.stop("k"), Err(Error::NotFound));
    // Bytes that are not UTF-8 in a payload are kept as they are.
    node.dispatch("binary", &[0, 0xFF, 0xFE, b'\n']).unwrap();
    let job = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(job.payload, [0, 0xFF, 0xFE, b'\n']);
}

#[test]
fn pool_names_with_braces_colons_and_newlines_are_pools_of_their_own() {
    let Some(redis) = redis_support::start(false) else {
        return;
    };
    let url = redis.url();
    let names = ["{a}", "a", "a}:b{", "x:y:", "line\nbreak", "line", "\0nul"];
    let nodes: Vec<Node> = names
        .iter()
        .map(|n| builder(n, &url).join().unwrap())
        .collect();
    // One key, dispatched in every pool: no pool sees another's.
    for node in &nodes {
        node.dispatch("same-key", node.pool().as_bytes()).unwrap();
    }
    for (node, name) in nodes.iter().zip(names) {
        assert_eq!(node.pool(), name);
        assert_eq!(node.dispatch("same-key", b""), Err(Error::Exists));
        let (tx, rx) = channel();
        let _w = node.add_worker(1, Started(tx)).unwrap();
        let job = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(job.payload, name.as_bytes(), "pool {name:?}");
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    }
    // Every key in Redis is under one hash tag, its pool's escaped name: no
    // raw brace, colon or newline of a name reaches a key.
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.conn())
        .unwrap();
    assert!(!keys.is_empty());
    for k in &keys {
        let k = String::from_utf8(k.clone()).unwrap();
        let tag_end = k.find('}').unwrap();
        let tag = &k["{sjp:".len()..tag_end];
        assert!(k.starts_with("{sjp:"), "{k:?}");
        assert!(
            !tag.contains(['{', '}', ':', '\n', '\0']),
            "{k:?}: a raw character of the name"
        );
    }
    // The empty name is refused, naming the setting.
    let e = builder("", &url).join().unwrap_err();
    assert!(matches!(&e, Error::Config(c) if c.field() == "name"), "{e}");
}

#[test]
fn a_wrong_password_is_refused_saying_so_and_showing_no_secret() {
    let Some(r) = secure::start() else { return };
    for (userinfo, wrong) in [
        (format!(":{PASSWORD}-wrong"), format!("{PASSWORD}-wrong")),
        (
            format!("{ACL_USER}:{ACL_PASSWORD}-wrong"),
            format!("{ACL_PASSWORD}-wrong"),
        ),
    ] {
        let url = r.url(&userinfo);
        let e = builder("pw", &url).join().unwrap_err();
        let text = format!("{e} {e:?}");
        no_secret(&text);
        assert!(!text.contains(&wrong), "{text}");
        assert!(matches!(e, Error::Redis(_)), "{e:?}");
        // Redis' own reason, and where.
        assert!(text.contains("authentication failed"), "{text}");
        assert!(text.contains("127.0.0.1"), "{text}");
        // The same through an Endpoint with the password kept out of the URL.
        let e = Node::builder()
            .name("pw")
            .endpoint(Endpoint::parse(&r.url("")).unwrap().password(&wrong))
            .join()
            .unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(!text.contains(&wrong), "{text}");
    }
}

#[test]
fn a_closed_port_fails_quickly_naming_the_address() {
    // A port the OS handed out and took back: nothing listens there.
    let port = redis_support::free_port();
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{port}/");
    let t = Instant::now();
    let e = builder("closed", &url).join().unwrap_err();
    let took = t.elapsed();
    let text = format!("{e} {e:?}");
    no_secret(&text);
    assert!(matches!(e, Error::Redis(_)), "{e:?}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("connect"), "{text}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // A client-only node too: no keeper hides the failure.
    let e = builder("closed", &url)
        .client_only(true)
        .join()
        .unwrap_err();
    assert!(matches!(e, Error::Redis(_)), "{e:?}");
}

#[test]
fn a_sentinel_that_names_no_primary_is_not_taken_for_redis() {
    let Some(s) = sentinel::start(None, Duration::from_secs(1)) else {
        return;
    };
    // The Sentinel monitors nothing: it names no primary.
    assert_eq!(s.primary(), None);
    // A node given the Sentinel's address is told what it reached.
    let e = builder("sentinel", &s.url()).join().unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Redis(_)), "{e:?}");
    assert!(
        text.contains("is a Redis Sentinel, not a Redis primary"),
        "{text}"
    );
    assert!(text.contains("get-master-addr-by-name"), "{text}");
    assert!(text.contains(&s.port.to_string()), "{text}");
}
