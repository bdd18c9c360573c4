//! AUTH (password, ACL user) and TLS (a CA of the test's own) against a
//! local redis-server, and no secret in any Debug, Display or error text.

#[path = "support/secure.rs"]
#[allow(dead_code)]
mod secure;

#[path = "support/urls.rs"]
mod urls;

use std::sync::Arc;
use std::time::{Duration, Instant};

use secure::{ACL_PASSWORD, ACL_USER, PASSWORD};
use sidejob::Limiter;
use sidejob_redis::{Budget, Endpoint};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn budget(name: &str, endpoint: Endpoint) -> Budget {
    Budget::builder()
        .endpoint(endpoint)
        .name(name)
        .capacity(10)
        .fresh(true)
        // A reconnect (TCP, the TLS handshake, AUTH) must fit in a quarter
        // of the renewal timeout: 250 ms here. The default, half of
        // renew_every, left 25 ms, which a debug build's TLS handshake on
        // a busy machine misses every time (no renewal ever succeeds).
        .ttl(ms(3000))
        .renew_every(ms(200))
        .renew_timeout(ms(1000))
        .grace(ms(300))
        .max_hold(ms(200))
        .pause_margin(ms(50))
        .build()
        .unwrap()
}

/// A keeper on `endpoint` gets units from Redis within 5 s.
fn leases(name: &str, endpoint: Endpoint) -> bool {
    let limiter = Arc::new(Limiter::new(1).unwrap());
    let keeper = budget(name, endpoint).attach(limiter.clone()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if keeper.stats().leased > 0 {
            keeper.shutdown();
            return true;
        }
        let _ = limiter.try_acquire(); // a refusal asks for units early
        std::thread::sleep(ms(20)); // polling a real-time lease
    }
    false
}

fn no_secret(text: &str) {
    for s in [PASSWORD, ACL_PASSWORD] {
        assert!(!text.contains(s), "secret in {text:?}");
    }
}

#[test]
fn password_and_acl_user_log_in_and_no_secret_is_printed() {
    let Some(r) = secure::start() else { return };
    let with_pw = Endpoint::parse(&r.url(&format!(":{PASSWORD}"))).unwrap();
    assert!(leases("pw", with_pw.clone()));
    let acl = Endpoint::parse(&r.url(&format!("{ACL_USER}:{ACL_PASSWORD}"))).unwrap();
    assert!(leases("acl", acl.clone()));
    // The password given apart from the URL.
    let apart = Endpoint::parse(&r.url(""))
        .unwrap()
        .username(ACL_USER)
        .password(ACL_PASSWORD);
    assert!(leases("apart", apart.clone()));

    let mut builder = Budget::builder();
    builder
        .url(r.url(&format!("{ACL_USER}:{ACL_PASSWORD}")))
        .name("dbg");
    let b = budget("dbg", acl.clone());
    for text in [
        format!("{with_pw:?} {with_pw} {acl:?} {acl} {apart:?} {apart}"),
        format!("{builder:?}"),
        format!("{b:?}"),
    ] {
        no_secret(&text);
    }

    // A wrong password: refused, and the error does not echo either one.
    let wrong = Endpoint::parse(&r.url(&format!("{ACL_USER}:not-{ACL_PASSWORD}"))).unwrap();
    let err = budget("wrong", wrong).status().unwrap_err();
    let text = format!("{err} {err:?}");
    no_secret(&text);
    assert!(!text.contains("not-alice"), "{text}");
    assert!(
        text.to_lowercase().contains("auth") || text.contains("WRONGPASS"),
        "says why: {text}"
    );
    // No password at all: refused too.
    let err = budget("none", Endpoint::parse(&r.url("")).unwrap())
        .status()
        .unwrap_err();
    assert!(err.to_string().contains("NOAUTH"), "{err}");
    // A bad URL's error leaves the password out.
    let mut bad = Budget::builder();
    bad.url(format!("redis://u:{PASSWORD}@[::1/"))
        .name("x")
        .capacity(1)
        .max_hold(ms(200));
    no_secret(&format!("{:?} {}", bad, bad.build().unwrap_err()));
}

