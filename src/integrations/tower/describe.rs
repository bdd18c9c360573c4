//! What a request asks of the limiter: the layer's last type parameter,
//! a *describer* ([`Describe`]) that says how many units a request takes
//! and of which [`Class`]. [`Unweighed`] (the default: one unit of the
//! default class), [`Weighed`] (units from a function of the request) and
//! [`Classified`] (a class from a function of the request, over either
//! weight, so a request may be weighed *and* classed).
//!
//! One `Service` impl per mode serves them all (`service.rs`): it asks the
//! describer for the request's [`Ask`], then takes it the way the
//! describer's units are carried ([`Carry`]): [`One`], the hot path's, for
//! [`Unweighed`] (its ask is a constant the take never reads, so the
//! unweighed layer runs the code it ran before requests had weights or
//! classes), [`Many`] for the others, whose asks go through the limiter's
//! take of an ask (the class's headroom, the waiting room's class order).

use super::{Acquire, Limiter};
use crate::engine::class::Class;
use crate::error::Error;
use crate::limiter::OwnedPermit;
use crate::sync::Arc;
use crate::units::{Ask, Many, One};
use std::fmt;

pub(super) use sealed::{Carry, First};

/// What a request asks of a [`LimitLayer`](super::LimitLayer)'s limiter:
/// how many units it takes, and of which [`Class`]. The layer's last type
/// parameter is one: [`Unweighed`] (one unit of the default class, the
/// default), [`Weighed`] ([`LimitLayer::weigh`](super::LimitLayer::weigh))
/// or [`Classified`] ([`LimitLayer::classify`](super::LimitLayer::classify),
/// over either of the first two). Sealed: the layer's methods build them.
///
/// A [`Limit`](super::Limit) service asks it once per request, in `call`,
/// before any unit is taken and under no lock of the limiter's.
///
/// # Examples
///
/// ```
/// use sidejob::tower::{Describe, Unweighed};
/// use sidejob::units::Ask;
///
/// // Every request of an unweighed, unclassified layer asks for one unit
/// // of the default class.
/// assert_eq!(Describe::<u32>::describe(&Unweighed, &7), Ask::new());
/// ```
pub trait Describe<Request>: sealed::Sealed {
    /// The ask `request` makes: its units (at least one) and its class.
    /// Its waiting mode is the layer's (fail-fast for
    /// [`LimitLayer::new`](super::LimitLayer::new), waiting for
    /// [`LimitLayer::waiting`](super::LimitLayer::waiting)), not the ask's.
    fn describe(&self, request: &Request) -> Ask;
}

/// The weight of a layer, which a [`Classified`] layer keeps beside its
/// classifier: [`Unweighed`] or [`Weighed`]. Sealed.
///
/// # Examples
///
/// ```
/// use sidejob::tower::{Unweighed, Weight};
///
/// fn weighs_nothing<W: Weight>(_: &W) {}
/// weighs_nothing(&Unweighed);
/// ```
pub trait Weight: sealed::Weight {}

/// A classifier: the [`Class`] of a request, for
/// [`LimitLayer::classify`](super::LimitLayer::classify). Implemented for
/// every `Fn(&Request) -> Class` and, with the feature `http`, for
/// `ByHeader` ([`LimitLayer::classify_by_header`]).
///
/// It runs in `call`, once per request, before any unit is taken; it
/// should be cheap (read a header or an extension, not the body), and it
/// should not panic: a panic unwinds out of `call`.
///
/// # Examples
///
/// A type of your own, for a classifier with state of its own:
///
/// ```
/// use sidejob::{tower::Classify, Class};
///
/// /// Requests for paths under `/batch/` are sheddable.
/// #[derive(Clone)]
/// struct ByPath;
///
/// impl Classify<String> for ByPath {
///     fn classify(&self, path: &String) -> Class {
///         if path.starts_with("/batch/") { Class::Sheddable } else { Class::Critical }
///     }
/// }
///
/// assert_eq!(ByPath.classify(&"/batch/export".to_string()), Class::Sheddable);
/// // A closure is a classifier too.
/// let by_len = |path: &String| if path.len() > 10 { Class::SheddablePlus } else { Class::Critical };
/// assert_eq!(by_len.classify(&"/".to_string()), Class::Critical);
/// ```
#[cfg_attr(
    feature = "http",
    doc = "[`LimitLayer::classify_by_header`]: super::LimitLayer::classify_by_header"
)]
#[cfg_attr(
    not(feature = "http"),
    doc = "[`LimitLayer::classify_by_header`]: crate::tower#priority-classes"
)]
pub trait Classify<Request> {
    /// The class of `request`.
    fn classify(&self, request: &Request) -> Class;
}

