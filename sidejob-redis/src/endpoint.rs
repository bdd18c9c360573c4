//! Where a Redis is and how to log in: a URL, a password or ACL user, and
//! the CA to trust for TLS, shown everywhere without the secret.
//!
//! Shared by `sidejob-redis` and `sidejob-pulse`: both print endpoints in
//! `Debug` output and error messages, and neither may print a password.

use std::fmt;
use std::path::Path;

use redis::{Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

/// A Redis server to connect to: address, database, user, password and,
/// for `rediss://`, the certificate authority to trust.
///
/// Made from a URL (`redis://[user[:password]@]host[:port][/db]`,
/// `rediss://…` for TLS, `unix:///path/to/socket[?user=…&pass=…&db=…]`,
/// or the `valkey` spellings of these). The password can also be
/// given apart from the URL ([`Endpoint::password`]), so that the URL in a
/// config file holds no secret.
///
/// `Debug` and `Display` never show the password: `Display` is the URL
/// with the password left out, and every error that names an endpoint uses
/// it.
///
/// TLS needs the crate feature `tls` (rustls, with the `ring` provider):
/// without it a `rediss://` endpoint is refused by [`Endpoint::client`]
/// with an error that says so. Without [`Endpoint::ca_pem`] the system's
/// roots are trusted.
///
/// # Examples
///
/// ```
/// # use sidejob_redis::{Endpoint, EndpointError};
/// let e = Endpoint::parse("redis://app:s3cret@127.0.0.1:6380/2")?;
/// assert_eq!(e.to_string(), "redis://app@127.0.0.1:6380/2");
/// assert!(!format!("{e:?}").contains("s3cret"));
/// assert!(!e.is_tls());
///
/// // With the `tls` feature: TLS, the password kept out of the URL.
/// if let Ok(tls) = Endpoint::parse("rediss://cache.internal:6380/") {
///     let tls = tls.username("app").password("s3cret");
///     assert!(tls.is_tls());
///     assert_eq!(tls.to_string(), "rediss://app@cache.internal:6380/0");
/// }
/// # Ok::<(), EndpointError>(())
/// ```
#[derive(Clone)]
pub struct Endpoint {
    info: ConnectionInfo,
    ca: Option<Vec<u8>>,
}

/// An endpoint that could not be parsed or used; says why, without any
/// secret.
///
/// # Examples
///
/// ```
/// # use sidejob_redis::Endpoint;
/// let err = Endpoint::parse("http://user:hunter2@host/").unwrap_err();
/// assert!(!err.to_string().contains("hunter2"), "{err}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointError(String);

impl fmt::Display for EndpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EndpointError {}

impl Endpoint {
    /// Parses a Redis URL.
    ///
    /// # Errors
    ///
    /// If the URL does not parse as a Redis URL, or is a `rediss://` URL in
    /// a build without the `tls` feature; the message has the URL with
    /// every secret (`user:password@`, `?pass=`, `?password=`, any query
    /// value but `db` and `protocol`) replaced by `<redacted>`.
    pub fn parse(url: &str) -> Result<Endpoint, EndpointError> {
        if cfg!(not(feature = "tls"))
            && (url.starts_with("rediss://") || url.starts_with("valkeys://"))
        {
            return Err(EndpointError(format!(
                "{:?}: a rediss:// endpoint needs the crate feature `tls`",
                redact_url(url)
            )));
        }
        let info = url.into_connection_info().map_err(|e| {
            EndpointError(format!(
                "bad Redis URL {:?}: {}",
                redact_url(url),
                why_bad(url, &e)
            ))
        })?;
        // No `CLIENT SETINFO` on connecting: two more replies to wait for,
        // for a label in `CLIENT LIST`.
        let redis = info.redis_settings().clone().set_skip_set_lib_name();
        Ok(Endpoint {
            info: info.set_redis_settings(redis),
            ca: None,
        })
    }

    /// Logs in as this ACL user (`AUTH user password`) instead of the URL's.
    #[must_use]
    pub fn username(mut self, user: impl AsRef<str>) -> Self {
        let redis = self.info.redis_settings().clone().set_username(user);
        self.info = self.info.set_redis_settings(redis);
        self
    }

    /// Logs in with this password instead of the URL's (kept out of every
    /// `Debug`, `Display` and error text).
    #[must_use]
    pub fn password(mut self, password: impl AsRef<str>) -> Self {
        let redis = self.info.redis_settings().clone().set_password(password);
        self.info = self.info.set_redis_settings(redis);
        self
    }

    /// Trusts this CA (PEM, one or more certificates) for `rediss://`,
    /// instead of the system's roots.
    #[must_use]
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// [`ca_pem`](Self::ca_pem) with the contents of a file.
    ///
    /// # Errors
    ///
    /// If the file cannot be read.
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self, EndpointError> {
        let path = path.as_ref();
        let pem = std::fs::read(path)
            .map_err(|e| EndpointError(format!("cannot read CA file {}: {e}", path.display())))?;
        Ok(self.ca_pem(pem))
    }

    /// A key that tells endpoints apart by address *and* login, for
    /// sharing connections: the Display form, `#`, and a digest of the
    /// password and CA (never the secret itself).
    pub(crate) fn identity(&self) -> String {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.info.redis_settings().password().hash(&mut h);
        self.ca.hash(&mut h);
        format!("{self}#{:016x}", h.finish())
    }

    /// Whether this is a TLS (`rediss://`) endpoint.
    pub fn is_tls(&self) -> bool {
        matches!(self.info.addr(), ConnectionAddr::TcpTls { .. })
    }

    /// A client for this endpoint (no connection is opened yet).
    ///
    /// # Errors
    ///
    /// A `rediss://` endpoint in a build without the `tls` feature, or a CA
    /// that does not parse as PEM certificates.
    pub fn client(&self) -> Result<Client, EndpointError> {
        if self.is_tls() {
            return self.tls_client();
        }
        Client::open(self.info.clone())
            .map_err(|e| EndpointError(format!("{self}: {:?}", e.kind())))
    }

    #[cfg(feature = "tls")]
    fn tls_client(&self) -> Result<Client, EndpointError> {
        // rustls picks its process-wide provider; install ring's if none
        // is (an error only means another was installed first, which is
        // then used).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: self.ca.clone(),
        };
        Client::build_with_tls(self.info.clone(), certs)
            .map_err(|e| EndpointError(format!("{self}: TLS setup failed: {e}")))
    }

    #[cfg(not(feature = "tls"))]
    fn tls_client(&self) -> Result<Client, EndpointError> {
        Err(EndpointError(format!(
            "{self}: a rediss:// endpoint needs the crate feature `tls`"
        )))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.info.redis_settings();
        let user = r.username().map(|u| format!("{u}@")).unwrap_or_default();
        match self.info.addr() {
            ConnectionAddr::Tcp(host, port) => {
                write!(f, "redis://{user}{host}:{port}/{}", r.db())
            }
            ConnectionAddr::TcpTls { host, port, .. } => {
                write!(f, "rediss://{user}{host}:{port}/{}", r.db())
            }
            ConnectionAddr::Unix(path) => write!(f, "unix://{user}{}", path.display()),
            _ => write!(f, "redis://{user}(unsupported address)"),
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.info.redis_settings();
        f.debug_struct("Endpoint")
            .field("url", &self.to_string())
            .field(
                "password",
                &if r.password().is_some() {
                    "<redacted>"
                } else {
                    "none"
                },
            )
            .field("ca", &self.ca.as_ref().map(|_| "<custom>"))
            .finish()
    }
}

/// The schemes a Redis URL may have.
const SCHEMES: [&str; 5] = ["redis", "rediss", "valkey", "valkeys", "unix"];

/// Why `url` is not a Redis URL, in words that quote nothing of it: the
/// redis crate's error text may quote the URL, so only its fixed
/// description (the part before " - ") is used, or the `url` crate's
/// reason (fixed phrases too).
fn why_bad(url: &str, e: &redis::RedisError) -> String {
    let Some((scheme, _)) = url.split_once("://") else {
        return "no scheme: a Redis URL starts with redis://, rediss://, valkey://, valkeys:// or unix://".into();
    };
    if !SCHEMES.contains(&scheme) {
        return "unsupported scheme: a Redis URL starts with redis://, rediss://, valkey://, valkeys:// or unix://".into();
    }
    if let Err(e) = url::Url::parse(url) {
        return e.to_string();
    }
    match e.to_string().split(" - ").next() {
        Some(desc) if e.detail().is_none() && !desc.is_empty() => desc.to_string(),
        _ => format!("{:?}", e.kind()),
    }
}

/// `url` with every place a secret can sit replaced by `<redacted>`: for
/// messages about URLs that did not parse as Redis URLs.
///
/// A URL the `url` crate parses is rebuilt from its parts: the password
/// (and a lone user field, where people write passwords too) is redacted,
/// and so is every query value but `db` and `protocol` (`?pass=` and
/// `?user=` of a socket URL, or a `?password=` the redis crate ignores),
/// and a fragment other than `#insecure`. Of one that does not parse, only
/// the scheme is shown if anything after it could hold a secret (an `@`,
/// a query or a fragment): where the parts end is then anybody's guess.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return redact_loose(url);
    };
    let mut chars = scheme.chars();
    let is_scheme = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !is_scheme {
        return redact_loose(url);
    }
    match url::Url::parse(url) {
        Ok(u) => redact_parsed(&u),
        Err(_) if rest.contains(['@', '?', '#']) => format!("{scheme}://<redacted>"),
        Err(_) => url.to_string(),
    }
}

