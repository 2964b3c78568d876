//! A round that times out leaves a `lens.hang` span on every live rank that waited, naming
//! the round, the missing ranks and the spans open then, flushed before the error returns.
//! (Its own process: it sets the global tracer provider.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lens_core::hang::{self, OpenSpans, keys};
use lens_core::{Broadcaster as _, Error, blocking};
use lens_testkit::LocalCluster;
use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Array, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};

fn attr<'a>(s: &'a opentelemetry_sdk::trace::SpanData, k: &str) -> Option<&'a Value> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == k)
        .map(|kv| &kv.value)
}

#[test]
fn a_timed_out_round_leaves_a_hang_report_on_each_waiting_rank() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(OpenSpans)
        .with_simple_exporter(exporter.clone())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    let flushed = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&flushed);
    let id = hang::set_flush(Box::new(move || {
        counter.fetch_add(1, Ordering::Relaxed);
    }));
    let tracer = provider.tracer("test");

    // Three ranks; rank 2, the root of the second round, never comes to it.
    let ranks = LocalCluster::new(3)
        .timeout(Duration::from_millis(300))
        .broadcasters();
    let results = lens_testkit::on_each_rank(&ranks, |b| {
        let first = blocking::broadcast(b, 0, (b.rank() == 0).then_some(&b"one"[..]));
        assert!(first.is_ok(), "rank {}: {first:?}", b.rank());
        if b.rank() == 2 {
            return None;
        }
        let mut step = tracer.start(format!("train_step on rank {}", b.rank()));
        let second = blocking::broadcast(b, 2, None);
        step.end();
        Some(second)
    });
    for (rank, r) in results.iter().enumerate().take(2) {
        match r {
            Some(Err(Error::Timeout {
                missing, last_seen, ..
            })) => {
                assert_eq!(missing, &vec![2], "rank {rank}");
                // Rank 2 took part in the first round only.
                assert_eq!(last_seen, &vec![(2, 1)], "rank {rank}");
            }
            other => panic!("rank {rank}: {other:?}"),
        }
    }
    // Errors other than timeouts (a bad root) report nothing; the rounds that succeeded
    // (the first) reported nothing either: two reports, one per waiting rank.
    assert!(matches!(
        blocking::broadcast(&ranks[0], 9, Some(b"x")),
        Err(Error::InvalidRoot { .. })
    ));
    assert_eq!(
        flushed.load(Ordering::Relaxed),
        2,
        "flushed once per report, before the error returned"
    );
    hang::clear_flush(id);

    let spans = exporter.get_finished_spans().expect("spans");
    let reports: Vec<_> = spans.iter().filter(|s| s.name == keys::SPAN).collect();
    assert_eq!(reports.len(), 2, "{spans:#?}");
    let mut who: Vec<i64> = Vec::new();
    for r in &reports {
        let Some(Value::I64(rank)) = attr(r, keys::RANK) else {
            panic!("no rank: {r:?}");
        };
        who.push(*rank);
        assert_eq!(
            attr(r, keys::ROUND),
            Some(&Value::I64(2)),
            "the second round: {r:?}"
        );
        assert_eq!(
            attr(r, keys::MISSING_RANKS),
            Some(&Value::Array(Array::I64(vec![2]))),
            "{r:?}"
        );
        assert_eq!(
            attr(r, keys::MISSING_LAST_SEEN),
            Some(&Value::Array(Array::I64(vec![1]))),
            "{r:?}"
        );
        let open: Vec<String> = r
            .events
            .iter()
            .filter(|e| e.name == keys::OPEN_SPAN_EVENT)
            .filter_map(|e| {
                e.attributes
                    .iter()
                    .find(|kv| kv.key.as_str() == keys::SPAN_NAME)
                    .map(|kv| kv.value.as_str().into_owned())
            })
            .collect();
        // Both ranks' step spans were open (one process), and never the report itself.
        assert!(
            open.iter()
                .any(|n| n == &format!("train_step on rank {rank}")),
            "rank {rank}'s report names its open step: {open:?}"
        );
        assert!(!open.iter().any(|n| n == keys::SPAN), "{open:?}");
    }
    who.sort_unstable();
    assert_eq!(who, vec![0, 1]);
    // Once ended, spans are no longer open.
    assert!(
        hang::open_spans()
            .iter()
            .all(|(n, _)| !n.starts_with("train_step")),
        "{:?}",
        hang::open_spans()
    );
    assert_eq!(ranks[0].rounds_started(), Some(2));
}