impl<Request, F> Classify<Request> for F
where
    F: Fn(&Request) -> Class,
{
    #[inline]
    fn classify(&self, request: &Request) -> Class {
        self(request)
    }
}

/// The weight of a [`LimitLayer`](super::LimitLayer) made by
/// [`LimitLayer::new`](super::LimitLayer::new) or
/// [`LimitLayer::waiting`](super::LimitLayer::waiting): every request
/// takes one unit, of the default class.
///
/// The default last type parameter of [`LimitLayer`](super::LimitLayer)
/// and [`Limit`](super::Limit), so code that names `LimitLayer<R, M, H>`
/// keeps compiling, and an unweighed request pays what it paid before
/// requests had weights or classes (its guard holds no count, its take
/// is the one-unit take). [`LimitLayer::weigh`](super::LimitLayer::weigh)
/// swaps it for [`Weighed`], [`LimitLayer::classify`](super::LimitLayer::classify)
/// wraps it in [`Classified`].
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use sidejob::tower::{FailFast, LimitLayer, Reject, Unweighed, UntilResponse};
/// use sidejob::Limiter;
///
/// let layer: LimitLayer<Reject, FailFast, UntilResponse, Unweighed> =
///     LimitLayer::new(Arc::new(Limiter::new(8)?));
/// assert!(format!("{layer:?}").contains("Unweighed"));
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Unweighed;

/// The weight of a [`LimitLayer`](super::LimitLayer) made by
/// [`LimitLayer::weigh`](super::LimitLayer::weigh): each request takes as
/// many units as the function `F` says for it (at least one), and holds
/// all of them until its response (or, with
/// [`hold_until_body_ends`](crate::tower#streamed-bodies), its body) is
/// done. See [Weighed requests](crate::tower#weighed-requests).
///
/// # Examples
///
/// Requests weighed by themselves: a `u32` request takes that many units.
///
/// ```
/// use std::sync::Arc;
/// use sidejob::tower::LimitLayer;
/// use sidejob::Limiter;
/// use tower::{service_fn, Layer, Service, ServiceExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let limiter = Arc::new(Limiter::new(10)?);
/// let layer = LimitLayer::new(Arc::clone(&limiter)).weigh(|n: &u32| *n as usize);
/// let mut service = layer.layer(service_fn(|n: u32| async move { Ok::<_, std::convert::Infallible>(n) }));
///
/// let pending = service.ready().await?.call(7); // called, not yet polled
/// assert_eq!(limiter.usage(), 7);
/// assert_eq!(pending.await?, 7); // done: all seven go back
/// assert_eq!(limiter.usage(), 0);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct Weighed<F>(pub(super) F);

impl<F> fmt::Debug for Weighed<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Weighed(..)")
    }
}

/// The describer of a [`LimitLayer`](super::LimitLayer) made by
/// [`LimitLayer::classify`](super::LimitLayer::classify) (or
/// `classify_by_header`, feature `http`): each request is of the
/// [`Class`] the classifier `C` says, and takes the units its weight `W`
/// says ([`Unweighed`]: one; [`Weighed`]: the weigher's). See
/// [Priority classes](crate::tower#priority-classes).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use sidejob::tower::{Classified, FailFast, LimitLayer, Reject, Unweighed, UntilResponse, Weighed};
/// use sidejob::{Class, Limiter};
///
/// fn class(n: &u32) -> Class {
///     if *n > 100 { Class::Sheddable } else { Class::Critical }
/// }
/// fn weight(n: &u32) -> usize {
///     *n as usize / 100
/// }
///
/// let limiter = Arc::new(Limiter::new(8)?);
/// let classed: LimitLayer<Reject, FailFast, UntilResponse, Classified<fn(&u32) -> Class>> =
///     LimitLayer::new(Arc::clone(&limiter)).classify(class as fn(&u32) -> Class);
/// // Weighed and classed, in either order: the same type.
/// type Both = Classified<fn(&u32) -> Class, Weighed<fn(&u32) -> usize>>;
/// let a: LimitLayer<Reject, FailFast, UntilResponse, Both> =
///     classed.weigh(weight as fn(&u32) -> usize);
/// let b: LimitLayer<Reject, FailFast, UntilResponse, Both> = LimitLayer::new(limiter)
///     .weigh(weight as fn(&u32) -> usize)
///     .classify(class as fn(&u32) -> Class);
/// # let _ = (a, b);
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Classified<C, W = Unweighed> {
    pub(super) classify: C,
    pub(super) weight: W,
}

