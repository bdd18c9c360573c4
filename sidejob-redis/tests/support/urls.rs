//! A table of Redis URLs with a secret in every place one can go: every
//! scheme the redis crate accepts (`redis`, `rediss`, `valkey`, `valkeys`,
//! `unix`, `redis+unix`, `valkey+unix`), the password in `user:pass@`,
//! `:pass@`, `?pass=` and `?password=`, query parameters in several
//! orders, and each URL also broken three ways (a bad `protocol`, a bad
//! database, an address that does not parse), so that both the parsed and
//! the refused paths are covered. Hosts are loopback only.
//!
//! Shared by `sidejob-redis/tests/security.rs` and
//! `sidejob-pulse/tests/security.rs`.

/// A plain secret, as written in the URL.
pub const SECRET: &str = "Hunter2-Sekret";
/// A secret with characters that must be percent-encoded in a URL.
pub const SPECIAL: &str = "p@ss:w/rd?#&=";
/// [`SPECIAL`], percent-encoded.
pub const SPECIAL_ENCODED: &str = "p%40ss%3Aw%2Frd%3F%23%26%3D";

/// Panics if `text` holds either secret, in either spelling.
pub fn assert_no_secret(url: &str, text: &str) {
    for s in [SECRET, SPECIAL, SPECIAL_ENCODED] {
        assert!(!text.contains(s), "{url:?}: secret {s:?} in {text:?}");
    }
}

const TCP: [&str; 4] = ["redis", "rediss", "valkey", "valkeys"];
const UNIX: [&str; 3] = ["unix", "redis+unix", "valkey+unix"];

/// Every URL of the table, each with [`SECRET`] or [`SPECIAL_ENCODED`].
pub fn table() -> Vec<String> {
    let mut good = Vec::new();
    for pw in [SECRET, SPECIAL_ENCODED] {
        for s in TCP {
            for rest in [
                format!("app:{pw}@127.0.0.1:1/0"),
                format!(":{pw}@127.0.0.1:1/0"),
                format!("app:{pw}@[::1]:1/3?protocol=3"),
                format!(":{pw}@127.0.0.1:1/0?protocol=resp2#insecure"),
                // Not a password to the redis crate over TCP, but people
                // write them.
                format!("127.0.0.1:1/0?pass={pw}"),
                format!("127.0.0.1:1/0?password={pw}&protocol=3"),
                format!("127.0.0.1:1/0?protocol=3&password={pw}"),
            ] {
                good.push(format!("{s}://{rest}"));
            }
        }
        for s in UNIX {
            for rest in [
                format!("/tmp/sj-no-such.sock?pass={pw}"),
                format!("/tmp/sj-no-such.sock?user=app&pass={pw}"),
                format!("/tmp/sj-no-such.sock?pass={pw}&user=app&db=2"),
                format!("/tmp/sj-no-such.sock?db=2&protocol=3&pass={pw}"),
                format!("/tmp/sj-no-such.sock?password={pw}&db=1"),
                format!("/tmp/sj-no-such.sock?db=1&user=app&password={pw}"),
            ] {
                good.push(format!("{s}://{rest}"));
            }
            // A password where a TCP URL has it.
            good.push(format!("{s}://app:{pw}@localhost/tmp/sj-no-such.sock"));
        }
    }
    let mut all = Vec::new();
    for u in good {
        all.push(bad_protocol(&u));
        all.push(bad_db(&u));
        all.push(bad_address(&u));
        all.push(u);
    }
    all
}

/// `url` with `protocol=9` first in its query.
fn bad_protocol(url: &str) -> String {
    match url.split_once('?') {
        Some((a, b)) => format!("{a}?protocol=9&{b}"),
        None => match url.split_once('#') {
            Some((a, b)) => format!("{a}?protocol=9#{b}"),
            None => format!("{url}?protocol=9"),
        },
    }
}

/// `url` with a database that is not a number.
fn bad_db(url: &str) -> String {
    if url.contains(".sock") {
        match url.split_once('?') {
            Some((a, b)) => format!("{a}?{b}&db=x"),
            None => format!("{url}?db=x"),
        }
    } else {
        // The database is the path: `/0` or `/3` before any query.
        let (head, tail) = url.split_at(url.find(['?', '#']).unwrap_or(url.len()));
        let cut = head.rfind('/').unwrap();
        format!("{}/db-x{tail}", &head[..cut])
    }
}

/// `url` with an address that does not parse (a port out of range, a host
/// that is not loopback's name for a socket path).
fn bad_address(url: &str) -> String {
    if url.contains("127.0.0.1:1/") {
        url.replace("127.0.0.1:1/", "127.0.0.1:99999/")
    } else if url.contains("[::1]:1/") {
        url.replace("[::1]:1/", "[::1:1/")
    } else if url.contains("@localhost/") {
        url.replace("@localhost/", "@[bad/")
    } else {
        url.replacen(":///", "://[::1/", 1)
    }
}
