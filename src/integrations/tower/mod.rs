//! [`LimitLayer`]: tower middleware that admits each request through a
//! [`Limiter`], failing fast with [`Error::Overload`] when it is full, or
//! waiting in the limiter's waiting room.
//!
//! Most Rust services that need load shedding are tower services (axum,
//! tonic, hyper). Wrap the handlers you want bounded in a [`LimitLayer`]:
//! each request takes one unit of the limiter when the service is
//! *called*, holds it until the inner service's response future completes
//! (or, [as an option](#streamed-bodies), until the response body ends),
//! and is refused at once when every unit is out, with an error or an
//! HTTP or gRPC answer ([`HttpRefusal`], [`GrpcRefusal`]).
//!
//! # Why the unit is taken in `call`, not in `poll_ready`
//!
//! tower's own [`ConcurrencyLimit`] reserves a permit in `poll_ready` and
//! holds it until `call`. That is tower's backpressure contract, but for a
//! server it goes wrong three ways:
//!
//! * a clone that is polled ready and then not called (or called late)
//!   holds a unit nobody uses, starving the other clones;
//! * behind `LoadShed`, a request is shed because *this clone* could not
//!   reserve, even when a unit is free a moment later;
//! * hyper calls `poll_ready` before any request has arrived, so every idle
//!   keep-alive connection holds a permit (vector PR #26457), and users who
//!   ask for "a limit that rejects instead of queueing" (tower#793) get a
//!   queue of connections instead.
//!
//! So [`Limit::poll_ready`](tower_service::Service::poll_ready) only asks
//! the inner service, never reserves and never waits for capacity;
//! [`call`](tower_service::Service::call) takes the unit (a few
//! nanoseconds), and on refusal returns a future that is ready at once
//! with the refusal, without calling the inner service. The cost: a caller
//! learns about overload from the response, not from `poll_ready`, which
//! is exactly what a load-shedding server wants.
//!
//! # The inner service's reservation
//!
//! `poll_ready` passes the inner service's readiness on, and an inner
//! service that reserves in `poll_ready` (tower's [`ConcurrencyLimit`] a
//! permit, `Buffer` a slot) holds that reservation for the request that
//! follows; tower ends a reservation only when the service is called or
//! dropped. A refused request never reaches the inner service, so `call`
//! drops the polled inner service and keeps a fresh, unpolled clone for
//! the next `poll_ready`: the refused clone holds nothing, and another
//! clone (another keep-alive connection) reserves at once. A request that
//! must [wait](#waiting) does the same and waits with an unpolled clone of
//! its own. Neither holds an inner reservation it does not use.
//!
//! So the inner service must be `Clone` in both modes. The services a
//! tower stack hands a layer nearly always are (axum's routes and
//! handlers, tonic's generated servers, `BoxCloneService`; hyper-util's
//! `TowerToHyperService` requires it too); put one that is not behind
//! tower's `Buffer`. An admitted request clones nothing; a refusal costs
//! one clone of the inner service (for a boxed service, axum's `Route`
//! among them, an allocation). tower's own
//! `Filter`, which needs no `Clone`, keeps the reservation when it
//! rejects: the starvation above.
//!
//! # What a refusal looks like
//!
//! By default ([`Reject`]) the service's error is tower's boxed error,
//! [`BoxError`], and a refusal is [`Error::Overload`] inside it:
//! `err.downcast_ref::<sidejob::Error>()`. [`LimitLayer::refuse_with`]
//! answers refusals with a response instead, and the service keeps the
//! inner service's error type (an axum route needs no
//! `HandleErrorLayer`):
//!
//! * [`HttpRefusal`] (feature `http`): `503 Service Unavailable` when every
//!   unit is out, after a `max_wait` and on shutdown; `429 Too Many
//!   Requests` (or `503`, your choice) when a waiting layer's room is
//!   full; each with `Retry-After`. `413 Content Too Large`, without, for
//!   a [weighed](#weighed-requests) request above the whole capacity.
//! * [`GrpcRefusal`] (feature `http`): gRPC's `RESOURCE_EXHAUSTED` for
//!   overload, `UNAVAILABLE` after a `max_wait` and on shutdown, with
//!   gRPC's retry pushback, as a tonic client reads them; `OUT_OF_RANGE`,
//!   without, for a weighed request above the whole capacity.
//! * [`LimitLayer::on_overload`]: a function of yours from the [`Error`]
//!   to a response.
//!
//! # Streamed bodies
//!
//! By default ([`UntilResponse`]) the unit is held until the inner
//! service's *response future* completes, that is, until the response
//! head (status and headers) is ready. A body streamed after that is not
//! covered: the limit bounds how many handlers run at once, not how many
//! responses are still being sent. A handler that builds its whole body
//! before returning (the usual axum handler) is covered in full.
//!
//! [`LimitLayer::hold_until_body_ends`] (feature `http`, for services
//! answering `http::Response<B>`) moves the unit into the response body
//! ([`HeldBody`]): it goes back when the body's last frame is out, when
//! the body fails, or when it is dropped (a client that hung up), so the
//! limit bounds the live bodies, streaming ones included. The time in the
//! limit (`record_time`) then runs to the body's end too. A refused
//! request's body holds nothing, and an empty body none either.
//!
//! # Weighed requests
//!
//! [`LimitLayer::weigh`] makes a request take as many units as a function
//! of it says (an upload its `Content-Length`, a query its cost), all or
//! nothing, in `call`, and hold them as one unit is held: until the
//! response future completes, or through the body with
//! [`hold_until_body_ends`](#streamed-bodies). A weight
//! of 0 counts as 1. A request weighing more than the limiter's capacity
//! in force is refused at once with [`Error::TooLarge`] (in a waiting
//! layer too: it never waits), which [`HttpRefusal`] answers `413 Content
//! Too Large` and [`GrpcRefusal`] `OUT_OF_RANGE`, both without a retry
//! hint; one whose units are not all free is refused with
//! [`Error::Overload`] (`503`), or waits for all of them in a waiting
//! layer.
//!
//! The weight is a type parameter of the layer ([`Unweighed`], the
//! default, or [`Weighed`]): an unweighed layer keeps its types and its
//! cost, a guard of one unit with no count in it
//! (`benches/tower.rs`).
//!
//! # Priority classes
//!
//! [`LimitLayer::classify`] reads each request's [`Class`](crate::Class)
//! through a closure of yours (a header, a request extension an
//! authentication layer set, the route), and
//! [`LimitLayer::classify_by_header`] (feature `http`) from a header such
//! as `x-priority`, by the one documented mapping,
//! [`Class::from_header`](crate::Class::from_header): a class's name, and
//! the default class, `Critical`, for a missing header or a value that
//! names no class (never an error, never a way ahead). A gRPC call's
//! metadata are HTTP headers, so a tonic server reads the class the same
//! way.
//!
//! A request of class `c` takes its units only while the limiter holds
//! less than the fraction of its capacity `c` may fill (its
//! [headroom](crate::LimiterBuilder::headroom): `Critical` and
//! `CriticalPlus` the whole capacity, `SheddablePlus` 90 % and
//! `Sheddable` 80 % by default). So under overload the sheddable classes
//! are refused first, with the answers above (`503`, `RESOURCE_EXHAUSTED`),
//! while the classes above them are still served; a request that weighs
//! more than its class's whole share is shed the same way at once (never
//! a wait), and only one that weighs more than the whole capacity is
//! `TooLarge`. In a
//! waiting layer, a request that finds its class's share full waits, and a
//! freed unit goes to the most important class waiting (`CriticalPlus`
//! ahead of everyone). Each class's figures are in
//! [`Stats::classes`](crate::Stats::classes) and the metrics export.
//!
//! Classes and weights compose: `.weigh(..).classify(..)` (or the other
//! way round) makes each request take its weight in units of its class.
//! The layer's last type parameter is a [`Describe`]r of requests
//! ([`Unweighed`], [`Weighed`], [`Classified`]); an unclassified layer
//! keeps its types and its cost.
//!
//! # Waiting
//!
//! [`LimitLayer::new`] fails fast. [`LimitLayer::waiting`] makes a layer
//! that, when every unit is out, queues the request in the limiter's
//! waiting room ([`max_waiters`](crate::LimiterBuilder::max_waiters),
//! [`max_wait`](crate::LimiterBuilder::max_wait),
//! [`queue_order`](crate::LimiterBuilder::queue_order)) and calls the inner
//! service once a unit is handed to it: for example 10 at once, 20 more
//! waiting, `429` past that. Its refusals are [`Error::Overload`] (the
//! waiting room is full too: [`HttpRefusal`] answers `429`),
//! [`Error::Timeout`] (waited `max_wait`: `503`) and [`Error::Shutdown`]
//! (the limiter was closed: `503`); a [`Refusal`] of your own tells them
//! apart through [`Refusal::refuse_waiting`].
//!
//! The wait happens inside the response future, never in `poll_ready`
//! (which stays non-reserving and non-blocking, for the reasons above).
//! Dropping the response future (a client that hung up) leaves the queue
//! at once; a unit handed to it meanwhile goes to the next waiter. A unit
//! free at `call` is taken there, as in the fail-fast layer, and the inner
//! service is called at once; only a request that must wait pays for it:
//! two clones of the inner service and one allocation for the wait. The
//! request waits with a clone that was never polled ready, so it holds no
//! reservation of the inner service while it waits (the clone polled
//! ready for it is dropped in `call`, the other clone stays behind for the
//! next `poll_ready`). Once a unit is handed to it, the response future
//! polls its clone ready and then calls it; the unit is held meanwhile (the
//! request is admitted, the inner service not yet ready for it), and goes
//! back if the inner service's `poll_ready` fails (that error is the
//! answer) or the response future is dropped.
//!
//! Why a constructor of its own rather than "wait whenever the limiter has
//! a waiting room":
//!
//! * A layer is a call site, like [`Limiter::try_acquire`] (never waits)
//!   and [`Limiter::acquire`] (waits under the policy). One limiter can
//!   bound an API route that must fail fast and a batch route that may
//!   queue, sharing one capacity; deciding by the limiter alone would make
//!   that impossible.
//! * Waiting needs a response future that carries the request and a
//!   clone of the inner service, to call it later. The fail-fast layer
//!   needs neither, so its future stays the small one it was: its cost is
//!   unchanged (`benches/tower.rs`).
//!
//! A waiting layer over a limiter with no waiting room (`max_waiters` 0,
//! the default) refuses at once in `call`, as the fail-fast layer does:
//! build the limiter with a room for it to wait.
//!
//! # tonic
//!
//! A tonic server takes tower layers with `Server::builder().layer(..)`,
//! and [`GrpcRefusal`] answers in gRPC's own terms, so a tonic client gets
//! a `Status` (`RESOURCE_EXHAUSTED`, `UNAVAILABLE`) rather than a
//! transport error:
//!
//! ```text
//! use std::sync::Arc;
//! use sidejob::{tower::{GrpcRefusal, LimitLayer}, Limiter};
//!
//! let limiter = Arc::new(Limiter::new(64)?);
//! tonic::transport::Server::builder()
//!     .layer(LimitLayer::new(limiter).refuse_with(GrpcRefusal::new()))
//!     .add_service(GreeterServer::new(MyGreeter::default()))
//!     .serve(addr)
//!     .await?;
//! ```
//!
//! `examples/tonic_server.rs` serves a service on loopback this way and
//! `tests/grpc.rs` calls it with a real tonic client. (Not compiled here:
//! a tonic service is usually generated by `tonic-build`; the example
//! writes one by hand.)
//!
//! # Tracing
//!
//! With the feature `tracing`, a request that waits opens a `wait` span
//! (target `sidejob::tower`, level `DEBUG`, its `outcome` recorded when
//! the wait ends) and each refusal emits a `refused` event (its `error`,
//! and whether it `waited`), both inside the request's span: the span
//! current when the layer is called, which tower-http's `TraceLayer` or
//! any tracing middleware outside this layer sets. An admitted request
//! that did not wait emits nothing.
//!
//! [`ConcurrencyLimit`]: https://docs.rs/tower/latest/tower/limit/struct.ConcurrencyLimit.html
// Without the feature `http` its items are not built: their links point to
// the sections that describe them instead of breaking.
#![cfg_attr(
    not(feature = "http"),
    doc = "[`HttpRefusal`]: self#what-a-refusal-looks-like\n\
           [`GrpcRefusal`]: self#what-a-refusal-looks-like\n\
           [`HeldBody`]: self#streamed-bodies\n\
           [`LimitLayer::hold_until_body_ends`]: self#streamed-bodies\n\
           [`LimitLayer::classify_by_header`]: self#priority-classes"
)]

