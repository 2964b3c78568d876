//! The training loop's cost of OTLP export: one step (a broadcast on the in-process backend,
//! a linked span, its end) with export on (plain, and over TLS with gzip, to receivers on
//! loopback), against the same step with no export, measured in the same run; and how many
//! spans per second one rank can hand to the exporter and get exported, plain and over TLS.
//!
//! `cargo bench -p lens-otlp --bench step` (under `cargo test` it runs a few rounds only).
//! Each mode runs in 16 interleaved blocks after warm-up; the table gives median and p99 per
//! step and the ratio of medians against `no_export`.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::expect_used,
    clippy::unwrap_used
)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lens_core::{Broadcaster, LinkedSpan, Parent, RankInfo, blocking};
use lens_otlp::{ExportRanks, OtlpBuilder, OtlpGuard, Protocol};
use lens_testkit::LocalCluster;
use lens_testkit::otlp::{Receiver, TestCa};
use opentelemetry::trace::{Span as _, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{BatchConfigBuilder, SdkTracer, SdkTracerProvider};

const BLOCKS: usize = 16;
const WARMUP: usize = 50;

/// One step on the loop's thread: the source's context broadcast (one rank: the real code
/// path without waiting for a peer), a linked span, its end (the export handoff).
fn step(b: &dyn Broadcaster, tracer: &SdkTracer, cx: &Context, i: i64) {
    let remote = blocking::broadcast_context(b, 0, cx).expect("broadcast");
    LinkedSpan::builder("pp.recv_forward.linked")
        .remote(&remote)
        .parent(Parent::Remote)
        .attributes([KeyValue::new("nv.dl.step", i)])
        .start_with_context(tracer, &Context::new())
        .end();
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let iters = if bench { 40_000 } else { 320 };
    let receiver = Receiver::start().expect("receiver");
    let ca = TestCa::new().expect("a CA");
    let tls = Receiver::start_tls(&ca, false).expect("a TLS receiver");
    let info = || RankInfo::new(0, 1).expect("rank").with_job_id("bench");
    let guard = |b: OtlpBuilder| -> OtlpGuard { b.build().expect("guard") };
    let plain = SdkTracerProvider::builder()
        .with_resource(info().resource())
        .build();
    let guards = [
        (
            "not_chosen",
            guard(OtlpBuilder::new(info()).export_ranks(ExportRanks::List(BTreeSet::new()))),
        ),
        (
            "otlp_grpc",
            guard(
                OtlpBuilder::new(info())
                    .protocol(Protocol::Grpc)
                    .endpoint(receiver.grpc_endpoint()),
            ),
        ),
        (
            "grpc_no_open",
            guard(
                OtlpBuilder::new(info())
                    .protocol(Protocol::Grpc)
                    .endpoint(receiver.grpc_endpoint())
                    .track_open_spans(false),
            ),
        ),
        (
            "otlp_http",
            guard(
                OtlpBuilder::new(info())
                    .protocol(Protocol::HttpProtobuf)
                    .endpoint(receiver.http_endpoint()),
            ),
        ),
        (
            "grpc_tls_gz",
            guard(
                OtlpBuilder::new(info())
                    .protocol(Protocol::Grpc)
                    .endpoint(tls.grpc_endpoint())
                    .certificate(ca.ca_file())
                    .gzip(true),
            ),
        ),
        (
            "http_tls_gz",
            guard(
                OtlpBuilder::new(info())
                    .protocol(Protocol::HttpProtobuf)
                    .endpoint(tls.http_endpoint())
                    .certificate(ca.ca_file())
                    .gzip(true),
            ),
        ),
    ];
    let mut modes: Vec<(&str, SdkTracer)> = vec![("no_export", plain.tracer("bench"))];
    modes.extend(guards.iter().map(|(n, g)| (*n, g.tracer("bench"))));

    let b = LocalCluster::new(1).broadcasters().pop().expect("one rank");
    let source = plain.tracer("source").start("train_step");
    let cx = Context::new().with_span(source);
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(iters); modes.len()];
    for _ in 0..BLOCKS {
        for (m, (_, tracer)) in modes.iter().enumerate() {
            for i in 0..WARMUP {
                step(&b, tracer, &cx, i as i64);
            }
            for i in 0..iters / BLOCKS {
                let t = Instant::now();
                step(&b, tracer, &cx, i as i64);
                samples[m].push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    println!(
        "lens-otlp step overhead: broadcast + linked span + end, on the loop's thread ({iters} steps each)"
    );
    println!(
        "{:>12} {:>10} {:>10} {:>12}",
        "mode", "median_us", "p99_us", "vs_no_export"
    );
    let mut base = 0.0;
    for (m, (name, _)) in modes.iter().enumerate() {
        let s = &mut samples[m];
        s.sort_by(f64::total_cmp);
        let (median, p99) = (percentile(s, 0.5), percentile(s, 0.99));
        if m == 0 {
            base = median;
        }
        println!(
            "{name:>12} {median:>10.2} {p99:>10.2} {:>11.2}x",
            median / base
        );
    }

    // Spans per second one rank hands to the batch processor, and what reached the receiver:
    // with the default queue a burst beyond it is dropped (and counted); with a queue that
    // holds the burst the figure is the exporter's sustained rate.
    let n: usize = if bench { 200_000 } else { 2_000 };
    let plain_grpc = || {
        OtlpBuilder::new(info())
            .protocol(Protocol::Grpc)
            .endpoint(receiver.grpc_endpoint())
    };
    let tls_grpc = || {
        OtlpBuilder::new(info())
            .protocol(Protocol::Grpc)
            .endpoint(tls.grpc_endpoint())
            .certificate(ca.ca_file())
            .gzip(true)
    };
    let tls_http = || {
        OtlpBuilder::new(info())
            .protocol(Protocol::HttpProtobuf)
            .endpoint(tls.http_endpoint())
            .certificate(ca.ca_file())
            .gzip(true)
    };
    let runs: [(&str, OtlpBuilder, usize); 4] = [
        ("gRPC", plain_grpc(), 2_048),
        ("gRPC", plain_grpc(), n),
        ("gRPC, TLS + gzip", tls_grpc(), n),
        ("HTTP, TLS + gzip", tls_http(), n),
    ];
    for (what, builder, queue) in runs {
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(queue)
            .build();
        handoff(
            builder
                .batch_config(batch)
                .shutdown_timeout(Duration::from_secs(60)),
            n,
            queue,
            what,
        );
    }
    drop(guards);
}

fn handoff(builder: OtlpBuilder, n: usize, queue: usize, what: &str) {
    let g = builder.build().expect("guard");
    let tracer = g.tracer("bench");
    let t = Instant::now();
    for _ in 0..n {
        tracer.start("span").end();
    }
    let handed = t.elapsed().as_secs_f64();
    let result = g.shutdown();
    let total = t.elapsed().as_secs_f64();
    let (exported, lost) = match &result {
        Ok(s) => (s.exported, 0),
        Err(lens_core::Error::Export { lost, .. }) => (n as u64 - lost, *lost),
        Err(e) => {
            println!("handoff ({what}, queue {queue}): {e}");
            return;
        }
    };
    println!(
        "handoff ({what}, queue {queue}): {n} spans ended in {:.1} ms = {:.0} spans/s on one thread; \
         {exported} exported ({:.0} spans/s end to end), {lost} dropped and reported",
        handed * 1e3,
        n as f64 / handed,
        exported as f64 / total,
    );
}