/// Text that is not a URL at all (`localhost:6379`, a missing `redis://`):
/// shown, but for whatever could be a login (up to the last `@`) and a
/// query or fragment (from the first `?` or `#`), each `<redacted>`.
fn redact_loose(text: &str) -> String {
    let (login, rest) = match text.rsplit_once('@') {
        Some((_, rest)) => ("<redacted>@", rest),
        None => ("", text),
    };
    let (place, tail) = match rest.find(['?', '#']) {
        Some(i) => (&rest[..i], "<redacted>"),
        None => (rest, ""),
    };
    format!("{login}{place}{tail}")
}

/// Query keys shown with their values: never secret.
const SHOWN_QUERY: [&str; 2] = ["db", "protocol"];
/// Query keys shown without their values.
const NAMED_QUERY: [&str; 4] = ["user", "username", "pass", "password"];

fn redact_parsed(u: &url::Url) -> String {
    let mut out = format!("{}://", u.scheme());
    if u.password().is_some() {
        out.push_str(&format!("{}:<redacted>@", u.username()));
    } else if !u.username().is_empty() {
        out.push_str("<redacted>@");
    }
    out.push_str(u.host_str().unwrap_or(""));
    if let Some(port) = u.port() {
        out.push_str(&format!(":{port}"));
    }
    out.push_str(u.path());
    if let Some(query) = u.query() {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| {
                let key = pair.split('=').next().unwrap_or("");
                if SHOWN_QUERY.contains(&key) {
                    pair.to_string()
                } else if NAMED_QUERY.contains(&key) {
                    format!("{key}=<redacted>")
                } else {
                    "<redacted>".to_string()
                }
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    match u.fragment() {
        None => {}
        Some("insecure") => out.push_str("#insecure"),
        Some(_) => out.push_str("#<redacted>"),
    }
    out
}

/// The part of a Redis key that names a user's budget or pool, escaped so
/// that no name can reach into another's keys: bytes outside
/// `[A-Za-z0-9_.-]` become `%XX`. Injective, and the result holds none of
/// `{`, `}`, `:` or `*`, so a hash tag `{prefix:<escaped>}` ends where it
/// should and one name's keys are never another's.
///
/// # Examples
///
/// ```
/// use sidejob_redis::escape_name;
///
/// assert_eq!(escape_name("orders-db"), "orders-db");
/// assert_eq!(escape_name("a}:held"), "a%7D%3Aheld");
/// assert_ne!(escape_name("a%7D"), escape_name("a}"));
/// ```
pub fn escape_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_url_hides_passwords() {
        assert_eq!(redact_url("redis://u:p@h:1/"), "redis://u:<redacted>@h:1/");
        assert_eq!(redact_url("redis://p@h/"), "redis://<redacted>@h/");
        assert_eq!(redact_url("redis://h/"), "redis://h/");
        // Not a URL: shown, but for a login, a query or a fragment.
        assert_eq!(redact_url("nonsense"), "nonsense");
        assert_eq!(redact_url("localhost:6379"), "localhost:6379");
        assert_eq!(
            redact_url("u:hunter2@localhost:6379/?x#y"),
            "<redacted>@localhost:6379/<redacted>"
        );
        // Every query value but `db` and `protocol`, in any order; a
        // fragment but `#insecure`.
        assert_eq!(
            redact_url("unix:///s.sock?db=x&pass=p&user=u&protocol=3"),
            "unix:///s.sock?db=x&pass=<redacted>&user=<redacted>&protocol=3"
        );
        assert_eq!(
            redact_url("redis+unix:///s.sock?password=p&pa%73s=p&db=1"),
            "redis+unix:///s.sock?password=<redacted>&<redacted>&db=1"
        );
        assert_eq!(
            redact_url("rediss://:p@h/0?protocol=9#insecure"),
            "rediss://:<redacted>@h/0?protocol=9#insecure"
        );
        assert_eq!(redact_url("redis://h/#p"), "redis://h/#<redacted>");
        // Not parsed: only the scheme, where a secret could sit.
        assert_eq!(redact_url("redis://u:p@[bad/"), "redis://<redacted>");
        assert_eq!(redact_url("unix://[bad/s?pass=p"), "unix://<redacted>");
        assert_eq!(redact_url("redis://[bad/"), "redis://[bad/");
        assert_eq!(redact_url("u:p@h://x"), "<redacted>@h://x");
    }

    #[test]
    fn parse_errors_say_why() {
        let err = Endpoint::parse("unix:///s.sock?pass=p&db=x").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"bad Redis URL "unix:///s.sock?pass=<redacted>&db=x": Invalid database number"#
        );
        // Not a URL at all: the input and the reason, not "<not a URL>":
        // InvalidClientConfig (issue 38, item 5).
        let err = Endpoint::parse("127.0.0.1:6379").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"bad Redis URL "127.0.0.1:6379": no scheme: a Redis URL starts with redis://, rediss://, valkey://, valkeys:// or unix://"#
        );
        let err = Endpoint::parse("app:hunter2@cache:6379").unwrap_err();
        assert!(
            err.to_string()
                .starts_with(r#"bad Redis URL "<redacted>@cache:6379": no scheme"#),
            "{err}"
        );
        let err = Endpoint::parse("http://app:hunter2@cache:6379/").unwrap_err();
        assert!(
            err.to_string().starts_with(
                r#"bad Redis URL "http://app:<redacted>@cache:6379/": unsupported scheme"#
            ),
            "{err}"
        );
        let err = Endpoint::parse("redis://u:p@127.0.0.1:99999/").unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"bad Redis URL "redis://<redacted>": invalid port number"#
        );
    }

    #[test]
    fn no_secret_in_debug_display_or_errors() {
        let e = Endpoint::parse("redis://app:hunter2@127.0.0.1:1/").unwrap();
        assert!(!format!("{e:?}{e}").contains("hunter2"));
        let e = Endpoint::parse("redis://:hunter2@127.0.0.1:1/").unwrap();
        assert!(!format!("{e:?}{e}").contains("hunter2"));
        // A lone field before `@` is a user name to the redis crate.
        let e = Endpoint::parse("redis://alice@127.0.0.1:1/").unwrap();
        assert_eq!(e.to_string(), "redis://alice@127.0.0.1:1/0");
        let e = e.password("hunter3");
        assert!(!format!("{e:?}{e}").contains("hunter3"));
        let err = Endpoint::parse("redis://app:hunter2@[bad/").unwrap_err();
        assert!(!format!("{err:?}{err}").contains("hunter2"), "{err}");
    }

    #[test]
    fn escape_is_injective_on_tricky_names() {
        let names = ["a", "a}", "a%7D", "a}:meta", "a:", "a*", "{a}", ""];
        let escaped: std::collections::HashSet<_> = names.iter().map(|n| escape_name(n)).collect();
        assert_eq!(escaped.len(), names.len());
        for e in &escaped {
            assert!(!e.contains(['{', '}', ':', '*']), "{e}");
        }
    }
}
