//! Carrier codec cost, for a traceparent-only carrier (the common case) and a ~200-byte one
//! with tracestate and baggage: encode + decode, injection from a context, and the span
//! context a receiver parses; each beside the SDK's own W3C propagators doing the same.
// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use lens_core::Carrier;
use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::{TextMapCompositePropagator, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};

fn context() -> Context {
    let sc = SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"),
        SpanId::from_hex("00f067aa0ba902b7").expect("hex"),
        TraceFlags::new(0x03),
        true,
        TraceState::from_key_value([("rojo", "00f067aa0ba902b7"), ("congo", "t61rcWkgMzE")])
            .expect("state"),
    );
    Context::new().with_remote_span_context(sc).with_baggage([
        KeyValue::new("nv.dl.step", "17"),
        KeyValue::new("job.id", "job-42"),
        KeyValue::new("user", "team a"),
    ])
}

fn traceparent_only() -> Context {
    let sc = SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"),
        SpanId::from_hex("00f067aa0ba902b7").expect("hex"),
        TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    );
    Context::new().with_remote_span_context(sc)
}

fn bench(c: &mut Criterion) {
    for (name, cx) in [("traceparent", traceparent_only()), ("full", context())] {
        bench_one(c, name, &cx);
    }
}

fn bench_one(c: &mut Criterion, name: &str, cx: &Context) {
    let carrier = Carrier::from_context(cx);
    let bytes = carrier.encode();
    let sdk = TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]);
    let mut g = c.benchmark_group(format!("carrier_{name}_{}B", bytes.len()));
    // The round trip of a broadcast: the receiver decodes the buffer it was handed.
    g.bench_function("encode+decode", |b| {
        b.iter(|| Carrier::decode_owned(black_box(&carrier).encode()).expect("decodes"))
    });
    g.bench_function("encode+decode_copy", |b| {
        b.iter(|| Carrier::decode(&black_box(&carrier).encode()).expect("decodes"))
    });
    g.bench_function("encode", |b| b.iter(|| black_box(&carrier).encode()));
    g.bench_function("decode", |b| {
        b.iter(|| Carrier::decode(black_box(&bytes)).expect("decodes"))
    });
    g.bench_function("from_context", |b| {
        b.iter(|| Carrier::from_context(black_box(cx)))
    });
    g.bench_function("sdk_inject", |b| {
        b.iter(|| {
            let mut m = std::collections::HashMap::new();
            sdk.inject_context(black_box(cx), &mut m);
            m
        })
    });
    g.bench_function("span_context", |b| {
        b.iter(|| black_box(&carrier).span_context())
    });
    g.bench_function("decode+span_context", |b| {
        b.iter(|| {
            Carrier::decode(black_box(&bytes))
                .expect("decodes")
                .span_context()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
