//! Code written against the global tracer runs on N in-process ranks, each rank's spans
//! captured apart.

use lens_core::broadcast_context;
use lens_testkit::{Cluster, globals};
use opentelemetry::trace::{Span as _, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue, global};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};

/// Application code that knows nothing of ranks: it uses the global tracer.
async fn app_step(b: &dyn lens_core::Broadcaster, step: i64) -> lens_core::Result<()> {
    let tracer = global::tracer("app");
    let cx = if b.rank() == 0 {
        Context::new().with_span(
            tracer
                .span_builder("train_step")
                .with_attributes([KeyValue::new("step", step)])
                .start(&tracer),
        )
    } else {
        Context::new()
    };
    let remote = broadcast_context(b, 0, &cx).await?;
    if b.rank() > 0 {
        lens_core::LinkedSpan::builder("stage")
            .remote(&remote)
            .parent(lens_core::Parent::Remote)
            .start_with_context(&tracer, &Context::new())
            .end();
    }
    cx.span().end();
    Ok(())
}

#[test]
fn global_tracer_spans_land_on_the_rank_that_made_them() {
    let report = Cluster::builder(4)
        .route_globals()
        .build()
        .run_blocking(|rank| async move {
            for step in 0..3 {
                app_step(&*rank.broadcaster, step).await?;
                // Yield so ranks interleave on the runtime's threads.
                tokio::task::yield_now().await;
            }
            Ok(())
        })
        .expect("run");
    report.outcomes().expect("every rank");
    assert_eq!(report.named(0, "train_step").len(), 3);
    for r in 0..4 {
        let spans = report.spans(r);
        assert_eq!(spans.len(), 3, "rank {r} captured exactly its own 3 spans");
        let want = if r == 0 { "train_step" } else { "stage" };
        assert!(
            spans.iter().all(|s| s.name == want),
            "rank {r}: {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        assert!(
            spans
                .iter()
                .all(|s| s.instrumentation_scope.name() == "app"),
            "rank {r}: the scope is kept"
        );
    }
    for r in 1..4 {
        report
            .check_links(r, "stage", 0, "train_step")
            .expect("links");
    }
}

#[test]
fn with_rank_routes_threads_and_nothing_leaks_outside() {
    globals::install();
    let providers: Vec<(SdkTracerProvider, InMemorySpanExporter)> = (0..2)
        .map(|_| {
            let e = InMemorySpanExporter::default();
            (
                SdkTracerProvider::builder()
                    .with_simple_exporter(e.clone())
                    .build(),
                e,
            )
        })
        .collect();
    std::thread::scope(|s| {
        for (i, (p, _)) in providers.iter().enumerate() {
            s.spawn(move || {
                globals::with_rank(p, || {
                    for _ in 0..=i {
                        global::tracer("app").start("work").end();
                    }
                });
                // Outside the rank's scope: not captured by any rank.
                global::tracer("app").start("stray").end();
            });
        }
    });
    for (i, (p, e)) in providers.iter().enumerate() {
        let _ = p.force_flush();
        let spans = e.get_finished_spans().expect("spans");
        assert_eq!(spans.len(), i + 1, "provider {i}");
        assert!(spans.iter().all(|s| s.name == "work"));
    }
}
