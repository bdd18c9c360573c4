//! [`Limit`], the service a [`LimitLayer`] wraps around yours: it admits each request in `call` (never reserving in `poll_ready`), refuses at once or waits in the limiter's room, and keeps no inner reservation it does not use.

use super::{
    start_timer, trace, Acquire, Anchors, Carry, Deferred, Describe, FailFast, First, Held, Hold,
    Refusal, Reject, ResponseFuture, State, TimerSpec, Unit, UntilResponse, Unweighed, Wait,
    WaitResponseFuture, WaitState,
};
use crate::error::Error;
use crate::limiter::Limiter;
use crate::sync::Arc;
use crate::units::Units;
use std::fmt;
use std::task::{Context, Poll};
use tower_service::Service;

/// A service that admits each request through a [`Limiter`]; made by
/// [`LimitLayer`](super::LimitLayer).
///
/// * `poll_ready` is the inner service's: it reserves nothing of the
///   limiter's and never waits for capacity.
/// * `call` takes a unit (a [weighed](super::LimitLayer::weigh) request:
///   its units, all or nothing; a [classified](super::LimitLayer::classify)
///   one: under its class's headroom). Admitted, it calls the inner service and the
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
/// * `H` says when an admitted request's unit goes back:
///   [`UntilResponse`] (its response future completes, the default) or
///   `UntilBodyEnd` (its response body ends; feature `http`).
///
/// * `W` says what a request asks for ([`Describe`]): one unit of the
///   default class ([`Unweighed`], the default), as many units as a
///   function of the request says ([`Weighed`](super::Weighed), made by
///   [`LimitLayer::weigh`](super::LimitLayer::weigh)), or a class a
///   function of the request says, weighed or not
///   ([`Classified`](super::Classified), made by
///   [`LimitLayer::classify`](super::LimitLayer::classify)).
///
/// The inner service must be `Clone` (see
/// [The inner service's reservation](super#the-inner-services-reservation)).
/// Clones share the limiter.
pub struct Limit<S, R = Reject, M = FailFast, H = UntilResponse, W = Unweighed> {
    pub(super) inner: S,
    pub(super) limiter: Arc<Limiter>,
    pub(super) anchors: Anchors,
    pub(super) refusal: R,
    pub(super) timer: TimerSpec,
    pub(super) mode: M,
    pub(super) hold: H,
    pub(super) describe: W,
}

impl<S, R, M, H, W> Limit<S, R, M, H, W> {
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

impl<S, R, H, W, Request> Service<Request> for Limit<S, R, FailFast, H, W>
where
    S: Service<Request> + Clone,
    R: Refusal<S::Response, S::Error>,
    S::Error: Into<R::Error>,
    W: Describe<Request>,
    H: Hold<S::Response, W::Units>,
{
    type Response = H::Response;
    type Error = R::Error;
    type Future = ResponseFuture<S::Future, S::Response, R::Error, H, W::Units>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Only the inner service's readiness: see the module docs for why
        // no unit is reserved here.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Request) -> Self::Future {
        // The describer runs here, before any take and under no lock of
        // ours. An unweighed layer's ask is a constant its take never
        // reads: its path is the one-unit take it always was.
        let ask = self.describe.describe(&request);
        match W::Units::take(&self.limiter, ask) {
            Ok((shard, units)) => self.admitted(shard, units, request),
            Err(error) => self.refuse(error, false),
        }
    }
}

