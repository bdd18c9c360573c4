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
/// `rediss://…` for TLS, `unix:///path/to/socket`). The password can also be
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
/// use sidejob_redis::Endpoint;
///
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
/// # Ok::<(), sidejob_redis::EndpointError>(())
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
/// use sidejob_redis::Endpoint;
///
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
    /// a build without the `tls` feature; the message has the URL with any
    /// password replaced by `<redacted>`.
    pub fn parse(url: &str) -> Result<Endpoint, EndpointError> {
        if cfg!(not(feature = "tls")) && url.starts_with("rediss://") {
            return Err(EndpointError(format!(
                "{:?}: a rediss:// endpoint needs the crate feature `tls`",
                redact_url(url)
            )));
        }
        let info = url.into_connection_info().map_err(|e| {
            // The redis crate's message may quote the URL: say only what kind.
            EndpointError(format!(
                "bad Redis URL {:?}: {:?}",
                redact_url(url),
                e.kind()
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

/// `url` with whatever sits between `scheme://` and `@` after the first
/// `:` (the password) replaced: for messages about URLs that did not parse.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return "<not a URL>".into();
    };
    let rest = &url[scheme_end..];
    let Some(at) = rest.rfind('@') else {
        return url.to_string();
    };
    let creds = &rest[..at];
    let user = creds.split(':').next().unwrap_or("");
    let redacted = if creds.contains(':') {
        format!("{user}:<redacted>")
    } else {
        // `redis://field@host`: a user name to the redis crate, but
        // people write passwords there too; a URL that did not parse is
        // no place to guess.
        "<redacted>".to_string()
    };
    format!("{}{redacted}{}", &url[..scheme_end], &rest[at..])
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
        assert_eq!(redact_url("nonsense"), "<not a URL>");
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
