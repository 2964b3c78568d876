//! The step sampler over TCP: a rank's vote (an explicit one, a span with an error status)
//! travels up in its acknowledgement (and in rank 0's DONE to another source), so every
//! rank keeps the steps it voted for, whole; star and tree, rank 0 or another source.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use lens_core::sample::{SampleRules, StepSampler, keys};
use lens_core::{Broadcaster as _, blocking};
use opentelemetry::trace::{
    Span as _, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};

const STEPS: u64 = 10;

/// Each rank's kept steps, with how many spans each kept step has there.
fn run(n: usize, k: Option<usize>, source: usize) -> Vec<BTreeSet<(i64, usize)>> {
    let ranks = common::group_with(n, Duration::from_secs(10), k);
    // Votes only: every other step is dropped, but for the last two (kept as the groups end).
    let rules = SampleRules::parse("slower-than=60s").expect("rules");
    lens_testkit::on_each_rank(&ranks, |b| {
        let exporter = InMemorySpanExporter::default();
        let sampler = StepSampler::new(rules.clone(), SimpleSpanProcessor::new(exporter.clone()));
        let provider = SdkTracerProvider::builder()
            .with_span_processor(sampler.processor())
            .build();
        let tracer = provider.tracer("test");
        let rank = b.rank();
        let group = sampler.group(b);
        for step in 1..=STEPS {
            let cx = Context::current_with_span(tracer.start("step"));
            let _g = cx.clone().attach();
            blocking::broadcast_trace_context(&group, source).expect("round");
            tracer.start("work").end();
            // The last rank votes for step 3; rank 1 fails a span in step 6.
            if rank == n - 1 && step == 3 {
                sampler.keep_this_step();
            }
            if rank == 1 && step == 6 {
                cx.span().set_status(Status::error("it broke"));
            }
            cx.span().end();
        }
        drop(group);
        let spans = exporter.get_finished_spans().expect("spans");
        let steps: BTreeSet<i64> = spans
            .iter()
            .map(
                |s| match s.attributes.iter().find(|kv| kv.key.as_str() == keys::STEP) {
                    Some(kv) => match kv.value {
                        Value::I64(n) => n,
                        _ => -1,
                    },
                    None => -1,
                },
            )
            .collect();
        steps
            .into_iter()
            .map(|st| {
                let count = spans
                    .iter()
                    .filter(|s| {
                        s.attributes
                            .iter()
                            .any(|kv| kv.key.as_str() == keys::STEP && kv.value == Value::I64(st))
                    })
                    .count();
                (st, count)
            })
            .collect()
    })
}

#[test]
fn votes_travel_in_acks_and_every_rank_keeps_the_same_steps() {
    // (why, ranks, fan-out, source)
    let rows: &[(&str, usize, Option<usize>, usize)] = &[
        ("a star from rank 0", 5, None, 0),
        ("a tree of fan-out 2 from rank 0", 7, Some(2), 0),
        (
            "a tree from another source (votes in rank 0's DONE)",
            7,
            Some(2),
            3,
        ),
    ];
    let last = STEPS as i64;
    let want: BTreeSet<(i64, usize)> = [3, 6, last - 1, last].into_iter().map(|s| (s, 2)).collect();
    for &(why, n, k, source) in rows {
        let got = run(n, k, source);
        for (rank, kept) in got.iter().enumerate() {
            assert_eq!(kept, &want, "{why}: rank {rank} keeps steps 3 and 6 whole");
        }
    }
}