/// The describer of a layer with tenants, [`LimitLayer::key_by`](super::LimitLayer::key_by):
/// each request's ask is its inner describer's (its weight and class),
/// for the tenant `key(&request)` names.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use sidejob::tower::{FailFast, Keyed, LimitLayer, Reject, Unweighed, UntilResponse};
/// use sidejob::Limiter;
///
/// fn tenant(path: &String) -> String {
///     path.split('/').nth(1).unwrap_or_default().to_owned()
/// }
///
/// let layer: LimitLayer<Reject, FailFast, UntilResponse, Keyed<fn(&String) -> String>> =
///     LimitLayer::new(Arc::new(Limiter::new(8)?)).key_by(tenant as fn(&String) -> String);
/// # let _ = layer;
/// # Ok::<(), sidejob::ConfigError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Keyed<F, D = Unweighed> {
    pub(super) key: F,
    pub(super) inner: D,
}

impl<F, D: fmt::Debug> fmt::Debug for Keyed<F, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyed")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<Request, F, K, D> Describe<Request> for Keyed<F, D>
where
    F: Fn(&Request) -> K,
    K: std::hash::Hash,
    D: Describe<Request>,
{
    /// The inner describer's ask, for the tenant `key(request)` names.
    #[inline]
    fn describe(&self, request: &Request) -> Ask {
        self.inner.describe(request).key(&(self.key)(request))
    }
}

impl<C, W: fmt::Debug> fmt::Debug for Classified<C, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Classified")
            .field("weight", &self.weight)
            .finish_non_exhaustive()
    }
}

impl<Request> Describe<Request> for Unweighed {
    #[inline(always)]
    fn describe(&self, _: &Request) -> Ask {
        Ask::new()
    }
}

impl<Request, F> Describe<Request> for Weighed<F>
where
    F: Fn(&Request) -> usize,
{
    /// What the weigher says, and one for a weight of 0 (see
    /// [`LimitLayer::weigh`](super::LimitLayer::weigh)).
    #[inline]
    fn describe(&self, request: &Request) -> Ask {
        Ask::new().units((self.0)(request).max(1))
    }
}

impl<Request, C, W> Describe<Request> for Classified<C, W>
where
    C: Classify<Request>,
    W: Weight + Describe<Request>,
{
    #[inline]
    fn describe(&self, request: &Request) -> Ask {
        let ask = self.weight.describe(request);
        ask.class(self.classify.classify(request))
    }
}

impl Weight for Unweighed {}
impl<F> Weight for Weighed<F> {}

/// The [`Classify`] of [`LimitLayer::classify_by_header`](super::LimitLayer::classify_by_header):
/// the class a request's header names, by [`Class::from_header`] (a name
/// in any case, `-` for `_`, blanks around it ignored), and the default
/// class, [`Class::Critical`], for a request without the header or with a
/// value that names no class. Of several values, the first.
///
/// # Examples
///
/// ```
/// use http::{HeaderName, Request};
/// use sidejob::tower::{ByHeader, Classify};
/// use sidejob::Class;
///
/// let by_priority = ByHeader::new(HeaderName::from_static("x-priority"));
/// let request = |value: &str| Request::get("/").header("x-priority", value).body(()).unwrap();
/// assert_eq!(by_priority.classify(&request("sheddable")), Class::Sheddable);
/// assert_eq!(by_priority.classify(&request("Critical-Plus")), Class::CriticalPlus);
/// // Unknown, or missing: the default class, never an error.
/// assert_eq!(by_priority.classify(&request("urgent!!")), Class::Critical);
/// assert_eq!(by_priority.classify(&Request::get("/").body(()).unwrap()), Class::Critical);
/// ```
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
#[derive(Debug, Clone)]
pub struct ByHeader {
    name: http::HeaderName,
}

#[cfg(feature = "http")]
impl ByHeader {
    /// Classifies requests by the header `name`.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::HeaderName;
    /// use sidejob::tower::ByHeader;
    ///
    /// let by_priority = ByHeader::new(HeaderName::from_static("x-priority"));
    /// assert_eq!(by_priority.name(), "x-priority");
    /// ```
    pub fn new(name: http::HeaderName) -> Self {
        ByHeader { name }
    }

