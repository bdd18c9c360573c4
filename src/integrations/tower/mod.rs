//! [`LimitLayer`]: tower middleware that admits each request through a
//! [`Limiter`], failing fast with [`Error::Overload`] when it is full, or
//! waiting in the limiter's waiting room.
//!
//! Most Rust services that need load shedding are tower services (axum,
//! tonic, hyper). Wrap the handlers you want bounded in a [`LimitLayer`]:
//! each request takes one unit of the limiter when the service is
//! *called*, holds it until the inner service's response future completes,
//! and is refused at once when every unit is out.
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
//! `err.downcast_ref::<sidejob::Error>()`. With
//! [`LimitLayer::on_overload`] a function of yours turns the refusal into a
//! response instead, and the service keeps the inner service's error type:
//! an axum app answers `503 Service Unavailable` with `Retry-After` (or
//! `429 Too Many Requests`) with no
//! `HandleErrorLayer`.
//!
//! # Streamed bodies
//!
//! The unit is held until the inner service's *response future* completes,
//! that is, until the response head (status and headers) is ready. A body
//! that is streamed after that is not covered: the limit bounds how many
//! handlers run at once, not how many responses are still being sent. A
//! handler that builds its whole body before returning (the usual axum
//! handler) is covered in full. To bound streaming too, move an
//! [`OwnedPermit`](crate::OwnedPermit) into the body stream yourself.
//!
//! # Waiting
//!
//! [`LimitLayer::new`] fails fast. [`LimitLayer::waiting`] makes a layer
//! that, when every unit is out, queues the request in the limiter's
//! waiting room ([`max_waiters`](crate::LimiterBuilder::max_waiters),
//! [`max_wait`](crate::LimiterBuilder::max_wait),
//! [`queue_order`](crate::LimiterBuilder::queue_order)) and calls the inner
//! service once a unit is handed to it: for example 10 at once, 20 more waiting, `429` past that. The refusal function receives
//! the [`Error`], so it can answer [`Error::Overload`] (the waiting room
//! is full too: `429`) and [`Error::Timeout`] (waited `max_wait`: `503`)
//! differently.
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
//! A tonic server takes tower layers with `Server::builder().layer(..)`.
//! gRPC reports overload as the status `RESOURCE_EXHAUSTED`; answer it from
//! the refusal function so the client gets a proper gRPC status rather
//! than a transport error:
//!
//! ```text
//! use std::sync::Arc;
//! use sidejob::{tower::LimitLayer, Limiter};
//!
//! let limiter = Arc::new(Limiter::new(64)?);
//! let layer = LimitLayer::new(limiter)
//!     .on_overload(|_| tonic::Status::resource_exhausted("server busy, retry later").into_http());
//! tonic::transport::Server::builder()
//!     .layer(layer)
//!     .add_service(GreeterServer::new(MyGreeter::default()))
//!     .serve(addr)
//!     .await?;
//! ```
//!
//! `Status::into_http` gives an `http::Response` with the gRPC status in
//! its trailers-only headers, which is the response type tonic's services
//! have. (The example is not compiled here: a tonic service needs code
//! generated by `tonic-build`, which needs `protoc`.)
//!
//! [`ConcurrencyLimit`]: https://docs.rs/tower/latest/tower/limit/struct.ConcurrencyLimit.html

use crate::error::Error;
use crate::limiter::Limiter;
use crate::sync::Arc;
use crossbeam_utils::CachePadded;
use std::fmt;
use tower_layer::Layer;

mod future;
mod service;

use future::{Deferred, State, WaitState};
pub use future::{ResponseFuture, WaitResponseFuture};
pub use service::Limit;

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
pub struct LimitLayer<R = Reject, M = FailFast> {
    limiter: Arc<Limiter>,
    anchors: Anchors,
    refusal: R,
    timer: TimerSpec,
    mode: M,
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
    /// 10 requests at once, up to 20 more wait
    /// (for at most 10 s), `429 Too Many Requests` past that:
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use axum::http::StatusCode;
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
    ///     match e {
    ///         Error::Timeout => StatusCode::SERVICE_UNAVAILABLE, // waited 10 s
    ///         _ => StatusCode::TOO_MANY_REQUESTS,                // the queue is full
    ///     }
    ///     .into_response()
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
    pub fn waiting(limiter: Arc<Limiter>) -> Self {
        LimitLayer {
            anchors: anchors(&limiter),
            limiter,
            refusal: Reject,
            timer: TimerSpec::default(),
            mode: Wait,
        }
    }
}

impl<R, M> LimitLayer<R, M> {
    /// Answers refused requests with `respond(error)` instead of an error;
    /// the service then keeps the inner service's error type (for axum:
    /// `Infallible`, so the layer goes on a route as it is).
    ///
    /// `error` is [`Error::Overload`] when every unit is out (for a
    /// [waiting](LimitLayer::waiting) layer: and the waiting room is full),
    /// [`Error::Timeout`] when a waiting request waited its `max_wait`,
    /// and [`Error::Shutdown`] once the limiter is
    /// [closed](Limiter::close).
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
    pub fn on_overload<F>(self, respond: F) -> LimitLayer<RespondWith<F>, M> {
        LimitLayer {
            limiter: self.limiter,
            anchors: self.anchors,
            refusal: RespondWith(respond),
            timer: self.timer,
            mode: self.mode,
        }
    }