impl<S, R, H, W, Request> Service<Request> for Limit<S, R, Wait, H, W>
where
    S: Service<Request> + Clone,
    R: Refusal<S::Response, S::Error>,
    S::Error: Into<R::Error>,
    W: Describe<Request>,
    H: Hold<S::Response, W::Units>,
{
    type Response = H::Response;
    type Error = R::Error;
    type Future = WaitResponseFuture<S, Request, R, H, W::Units>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // As the fail-fast mode: nothing reserved, no wait for capacity.
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    #[inline]
    fn call(&mut self, request: Request) -> Self::Future {
        // As the fail-fast mode, then the room: a request that goes on to
        // wait is not counted as refused (the room counts it if it is
        // refused for good). `TooLarge` (more than the capacity in force,
        // or than its class may ever fill) never waits.
        let ask = self.describe.describe(&request);
        let response = match W::Units::first(&self.limiter, ask) {
            First::Taken(shard, units) => self.admitted(shard, units, request),
            First::Wait(acquire) => return self.wait_for(acquire, request),
            First::Refused(error) => self.refuse(error, true),
        };
        WaitResponseFuture {
            state: WaitState::Called { response },
        }
    }
}

impl<S, R, M, H, W> Limit<S, R, M, H, W> {
    /// The response future of a request admitted in `call` with `units`,
    /// the first on `shard`: the inner service called, the units held
    /// (with the timer) until `H` gives them back.
    #[inline]
    fn admitted<Request, U: Units>(
        &mut self,
        shard: usize,
        units: U,
        request: Request,
    ) -> ResponseFuture<S::Future, S::Response, R::Error, H, U>
    where
        S: Service<Request>,
        R: Refusal<S::Response, S::Error>,
    {
        // The units are anchored (and so given back on any unwind) before
        // the inner service is called.
        let held = Held {
            unit: Unit {
                anchor: Arc::clone(&self.anchors[shard]),
                units,
            },
            timer: start_timer(&self.timer),
        };
        ResponseFuture::new(State::Admitted {
            future: self.inner.call(request),
            held: Some(held),
        })
    }

    /// The response future of a request refused in `call` (by a waiting
    /// layer if `waiting`), with the inner service's reservation given
    /// back. Cold: refusals only.
    #[cold]
    fn refuse<Request, U: Units>(
        &mut self,
        error: Error,
        waiting: bool,
    ) -> ResponseFuture<S::Future, S::Response, R::Error, H, U>
    where
        S: Service<Request> + Clone,
        R: Refusal<S::Response, S::Error>,
    {
        trace::refused(error);
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
        let answer = if waiting {
            self.refusal.refuse_waiting(error)
        } else {
            self.refusal.refuse(error)
        };
        ResponseFuture::new(State::Refused {
            answer: Some(answer),
        })
    }
}

impl<S, R, H, W> Limit<S, R, Wait, H, W> {
    /// [`wait`](Self::wait), out of line. Cold: only requests that found
    /// their units out come here.
    #[cold]
    fn wait_for<Request, U: Carry>(
        &mut self,
        acquire: Acquire<U>,
        request: Request,
    ) -> WaitResponseFuture<S, Request, R, H, U>
    where
        S: Service<Request> + Clone,
        R: Refusal<S::Response, S::Error>,
    {
        self.wait(acquire, request)
    }

    /// The response future of a request that must wait: the wait
    /// (`acquire`), then the inner service's readiness, then the call.
    #[inline]
    fn wait<Request, U: Carry>(
        &mut self,
        acquire: Acquire<U>,
        request: Request,
    ) -> WaitResponseFuture<S, Request, R, H, U>
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
                acquire,
                call: Some(Deferred {
                    service,
                    request,
                    refusal: self.refusal.clone(),
                    anchors: Arc::clone(&self.anchors),
                    timer: self.timer.clone(),
                    trace: trace::WaitTrace::start(),
                }),
            },
        }
    }
}

impl<S: Clone, R: Clone, M: Clone, H: Clone, W: Clone> Clone for Limit<S, R, M, H, W> {
    fn clone(&self) -> Self {
        Limit {
            inner: self.inner.clone(),
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

impl<S: fmt::Debug, R, M: fmt::Debug, H: fmt::Debug, W: fmt::Debug> fmt::Debug
    for Limit<S, R, M, H, W>
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .field("mode", &self.mode)
            .field("hold", &self.hold)
            .field("describe", &self.describe)
            .finish_non_exhaustive()
    }
}