use crate::adaptive::{Controller, Outcome};
use crate::error::Error;
use crate::limiter::Limiter;
use crate::sync::Arc;
use crate::units::{One, Units};
use crossbeam_utils::CachePadded;
use std::fmt;
use tower_layer::Layer;

mod describe;
mod future;
mod hold;
mod service;
#[cfg(feature = "http")]
mod status;
mod trace;

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use describe::ByHeader;
use describe::{Carry, First};
pub use describe::{Classified, Classify, Describe, Keyed, Unweighed, Weighed, Weight};
use future::{Acquire, Deferred, State, WaitState};
pub use future::{ResponseFuture, WaitResponseFuture};
use hold::Held;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use hold::{HeldBody, UntilBodyEnd};
pub use hold::{Hold, UntilResponse};
pub use service::Limit;
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub use status::{GrpcRefusal, HttpRefusal};

/// tower's boxed error (the same type as `tower::BoxError`), the error of a
/// [`Limit`] that [`Reject`]s.
// A departure from the house rule against `Box<dyn Error>` in public
// signatures: it is tower's convention for middleware that adds an error
// of its own (`LoadShed`, `Timeout`), and what `HandleErrorLayer` expects.
// Users who want typed errors use `on_overload`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A [`Layer`] that wraps services in a [`Limit`]: each request admitted
/// through one shared [`Limiter`], refused at once when it is full.
///
/// Cloning the layer, or the services it makes, shares the limiter: the
/// capacity bounds all of them together.
///
/// # Examples
///
/// A refusal is [`Error::Overload`] inside tower's boxed error:
///
/// ```
/// use std::sync::Arc;
/// use sidejob::{tower::LimitLayer, Error, Limiter};
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let limiter = Arc::new(Limiter::new(1)?);
/// let mut service = LimitLayer::new(Arc::clone(&limiter))
///     .layer(service_fn(|n: u32| async move { Ok::<_, std::convert::Infallible>(n * 2) }));
///
/// // Called but not yet polled: the first response holds the only unit.
/// let first = service.ready().await?.call(21);
/// let refused = service.ready().await?.call(1).await.unwrap_err();
/// assert_eq!(refused.downcast_ref::<Error>(), Some(&Error::Overload));
///
/// assert_eq!(first.await?, 42); // completes, gives the unit back
/// assert_eq!(service.ready().await?.call(2).await?, 4);
/// assert_eq!(limiter.stats().rejected, 1);
/// # Ok(())
/// # }
/// ```
pub struct LimitLayer<R = Reject, M = FailFast, H = UntilResponse, W = Unweighed> {
    limiter: Arc<Limiter>,
    anchors: Anchors,
    refusal: R,
    timer: TimerSpec,
    mode: M,
    hold: H,
    describe: W,
}

