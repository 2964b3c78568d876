//! `create_linked_span` against SDK spans on the same tracer: with the same attributes and
//! no link, with a bare link, and made by hand as lens makes it (the remote as parent, the
//! link with lens's two attributes).
// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use lens_core::link::attributes;
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
    // The span create_linked_span makes, made by hand with the SDK: the remote as parent,
    // the same attributes, and the link with the same two attributes.
    g.bench_function("sdk_span_as_lens_makes_it", |b| {
        b.iter(|| {
            let parent = Context::new().with_remote_span_context(black_box(&sc).clone());
            let link = Link::new(
                sc.clone(),
                vec![
                    KeyValue::new(attributes::LINK_SOURCE_RANK, 0),
                    KeyValue::new(attributes::LINK_SOURCE, attributes::SOURCE_BROADCAST),
                ],
                0,
            );
            let builder = tracer
                .span_builder("pp.recv_forward.linked")
                .with_attributes(attrs())
                .with_links(vec![link]);
            drop(tracer.build_with_context(builder, &parent));
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
