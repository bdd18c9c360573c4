//! AUTH (password, ACL user) and TLS (a CA of the test's own) against a
//! local redis-server; no secret in any Debug, Display or error text; pool
//! names that cannot reach another pool's keys.

#[path = "../../sidejob-redis/tests/support/secure.rs"]
#[allow(dead_code)]
mod secure;

#[path = "../../sidejob-redis/tests/support/urls.rs"]
mod urls;

use std::sync::mpsc::{channel, Sender};
use std::time::Duration;

// The plain server, through `secure` (which loads it): one module per
// file (clippy's `duplicate_mod`).
use secure::plain as redis_support;
use secure::{ACL_PASSWORD, ACL_USER, PASSWORD};
use sidejob_pulse::{Endpoint, Error, Handler, Job, Node, StopReason, Token};

struct Started(Sender<String>);

impl Handler for Started {
    fn start(&mut self, job: Job) {
        let _ = self.0.send(job.key);
    }
    fn stop(&mut self, _: &str, _: Token, _: StopReason) {}
}

fn join(pool: &str, endpoint: Endpoint) -> Result<Node, Error> {
    Node::builder()
        .name(pool)
        .endpoint(endpoint)
        // 3 s: a worker's Redis calls get a tenth of it, enough for a TLS
        // handshake in a debug build on a busy machine.
        .worker_ttl(Duration::from_millis(3000))
        .join()
}

/// A node on `endpoint` runs a dispatched job.
fn runs_a_job(pool: &str, endpoint: Endpoint) {
    let node = join(pool, endpoint).unwrap();
    let (tx, rx) = channel();
    let _w = node.add_worker(10, Started(tx)).unwrap();
    node.dispatch("tenant-1", b"").unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(10)).unwrap(),
        "tenant-1"
    );
    node.shutdown().unwrap();
}

fn no_secret(text: &str) {
    for s in [PASSWORD, ACL_PASSWORD] {
        assert!(!text.contains(s), "secret in {text:?}");
    }
}

#[test]
fn password_and_acl_user_log_in_and_no_secret_is_printed() {
    let Some(r) = secure::start() else { return };
    runs_a_job(
        "pw",
        Endpoint::parse(&r.url(&format!(":{PASSWORD}"))).unwrap(),
    );
    let acl_url = r.url(&format!("{ACL_USER}:{ACL_PASSWORD}"));
    runs_a_job("acl", Endpoint::parse(&acl_url).unwrap());

    let mut b = Node::builder();
    b.name("dbg").url(&acl_url);
    let node = b.join().unwrap();
    no_secret(&format!("{b:?} {node:?}"));

    // Wrong password, no password: refused, saying why, echoing nothing.
    let wrong = Endpoint::parse(&r.url(&format!("{ACL_USER}:not-{ACL_PASSWORD}"))).unwrap();
    let err = join("wrong", wrong).unwrap_err();
    let text = format!("{err} {err:?}");
    no_secret(&text);
    assert!(!text.contains("not-alice"), "{text}");
    assert!(matches!(err, Error::Redis(_)), "{err:?}");
    let err = join("none", Endpoint::parse(&r.url("")).unwrap()).unwrap_err();
    assert!(err.to_string().contains("NOAUTH"), "{err}");
    // A URL that does not parse: the error leaves its password out.
    let err = Node::builder()
        .name("x")
        .url(format!("redis://u:{PASSWORD}@[::1/"))
        .join()
        .unwrap_err();
    no_secret(&format!("{err} {err:?}"));
    assert!(
        matches!(&err, Error::Config(c) if c.field() == "url"),
        "{err}"
    );
}

#[cfg(feature = "tls")]
#[test]
fn tls_with_a_ca_of_our_choice() {
    let Some(r) = secure::start() else { return };
    let tls = Endpoint::parse(&r.tls_url(&format!("{ACL_USER}:{ACL_PASSWORD}"), "localhost"))
        .unwrap()
        .ca_pem(r.ca.clone());
    runs_a_job("tls", tls.clone());
    no_secret(&format!("{tls:?} {tls}"));
    // A CA that did not sign the server's certificate: refused.
    let other = Endpoint::parse(&r.tls_url(&format!(":{PASSWORD}"), "localhost"))
        .unwrap()
        .ca_pem(r.other_ca.clone());
    let err = join("other", other).unwrap_err();
    no_secret(&format!("{err} {err:?}"));
    assert!(matches!(err, Error::Redis(_)), "{err:?}");
}

#[test]
fn pool_names_cannot_reach_each_others_keys() {
    let Some(redis) = redis_support::start(false) else {
        return;
    };
    let url = redis.url();
    let node = |name: &str| {
        Node::builder()
            .name(name)
            .url(&url)
            .worker_ttl(Duration::from_millis(1000))
            .join()
            .unwrap()
    };
    let (plain, tricky) = (node("t"), node("t}:jobs"));
    let (tx, rx) = channel();
    let _w = plain.add_worker(10, Started(tx)).unwrap();
    tricky.dispatch("k", b"").unwrap();
    plain.dispatch("j", b"").unwrap();
    // Only the plain pool's job runs on the plain pool's worker.
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "j");
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    assert_eq!(tricky.dispatch("k", b""), Err(Error::Exists));
    assert_eq!(plain.stop("k"), Err(Error::NotFound));
    let mut c = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    for k in &keys {
        assert!(
            k.starts_with("{sjp:t}:") || k.starts_with("{sjp:t%7D%3Ajobs}:"),
            "{k}"
        );
    }
    assert!(keys.iter().any(|k| k.starts_with("{sjp:t%7D%3Ajobs}:")));
}

/// Every URL form the redis crate accepts, parsed or refused: the secret is
/// in neither the builder's Debug nor `join`'s error (a bad URL, or no
/// Redis there: every host is loopback port 1 or a missing socket)
/// (hardening 3, item 6).
#[test]
fn no_url_form_shows_its_secret() {
    let (mut config, mut redis) = (0, 0);
    for url in urls::table() {
        let mut b = Node::builder();
        b.name("x").url(&url);
        urls::assert_no_secret(&url, &format!("{b:?}"));
        let err = b.join().unwrap_err();
        urls::assert_no_secret(&url, &format!("{err} {err:?}"));
        match &err {
            Error::Config(c) => {
                assert_eq!(c.field(), "url", "{url:?}: {err}");
                config += 1;
            }
            Error::Redis(_) => redis += 1,
            other => panic!("{url:?}: {other:?}"),
        }
    }
    assert!(config >= 200 && redis >= 40, "{config} {redis}");
}