/// The mode of a [`LimitLayer`] made by [`LimitLayer::new`]: a request
/// that finds every unit out is refused at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct FailFast;

/// The mode of a [`LimitLayer`] made by [`LimitLayer::waiting`]: a request
/// that finds every unit out waits in the limiter's waiting room.
#[derive(Debug, Clone, Copy, Default)]
pub struct Wait;

impl LimitLayer<Reject> {
    /// A layer admitting requests through `limiter`; refusals are
    /// [`Error::Overload`] in a [`BoxError`].
    ///
    /// The inner service must be `Clone`: a refused request gives back
    /// what the inner service reserved in `poll_ready` by dropping it for
    /// a fresh clone (see
    /// [The inner service's reservation](self#the-inner-services-reservation)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::{tower::LimitLayer, Limiter};
    ///
    /// let layer = LimitLayer::new(Arc::new(Limiter::new(64)?));
    /// assert_eq!(layer.limiter().capacity(), 64);
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    pub fn new(limiter: Arc<Limiter>) -> Self {
        LimitLayer {
            anchors: anchors(&limiter),
            limiter,
            refusal: Reject,
            timer: TimerSpec::default(),
            mode: FailFast,
            hold: UntilResponse,
            describe: Unweighed,
        }
    }
}

impl LimitLayer<Reject, Wait> {
    /// A layer admitting requests through `limiter`, waiting under its
    /// waiting policy when every unit is out; refusals are an [`Error`] in
    /// a [`BoxError`]. See [Waiting](self#waiting).
    ///
    /// A request that finds a unit free is admitted in `call`, as with
    /// [`new`](LimitLayer::new). Otherwise its response future waits, as
    /// [`Limiter::acquire_owned_async`] does, and calls the inner service
    /// once a unit is handed to it. The refusals:
    ///
    /// * [`Error::Overload`] at once when the waiting room is full (or the
    ///   limiter has none), counted in [`Stats::rejected`](crate::Stats::rejected);
    /// * [`Error::Timeout`] after [`max_wait`](crate::LimiterBuilder::max_wait),
    ///   counted in [`Stats::timed_out`](crate::Stats::timed_out);
    /// * [`Error::Shutdown`] once the limiter is closed.
    ///
    /// The inner service must be `Clone`: a request that waits is sent to
    /// a clone of it later, from its response future, polled ready only
    /// once a unit is handed over (see
    /// [The inner service's reservation](self#the-inner-services-reservation)).
    ///
    /// # Examples
    ///
    /// 10 requests at once, up to 20 more wait (for at most 10 s), `429
    /// Too Many Requests` past that, `503 Service Unavailable` for a
    /// request that waited 10 s or a limiter that was closed; this is what
    /// [`HttpRefusal`] (feature `http`) answers, written out:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use axum::http::{header, StatusCode};
    /// use axum::response::IntoResponse;
    /// use axum::{routing::post, Router};
    /// use sidejob::{tower::LimitLayer, Error, Limiter};
    ///
    /// let limiter = Limiter::builder()
    ///     .capacity(10)
    ///     .max_waiters(20)
    ///     .max_wait(Duration::from_secs(10))
    ///     .build()?;
    /// let layer = LimitLayer::waiting(Arc::new(limiter)).on_overload(|e: Error| {
    ///     let status = match e {
    ///         Error::Overload => StatusCode::TOO_MANY_REQUESTS, // the waiting room is full
    ///         _ => StatusCode::SERVICE_UNAVAILABLE, // waited 10 s (Timeout), or closed (Shutdown)
    ///     };
    ///     (status, [(header::RETRY_AFTER, "1")]).into_response()
    /// });
    /// let app: Router = Router::new().route("/facet", post(|| async { "called" }).layer(layer));
    /// # let _ = app;
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    ///
    /// In-process, a request waits for the unit a finished one frees:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::{tower::LimitLayer, Error, Limiter};
    /// use tower::{service_fn, Layer, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let limiter = Arc::new(Limiter::builder().capacity(1).max_waiters(1).build()?);
    /// let mut service = LimitLayer::waiting(Arc::clone(&limiter))
    ///     .layer(service_fn(|n: u32| async move { Ok::<_, std::convert::Infallible>(n * 2) }));
    ///
    /// let first = service.ready().await?.call(1); // holds the only unit
    /// let second = tokio::spawn(service.ready().await?.call(2)); // will wait
    /// while limiter.waiting() == 0 {
    ///     tokio::task::yield_now().await;
    /// }
    /// // The room is full: the third is refused at once.
    /// let third = service.ready().await?.call(3).await.unwrap_err();
    /// assert_eq!(third.downcast_ref::<Error>(), Some(&Error::Overload));
    ///
    /// assert_eq!(first.await?, 2); // frees the unit: handed to the second
    /// assert_eq!(second.await??, 4);
    /// let stats = limiter.stats();
    /// assert_eq!((stats.accepted, stats.waited, stats.rejected), (2, 1, 1));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(
        not(feature = "http"),
        doc = "[`HttpRefusal`]: crate::tower#what-a-refusal-looks-like"
    )]
    pub fn waiting(limiter: Arc<Limiter>) -> Self {
        LimitLayer {
            anchors: anchors(&limiter),
            limiter,
            refusal: Reject,
            timer: TimerSpec::default(),
            mode: Wait,
            hold: UntilResponse,
            describe: Unweighed,
        }
    }
}