    /// The header it reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::HeaderName;
    /// use sidejob::tower::ByHeader;
    ///
    /// assert_eq!(ByHeader::new(HeaderName::from_static("x-class")).name(), "x-class");
    /// ```
    pub fn name(&self) -> &http::HeaderName {
        &self.name
    }
}

#[cfg(feature = "http")]
impl<B> Classify<http::Request<B>> for ByHeader {
    #[inline]
    fn classify(&self, request: &http::Request<B>) -> Class {
        request
            .headers()
            .get(&self.name)
            .map_or_else(Class::default, |value| Class::from_header(value.as_bytes()))
    }
}

mod sealed {
    use super::{Acquire, Arc, Ask, Error, Limiter, Many, One, OwnedPermit};
    use crate::units::Units;

    /// Implemented by the crate's describers only: which kind of units
    /// their requests hold.
    pub trait Sealed {
        /// [`One`] for an unweighed layer (the hot path's guard, no
        /// count), [`Many`] for every other.
        type Units: Carry;
    }

    impl Sealed for super::Unweighed {
        type Units = One;
    }

    impl<F> Sealed for super::Weighed<F> {
        type Units = Many;
    }

    impl<C, W> Sealed for super::Classified<C, W> {
        type Units = Many;
    }

    impl<F, D> Sealed for super::Keyed<F, D> {
        type Units = Many;
    }

    /// Implemented by the two weights only.
    pub trait Weight {}

    impl Weight for super::Unweighed {}
    impl<F> Weight for super::Weighed<F> {}

    /// What the waiting layer's `call` found: the units taken, the wait
    /// for them (every unit was out and the limiter has a waiting room),
    /// or a refusal (counted if it is an `Overload`).
    pub enum First<U: Units> {
        Taken(usize, U),
        Wait(Acquire<U>),
        Refused(Error),
    }

