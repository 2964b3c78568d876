//! Spans with no subscriber, and with one that has no OpenTelemetry layer. In a binary of
//! its own: with no subscriber of its own, a thread's spans are disabled only while no
//! other thread of the process holds a subscriber that enables everything (tracing caches
//! a callsite's interest across every live subscriber), so next to the other tests, which
//! each install one, this test failed under load (4 of 40 runs).

use lens_core::Remote;
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
use tracing::info_span;

fn remote() -> Remote {
    Remote::from(SpanContext::new(
        TraceId::from(104u128),
        SpanId::from(104u64),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    ))
}

#[test]
fn a_disabled_span_is_returned_unchanged_and_no_subscriber_is_an_error() {
    // No subscriber at all: spans are disabled; nothing to link, no error.
    let span = lens_tracing::linked(info_span!("stage"), remote())
        .start()
        .expect("disabled");
    assert!(span.is_disabled());
    // A subscriber without the OpenTelemetry layer: the link cannot be made, and lens says so.
    let subscriber = tracing_subscriber::registry();
    let err = tracing::subscriber::with_default(subscriber, || {
        lens_tracing::linked(info_span!("stage"), remote())
            .start()
            .expect_err("no layer")
    });
    assert!(err.to_string().contains("tracing_opentelemetry"), "{err}");
}