#[cfg(feature = "tls")]
#[test]
fn tls_with_a_ca_of_our_choice() {
    let Some(r) = secure::start() else { return };
    let tls = Endpoint::parse(&r.tls_url(&format!("{ACL_USER}:{ACL_PASSWORD}"), "localhost"))
        .unwrap()
        .ca_pem(r.ca.clone());
    assert!(tls.is_tls());
    assert!(leases("tls", tls.clone()));
    let by_ip = Endpoint::parse(&r.tls_url(&format!(":{PASSWORD}"), "127.0.0.1"))
        .unwrap()
        .ca_pem(r.ca.clone());
    assert!(leases("tls-ip", by_ip));
    no_secret(&format!("{tls:?} {tls}"));
    // A CA that did not sign the server's certificate: refused.
    let other = Endpoint::parse(&r.tls_url(&format!(":{PASSWORD}"), "localhost"))
        .unwrap()
        .ca_pem(r.other_ca.clone());
    let err = budget("other", other).status().unwrap_err();
    no_secret(&err.to_string());
    // A plain client on the TLS port gets nowhere either.
    let plain = Endpoint::parse(&format!("redis://:{PASSWORD}@127.0.0.1:{}/", r.tls_port)).unwrap();
    assert!(budget("plain", plain).status().is_err());
}

#[cfg(not(feature = "tls"))]
#[test]
fn rediss_without_the_tls_feature_says_so() {
    let err = Endpoint::parse("rediss://u:pw-xyz@127.0.0.1:6380/").unwrap_err();
    assert!(!err.to_string().contains("pw-xyz"), "{err}");
    assert!(err.to_string().contains("feature `tls`"), "{err}");
}

#[test]
fn budget_names_cannot_reach_each_others_keys() {
    // Unescaped, `x}:held` would sit in `x`'s hash tag and collide with
    // its keys' shape; escaped, each name has a tag of its own.
    use sidejob_redis::{LeaseStore, RedisStore};
    let a = RedisStore::new("redis://127.0.0.1:1/", "x", ms(100)).unwrap();
    let _: &dyn LeaseStore = &a;
    let b = RedisStore::new("redis://127.0.0.1:1/", "x}:held", ms(100)).unwrap();
    let c = RedisStore::new("redis://127.0.0.1:1/", "x%7D%3Aheld", ms(100)).unwrap();
    let tag = |k: &str| k[..=k.find('}').unwrap()].to_string();
    for (s, t) in [(&a, &b), (&a, &c), (&b, &c)] {
        assert_ne!(tag(&s.keys()[0]), tag(&t.keys()[0]));
        for k in s.keys() {
            assert!(!t.keys().contains(k));
        }
    }
}

/// Every URL form the redis crate accepts, parsed or refused: the secret is
/// in no Display, Debug or error text of the endpoint, the builder, the
/// budget or `build`'s error, and a bad URL is reported as `url` even when
/// other settings are missing too (hardening 3, item 6).
#[test]
fn no_url_form_shows_its_secret() {
    let (mut parsed, mut refused, mut with_password) = (0, 0, 0);
    for url in urls::table() {
        let check = |text: String| urls::assert_no_secret(&url, &text);
        let mut b = Budget::builder();
        b.url(&url).name("x").capacity(1);
        check(format!("{b:?}"));
        match Endpoint::parse(&url) {
            Ok(e) => {
                parsed += 1;
                check(format!("{e} {e:?}"));
                if format!("{e:?}").contains("<redacted>") {
                    with_password += 1;
                }
                let budget = b.max_hold(ms(200)).build().unwrap();
                check(format!("{budget:?}"));
            }
            Err(err) => {
                refused += 1;
                check(format!("{err} {err:?}"));
                // `max_hold` is missing too: the URL is what is reported.
                let err = b.build().unwrap_err();
                check(format!("{err} {err:?}"));
                assert_eq!(err.field(), "url", "{url:?}: {err}");
            }
        }
    }
    // Both paths ran, and the forms that carry a password were read as such.
    assert!(parsed >= 40 && refused >= 200, "{parsed} {refused}");
    assert!(with_password >= 30, "{with_password}");
}
