//! What a new user had to guess (issue 38, item 5): endpoint errors that
//! convert into the crate's error with `?`, bad URLs that show the
//! (redacted) input and the reason, and nodes that disagree with the pool
//! on the worker TTL refused instead of joining silently.

#[path = "../../sidejob-redis/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

use std::time::Duration;

use sidejob_pulse::{ConfigError, Endpoint, EndpointError, Error, Node};

fn endpoint(url: &str) -> Result<Endpoint, Error> {
    Ok(Endpoint::parse(url)?)
}

#[test]
fn endpoint_errors_convert_with_the_question_mark() {
    assert!(endpoint("redis://127.0.0.1:6379/").is_ok());
    let Err(Error::Config(c)) = endpoint("redis://127.0.0.1:99999/") else {
        panic!("a bad port is a config error")
    };
    assert_eq!(c.field(), "url");
    let e: EndpointError = Endpoint::parse("nope").unwrap_err();
    let c: ConfigError = e.clone().into();
    assert_eq!(c.field(), "url");
    assert_eq!(c.to_string(), format!("invalid `url`: {e}"));
}

#[test]
fn a_bad_url_shows_the_redacted_input_and_the_reason() {
    let join = |url: &str| -> String {
        match Node::builder().name("p").url(url).join() {
            Err(Error::Config(c)) => {
                assert_eq!(c.field(), "url");
                c.to_string()
            }
            other => panic!("{url}: {other:?}"),
        }
    };
    let text = join("127.0.0.1:6379");
    assert!(
        text.contains("\"127.0.0.1:6379\"") && text.contains("no scheme"),
        "{text}"
    );
    assert!(!text.contains("<not a URL>"), "{text}");
    let text = join("app:hunter2@cache.internal:6379");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(
        text.contains("cache.internal:6379") && text.contains("no scheme"),
        "{text}"
    );
    let text = join("http://app:hunter2@cache.internal:6379/");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("unsupported scheme"), "{text}");
    let text = join("unix:///tmp/r.sock?pass=hunter2&db=x");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("Invalid database number"), "{text}");
}

fn join(url: &str, ttl_ms: u64, client_only: bool) -> Result<Node, Error> {
    Node::builder()
        .name("ttl")
        .url(url)
        .worker_ttl(Duration::from_millis(ttl_ms))
        .client_only(client_only)
        .join()
}

#[test]
fn a_node_with_another_worker_ttl_than_the_pool_is_refused() {
    let Some(redis) = redis_support::start(false) else {
        return;
    };
    let url = redis.url();
    let first = join(&url, 2000, false).unwrap();
    for client_only in [false, true] {
        match join(&url, 3000, client_only) {
            Err(Error::Config(c)) => {
                assert_eq!(c.field(), "worker_ttl");
                let text = c.to_string();
                assert!(text.contains("2s") && text.contains("3s"), "{text}");
            }
            other => panic!("joined with another TTL: {other:?}"),
        }
    }
    // The pool's own TTL is fine, on any node.
    let same = join(&url, 2000, true).unwrap();
    same.dispatch("k", b"").unwrap();
    drop(same);
    first.shutdown().unwrap();
}