impl<R, M, H, W> LimitLayer<R, M, H, W> {
    /// Answers refused requests with `respond(error)` instead of an error;
    /// the service then keeps the inner service's error type (for axum:
    /// `Infallible`, so the layer goes on a route as it is).
    ///
    /// `error` is [`Error::Overload`] when every unit is out (for a
    /// [waiting](LimitLayer::waiting) layer: and the waiting room is full),
    /// [`Error::Timeout`] when a waiting request waited its `max_wait`,
    /// [`Error::TooLarge`] when a [weighed](LimitLayer::weigh) request
    /// weighs more than the whole capacity, and [`Error::Shutdown`] once
    /// the limiter is [closed](Limiter::close). [`HttpRefusal`] and [`GrpcRefusal`]
    /// (feature `http`, with [`refuse_with`](LimitLayer::refuse_with))
    /// are this mapping ready-made.
    ///
    /// # Examples
    ///
    /// An axum route answering `503` with `Retry-After` when full:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use axum::http::{header, StatusCode};
    /// use axum::response::IntoResponse;
    /// use axum::{routing::get, Router};
    /// use sidejob::{tower::LimitLayer, Limiter};
    ///
    /// let limiter = Arc::new(Limiter::new(64)?);
    /// let busy = LimitLayer::new(limiter).on_overload(|_| {
    ///     (StatusCode::SERVICE_UNAVAILABLE, [(header::RETRY_AFTER, "1")]).into_response()
    /// });
    /// let app: Router = Router::new()
    ///     .route("/work", get(|| async { "done" }).layer(busy))
    ///     .route("/health", get(|| async { "ok" }));
    /// # let _ = app;
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    #[cfg_attr(
        not(feature = "http"),
        doc = "[`HttpRefusal`]: crate::tower#what-a-refusal-looks-like"
    )]
    #[cfg_attr(
        not(feature = "http"),
        doc = "[`GrpcRefusal`]: crate::tower#what-a-refusal-looks-like"
    )]
    pub fn on_overload<F>(self, respond: F) -> LimitLayer<RespondWith<F>, M, H, W> {
        self.refuse_with(RespondWith(respond))
    }

    /// Answers refused requests with `refusal`: [`HttpRefusal`] for an
    /// HTTP service, [`GrpcRefusal`] for a tonic server (both feature
    /// `http`), or a [`Refusal`] of your own. See
    /// [What a refusal looks like](self#what-a-refusal-looks-like).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "http")] {
    /// use std::sync::Arc;
    /// use axum::http::StatusCode;
    /// use sidejob::tower::{HttpRefusal, LimitLayer};
    /// use sidejob::Limiter;
    ///
    /// let limiter = Limiter::builder().capacity(10).max_waiters(20).build()?;
    /// // 503 past the waiting room too, for a load balancer that retries only 503.
    /// let refusal = HttpRefusal::new().room_full(StatusCode::SERVICE_UNAVAILABLE);
    /// let layer = LimitLayer::waiting(Arc::new(limiter)).refuse_with(refusal);
    /// # let _ = layer;
    /// # }
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    #[cfg_attr(
        not(feature = "http"),
        doc = "[`HttpRefusal`]: crate::tower#what-a-refusal-looks-like"
    )]
    #[cfg_attr(
        not(feature = "http"),
        doc = "[`GrpcRefusal`]: crate::tower#what-a-refusal-looks-like"
    )]
    pub fn refuse_with<R2>(self, refusal: R2) -> LimitLayer<R2, M, H, W> {
        LimitLayer {
            limiter: self.limiter,
            anchors: self.anchors,
            refusal,
            timer: self.timer,
            mode: self.mode,
            hold: self.hold,
            describe: self.describe,
        }
    }

    /// Holds each admitted request's unit until its response *body* ends
    /// or is dropped, not only until the response head is ready, so the
    /// limit bounds streaming bodies too (see
    /// [Streamed bodies](self#streamed-bodies)).
    ///
    /// For services answering `http::Response<B>` (axum, hyper, tonic);
    /// the layer's services then answer `http::Response<HeldBody<B>>`.
    /// The unit goes back when the body yields its last frame, fails, or
    /// is dropped (the client hung up); with `record_time` (feature
    /// `metrics`), the time in the limit runs until then too.
    ///
    /// # Examples
    ///
    /// At most 2 downloads streaming at once; the third is refused while
    /// two bodies are still being sent, though both handlers returned:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use axum::body::Body;
    /// use axum::http::{Request, StatusCode};
    /// use axum::{routing::get, Router};
    /// use http_body_util::BodyExt;
    /// use sidejob::tower::{HttpRefusal, LimitLayer};
    /// use sidejob::Limiter;
    /// use tower::ServiceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let limiter = Arc::new(Limiter::new(2)?);
    /// let layer = LimitLayer::new(Arc::clone(&limiter))
    ///     .refuse_with(HttpRefusal::new())
    ///     .hold_until_body_ends();
    /// let app: Router = Router::new().route("/download", get(|| async { "a large file" }).layer(layer));
    /// let get = || Request::get("/download").body(Body::empty()).unwrap();
    ///
    /// let first = app.clone().oneshot(get()).await?; // head ready, body not sent
    /// let second = app.clone().oneshot(get()).await?;
    /// assert_eq!(limiter.usage(), 2);
    /// let third = app.clone().oneshot(get()).await?;
    /// assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
    ///
    /// let body = first.into_body().collect().await?.to_bytes(); // sent: the unit goes back
    /// assert_eq!(body, "a large file");
    /// drop(second); // a client that hung up: the unit goes back too
    /// assert_eq!(limiter.usage(), 0);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub fn hold_until_body_ends(self) -> LimitLayer<R, M, UntilBodyEnd, W> {
        self.made_over(|_| UntilBodyEnd, |describe| describe)
    }

    /// Records each admitted request's time in the limit (admission to the
    /// response future's completion, or to the body's end with
    /// [`hold_until_body_ends`](crate::tower#streamed-bodies), in
    /// seconds) in the histogram `sidejob_hold_seconds{name, kind="limiter"}`,
    /// under the limiter's [`name`](Limiter::name): the same series name
    /// as the [`Reporter`](crate::observe::Reporter) exporting the
    /// limiter's counters, with no name to repeat by hand.
    ///
    /// The histogram handle is registered now, with the `metrics` recorder
    /// installed now: install your exporter first. Each admitted request
    /// then pays two clock reads and one histogram record (tens of
    /// nanoseconds); refused requests pay nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::{tower::LimitLayer, Limiter};
    ///
    /// let limiter = Limiter::builder().name("api").capacity(64).build()?;
    /// let layer = LimitLayer::new(Arc::new(limiter)).record_time();
    /// # let _ = layer;
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn record_time(mut self) -> Self {
        self.timer.histogram = Some(crate::integrations::metrics::time_histogram(
            self.limiter.name(),
            "limiter",
        ));
        self
    }

    /// Feeds an adaptive [`Controller`] with each admitted request's time
    /// in the limit: a success when the inner service answers `Ok`, a drop
    /// ([`Outcome::Dropped`]) when it answers an error (a timeout layer's,
    /// say). The controller moves the limiter's capacity from these
    /// samples; build it over this layer's limiter.
    ///
    /// About one admitted request in the controller's
    /// [`sample_every`](crate::adaptive::ControllerBuilder::sample_every)
    /// then pays two clock reads and a few relaxed atomic adds, the others
    /// a thread-local countdown; refused requests pay nothing. The sample is recorded
    /// just before the unit goes back, and may close the controller's
    /// window (its algorithm then runs on this task, under no lock).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::adaptive::{Controller, Guarded};
    /// use sidejob::{tower::LimitLayer, Limiter};
    ///
    /// let limiter = Arc::new(Limiter::new(64)?);
    /// let controller = Controller::builder().build(Arc::clone(&limiter), Guarded::default())?;
    /// let layer = LimitLayer::new(limiter).adaptive(Arc::new(controller));
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn adaptive(mut self, controller: Arc<Controller>) -> Self {
        self.timer.adaptive = Some(controller);
        self
    }

    /// The limiter requests are admitted through.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }
}

