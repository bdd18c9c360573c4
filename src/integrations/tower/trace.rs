//! The layer's `tracing` hooks (feature `tracing`): a `wait` span for each
//! request that waits, and a `refused` event for each refusal, inside the
//! request's span. Without the feature they are a unit struct and empty
//! functions, so the call sites need no `cfg`.
//!
//! Both are on cold paths (a request that must wait already allocates; a
//! refusal answers at once), so an admitted request pays nothing, feature
//! or not. The target is `sidejob::tower`, the level `DEBUG`: under
//! overload every refused request makes an event, which is a rate no
//! default `INFO` log should carry (count them with the `metrics` feature).
//!
//! "The request's span" is the span current when the layer's `call` runs:
//! tower-http's `TraceLayer` enters its request span around `call` (and
//! around each poll of the response future), as any tracing middleware
//! outside this layer does.

use crate::error::Error;

/// The trace of one request sent to the waiting room: the request's span
/// (current in `call`), and the `wait` span, opened only once the request
/// actually waits (its first `Pending`). A request the full room refuses
/// at its first poll never waited: it gets a `refused` event, no span.
#[cfg(feature = "tracing")]
pub(super) struct WaitTrace {
    request: tracing::Span,
    wait: Option<tracing::Span>,
}

/// Nothing to trace without the feature.
#[cfg(not(feature = "tracing"))]
pub(super) struct WaitTrace;

/// A request refused in `call`, at once: a `refused` event in the
/// request's span (the current one).
#[cold]
#[inline(never)]
pub(super) fn refused(error: Error) {
    #[cfg(feature = "tracing")]
    tracing::debug!(target: "sidejob::tower", error = %error, waited = false, "refused");
    #[cfg(not(feature = "tracing"))]
    let _ = error;
}

impl WaitTrace {
    /// A request goes to the waiting room, from `call`: remembers the
    /// request's span (the current one).
    #[inline]
    pub(super) fn start() -> Self {
        #[cfg(feature = "tracing")]
        {
            WaitTrace {
                request: tracing::Span::current(),
                wait: None,
            }
        }
        #[cfg(not(feature = "tracing"))]
        WaitTrace
    }

    /// The wait is pending: opens the `wait` span, a child of the
    /// request's, the first time.
    #[inline]
    pub(super) fn pending(&mut self) {
        #[cfg(feature = "tracing")]
        if self.wait.is_none() {
            self.wait = Some(tracing::debug_span!(
                target: "sidejob::tower",
                parent: &self.request,
                "wait",
                outcome = tracing::field::Empty
            ));
        }
    }

    /// The wait ended with `outcome`. If the request waited, the outcome
    /// is recorded on its `wait` span (`admitted`, `overload`, `timeout`,
    /// `shutdown`, `too_large`), a refusal is a `refused` event inside that span, and
    /// the span closes here. If it did not (the room was full at once),
    /// a refusal is a `refused` event in the request's span.
    #[inline]
    pub(super) fn end(self, outcome: Result<(), Error>) {
        #[cfg(feature = "tracing")]
        let WaitTrace { request, wait } = self;
        #[cfg(feature = "tracing")]
        match (wait, outcome) {
            (Some(wait), Ok(())) => {
                wait.record("outcome", "admitted");
            }
            (Some(wait), Err(error)) => {
                wait.record("outcome", outcome_name(error));
                tracing::debug!(
                    target: "sidejob::tower",
                    parent: &wait,
                    error = %error,
                    waited = true,
                    "refused"
                );
            }
            (None, Ok(())) => {}
            (None, Err(error)) => {
                tracing::debug!(
                    target: "sidejob::tower",
                    parent: &request,
                    error = %error,
                    waited = false,
                    "refused"
                );
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = outcome;
    }
}

/// The `outcome` field's value for a refusal.
#[cfg(feature = "tracing")]
fn outcome_name(error: Error) -> &'static str {
    match error {
        Error::Overload => "overload",
        Error::Timeout => "timeout",
        Error::Shutdown => "shutdown",
        // A weighed waiter the capacity shrank below.
        Error::TooLarge => "too_large",
        // A limiter's wait ends in none of these; named for completeness.
        _ => "refused",
    }
}
