//! `create_linked_span` against a plain SDK span with the same attributes (and a link built
//! by hand), on the same tracer.
// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use lens_core::{Carrier, create_linked_span};
use opentelemetry::trace::{
    Link, SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracerProvider;

fn bench(c: &mut Criterion) {
    // No exporter: the cost measured is span creation and end, not export.
    let provider = SdkTracerProvider::builder().build();
    let tracer = provider.tracer("bench");
    let sc = SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"),
        SpanId::from_hex("00f067aa0ba902b7").expect("hex"),
        TraceFlags::new(0x03),
        true,
        TraceState::NONE,
    );
    let carrier = Carrier::from_context(&Context::new().with_remote_span_context(sc.clone()))
        .with_source_rank(0);
    let attrs = || {
        vec![
            KeyValue::new("pp.stage", 3),
            KeyValue::new("nv.dl.step", 17),
        ]
    };

    let mut g = c.benchmark_group("span");
    g.bench_function("plain_sdk_span", |b| {
        b.iter(|| {
            let builder = tracer
                .span_builder("pp.recv_forward")
                .with_attributes(attrs());
            drop(tracer.build_with_context(builder, black_box(&Context::new())));
        })
    });
    g.bench_function("plain_sdk_span_with_link", |b| {
        b.iter(|| {
            let builder = tracer
                .span_builder("pp.recv_forward")
                .with_attributes(attrs())
                .with_links(vec![Link::with_context(black_box(&sc).clone())]);
            drop(tracer.build(black_box(builder)));
        })
    });
    g.bench_function("create_linked_span", |b| {
        b.iter(|| {
            drop(create_linked_span(
                &tracer,
                "pp.recv_forward.linked",
                black_box(&carrier),
                attrs(),
            ))
        })
    });
    let fresh = carrier.encode();
    g.bench_function("create_linked_span_fresh_carrier", |b| {
        // Worst case: a carrier never used before, so its traceparent is parsed here.
        b.iter_batched(
            || Carrier::decode(&fresh).expect("decodes"),
            |c| {
                drop(create_linked_span(
                    &tracer,
                    "pp.recv_forward.linked",
                    &c,
                    attrs(),
                ))
            },
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