    /// Records each admitted request's time in the limit (admission to the
    /// response future's completion, in seconds) in the histogram
    /// `sidejob_time_in_pool_seconds{name, kind="limiter"}`.
    ///
    /// The histogram handle is registered now, with the `metrics` recorder
    /// installed now: install your exporter first. Each admitted request
    /// then pays two clock reads and one histogram record (tens of
    /// nanoseconds); refused requests pay nothing. Use the same `name` as
    /// the [`Reporter`](crate::observe::Reporter) exporting the limiter's counters.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use sidejob::{tower::LimitLayer, Limiter};
    ///
    /// let layer = LimitLayer::new(Arc::new(Limiter::new(64)?)).record_time("api");
    /// # let _ = layer;
    /// # Ok::<(), sidejob::ConfigError>(())
    /// ```
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn record_time(mut self, name: &str) -> Self {
        self.timer = Some(crate::metrics::time_histogram(name, "limiter"));
        self
    }

    /// The limiter requests are admitted through.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }
}

impl<S, R: Clone, M: Clone> Layer<S> for LimitLayer<R, M> {
    type Service = Limit<S, R, M>;

    fn layer(&self, inner: S) -> Limit<S, R, M> {
        Limit {
            inner,
            limiter: Arc::clone(&self.limiter),
            anchors: Arc::clone(&self.anchors),
            refusal: self.refusal.clone(),
            timer: self.timer.clone(),
            mode: self.mode.clone(),
        }
    }
}

impl<R: Clone, M: Clone> Clone for LimitLayer<R, M> {
    fn clone(&self) -> Self {
        LimitLayer {
            limiter: Arc::clone(&self.limiter),
            anchors: Arc::clone(&self.anchors),
            refusal: self.refusal.clone(),
            timer: self.timer.clone(),
            mode: self.mode.clone(),
        }
    }
}

impl<R, M: fmt::Debug> fmt::Debug for LimitLayer<R, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitLayer")
            .field("limiter", &self.limiter)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// How a [`Limit`] answers a request it refused, and what error type the
/// service has. Implemented by [`Reject`] and [`RespondWith`]; implement it
/// to map refusals to an error type of your own.
///
/// `T` is the inner service's response, `E` its error; the inner
/// service's errors are converted with `Into<Self::Error>`.
pub trait Refusal<T, E>: Clone {
    /// The error type of the [`Limit`] service.
    type Error;

    /// The answer to a request refused with `error`: [`Error::Overload`]
    /// (no unit, no room to wait), [`Error::Timeout`] (a waiting request
    /// waited its `max_wait`) or [`Error::Shutdown`] (the limiter is
    /// closed).
    fn refuse(&self, error: Error) -> Result<T, Self::Error>;
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
type Anchors = Arc<[Arc<CachePadded<Arc<Limiter>>>]>;

fn anchors(limiter: &Arc<Limiter>) -> Anchors {
    (0..limiter.shards())
        .map(|_| Arc::new(CachePadded::new(Arc::clone(limiter))))
        .collect()
}

/// An admitted request's unit: the shard it was taken from, and that
/// shard's anchor keeping the limiter alive. Given back on drop.
struct Unit {
    anchor: Arc<CachePadded<Arc<Limiter>>>,
    shard: usize,
}

impl Drop for Unit {
    #[inline]
    fn drop(&mut self) {
        self.anchor.release(self.shard);
    }
}

// The optional time-in-limit histogram. Without the `metrics` feature the
// types are `()` and the functions nothing, so no field needs a `cfg`.
#[cfg(feature = "metrics")]
type TimerSpec = Option<::metrics::Histogram>;

#[cfg(not(feature = "metrics"))]
type TimerSpec = ();

#[cfg(feature = "metrics")]
type Timer = Option<(::metrics::Histogram, std::time::Instant)>;

#[cfg(not(feature = "metrics"))]
type Timer = ();

/// Starts timing an admitted request, if the layer records time.
#[inline]
fn start_timer(spec: &TimerSpec) -> Timer {
    #[cfg(feature = "metrics")]
    {
        spec.as_ref().map(|h| (h.clone(), crate::sync::now()))
    }
    #[cfg(not(feature = "metrics"))]
    {
        let () = *spec;
    }
}

/// Records the time since admission, once.
#[inline]
fn stop_timer(timer: &mut Timer) {
    #[cfg(feature = "metrics")]
    if let Some((histogram, start)) = timer.take() {
        histogram.record(crate::sync::now().duration_since(start).as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    {
        let () = *timer;
    }
}