impl<R, M, H, W> LimitLayer<R, M, H, W> {
    /// Names each request's tenant: `key(&request)` (a header, a path
    /// segment, an authenticated account: anything `Hash`), so the
    /// limiter shares its capacity fairly among tenants (their weights,
    /// caps and the fair line are the limiter's settings; see
    /// [`guide::fairness`](crate::guide::fairness)). A tenant over its
    /// cap is refused with [`Error::KeyBusy`](crate::Error::KeyBusy)
    /// (`429`, or `RESOURCE_EXHAUSTED`); one over its share while the
    /// capacity binds with [`Error::Overload`](crate::Error::Overload)
    /// (fail-fast), or it waits behind the tenants under theirs (a
    /// [waiting](LimitLayer::waiting) layer).
    ///
    /// Set last: a keyed layer keeps the weight and class its describer
    /// gave (call [`weigh`](LimitLayer::weigh) and
    /// [`classify`](LimitLayer::classify) before this). The closure runs
    /// in `call`, once per request, before any unit is taken; it should
    /// be cheap and must not panic.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Builder::new_current_thread().build()?;
    /// # rt.block_on(async {
    /// use std::sync::Arc;
    /// use sidejob::tower::LimitLayer;
    /// use sidejob::{Error, Limiter};
    /// use tower::{service_fn, Layer, Service, ServiceExt};
    ///
    /// // Tenant "a" may hold one unit at once.
    /// let limiter = Arc::new(Limiter::builder().capacity(8).key_cap("a", 1).build()?);
    /// let layer = LimitLayer::new(Arc::clone(&limiter))
    ///     .key_by(|request: &(&'static str, u32)| request.0);
    /// let mut service = layer.layer(service_fn(|request: (&'static str, u32)| async move {
    ///     Ok::<_, Error>(request.1)
    /// }));
    /// let held = service.ready().await?.call(("a", 1)); // admitted, not yet run
    /// let refused = service.ready().await?.call(("a", 2)).await;
    /// assert!(matches!(refused, Err(e) if e.to_string().contains("key")));
    /// assert_eq!(service.ready().await?.call(("b", 3)).await?, 3);
    /// assert_eq!(held.await?, 1);
    /// assert_eq!(limiter.key_usage("a"), 0);
    /// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    /// ```
    pub fn key_by<F>(self, key: F) -> LimitLayer<R, M, H, Keyed<F, W>> {
        self.describe_with(|inner| Keyed { key, inner })
    }

    /// The same layer with its describer made over by `f`.
    fn describe_with<W2>(self, f: impl FnOnce(W) -> W2) -> LimitLayer<R, M, H, W2> {
        self.made_over(|hold| hold, f)
    }

    /// The same layer with how long a request holds its units made over
    /// by `hold`, and its describer by `describe`: the one place the
    /// layer's other fields are moved across to a layer of other types.
    fn made_over<H2, W2>(
        self,
        hold: impl FnOnce(H) -> H2,
        describe: impl FnOnce(W) -> W2,
    ) -> LimitLayer<R, M, H2, W2> {
        LimitLayer {
            limiter: self.limiter,
            anchors: self.anchors,
            refusal: self.refusal,
            timer: self.timer,
            mode: self.mode,
            hold: hold(self.hold),
            describe: describe(self.describe),
        }
    }
}

