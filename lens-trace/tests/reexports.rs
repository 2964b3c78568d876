//! The re-exported OpenTelemetry crates are the very ones lens's own types take, so a
//! program that names them through lens never meets two versions (E0277).

use lens::opentelemetry::trace::TracerProvider as _;
use lens::opentelemetry::{Context, KeyValue};
use lens::opentelemetry_sdk::trace::SdkTracerProvider;

#[test]
fn lens_takes_the_types_of_the_crates_it_reexports() {
    let carrier = lens::Carrier::from_context(&Context::new());
    assert!(carrier.span_context().is_none());
    let provider = SdkTracerProvider::builder().build();
    let tracer = provider.tracer("reexports");
    let span = lens::create_linked_span(
        &tracer,
        "stage",
        Some(carrier),
        vec![KeyValue::new("k", "v")],
    );
    drop(span);
}
