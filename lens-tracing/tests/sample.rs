//! The step sampler under `tracing`: its processor sits in the provider that
//! `tracing-opentelemetry` writes to, so `tracing` spans are held and kept or dropped by
//! step, the same on every rank.

use std::collections::BTreeSet;

use lens_core::Broadcaster as _;
use lens_core::sample::{SampleRules, StepSampler, keys};
use lens_testkit::LocalCluster;
use opentelemetry::Value;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor};
use tracing::info_span;
use tracing_subscriber::layer::SubscriberExt as _;

#[test]
fn tracing_spans_are_kept_by_step_on_every_rank() {
    const STEPS: u64 = 6;
    let rules = SampleRules::parse("slower-than=60s").expect("rules");
    let ranks = LocalCluster::new(3).broadcasters();
    let kept: Vec<BTreeSet<i64>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .map(|b| {
                let rules = rules.clone();
                s.spawn(move || {
                    let exporter = InMemorySpanExporter::default();
                    let sampler =
                        StepSampler::new(rules, SimpleSpanProcessor::new(exporter.clone()));
                    let provider = SdkTracerProvider::builder()
                        .with_span_processor(sampler.processor())
                        .build();
                    let subscriber = tracing_subscriber::registry().with(
                        lens_tracing::tracing_opentelemetry::layer()
                            .with_tracer(provider.tracer("test")),
                    );
                    let rank = b.rank();
                    let group = sampler.group(b);
                    tracing::subscriber::with_default(subscriber, || {
                        for step in 1..=STEPS {
                            let span = info_span!("train_step", step);
                            let _in = span.enter();
                            lens_tracing::broadcast_current_blocking(&group, 0, &span)
                                .expect("round");
                            info_span!("work").in_scope(|| {
                                // Rank 2 votes for step 3.
                                if rank == 2 && step == 3 {
                                    sampler.keep_this_step();
                                }
                            });
                        }
                    });
                    drop(group);
                    exporter
                        .get_finished_spans()
                        .expect("spans")
                        .iter()
                        .map(|s| {
                            match s.attributes.iter().find(|kv| kv.key.as_str() == keys::STEP) {
                                Some(kv) => match &kv.value {
                                    Value::I64(n) => *n,
                                    v => panic!("{v:?}"),
                                },
                                None => panic!("a span passed without its step: {s:?}"),
                            }
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    // Step 3 (the vote), and the last two, undecided when the groups ended.
    for (rank, steps) in kept.iter().enumerate() {
        assert_eq!(
            steps,
            &BTreeSet::from([3, 5, 6]),
            "rank {rank} keeps what every rank keeps"
        );
    }
}
