//! lens's own cost per round, transport left out: a 1-rank slab group (the path MPI and NCCL
//! take) over a transport that has nothing to move, beside the work any scheme does at the
//! source (inject and encode). What `lens bench --backend mpi` adds over `raw` beyond these
//! is the collective itself.
// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use lens_core::backend::slab::{Round, Slab, SlabBroadcaster, SlabOptions, SlabTransport};
use lens_core::{Carrier, Result, blocking};
use opentelemetry::baggage::BaggageExt;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};

/// One rank: the slab is already where it must be.
struct Alone;

impl SlabTransport for Alone {
    fn broadcast_slab(&mut self, _: &Round, _: &mut Slab, _: Option<usize>) -> Result<()> {
        Ok(())
    }

    fn broadcast_rest(&mut self, _: &Round, _: &mut [u8]) -> Result<()> {
        Ok(())
    }
}

/// The context `lens bench` broadcasts: a traceparent and two baggage members.
fn context() -> Context {
    let sc = SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"),
        SpanId::from_hex("00f067aa0ba902b7").expect("hex"),
        TraceFlags::new(0x03),
        true,
        TraceState::NONE,
    );
    Context::new().with_remote_span_context(sc).with_baggage([
        KeyValue::new("nv.dl.step", "17"),
        KeyValue::new("job.id", "job-42"),
    ])
}

fn bench(c: &mut Criterion) {
    let group = SlabBroadcaster::new("bench", *b"BNCH", Alone, (0, 1), &SlabOptions::default())
        .expect("group");
    let cx = context();
    let bytes = Carrier::from_context(&cx).encode();
    let mut g = c.benchmark_group("round_1_rank");
    g.bench_function("inject+encode", |b| {
        b.iter(|| Carrier::from_context(black_box(&cx)).encode())
    });
    g.bench_function("broadcast_bytes", |b| {
        b.iter(|| blocking::broadcast(&group, 0, Some(black_box(&bytes))).expect("round"))
    });
    g.bench_function("broadcast_context", |b| {
        b.iter(|| blocking::broadcast_context(&group, 0, black_box(&cx)).expect("round"))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
