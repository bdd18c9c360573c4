//! [`Limit`], the service a [`LimitLayer`] wraps around yours: it admits each request in `call` (never reserving in `poll_ready`), refuses at once or waits in the limiter's room, and keeps no inner reservation it does not use.

use super::{
    start_timer, Anchors, Deferred, FailFast, Refusal, Reject, ResponseFuture, State, TimerSpec,
    Unit, Wait, WaitResponseFuture, WaitState,
};
use crate::error::Error;
use crate::limiter::Limiter;
use crate::sync::Arc;
use std::fmt;
use std::task::{Context, Poll};
use tower_service::Service;

/// A service that admits each request through a [`Limiter`]; made by
/// [`LimitLayer`](super::LimitLayer).
///
/// * `poll_ready` is the inner service's: it reserves nothing of the
///   limiter's and never waits for capacity.
/// * `call` takes a unit. Admitted, it calls the inner service and the
///   [`ResponseFuture`] holds the unit until the inner future completes
///   (or is dropped). Refused, it does not call the inner service, gives
///   back whatever the inner service reserved in `poll_ready` (it drops
///   the polled inner service and keeps a fresh clone), and returns a
///   future that is ready at once with the refusal (see [`Reject`] and
///   [`RespondWith`](super::RespondWith)).
/// * In [`Wait`] mode ([`LimitLayer::waiting`](super::LimitLayer::waiting)), a request that finds no
///   unit free gets a [`WaitResponseFuture`] that waits in the limiter's
///   waiting room, then polls its own clone of the inner service ready
///   and calls it.
///
/// The inner service must be `Clone` (see
/// [The inner service's reservation](super#the-inner-services-reservation)).
/// Clones share the limiter.
pub struct Limit<S, R = Reject, M = FailFast> {
    pub(super) inner: S,
    pub(super) limiter: Arc<Limiter>,
    pub(super) anchors: Anchors,
    pub(super) refusal: R,
    pub(super) timer: TimerSpec,
    pub(super) mode: M,
}

impl<S, R, M> Limit<S, R, M> {
    /// The limiter requests are admitted through.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, R, Request> Service<Request> for Limit<S, R, FailFast>
where
    S: Service<Request> + Clone,
    R: Refusal<S::Response, S::Error>,
    S::Error: Into<R::Error>,
{
    type Response = S::Response;
    type Error = R::Error;
    type Future = ResponseFuture<S::Future, S::Response, R::Error>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Only the inner service's readiness: see the module docs for why
        // no unit is reserved here.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Request) -> Self::Future {
        match self.limiter.take_unit() {
            Ok(shard) => ResponseFuture {
                state: State::Admitted {
                    timer: start_timer(&self.timer),
                    future: self.inner.call(request),
                    permit: Some(Unit {
                        anchor: Arc::clone(&self.anchors[shard]),
                        shard,
                    }),
                },
            },
            Err(error) => self.refuse(error),
        }
    }
}

impl<S, R, Request> Service<Request> for Limit<S, R, Wait>
where
    S: Service<Request> + Clone,
    R: Refusal<S::Response, S::Error>,
    S::Error: Into<R::Error>,
{
    type Response = S::Response;
    type Error = R::Error;
    type Future = WaitResponseFuture<S, Request, R>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // As the fail-fast mode: nothing reserved, no wait for capacity.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Request) -> Self::Future {
        // Uncounted: a request that goes on to wait is not a refusal; the
        // waiting room counts one if it is refused for good.
        let response = match self.limiter.take_unit_uncounted() {
            Ok(shard) => ResponseFuture {
                state: State::Admitted {
                    timer: start_timer(&self.timer),
                    future: self.inner.call(request),
                    permit: Some(Unit {
                        anchor: Arc::clone(&self.anchors[shard]),
                        shard,
                    }),
                },
            },
            // A limiter without a waiting room refuses here, counted,
            // without the clone and allocation of a wait.
            Err(Error::Overload) if self.limiter.has_room() => return self.wait(request),
            Err(error) => {
                if error == Error::Overload {
                    self.limiter.count_refusal();
                }
                self.refuse(error)
            }
        };
        WaitResponseFuture {
            state: WaitState::Called { response },
        }
    }
}

impl<S, R, M> Limit<S, R, M> {
    /// The response future of a request refused in `call`, with the inner
    /// service's reservation given back. Cold: refusals only.
    #[cold]
    fn refuse<Request>(&mut self, error: Error) -> ResponseFuture<S::Future, S::Response, R::Error>
    where
        S: Service<Request> + Clone,
        R: Refusal<S::Response, S::Error>,
    {
        // The inner service was polled ready for this request and may have
        // reserved (tower's `ConcurrencyLimit` a permit, `Buffer` a slot).
        // tower has no "unreserve": a reservation ends when the service is
        // called or dropped. So the polled service is dropped and a fresh,
        // unpolled clone stays for the next `poll_ready` (the `mem::replace`
        // of tower's `AsyncFilter`). Keeping the polled one, as tower's
        // `Filter` does on a rejection, would hold the reservation for as
        // long as this clone lives (an idle keep-alive connection's) and
        // starve every other clone. This is why the fail-fast mode needs
        // `S: Clone`; an admitted request clones nothing.
        let fresh = self.inner.clone();
        drop(std::mem::replace(&mut self.inner, fresh));
        ResponseFuture {
            state: State::Refused {
                answer: Some(self.refusal.refuse(error)),
            },
        }
    }
}

impl<S, R> Limit<S, R, Wait> {
    /// The response future of a request that must wait: the wait, then the
    /// inner service's readiness, then the call. Cold: only requests that
    /// found every unit out come here.
    #[cold]
    fn wait<Request>(&mut self, request: Request) -> WaitResponseFuture<S, Request, R>
    where
        S: Service<Request> + Clone,
        R: Refusal<S::Response, S::Error>,
    {
        // The request waits with an unpolled clone and polls it ready only
        // once a unit is handed over, so nothing of the inner service's is
        // reserved during the wait. The clone polled ready for it is
        // dropped here, giving its reservation back, and a fresh one stays
        // for the next `poll_ready`: two clones, on a path that already
        // allocates. (Carrying the polled clone instead, tower's idiom for
        // a call made later, held an inner reservation, `ConcurrencyLimit`'s
        // permit, for the whole wait, and the other clones starved.)
        let service = self.inner.clone();
        let fresh = self.inner.clone();
        drop(std::mem::replace(&mut self.inner, fresh));
        WaitResponseFuture {
            state: WaitState::Queued {
                // Boxed: `acquire_owned_async`'s future has no name to
                // store it under. One allocation, for a request that waits.
                acquire: Box::pin(Arc::clone(&self.limiter).acquire_owned_async()),
                call: Some(Deferred {
                    service,
                    request,
                    refusal: self.refusal.clone(),
                    anchors: Arc::clone(&self.anchors),
                    timer: self.timer.clone(),
                }),
            },
        }
    }
}

impl<S: Clone, R: Clone, M: Clone> Clone for Limit<S, R, M> {
    fn clone(&self) -> Self {
        Limit {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
            anchors: Arc::clone(&self.anchors),
            refusal: self.refusal.clone(),
            timer: self.timer.clone(),
            mode: self.mode.clone(),
        }
    }
}

impl<S: fmt::Debug, R, M: fmt::Debug> fmt::Debug for Limit<S, R, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}
