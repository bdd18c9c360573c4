//! When an admitted request gives its unit back: [`UntilResponse`] (when
//! the response future completes, the default) or `UntilBodyEnd` (when
//! the response body ends or is dropped; feature `http`), chosen by a
//! [`Hold`] type parameter of the layer.
//!
//! The unit and the time-in-limit timer travel together as a [`Held`]:
//! dropping it records the time and gives the unit back, once, on every
//! path (completion, inner error, cancellation, unwinding). A hold mode
//! only decides *where* the `Held` is dropped: in the response future, or
//! inside the body the response carries.

#[cfg(feature = "http")]
pub use body::{HeldBody, UntilBodyEnd};

#[cfg(doc)]
use crate::units::Many;
use crate::units::{One, Units};

/// When an admitted request's units go back, for a response of type `T`
/// and a request holding `U` units ([`One`], or [`Many`] for a
/// [weighed](super::LimitLayer::weigh) request): [`UntilResponse`] (the
/// default) or `UntilBodyEnd` (feature `http`). Sealed: the two modes are
/// the crate's.
pub trait Hold<T, U: Units = One>: private::Sealed {
    /// The response the [`Limit`](super::Limit) service answers with: `T`
    /// itself for [`UntilResponse`], `T` with its body wrapped in a
    /// `HeldBody` for `UntilBodyEnd`.
    type Response;

    /// An admitted request's response, its units and timer in `held`.
    #[doc(hidden)]
    fn admitted(response: T, held: private::Held<U>) -> Self::Response;

    /// A refused request's answer (it holds no unit).
    #[doc(hidden)]
    fn refused(response: T) -> Self::Response;
}

/// The default [`Hold`]: the unit goes back when the inner service's
/// response future completes, that is when the response head is ready.
///
/// A body streamed after that runs outside the limit; see
/// [Streamed bodies](crate::tower#streamed-bodies) and
/// `LimitLayer::hold_until_body_ends` (feature `http`).
#[derive(Debug, Clone, Copy, Default)]
pub struct UntilResponse;

impl<T, U: Units> Hold<T, U> for UntilResponse {
    type Response = T;

    #[inline]
    fn admitted(response: T, held: private::Held<U>) -> T {
        drop(held);
        response
    }

    #[inline]
    fn refused(response: T) -> T {
        response
    }
}

pub(super) use private::Held;

mod private {
    use super::super::{stop_timer, Timer, Unit};
    use crate::units::{One, Units};

    /// Implemented by the crate's hold modes only.
    pub trait Sealed {}

    impl Sealed for super::UntilResponse {}
    #[cfg(feature = "http")]
    impl Sealed for super::UntilBodyEnd {}

    /// An admitted request's unit and its time-in-limit timer. Dropping it
    /// records the time, then gives the unit back.
    ///
    /// Public in a private module: it appears in the sealed [`Hold`]
    /// trait's hidden methods, and no user can name or build it.
    ///
    /// [`Hold`]: super::Hold
    pub struct Held<U: Units = One> {
        // Held for its `Drop`, which gives the units back.
        pub(in crate::integrations::tower) unit: Unit<U>,
        pub(in crate::integrations::tower) timer: Timer,
    }

    impl<U: Units> std::fmt::Debug for Held<U> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Held")
                .field("shard", &self.unit.shard())
                .field("units", &self.unit.units.count())
                .finish_non_exhaustive()
        }
    }

    impl<U: Units> Drop for Held<U> {
        #[inline]
        fn drop(&mut self) {
            // The unit (a field) is released right after this body.
            stop_timer(&mut self.timer);
        }
    }
}

#[cfg(feature = "http")]
mod body {
    use super::{Held, Hold};
    use crate::units::{One, Units};
    use http_body::{Body, Frame, SizeHint};
    use std::fmt;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// The [`Hold`] of [`LimitLayer::hold_until_body_ends`](crate::tower::LimitLayer::hold_until_body_ends):
    /// the unit rides in the response body and goes back when the body
    /// ends (its last frame, an error, or an empty body at once) or is
    /// dropped (a client that hung up mid-stream).
    #[derive(Debug, Clone, Copy, Default)]
    pub struct UntilBodyEnd;

    impl<B: Body, U: Units> Hold<http::Response<B>, U> for UntilBodyEnd {
        type Response = http::Response<HeldBody<B, U>>;

        fn admitted(response: http::Response<B>, held: Held<U>) -> Self::Response {
            // A body that is already over (an empty body, a `HEAD`
            // answer) holds nothing: the unit goes back now.
            let held = if response.body().is_end_stream() {
                drop(held);
                None
            } else {
                Some(held)
            };
            response.map(|inner| HeldBody { inner, held })
        }

        fn refused(response: http::Response<B>) -> Self::Response {
            response.map(|inner| HeldBody { inner, held: None })
        }
    }

    pin_project_lite::pin_project! {
        /// A response body that holds its request's unit until it ends
        /// or is dropped; made by
        /// [`LimitLayer::hold_until_body_ends`](crate::tower::LimitLayer::hold_until_body_ends).
        /// `U` is how many units: [`One`], or [`Many`](crate::units::Many)
        /// for a [weighed](crate::tower::LimitLayer::weigh) request's body.
        ///
        /// Its frames, errors, [`size_hint`](Body::size_hint) and
        /// [`is_end_stream`](Body::is_end_stream) are the inner body's.
        /// The unit goes back (and the time in the limit is recorded) as
        /// soon as the inner body yields its last frame (after which it
        /// reports `is_end_stream`), ends, or fails, whichever comes
        /// first; or when this body is dropped unfinished. A refused
        /// request's body holds nothing.
        ///
        /// A response leaked with [`std::mem::forget`] (or kept in an
        /// `Rc` cycle) is never dropped: its unit stays taken for the
        /// limiter's life, and, since no code of the limiter runs, it
        /// is not counted in [`Stats::forgotten`](crate::Stats::forgotten)
        /// (only in `usage`).
        pub struct HeldBody<B, U: Units = One> {
            // Declared before `held`, so dropped first: a body dropped
            // unfinished is gone before its unit goes back.
            #[pin]
            inner: B,
            held: Option<Held<U>>,
        }
    }

    impl<B, U: Units> HeldBody<B, U> {
        /// Whether this body still holds its request's unit.
        pub fn is_holding(&self) -> bool {
            self.held.is_some()
        }

        /// The inner body. Its unit, if still held, goes back now.
        pub fn into_inner(self) -> B {
            self.inner
        }
    }

    impl<B: Body, U: Units> Body for HeldBody<B, U> {
        type Data = B::Data;
        type Error = B::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
            let mut this = self.project();
            let frame = std::task::ready!(this.inner.as_mut().poll_frame(cx));
            let over = match &frame {
                Some(Ok(_)) => this.inner.is_end_stream(),
                // The end, or an error: hyper polls no further.
                None | Some(Err(_)) => true,
            };
            if over {
                drop(this.held.take());
            }
            Poll::Ready(frame)
        }

        #[inline]
        fn is_end_stream(&self) -> bool {
            self.inner.is_end_stream()
        }

        #[inline]
        fn size_hint(&self) -> SizeHint {
            self.inner.size_hint()
        }
    }

    impl<B, U: Units> fmt::Debug for HeldBody<B, U> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("HeldBody")
                .field("holding", &self.held.is_some())
                .finish_non_exhaustive()
        }
    }
}