impl<R, M, H, W: Weight> LimitLayer<R, M, H, W> {
    /// Weighs each request: `weigh(&request)` units of the limiter are
    /// taken for it in `call`, all or nothing, and held until its response
    /// future completes (or, with
    /// [`hold_until_body_ends`](crate::tower#streamed-bodies), until its
    /// body ends), as one unit is for an unweighed layer. For example an
    /// upload weighed by its `Content-Length` in KiB, so that a limiter of
    /// 64 Mi units bounds the bytes being received at once, not the
    /// uploads. See [Weighed requests](self#weighed-requests).
    ///
    /// * A weight of **0 counts as 1**: every admitted request holds at
    ///   least one unit. A weigher by `Content-Length` answers 0 for a
    ///   request without a body (a `GET`), and those requests still run
    ///   handlers; letting them in for free would let a flood of them past
    ///   the limit. Route what must not be limited around the layer.
    /// * A request weighing more than the limiter's
    ///   [capacity](Limiter::capacity) in force is refused at once with
    ///   [`Error::TooLarge`] (not counted in
    ///   [`Stats::rejected`](crate::Stats::rejected)), in either mode: it
    ///   could not be admitted as the limiter stands, so it never waits.
    ///   [`HttpRefusal`] answers it `413 Content Too Large` without
    ///   `Retry-After`, [`GrpcRefusal`] `OUT_OF_RANGE` without retry
    ///   pushback: retrying the same request cannot help.
    /// * Otherwise a request whose units are not all free is refused with
    ///   [`Error::Overload`] (`503`, or `RESOURCE_EXHAUSTED`), or, in a
    ///   [waiting](LimitLayer::waiting) layer, waits for all of them, as
    ///   [`Limiter::acquire_many_owned_async`] does (small requests may
    ///   pass a large one within the limiter's
    ///   [pass budget](crate::LimiterBuilder::pass_budget)).
    ///
    /// The weigher runs in `call`, once per request, before the units are
    /// taken and under no lock of the limiter's; it should be cheap (read
    /// a header, not the body). It must be annotated with the request
    /// type (`|request: &Request<Body>| ..`): the layer does not know the
    /// request type until it wraps a service.
    ///
    /// The unweighed layer is untouched by this: its requests take one
    /// unit on the path they always did ([`Unweighed`]). A weighed layer
    /// may be [classified](LimitLayer::classify) too, before or after
    /// `weigh`. Weighing a weighed layer again replaces its weigher.
    ///
    /// # Examples
    ///
    /// An axum route whose uploads hold their `Content-Length` in bytes of
    /// a 1 MiB budget:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use axum::body::Body;
    /// use axum::http::{header, Request, StatusCode};
    /// use axum::{routing::post, Router};
    /// # #[cfg(feature = "http")]
    /// use sidejob::tower::{HttpRefusal, LimitLayer};
    /// use sidejob::Limiter;
    /// use tower::ServiceExt;
    ///
    /// /// The request's `Content-Length`, or 0 (which counts as one unit).
    /// fn content_length(request: &Request<Body>) -> usize {
    ///     request
    ///         .headers()
    ///         .get(header::CONTENT_LENGTH)
    ///         .and_then(|v| v.to_str().ok()?.parse().ok())
    ///         .unwrap_or(0)
    /// }
    ///
    /// # #[cfg(not(feature = "http"))] fn main() {}
    /// # #[cfg(feature = "http")]
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let limiter = Arc::new(Limiter::new(1 << 20)?);
    /// let layer = LimitLayer::new(Arc::clone(&limiter))
    ///     .refuse_with(HttpRefusal::new())
    ///     .weigh(content_length);
    /// let app: Router = Router::new().route("/upload", post(|body: String| async move { body.len().to_string() }).layer(layer));
    /// let upload = |bytes: usize| {
    ///     Request::post("/upload")
    ///         .header(header::CONTENT_LENGTH, bytes)
    ///         .body(Body::from(vec![b'x'; bytes]))
    ///         .unwrap()
    /// };
    ///
    /// let ok = app.clone().oneshot(upload(1000)).await?;
    /// assert_eq!(ok.status(), StatusCode::OK);
    ///
    /// let held = limiter.try_acquire_many((1 << 20) - 500)?; // others' uploads
    /// let busy = app.clone().oneshot(upload(1000)).await?;
    /// assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE); // retry later
    /// drop(held);
    ///
    /// let huge = Request::post("/upload")
    ///     .header(header::CONTENT_LENGTH, 2 << 20)
    ///     .body(Body::empty())?;
    /// let too_large = app.oneshot(huge).await?;
    /// assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE); // never fits
    /// assert!(!too_large.headers().contains_key(header::RETRY_AFTER));
    /// assert_eq!(limiter.usage(), 0);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(
        not(feature = "http"),
        doc = "[`HttpRefusal`]: crate::tower#what-a-refusal-looks-like"
    )]
    #[cfg_attr(
        not(feature = "http"),
        doc = "[`GrpcRefusal`]: crate::tower#what-a-refusal-looks-like"
    )]
    pub fn weigh<F>(self, weigh: F) -> LimitLayer<R, M, H, Weighed<F>> {
        self.describe_with(|_| Weighed(weigh))
    }

    /// Classifies each request: `classify(&request)` is its [`Class`](crate::Class),
    /// the fraction of the capacity it may fill and its place in the
    /// waiting room (see [Priority classes](self#priority-classes)). For
    /// example a header or a request extension an earlier layer set (an
    /// authenticated client's tier), or the route. The default class,
    /// [`Critical`](crate::Class::Critical), may fill the whole capacity;
    /// the sheddable classes stop at their
    /// [headroom](crate::LimiterBuilder::headroom) (90 % and 80 % by
    /// default), so under overload they are refused first (`503`, or
    /// `RESOURCE_EXHAUSTED`), while the classes above them are still served.
    ///
    /// A classified layer may be [weighed](LimitLayer::weigh) too, before
    /// or after this: each request then takes its weight in units of its
    /// class. A request of a sheddable class that weighs more than its
    /// class may ever fill (but not more than the capacity) is shed at
    /// once with [`Error::Overload`] (`503`, or `RESOURCE_EXHAUSTED`),
    /// never a wait; [`Error::TooLarge`] (`413`, or `OUT_OF_RANGE`) is for
    /// more than the whole capacity. In a [waiting](LimitLayer::waiting)
    /// layer a request that finds its class's share full waits in the
    /// room, and a freed unit goes to the most important class waiting.
    ///
    /// The classifier runs in `call`, once per request, before any unit
    /// is taken and under no lock of the limiter's; it should be cheap. As
    /// with [`weigh`](LimitLayer::weigh), a closure must be annotated with
    /// the request type. A layer has one classifier: a classified layer
    /// has no `classify`. [`LimitLayer::classify_by_header`]
    /// (feature `http`) is the header mapping ready-made.
    ///
    /// The unclassified layer is untouched by this: its requests take one
    /// unit of the default class on the path they always did.
    ///
    /// # Examples
    ///
    /// Background jobs may fill half the capacity; a job a person waits
    /// for gets in while they are refused:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::tower::LimitLayer;
    /// use sidejob::{Class, Error, Limiter};
    /// use tower::{service_fn, Layer, Service, ServiceExt};
    ///
    /// /// A job, and whether a person waits for it.
    /// struct Job {
    ///     interactive: bool,
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// // One shard: the half is exact in total (per shard, see `Class`).
    /// let limiter = Limiter::builder().capacity(4).shards(1).headroom(Class::Sheddable, 0.5).build()?;
    /// let limiter = Arc::new(limiter);
    /// let layer = LimitLayer::new(Arc::clone(&limiter)).classify(|job: &Job| {
    ///     if job.interactive { Class::Critical } else { Class::Sheddable }
    /// });
    /// let mut service = layer.layer(service_fn(|_: Job| async { Ok::<_, std::convert::Infallible>("done") }));
    ///
    /// // Two background jobs, called and not yet polled, fill their half...
    /// let a = service.ready().await?.call(Job { interactive: false });
    /// let b = service.ready().await?.call(Job { interactive: false });
    /// let c = service.ready().await?.call(Job { interactive: false }).await.unwrap_err();
    /// assert_eq!(c.downcast_ref::<Error>(), Some(&Error::Overload));
    /// // ...and an interactive one is still served.
    /// assert_eq!(service.ready().await?.call(Job { interactive: true }).await?, "done");
    ///
    /// let stats = limiter.stats();
    /// assert_eq!(stats.classes[Class::Sheddable.rank()].rejected, 1);
    /// assert_eq!(stats.classes[Class::Critical.rank()].accepted, 1);
    /// # drop((a, b));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(
        not(feature = "http"),
        doc = "[`LimitLayer::classify_by_header`]: crate::tower#priority-classes"
    )]
    pub fn classify<C>(self, classify: C) -> LimitLayer<R, M, H, Classified<C, W>> {
        self.describe_with(|weight| Classified { classify, weight })
    }

    /// Classifies each request by its header `name` (`x-priority`, say):
    /// the class the value names, by [`Class::from_header`](crate::Class::from_header)
    /// (`critical_plus`, `critical`, `sheddable_plus`, `sheddable`, in any
    /// case, `-` for `_`), and the default class,
    /// [`Critical`](crate::Class::Critical), for a request without the
    /// header or with a value that names no class: never an error, and
    /// never a way ahead of the default class. The first value counts.
    /// [`classify`](LimitLayer::classify) with [`ByHeader`] as the
    /// classifier; see there for what a class does.
    ///
    /// For services of `http::Request<B>`: axum, hyper, and tonic, whose
    /// request metadata are HTTP headers (a client's
    /// `request.metadata_mut().insert("x-priority", ..)`).
    ///
    /// A client can claim any class with the header, `critical_plus`
    /// included: where clients are not trusted, use
    /// [`classify`](LimitLayer::classify) with a mapping of your own (cap
    /// what the header may ask for by the client's identity).
    ///
    /// # Panics
    ///
    /// If `name` is not a valid header name (as
    /// `http::HeaderName::from_static` does): a name written in the code
    /// either always panics or never does. Capitals are allowed (header
    /// names are read in lower case).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use axum::body::Body;
    /// use axum::http::{Request, StatusCode};
    /// use axum::{routing::get, Router};
    /// use sidejob::tower::{HttpRefusal, LimitLayer};
    /// use sidejob::{Class, Limiter};
    /// use tower::ServiceExt;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// // Sheddable requests may fill 80 % of 10: 8 (one shard: exact in total).
    /// let limiter = Arc::new(Limiter::builder().capacity(10).shards(1).build()?);
    /// let layer = LimitLayer::new(Arc::clone(&limiter))
    ///     .refuse_with(HttpRefusal::new())
    ///     .classify_by_header("x-priority");
    /// let app: Router = Router::new().route("/feed", get(|| async { "items" }).layer(layer));
    /// let get = |priority: &str| {
    ///     Request::get("/feed").header("x-priority", priority).body(Body::empty()).unwrap()
    /// };
    ///
    /// let others = limiter.try_acquire_many(8)?; // requests in flight
    /// let prefetch = app.clone().oneshot(get("sheddable")).await?;
    /// assert_eq!(prefetch.status(), StatusCode::SERVICE_UNAVAILABLE);
    /// let checkout = app.clone().oneshot(Request::get("/feed").body(Body::empty())?).await?;
    /// assert_eq!(checkout.status(), StatusCode::OK); // no header: the default class
    /// let unknown = app.clone().oneshot(get("urgent!!")).await?;
    /// assert_eq!(unknown.status(), StatusCode::OK); // the default class too
    ///
    /// let stats = limiter.stats();
    /// assert_eq!(stats.classes[Class::Sheddable.rank()].rejected, 1);
    /// # drop(others);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "http")]
    #[cfg_attr(docsrs, doc(cfg(feature = "http")))]
    pub fn classify_by_header<N>(self, name: N) -> LimitLayer<R, M, H, Classified<ByHeader, W>>
    where
        N: TryInto<http::HeaderName>,
        N::Error: fmt::Debug,
    {
        let name = name
            .try_into()
            .unwrap_or_else(|e| panic!("classify_by_header: not a header name: {e:?}"));
        self.classify(ByHeader::new(name))
    }
}