    impl<U: Units> std::fmt::Debug for First<U> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                First::Taken(shard, units) => {
                    f.debug_tuple("Taken").field(shard).field(units).finish()
                }
                First::Wait(_) => f.write_str("Wait(..)"),
                First::Refused(error) => f.debug_tuple("Refused").field(error).finish(),
            }
        }
    }

    /// How an admitted request's units are taken and carried, for each
    /// kind of units: taken in `call` (by the waiting layer: first tried,
    /// then waited for), and a permit handed over after a wait turned
    /// into them.
    ///
    /// Public in a private module: the sealed [`Sealed`]'s associated type
    /// is bound by it, and no user can name it.
    pub trait Carry: Units + Sized {
        /// The fail-fast layer's take, counted (an `Overload` in the
        /// limiter's refusals).
        fn take(limiter: &Limiter, ask: Ask) -> Result<(usize, Self), Error>;

        /// The waiting layer's take in `call`: uncounted where a wait may
        /// follow, counted where it is the last word; the wait itself if
        /// one follows. (For [`One`] the ask goes nowhere, not even to the
        /// cold wait: passed on there, it was stored on every request's
        /// path, four instructions more.)
        fn first(limiter: &Arc<Limiter>, ask: Ask) -> First<Self>;

        /// Disarms `permit`: its units stay taken, and the caller owes
        /// their release. Returns the shard of the first, and the units.
        fn disarm(permit: OwnedPermit<Self>) -> (usize, Self);
    }

    /// One unit of the default class: the ask is the constant
    /// `Ask::new()`, read by none of these.
    impl Carry for One {
        #[inline(always)]
        fn take(limiter: &Limiter, _: Ask) -> Result<(usize, One), Error> {
            limiter.take_unit().map(|shard| (shard, One))
        }

        #[inline(always)]
        fn first(limiter: &Arc<Limiter>, _: Ask) -> First<One> {
            // Uncounted: a request that goes on to wait is not a refusal;
            // the waiting room counts one if it is refused for good.
            match limiter.take_unit_uncounted() {
                Ok(shard) => First::Taken(shard, One),
                Err(Error::Overload) if limiter.has_room() => First::Wait(wait_one(limiter)),
                // A limiter without a waiting room refuses here, counted,
                // without the clone and allocation of a wait.
                Err(error) => {
                    if error == Error::Overload {
                        limiter.count_refusal();
                    }
                    First::Refused(error)
                }
            }
        }

        fn disarm(permit: OwnedPermit<One>) -> (usize, One) {
            (permit.into_shard(), One)
        }
    }

    /// Any number of units of any class: the limiter's take of an ask.
    impl Carry for Many {
        #[inline]
        fn take(limiter: &Limiter, ask: Ask) -> Result<(usize, Many), Error> {
            limiter.take_ask(ask)
        }

        fn first(limiter: &Arc<Limiter>, ask: Ask) -> First<Many> {
            // With a room: uncounted, the room counts a refusal for good
            // (the class's too). Without one: the fail-fast take, which
            // counts an `Overload` in the totals and the class's figures.
            // More than the class may ever hold is `Overload` from the
            // wait at once (never queued); `TooLarge` never waits.
            let taken = if limiter.has_room() {
                limiter.probe_ask(ask)
            } else {
                limiter.take_ask(ask)
            };
            match taken {
                Ok((shard, units)) => First::Taken(shard, units),
                Err(Error::Overload) if limiter.has_room() => First::Wait(wait_many(limiter, ask)),
                Err(error) => First::Refused(error),
            }
        }

        fn disarm(permit: OwnedPermit<Many>) -> (usize, Many) {
            permit.into_parts()
        }
    }

    /// The wait for one unit of the default class. Cold: only requests
    /// that found every unit out come here. Boxed: `acquire_owned_async`'s
    /// future has no name to store it under; one allocation, for a request
    /// that waits.
    #[cold]
    fn wait_one(limiter: &Arc<Limiter>) -> Acquire<One> {
        Box::pin(Arc::clone(limiter).acquire_owned_async())
    }

    /// The wait for what `ask` describes, in its class's place. Cold, as
    /// [`wait_one`].
    #[cold]
    fn wait_many(limiter: &Arc<Limiter>, ask: Ask) -> Acquire<Many> {
        Box::pin(Arc::clone(limiter).wait_ask_owned(ask))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A request of `units` units, for the weigher, and a class name.
    type Job = (usize, &'static str);

    fn units(job: &Job) -> usize {
        job.0
    }

    fn class(job: &Job) -> Class {
        Class::from_header(job.1.as_bytes())
    }

    #[test]
    fn weighing_and_classifying_compose_in_either_order() {
        let weighed_first = Classified {
            classify: class,
            weight: Weighed(units),
        };
        for (job, want) in [
            (
                (3, "sheddable"),
                Ask::new().units(3).class(Class::Sheddable),
            ),
            ((0, "critical_plus"), Ask::new().class(Class::CriticalPlus)),
            ((2, "no such class"), Ask::new().units(2)),
        ] {
            assert_eq!(weighed_first.describe(&job), want, "{job:?}");
        }
        // Unweighed but classed: one unit of the class.
        let classed = Classified {
            classify: class,
            weight: Unweighed,
        };
        assert_eq!(
            classed.describe(&(9, "Sheddable-Plus")),
            Ask::new().class(Class::SheddablePlus)
        );
        // Neither: the hot path's constant ask.
        assert_eq!(
            Describe::<Job>::describe(&Unweighed, &(9, "sheddable")),
            Ask::new()
        );
    }

    #[cfg(feature = "http")]
    #[test]
    fn a_header_names_a_class_or_the_default_never_an_error() {
        use http::{HeaderName, HeaderValue, Request};

        let by = ByHeader::new(HeaderName::from_static("x-priority"));
        let with = |values: &[&[u8]]| {
            let mut request = Request::new(());
            for value in values {
                request.headers_mut().append(
                    "x-priority",
                    HeaderValue::from_bytes(value).expect("a valid header value"),
                );
            }
            by.classify(&request)
        };
        assert_eq!(with(&[]), Class::Critical, "missing");
        assert_eq!(with(&[b"sheddable"]), Class::Sheddable);
        assert_eq!(with(&[b" SHEDDABLE_plus "]), Class::SheddablePlus);
        assert_eq!(with(&[b""]), Class::Critical, "empty");
        assert_eq!(with(&[b"critical-plus-plus"]), Class::Critical, "unknown");
        // Not text (obs-text bytes a header may carry): the default too.
        assert_eq!(with(&[b"\xff\xfe"]), Class::Critical, "not UTF-8");
        // Of several values, the first counts: a second one cannot lift it.
        assert_eq!(with(&[b"sheddable", b"critical_plus"]), Class::Sheddable);
        // Another header is not read.
        let mut other = Request::new(());
        other
            .headers_mut()
            .insert("priority", HeaderValue::from_static("sheddable"));
        assert_eq!(by.classify(&other), Class::Critical);
    }
}
