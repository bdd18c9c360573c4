//! Refusals as HTTP and gRPC answers (feature `http`): [`HttpRefusal`]
//! answers `503`/`429` with `Retry-After`, [`GrpcRefusal`] a trailers-only
//! gRPC response with `RESOURCE_EXHAUSTED` or `UNAVAILABLE`, each mapping
//! every [`Error`] variant.
//!
//! A gRPC refusal needs no tonic: gRPC carries a call that fails before
//! any message as an HTTP `200` whose headers hold `grpc-status` and
//! `grpc-message` and whose body is empty ("Trailers-Only" in gRPC's
//! PROTOCOL-HTTP2), which is exactly what tonic's `Status::into_http`
//! builds. So both types only need the `http` crate, and the response
//! body type is any `B: Default` (empty): axum's `Body`, tonic's `Body`,
//! http-body-util's `Empty`, `Full` and boxed bodies.

use super::Refusal;
use crate::error::Error;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use std::time::Duration;

/// A [`Refusal`] answering refused requests with an HTTP status and
/// `Retry-After`, for [`LimitLayer::refuse_with`](super::LimitLayer::refuse_with).
///
/// The body is empty (`B::default()`); the status line and `Retry-After`
/// say it all. The layer keeps the inner service's error type (for axum,
/// `Infallible`).
///
/// | refusal | status |
/// |---|---|
/// | [`Error::Overload`] from a fail-fast layer ([`LimitLayer::new`](super::LimitLayer::new)): every unit is out | `503 Service Unavailable` |
/// | [`Error::Overload`] from a [waiting](super::LimitLayer::waiting) layer: the waiting room is full (or the limiter has none) | `429 Too Many Requests`, or what [`room_full`](HttpRefusal::room_full) chose |
/// | [`Error::Timeout`]: a waiting request waited its `max_wait` | `503 Service Unavailable` |
/// | [`Error::Shutdown`]: the limiter is [closed](crate::Limiter::close) | `503 Service Unavailable` |
/// | [`Error::TooLarge`]: a [weighed](super::LimitLayer::weigh) request weighs more than the whole capacity | `413 Content Too Large`, without `Retry-After` |
///
/// `413` and not `503`: the same request would be refused again however
/// long the client waits (until the capacity grows), so it is a client
/// error, and clients and load balancers that retry `503` must not retry
/// it. Every other row carries `Retry-After` (1 second unless
/// [`retry_after`](HttpRefusal::retry_after) says otherwise). A limiter
/// refuses with nothing else; [`response`](HttpRefusal::response) maps the
/// other variants too, for a handler that answers a [`Pool`](crate::Pool)'s
/// or a [`Supervisor`](crate::Supervisor)'s error with the same mapping:
/// [`Error::KeyBusy`] `429` (that key's work runs already: retry later),
/// [`Error::Spawn`] `503` (the system refused a thread), each with
/// `Retry-After`; [`Error::WorkerPanicked`], [`Error::NoRuntime`] and
/// [`Error::CallingSelf`] `500 Internal Server Error`, without (a retry
/// would not help).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use axum::body::Body;
/// use axum::http::{header, Request, StatusCode};
/// use axum::{routing::get, Router};
/// use sidejob::tower::{HttpRefusal, LimitLayer};
/// use sidejob::Limiter;
/// use tower::ServiceExt;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Arc::new(Limiter::new(64)?);
/// let layer = LimitLayer::new(Arc::clone(&limiter)).refuse_with(HttpRefusal::new());
/// let app: Router = Router::new().route("/work", get(|| async { "done" }).layer(layer));
///
/// let full: Vec<_> = (0..64).map(|_| limiter.try_acquire()).collect::<Result<_, _>>()?;
/// let response = app.oneshot(Request::get("/work").body(Body::empty())?).await?;
/// assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
/// assert_eq!(response.headers()[header::RETRY_AFTER], "1");
/// # drop(full);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpRefusal {
    room_full: StatusCode,
    retry_after: Option<u64>,
}

impl HttpRefusal {
    /// `503` for overload, timeout and shutdown, `429` for a full waiting
    /// room, all with `Retry-After: 1`.
    pub const fn new() -> Self {
        HttpRefusal {
            room_full: StatusCode::TOO_MANY_REQUESTS,
            retry_after: Some(1),
        }
    }

    /// The status of a request a [waiting](super::LimitLayer::waiting)
    /// layer refused because its waiting room was full: `429 Too Many
    /// Requests` by default (what a queueing HTTP worker usually answers), or
    /// `503 Service Unavailable` for clients and load balancers that
    /// retry only that. Any status is taken as given.
    pub const fn room_full(mut self, status: StatusCode) -> Self {
        self.room_full = status;
        self
    }