impl<R, M, H, C, W: Weight> LimitLayer<R, M, H, Classified<C, W>> {
    /// [`weigh`](LimitLayer::weigh) for a [classified](LimitLayer::classify)
    /// layer: each request takes `weigh(&request)` units (0 counts as 1),
    /// of the class its classifier says, all or nothing. The classifier
    /// stays; a weigher set before is replaced. Weighing before or after
    /// classifying makes the same layer.
    ///
    /// # Examples
    ///
    /// A batch of `n` jobs takes `n` units of the sheddable class, which
    /// may fill half the capacity here:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::tower::LimitLayer;
    /// use sidejob::{Class, Error, Limiter};
    /// use tower::{service_fn, Layer, Service, ServiceExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let limiter = Arc::new(Limiter::builder().capacity(10).headroom(Class::Sheddable, 0.5).build()?);
    /// let layer = LimitLayer::new(Arc::clone(&limiter))
    ///     .classify(|_: &u32| Class::Sheddable)
    ///     .weigh(|n: &u32| *n as usize);
    /// let mut service = layer.layer(service_fn(|n: u32| async move { Ok::<_, std::convert::Infallible>(n) }));
    ///
    /// let four = service.ready().await?.call(4); // 4 of the 5 it may fill
    /// let refused = service.ready().await?.call(2).await.unwrap_err();
    /// assert_eq!(refused.downcast_ref::<Error>(), Some(&Error::Overload));
    /// // More than the class's 5, ever: shed at once (a 503 at an HTTP
    /// // edge); more than the whole capacity: too large for any class.
    /// let shed = service.ready().await?.call(6).await.unwrap_err();
    /// assert_eq!(shed.downcast_ref::<Error>(), Some(&Error::Overload));
    /// let too_large = service.ready().await?.call(11).await.unwrap_err();
    /// assert_eq!(too_large.downcast_ref::<Error>(), Some(&Error::TooLarge));
    /// assert_eq!(four.await?, 4);
    /// assert_eq!(limiter.usage(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub fn weigh<F>(self, weigh: F) -> LimitLayer<R, M, H, Classified<C, Weighed<F>>> {
        self.describe_with(|described| Classified {
            classify: described.classify,
            weight: Weighed(weigh),
        })
    }
}

impl<S, R: Clone, M: Clone, H: Clone, W: Clone> Layer<S> for LimitLayer<R, M, H, W> {
    type Service = Limit<S, R, M, H, W>;

    fn layer(&self, inner: S) -> Limit<S, R, M, H, W> {
        Limit {
            inner,
            limiter: Arc::clone(&self.limiter),
            anchors: Arc::clone(&self.anchors),
            refusal: self.refusal.clone(),
            timer: self.timer.clone(),
            mode: self.mode.clone(),
            hold: self.hold.clone(),
            describe: self.describe.clone(),
        }
    }
}

impl<R: Clone, M: Clone, H: Clone, W: Clone> Clone for LimitLayer<R, M, H, W> {
    fn clone(&self) -> Self {
        LimitLayer {
            limiter: Arc::clone(&self.limiter),
            anchors: Arc::clone(&self.anchors),
            refusal: self.refusal.clone(),
            timer: self.timer.clone(),
            mode: self.mode.clone(),
            hold: self.hold.clone(),
            describe: self.describe.clone(),
        }
    }
}

impl<R, M: fmt::Debug, H: fmt::Debug, W: fmt::Debug> fmt::Debug for LimitLayer<R, M, H, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitLayer")
            .field("limiter", &self.limiter)
            .field("mode", &self.mode)
            .field("hold", &self.hold)
            .field("describe", &self.describe)
            .finish_non_exhaustive()
    }
}

/// How a [`Limit`] answers a request it refused, and what error type the
/// service has. Implemented by [`Reject`], [`RespondWith`] and (feature
/// `http`) `HttpRefusal` and `GrpcRefusal`; implement it to map refusals
/// to an error type of your own.
///
/// `T` is the inner service's response, `E` its error; the inner
/// service's errors are converted with `Into<Self::Error>`.
pub trait Refusal<T, E>: Clone {
    /// The error type of the [`Limit`] service.
    type Error;

    /// The answer to a request a fail-fast layer ([`LimitLayer::new`])
    /// refused with `error`: [`Error::Overload`] (every unit is out, or,
    /// for a [weighed](LimitLayer::weigh) request, too few),
    /// [`Error::TooLarge`] (a weighed request above the whole capacity)
    /// or [`Error::Shutdown`] (the limiter is closed).
    fn refuse(&self, error: Error) -> Result<T, Self::Error>;

