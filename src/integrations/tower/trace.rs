//! The layer's `tracing` hooks (feature `tracing`): a `wait` span for each
//! request that waits, and a `refused` event for each refusal, inside the
//! request's span. Without the feature they are `()` and empty functions,
//! so the call sites need no `cfg`.
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

/// The trace of one wait: its span, or nothing without the feature.
#[cfg(feature = "tracing")]
pub(super) type WaitTrace = tracing::Span;

#[cfg(not(feature = "tracing"))]
pub(super) type WaitTrace = ();

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

/// A request starts to wait: a `wait` span, child of the request's span
/// (the current one), open until the wait ends.
#[inline]
pub(super) fn wait_started() -> WaitTrace {
    #[cfg(feature = "tracing")]
    {
        tracing::debug_span!(target: "sidejob::tower", "wait", outcome = tracing::field::Empty)
    }
}

/// The wait ended with `outcome`: recorded on the wait span as
/// `outcome` (`admitted`, `overload`, `timeout`, `shutdown`); a refusal is
/// also a `refused` event inside the wait span (so inside the request's).
/// The span closes when `trace` is dropped, here.
#[inline]
pub(super) fn wait_ended(trace: WaitTrace, outcome: Result<(), Error>) {
    #[cfg(feature = "tracing")]
    match outcome {
        Ok(()) => {
            trace.record("outcome", "admitted");
        }
        Err(error) => {
            trace.record("outcome", outcome_name(error));
            tracing::debug!(
                target: "sidejob::tower",
                parent: &trace,
                error = %error,
                waited = true,
                "refused"
            );
        }
    }
    #[cfg(not(feature = "tracing"))]
    {
        let ((), _) = (trace, outcome);
    }
}

/// The `outcome` field's value for a refusal.
#[cfg(feature = "tracing")]
fn outcome_name(error: Error) -> &'static str {
    match error {
        Error::Overload => "overload",
        Error::Timeout => "timeout",
        Error::Shutdown => "shutdown",
        // A limiter's wait ends in none of these; named for completeness.
        _ => "refused",
    }
}