    /// The `Retry-After` header of every `429` and `503`: `Some(after)`
    /// in whole seconds, rounded up (HTTP's delay-seconds) and saturating
    /// at `u64::MAX`, or `None` for no header. Default: 1 second.
    pub fn retry_after(mut self, after: Option<Duration>) -> Self {
        self.retry_after = after.map(whole_seconds);
        self
    }

    /// The status this answers `error` with, in a fail-fast layer (so
    /// [`Error::Overload`] is `503`); see the table above.
    pub fn status(&self, error: Error) -> StatusCode {
        match error {
            Error::Overload | Error::Timeout | Error::Shutdown | Error::Spawn(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Error::KeyBusy => StatusCode::TOO_MANY_REQUESTS,
            Error::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Error::WorkerPanicked | Error::NoRuntime | Error::CallingSelf => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }

    /// The response this answers `error` with, in a fail-fast layer: its
    /// [`status`](HttpRefusal::status), `Retry-After` on a `429` or `503`,
    /// an empty body. For a handler that answers a pool's refusal as the
    /// layer answers its own.
    pub fn response<B: Default>(&self, error: Error) -> Response<B> {
        self.with_status(self.status(error))
    }

    fn with_status<B: Default>(&self, status: StatusCode) -> Response<B> {
        let mut response = Response::new(B::default());
        *response.status_mut() = status;
        let retry =
            status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS;
        if let (true, Some(seconds)) = (retry, self.retry_after) {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl Default for HttpRefusal {
    fn default() -> Self {
        HttpRefusal::new()
    }
}

impl<B: Default, E> Refusal<Response<B>, E> for HttpRefusal {
    type Error = E;

    fn refuse(&self, error: Error) -> Result<Response<B>, E> {
        Ok(self.response(error))
    }

    fn refuse_waiting(&self, error: Error) -> Result<Response<B>, E> {
        Ok(match error {
            Error::Overload => self.with_status(self.room_full),
            other => self.response(other),
        })
    }
}

/// A [`Refusal`] answering refused gRPC calls with the status gRPC clients
/// expect, for [`LimitLayer::refuse_with`](super::LimitLayer::refuse_with)
/// on a tonic server (`Server::builder().layer(..)`).
///
/// The answer is a gRPC "Trailers-Only" response: HTTP `200`,
/// `content-type: application/grpc`, `grpc-status`, `grpc-message` (the
/// [`Error`]'s text) and, as gRPC's `Retry-After`,
/// `grpc-retry-pushback-ms` (the pushback of gRPC's retry design, A6),
/// which a tonic client reads from `Status::metadata()`. The body is
/// empty (`B::default()`).
///
/// | refusal | `grpc-status` |
/// |---|---|
/// | [`Error::Overload`]: every unit is out, or the waiting room is full | `RESOURCE_EXHAUSTED` (8) |
/// | [`Error::Timeout`]: a waiting request waited its `max_wait` | `UNAVAILABLE` (14) |
/// | [`Error::Shutdown`]: the limiter is [closed](crate::Limiter::close) | `UNAVAILABLE` (14) |
/// | [`Error::TooLarge`]: a [weighed](super::LimitLayer::weigh) request weighs more than the whole capacity | `OUT_OF_RANGE` (11), without pushback |
///
/// `OUT_OF_RANGE` rather than `RESOURCE_EXHAUSTED`: gRPC's retry
/// policies commonly list `RESOURCE_EXHAUSTED` (and `UNAVAILABLE`) as
/// retryable, and a retry of a request above the whole capacity cannot
/// succeed. `OUT_OF_RANGE` is gRPC's code for "past the valid range,
/// may be fixed if the system state changes" (here: the capacity grows),
/// which no usual policy retries; without `grpc-retry-pushback-ms` the
/// client's own policy decides, and an explicit pushback would invite the
/// retry that cannot help. `INVALID_ARGUMENT` was rejected too: the same
/// request is valid on a larger limiter.
///
/// `RESOURCE_EXHAUSTED` is gRPC's code for a server out of a resource
/// (its own servers answer it when a limit is hit); `UNAVAILABLE` its code
/// for "transient, retry with backoff", and the one a retry policy retries
/// by default. A limiter refuses with nothing else;
/// [`response`](GrpcRefusal::response) maps the rest for handlers:
/// [`Error::KeyBusy`] `RESOURCE_EXHAUSTED`, [`Error::Spawn`]
/// `UNAVAILABLE`, [`Error::WorkerPanicked`], [`Error::NoRuntime`] and
/// [`Error::CallingSelf`] `INTERNAL` (13, without pushback).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use sidejob::tower::{GrpcRefusal, LimitLayer};
/// use sidejob::{Error, Limiter};
///
/// let refusal = GrpcRefusal::new();
/// let answer: http::Response<()> = refusal.response(Error::Overload);
/// assert_eq!(answer.status(), http::StatusCode::OK); // gRPC's way
/// assert_eq!(answer.headers()["grpc-status"], "8"); // RESOURCE_EXHAUSTED
/// assert_eq!(answer.headers()["grpc-retry-pushback-ms"], "1000");
///
/// // On a tonic server: Server::builder().layer(layer).add_service(..)
/// let layer = LimitLayer::new(Arc::new(Limiter::new(64)?)).refuse_with(refusal);
/// # let _ = layer;
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcRefusal {
    retry_after_ms: Option<u64>,
}

/// gRPC's status codes used here (the numbers of gRPC's `Code` enum).
const RESOURCE_EXHAUSTED: u16 = 8;
const OUT_OF_RANGE: u16 = 11;
const INTERNAL: u16 = 13;
const UNAVAILABLE: u16 = 14;

impl GrpcRefusal {
    /// `RESOURCE_EXHAUSTED` for overload, `UNAVAILABLE` for timeout and
    /// shutdown, with a retry pushback of 1 second.
    pub const fn new() -> Self {
        GrpcRefusal {
            retry_after_ms: Some(1000),
        }
    }

    /// The `grpc-retry-pushback-ms` of every `RESOURCE_EXHAUSTED` and
    /// `UNAVAILABLE`, in milliseconds rounded up and saturating at
    /// `u64::MAX`, or `None` for none. Default: 1 second.
    pub fn retry_after(mut self, after: Option<Duration>) -> Self {
        self.retry_after_ms =
            after.map(|d| u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX));
        self
    }

    /// The gRPC status code (`grpc-status`) this answers `error` with;
    /// see the table above.
    pub fn code(&self, error: Error) -> u16 {
        match error {
            Error::Overload | Error::KeyBusy => RESOURCE_EXHAUSTED,
            Error::Timeout | Error::Shutdown | Error::Spawn(_) => UNAVAILABLE,
            Error::WorkerPanicked | Error::NoRuntime | Error::CallingSelf => INTERNAL,
            Error::TooLarge => OUT_OF_RANGE,
        }
    }

    /// The trailers-only response this answers `error` with.
    pub fn response<B: Default>(&self, error: Error) -> Response<B> {
        let code = self.code(error);
        let mut response = Response::new(B::default());
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from(code));
        if let Ok(message) = HeaderValue::try_from(percent_encode(&error.to_string())) {
            headers.insert("grpc-message", message);
        }
        // Pushback only where a retry may help: not on `INTERNAL`, nor on
        // `OUT_OF_RANGE` (a request too large for the whole capacity).
        let retry = code == RESOURCE_EXHAUSTED || code == UNAVAILABLE;
        if let (true, Some(ms)) = (retry, self.retry_after_ms) {
            headers.insert("grpc-retry-pushback-ms", HeaderValue::from(ms));
        }
        response
    }
}

impl Default for GrpcRefusal {
    fn default() -> Self {
        GrpcRefusal::new()
    }
}

impl<B: Default, E> Refusal<Response<B>, E> for GrpcRefusal {
    type Error = E;

    fn refuse(&self, error: Error) -> Result<Response<B>, E> {
        Ok(self.response(error))
    }
}

/// Whole seconds, rounded up: a `Retry-After` of 1.2 s is `2`. Saturates
/// at `u64::MAX` (a `Duration::MAX` must not wrap to 0, "retry at once").
fn whole_seconds(after: Duration) -> u64 {
    after
        .as_secs()
        .saturating_add(u64::from(after.subsec_nanos() > 0))
}

/// `grpc-message` is percent-encoded: bytes outside printable ASCII, and
/// `%` itself, as `%XX` (gRPC's PROTOCOL-HTTP2, "Responses").
fn percent_encode(message: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(message.len());
    for &byte in message.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_seconds_round_up() {
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
    }

    #[test]
    fn the_longest_retry_after_saturates() {
        // Duration::MAX is u64::MAX seconds and a fraction: rounding up
        // must not wrap to 0 ("retry at once") nor panic.
        assert_eq!(whole_seconds(Duration::MAX), u64::MAX);
        let http: Response<()> = HttpRefusal::new()
            .retry_after(Some(Duration::MAX))
            .response(Error::Overload);
        assert_eq!(http.headers()[RETRY_AFTER], u64::MAX.to_string().as_str());
        let grpc: Response<()> = GrpcRefusal::new()
            .retry_after(Some(Duration::MAX))
            .response(Error::Overload);
        assert_eq!(
            grpc.headers()["grpc-retry-pushback-ms"],
            u64::MAX.to_string().as_str()
        );
    }

    #[test]
    fn grpc_messages_are_percent_encoded() {
        assert_eq!(percent_encode("timed out"), "timed out");
        assert_eq!(percent_encode("100% é\n"), "100%25 %C3%A9%0A");
    }
}
