//! lens writes the W3C headers itself (no propagator on the inject path); this table proves
//! its bytes equal the OpenTelemetry SDK's W3C propagators' for every case where the two
//! should agree, and pins the one place lens differs on purpose (all eight flag bits).

use std::collections::HashMap;

use lens_core::Carrier;
use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::{TextMapCompositePropagator, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};

fn span(flags: u8, state: &[(&str, &str)]) -> Context {
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"),
        SpanId::from_hex("00f067aa0ba902b7").expect("hex"),
        TraceFlags::new(flags),
        true,
        TraceState::from_key_value(state.iter().copied()).expect("state"),
    ))
}

fn sdk(cx: &Context) -> HashMap<String, String> {
    let p = TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]);
    let mut out = HashMap::new();
    p.inject_context(cx, &mut out);
    // The SDK writes an empty tracestate; lens (and Python) leave it out.
    out.retain(|k, v| !(k == "tracestate" && v.is_empty()));
    out
}

#[test]
fn inject_writes_what_the_sdk_propagators_write() {
    let rows: Vec<(&str, Context)> = vec![
        ("sampled", span(0x01, &[])),
        ("not sampled", span(0x00, &[])),
        (
            "tracestate of one member",
            span(0x01, &[("rojo", "00f067aa0ba902b7")]),
        ),
        (
            "tracestate of two members",
            span(
                0x01,
                &[("rojo", "00f067aa0ba902b7"), ("congo", "t61rcWkgMzE")],
            ),
        ),
        (
            "a multi-tenant tracestate key",
            span(0x01, &[("tenant@system", "v-1")]),
        ),
        (
            "one baggage entry",
            span(0x01, &[]).with_baggage([KeyValue::new("job.id", "job-42")]),
        ),
        (
            "baggage needing no escapes",
            span(0x01, &[]).with_baggage([KeyValue::new("nv.dl.step", "17")]),
        ),
        (
            "baggage without a span",
            Context::new().with_baggage([KeyValue::new("k", "v")]),
        ),
        ("no span, no baggage", Context::new()),
        (
            "an invalid span context",
            Context::new().with_remote_span_context(SpanContext::empty_context()),
        ),
    ];
    for (why, cx) in rows {
        let mine: HashMap<String, String> = Carrier::from_context(&cx)
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(mine, sdk(&cx), "{why}");
    }
}

#[test]
fn lens_keeps_all_flag_bits_where_the_sdk_keeps_only_sampled() {
    for flags in [0x02u8, 0x03, 0x81, 0xff] {
        let cx = span(flags, &[]);
        let mine = Carrier::from_context(&cx);
        let tp = mine.get("traceparent").expect("traceparent");
        assert!(
            tp.ends_with(&format!("-{flags:02x}")),
            "flags {flags:#x}: {tp}"
        );
        let theirs = sdk(&cx);
        let want = format!("-{:02x}", flags & 0x01);
        assert!(
            theirs["traceparent"].ends_with(&want),
            "flags {flags:#x}: the SDK changed; revisit this difference: {}",
            theirs["traceparent"]
        );
        // Everything before the flags is the same.
        assert_eq!(tp[..53], theirs["traceparent"][..53], "flags {flags:#x}");
    }
}