    /// The answer to a request a [waiting](LimitLayer::waiting) layer
    /// refused with `error`: [`Error::Overload`] (the waiting room is
    /// full too, or the limiter has none), [`Error::Timeout`] (it waited
    /// its `max_wait`), [`Error::TooLarge`] (a
    /// [weighed](LimitLayer::weigh) request above the whole capacity,
    /// refused without waiting) or [`Error::Shutdown`] (the limiter is
    /// closed).
    ///
    /// By default the same answer as [`refuse`](Refusal::refuse);
    /// `HttpRefusal` answers a full room with its own status (`429`).
    fn refuse_waiting(&self, error: Error) -> Result<T, Self::Error> {
        self.refuse(error)
    }
}

/// The default [`Refusal`]: a refused request fails with
/// [`Error::Overload`] boxed in a [`BoxError`], and the inner service's
/// errors are boxed too.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reject;

impl<T, E: Into<BoxError>> Refusal<T, E> for Reject {
    type Error = BoxError;

    fn refuse(&self, error: Error) -> Result<T, BoxError> {
        Err(Box::new(error))
    }
}

/// A [`Refusal`] that answers a refused request with a response made by a
/// function, keeping the inner service's error type; made by
/// [`LimitLayer::on_overload`].
#[derive(Clone, Copy)]
pub struct RespondWith<F>(F);

impl<F> fmt::Debug for RespondWith<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RespondWith(..)")
    }
}

impl<T, E, F> Refusal<T, E> for RespondWith<F>
where
    F: Fn(Error) -> T + Clone,
{
    type Error = E;

    fn refuse(&self, error: Error) -> Result<T, E> {
        Ok((self.0)(error))
    }
}

/// One `Arc<Limiter>` per shard, each in an allocation of its own on its
/// own cache lines: a request admitted on shard `i` keeps the limiter alive
/// by cloning anchor `i`.
// Why not an `OwnedPermit` (one `Arc<Limiter>` clone per request): every
// request would then do two RMWs on the one reference count all threads
// share, and on two threads that line bouncing between cores cost more than
// the whole admission (benches/tower.rs: 2.0x tower's throughput with it,
// see the commit for the figure without). A thread's requests mostly land
// on its own shard, so they touch only that shard's anchor.
type Anchors = Arc<[Arc<CachePadded<Anchor>>]>;

/// Shard `shard`'s anchor: the limiter, and the shard a request anchored
/// here took its (first) unit from.
struct Anchor {
    limiter: Arc<Limiter>,
    shard: usize,
}

fn anchors(limiter: &Arc<Limiter>) -> Anchors {
    (0..limiter.shards())
        .map(|shard| {
            Arc::new(CachePadded::new(Anchor {
                limiter: Arc::clone(limiter),
                shard,
            }))
        })
        .collect()
}

/// An admitted request's units: its shard's anchor (which keeps the
/// limiter alive and names the shard its first unit was taken from) and
/// how many: [`One`] (an unweighed request's, no size) or
/// [`Many`](crate::units::Many) (a
/// weighed request's). Given back on drop.
///
/// One word for an unweighed request, so that with its timer (one more,
/// null when untimed) a `Held` is two words, which the compiler moves as a
/// pair of registers. At three words (the shard beside the anchor) it was
/// copied through memory, and that copy's 16-byte load of two 8-byte
/// stores just made stalled on store forwarding: the fail-fast layer took
/// 24 ns a request where it takes 9 (`benches/tower.rs`, PERFORMANCE.md).
struct Unit<U: Units = One> {
    anchor: Arc<CachePadded<Anchor>>,
    units: U,
}

impl<U: Units> Unit<U> {
    /// The shard its (first) unit was taken from.
    fn shard(&self) -> usize {
        self.anchor.shard
    }
}

impl<U: Units> Drop for Unit<U> {
    #[inline]
    fn drop(&mut self) {
        let anchor = &**self.anchor;
        anchor.limiter.release_held(anchor.shard, &mut self.units);
    }
}

// What an admitted request's time goes to: the time-in-limit histogram
// (feature `metrics`) and an adaptive controller (`LimitLayer::adaptive`).
// With neither, starting and stopping a timer reads no clock.
#[derive(Clone, Default)]
struct TimerSpec {
    #[cfg(feature = "metrics")]
    histogram: Option<::metrics::Histogram>,
    adaptive: Option<Arc<Controller>>,
}

/// An admitted request's timer: `None` unless the layer records time and
/// this request is timed, so an untimed request carries one null word,
/// reads no clock and drops nothing. A struct of options here (an
/// `Option<Instant>`, an `Option<Arc<..>>` and a flag in every request's
/// `Held`) made the plain fail-fast layer about 3x slower (9 to 29 ns a
/// request, `benches/tower.rs`, bisected to the commit that added the
/// controller); the box is paid only by the timed requests, which read the
/// clock twice anyway. Stopped once, when its `Held` drops.
type Timer = Option<Box<Timing>>;

/// What a timed request's [`Timer`] holds.
struct Timing {
    start: std::time::Instant,
    #[cfg(feature = "metrics")]
    histogram: Option<::metrics::Histogram>,
    adaptive: Option<Arc<Controller>>,
    /// The inner service answered with an error: a drop for the controller.
    failed: bool,
}

impl TimerSpec {
    fn is_empty(&self) -> bool {
        #[cfg(feature = "metrics")]
        if self.histogram.is_some() {
            return false;
        }
        self.adaptive.is_none()
    }
}

/// Starts timing an admitted request, if the layer records time.
#[inline]
fn start_timer(spec: &TimerSpec) -> Timer {
    if spec.is_empty() {
        return None;
    }
    // The controller times about one request in its `sample_every`; the
    // histogram, every one.
    let adaptive = spec
        .adaptive
        .as_ref()
        .filter(|controller| controller.should_time())
        .map(Arc::clone);
    #[cfg(feature = "metrics")]
    let histogram = spec.histogram.clone();
    #[cfg(feature = "metrics")]
    let timed = adaptive.is_some() || histogram.is_some();
    #[cfg(not(feature = "metrics"))]
    let timed = adaptive.is_some();
    if !timed {
        return None;
    }
    Some(Box::new(Timing {
        start: crate::sync::now(),
        #[cfg(feature = "metrics")]
        histogram,
        adaptive,
        failed: false,
    }))
}

/// Records the time since admission, once.
#[inline]
fn stop_timer(timer: &mut Timer) {
    let Some(timing) = timer.take() else {
        return;
    };
    stop_timing(*timing);
}

/// [`stop_timer`] of a timed request, out of line: the untimed request's
/// drop is the null check alone.
#[cold]
#[inline(never)]
fn stop_timing(timer: Timing) {
    let elapsed = crate::sync::now().saturating_duration_since(timer.start);
    #[cfg(feature = "metrics")]
    if let Some(histogram) = timer.histogram {
        histogram.record(elapsed.as_secs_f64());
    }
    if let Some(controller) = timer.adaptive {
        let outcome = if timer.failed {
            Outcome::Dropped
        } else {
            Outcome::Success
        };
        controller.record(elapsed, outcome);
    }
}
