//! The layer's `tracing` output, read by a test subscriber: a request
//! that waits opens a `wait` span inside its request's span, with the
//! wait's outcome; each refusal is a `refused` event inside the request's
//! span (inside its wait span, if it waited); an admitted request that did
//! not wait emits nothing.
//!
//! The request spans are made as tower-http's `TraceLayer` makes them:
//! entered around `call`, and instrumenting the response future.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sidejob::tower::LimitLayer;
use sidejob::{Error, Limiter};
use tokio::sync::oneshot;
use tower::{service_fn, Layer, Service, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Instrument, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A span's or event's fields, as text.
#[derive(Debug, Default, Clone, PartialEq)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), value.to_string());
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl Fields {
    fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }
}

/// What the test layer saw: each span closed (name, fields, its parent's
/// label) and each event (fields, the labels of its scope, leaf first).
#[derive(Debug, Default)]
struct Seen {
    spans: Vec<(String, Fields, Option<String>)>,
    events: Vec<(Fields, Vec<String>)>,
}

/// A span's label: `request#3` for a request span, else its name.
fn label<S: for<'a> LookupSpan<'a>>(span: &tracing_subscriber::registry::SpanRef<'_, S>) -> String {
    let fields = span
        .extensions()
        .get::<Fields>()
        .cloned()
        .unwrap_or_default();
    match fields.get("id") {
        Some(id) => format!("{}#{id}", span.name()),
        None => span.name().to_string(),
    }
}

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Seen>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        ctx.span(id).unwrap().extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut extensions = span.extensions_mut();
        if let Some(fields) = extensions.get_mut::<Fields>() {
            values.record(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        fields
            .0
            .insert("target".into(), event.metadata().target().into());
        let scope = ctx
            .event_scope(event)
            .map(|scope| scope.map(|span| label(&span)).collect())
            .unwrap_or_default();
        self.0.lock().unwrap().events.push((fields, scope));
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        let fields = span
            .extensions()
            .get::<Fields>()
            .cloned()
            .unwrap_or_default();
        let parent = span.parent().map(|p| label(&p));
        let record = (span.name().to_string(), fields, parent);
        self.0.lock().unwrap().spans.push(record);
    }
}

/// Calls `service` inside a `request` span numbered `id`, as a tracing
/// middleware outside the layer would.
fn traced<S, R>(
    service: &mut S,
    id: u64,
    request: R,
) -> impl Future<Output = Result<S::Response, S::Error>>
where
    S: Service<R>,
{
    let span = tracing::info_span!("request", id);
    let future = span.in_scope(|| service.call(request));
    future.instrument(span)
}

#[tokio::test(flavor = "current_thread")]
async fn waits_and_refusals_are_traced_inside_the_request_span() {
    let recorder = Recorder::default();
    let subscriber = tracing_subscriber::registry().with(recorder.clone());
    let _default = tracing::subscriber::set_default(subscriber);

    let limiter = Arc::new(
        Limiter::builder()
            .capacity(1)
            .max_waiters(1)
            .max_wait(Duration::from_secs(3600))
            .build()
            .unwrap(),
    );
    let mut service = LimitLayer::waiting(Arc::clone(&limiter)).layer(service_fn(
        |rx: oneshot::Receiver<u32>| async move { Ok::<_, Infallible>(rx.await.unwrap_or(0)) },
    ));

    // 1 is admitted at once, 2 waits, 3 finds the room full.
    let (tx1, rx1) = oneshot::channel();
    let first = tokio::spawn(traced(service.ready().await.unwrap(), 1, rx1));
    tokio::task::yield_now().await;
    let (tx2, rx2) = oneshot::channel();
    let second = tokio::spawn(traced(service.ready().await.unwrap(), 2, rx2));
    while limiter.waiting() == 0 {
        tokio::task::yield_now().await;
    }
    let (_tx3, rx3) = oneshot::channel();
    let third = traced(service.ready().await.unwrap(), 3, rx3).await;
    assert_eq!(
        third.unwrap_err().downcast_ref::<Error>(),
        Some(&Error::Overload)
    );

    // 1 finishes: 2 is handed the unit.
    tx1.send(1).unwrap();
    assert_eq!(first.await.unwrap().unwrap(), 1);
    tx2.send(2).unwrap();
    assert_eq!(second.await.unwrap().unwrap(), 2);

    // 4 waits behind a held unit and is refused by the limiter's close.
    let (_tx5, rx5) = oneshot::channel();
    let held = service.ready().await.unwrap().call(rx5);
    let (_tx4, rx4) = oneshot::channel();
    let fourth = tokio::spawn(traced(service.ready().await.unwrap(), 4, rx4));
    while limiter.waiting() == 0 {
        tokio::task::yield_now().await;
    }
    limiter.close();
    let refused = fourth.await.unwrap().unwrap_err();
    assert_eq!(refused.downcast_ref::<Error>(), Some(&Error::Shutdown));
    drop(held);

    let seen = recorder.0.lock().unwrap();
    // Two waits, each a child of its request's span, with its outcome.
    let waits: Vec<_> = seen
        .spans
        .iter()
        .filter(|(name, ..)| name == "wait")
        .map(|(_, fields, parent)| (parent.as_deref(), fields.get("outcome")))
        .collect();
    assert_eq!(
        waits,
        [
            (Some("request#2"), Some("admitted")),
            (Some("request#4"), Some("shutdown"))
        ]
    );
    // Two refusals: 3 at once, in its request's span; 4 after its wait,
    // in the wait span inside its request's span. 1 and 2 emit nothing.
    let refusals: Vec<_> = seen
        .events
        .iter()
        .map(|(fields, scope)| {
            assert_eq!(fields.get("message"), Some("refused"));
            assert_eq!(fields.get("target"), Some("sidejob::tower"));
            (
                fields.get("error").unwrap().to_string(),
                fields.get("waited").unwrap().to_string(),
                scope.clone(),
            )
        })
        .collect();
    assert_eq!(
        refusals,
        [
            (
                Error::Overload.to_string(),
                "false".to_string(),
                vec!["request#3".to_string()]
            ),
            (
                Error::Shutdown.to_string(),
                "true".to_string(),
                vec!["wait".to_string(), "request#4".to_string()]
            ),
        ]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_fail_fast_refusal_is_an_event_in_the_request_span() {
    let recorder = Recorder::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let limiter = Arc::new(Limiter::new(1).unwrap());
    let mut service = LimitLayer::new(Arc::clone(&limiter))
        .on_overload(|e: Error| e.to_string())
        .layer(service_fn(|()| async {
            Ok::<_, Infallible>("served".to_string())
        }));

    let held = limiter.try_acquire().unwrap();
    let answer = traced(service.ready().await.unwrap(), 7, ()).await.unwrap();
    assert_eq!(answer, Error::Overload.to_string());
    drop(held);
    let answer = traced(service.ready().await.unwrap(), 8, ()).await.unwrap();
    assert_eq!(answer, "served");

    let seen = recorder.0.lock().unwrap();
    assert!(
        seen.spans.iter().all(|(name, ..)| name == "request"),
        "no wait span"
    );
    assert_eq!(
        seen.events.len(),
        1,
        "one refusal, nothing for the admitted request"
    );
    let (fields, scope) = &seen.events[0];
    assert_eq!(fields.get("waited"), Some("false"));
    assert_eq!(scope, &["request#7".to_string()]);
}
