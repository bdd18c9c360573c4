//! The response futures: [`ResponseFuture`] holds an admitted request's unit until the inner response is ready (then gives it back, or hands it to the body); [`WaitResponseFuture`] first waits for a unit, then polls the inner service ready and calls it.

use super::{start_timer, trace, Anchors, Carry, Held, Hold, Refusal, TimerSpec, Unit};
use crate::error::Error;
use crate::limiter::OwnedPermit;
use crate::sync::Arc;
use crate::units::{One, Units};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower_service::Service;

pin_project_lite::pin_project! {
    /// The response future of a [`Limit`]: the inner service's future and
    /// the unit it holds, or an answer ready at once for a refused request.
    ///
    /// When the inner future completes, the unit goes back
    /// ([`UntilResponse`](super::UntilResponse)) or moves into the
    /// response's body ([`UntilBodyEnd`](super::UntilBodyEnd)); an inner
    /// error gives it back either way. Dropped unfinished (a cancelled
    /// request), this future gives it back.
    ///
    /// `U` is how many units an admitted request holds: [`One`], or
    /// [`Many`](crate::units::Many) behind a
    /// [weighed](super::LimitLayer::weigh) layer.
    #[must_use = "futures do nothing unless polled; the unit is held until this completes or drops"]
    pub struct ResponseFuture<F, T, E, H = super::UntilResponse, U: Units = One> {
        #[pin]
        pub(super) state: State<F, T, E, U>,
        pub(super) hold: PhantomData<fn() -> H>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    pub(super) enum State<F, T, E, U: Units> {
        Admitted {
            #[pin]
            future: F,
            held: Option<Held<U>>,
        },
        Refused {
            answer: Option<Result<T, E>>,
        },
    }
}

impl<F, T, E, H, U: Units> ResponseFuture<F, T, E, H, U> {
    pub(super) fn new(state: State<F, T, E, U>) -> Self {
        ResponseFuture {
            state,
            hold: PhantomData,
        }
    }
}

impl<F, T, E, Fe, H, U> Future for ResponseFuture<F, T, E, H, U>
where
    F: Future<Output = Result<T, Fe>>,
    Fe: Into<E>,
    H: Hold<T, U>,
    U: Units,
{
    type Output = Result<H::Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Admitted { future, held } => {
                let output = std::task::ready!(future.poll(cx));
                // As soon as the response is ready, not when the caller
                // drops this future: the unit goes back (or on into the
                // body), and back at once on an inner error.
                let Some(held) = held.take() else {
                    // Polled again after completion: a contract breach by
                    // the caller. Pending rather than a panic.
                    return Poll::Pending;
                };
                Poll::Ready(match output {
                    Ok(response) => Ok(H::admitted(response, held)),
                    Err(error) => {
                        let mut held = held;
                        if let Some(timing) = held.timer.as_mut() {
                            timing.failed = true;
                        }
                        drop(held);
                        Err(error.into())
                    }
                })
            }
            StateProj::Refused { answer } => match answer.take() {
                Some(answer) => Poll::Ready(answer.map(H::refused)),
                // Polled again after completion: a contract breach by the
                // caller. Pending rather than a panic; it never completes.
                None => Poll::Pending,
            },
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of a [`Limit`] in [`Wait`] mode: a request
    /// admitted or refused in `call`, as [`ResponseFuture`]; or a request
    /// waiting in the limiter's waiting room, which, once a unit is handed
    /// to it, polls its clone of the inner service ready (holding the
    /// unit) and calls it. While it waits it holds no reservation of the
    /// inner service. If the inner service's `poll_ready` fails, that
    /// error is the answer and the unit goes back.
    ///
    /// # Cancel safety
    ///
    /// Dropping it while it waits leaves the queue at once: the limiter's
    /// [`waiting`](Limiter::waiting) count drops, and a unit handed to it
    /// meanwhile goes to the next waiter (or back to the limiter). Dropping
    /// it after admission, the inner service ready or not, gives the unit
    /// back, as [`ResponseFuture`] does.
    ///
    /// `U` is how many units it waits for and holds: [`One`], or
    /// [`Many`](crate::units::Many) behind a
    /// [weighed](super::LimitLayer::weigh) layer.
    #[must_use = "futures do nothing unless polled; a waiting request waits only while this is polled"]
    pub struct WaitResponseFuture<S, Request, R, H = super::UntilResponse, U = One>
    where
        S: Service<Request>,
        R: Refusal<S::Response, S::Error>,
        U: Units,
    {
        #[pin]
        pub(super) state: WaitState<S, Request, R, H, U>,
    }
}

pin_project_lite::pin_project! {
    #[project = WaitStateProj]
    pub(super) enum WaitState<S, Request, R, H, U>
    where
        S: Service<Request>,
        R: Refusal<S::Response, S::Error>,
        U: Units,
    {
        Queued {
            acquire: Acquire<U>,
            call: Option<Deferred<S, Request, R>>,
        },
        Handed {
            handed: Option<Handed<S, Request, U>>,
        },
        Called {
            #[pin]
            response: ResponseFuture<S::Future, S::Response, R::Error, H, U>,
        },
    }
}

/// The wait for units (`Limiter::acquire_owned_async`, or
/// `acquire_many_owned_async` for a weighed request).
pub(super) type Acquire<U> = Pin<Box<dyn Future<Output = Result<OwnedPermit<U>, Error>> + Send>>;

/// What a waiting request needs once its wait ends: a clone of the
/// service (not yet polled ready) and the request, or the refusal to
/// answer with.
pub(super) struct Deferred<S, Request, R> {
    pub(super) service: S,
    pub(super) request: Request,
    pub(super) refusal: R,
    pub(super) anchors: Anchors,
    pub(super) timer: TimerSpec,
    /// The wait's trace (feature `tracing`), ended with the wait.
    pub(super) trace: trace::WaitTrace,
}

/// A request handed a unit after its wait, polling its clone of the inner
/// service ready before calling it. Dropping it gives the unit back.
struct Handed<S, Request, U: Units> {
    service: S,
    request: Request,
    held: Held<U>,
}

impl<S, Request, R> Deferred<S, Request, R>
where
    S: Service<Request>,
    R: Refusal<S::Response, S::Error>,
{
    /// The wait ended with `admitted`: on to the inner service's readiness
    /// with the unit, or answer the refusal.
    fn admit<H, U: Carry>(
        self,
        admitted: Result<OwnedPermit<U>, Error>,
    ) -> WaitState<S, Request, R, H, U> {
        self.trace
            .end(admitted.as_ref().map(|_| ()).map_err(|e| *e));
        match admitted {
            Ok(permit) => {
                // The units move from the permit (and its `Arc` of the
                // limiter) to the shard's anchor before the inner service
                // is polled, so a panic in `poll_ready` or `call` still
                // gives them back.
                let (shard, units) = U::disarm(permit);
                WaitState::Handed {
                    handed: Some(Handed {
                        held: Held {
                            unit: Unit {
                                anchor: Arc::clone(&self.anchors[shard]),
                                units,
                            },
                            timer: start_timer(&self.timer),
                        },
                        service: self.service,
                        request: self.request,
                    }),
                }
            }
            Err(error) => WaitState::Called {
                response: ResponseFuture::new(State::Refused {
                    answer: Some(self.refusal.refuse_waiting(error)),
                }),
            },
        }
    }
}

impl<S, Request, R, H, U, Fe> Future for WaitResponseFuture<S, Request, R, H, U>
where
    S: Service<Request, Error = Fe>,
    R: Refusal<S::Response, Fe>,
    Fe: Into<R::Error>,
    H: Hold<S::Response, U>,
    U: Carry,
{
    type Output = Result<H::Response, R::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                WaitStateProj::Queued { acquire, call } => {
                    let Poll::Ready(admitted) = acquire.as_mut().poll(cx) else {
                        if let Some(call) = call.as_mut() {
                            call.trace.pending();
                        }
                        return Poll::Pending;
                    };
                    let Some(call) = call.take() else {
                        // Unreachable: the state moves on below. Pending
                        // rather than a panic, as `ResponseFuture`.
                        return Poll::Pending;
                    };
                    // The finished wait (and its box) is dropped here.
                    state.set(call.admit(admitted));
                }
                WaitStateProj::Handed { handed } => {
                    // Unreachable when `None`: the state moves on below.
                    let Some(ready) = handed.as_mut() else {
                        return Poll::Pending;
                    };
                    // The unit is held while the inner service gets ready:
                    // the request is admitted, its handler is not free yet.
                    match ready.service.poll_ready(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(error)) => {
                            // The unit goes back (counted as completed) and
                            // its time is recorded, as for an inner error.
                            drop(handed.take());
                            return Poll::Ready(Err(error.into()));
                        }
                        Poll::Ready(Ok(())) => {}
                    }
                    let Some(Handed {
                        mut service,
                        request,
                        held,
                    }) = handed.take()
                    else {
                        return Poll::Pending;
                    };
                    let future = service.call(request);
                    state.set(WaitState::Called {
                        response: ResponseFuture::new(State::Admitted {
                            future,
                            held: Some(held),
                        }),
                    });
                }
                WaitStateProj::Called { response } => return response.poll(cx),
            }
        }
    }
}

impl<S, Request, R, H, U> fmt::Debug for WaitResponseFuture<S, Request, R, H, U>
where
    S: Service<Request>,
    R: Refusal<S::Response, S::Error>,
    U: Units,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            WaitState::Queued { .. } => "waiting",
            WaitState::Handed { .. } => "admitted",
            WaitState::Called { response } => match response.state {
                State::Admitted { .. } => "admitted",
                State::Refused { .. } => "refused",
            },
        };
        f.debug_struct("WaitResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<F, T, E, H, U: Units> fmt::Debug for ResponseFuture<F, T, E, H, U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Admitted { .. } => "admitted",
            State::Refused { .. } => "refused",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
