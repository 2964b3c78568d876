//! `tracing` spans across ranks: one trace per step, links set before the span starts
//! (the sampler sees them), the too-late case reported, fan-in counted.

use std::sync::{Arc, Mutex};

use lens_core::link::attributes::{LINK_SOURCE_RANK, LINKS_DROPPED};
use lens_core::{Parent, Remote};
use lens_testkit::Cluster;
use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId, TraceState,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::trace::{
    InMemorySpanExporter, SamplingDecision, SamplingResult, SdkTracerProvider, ShouldSample,
};
use tracing::info_span;
use tracing_subscriber::layer::SubscriberExt as _;

#[test]
fn a_step_of_tracing_spans_is_one_trace_across_ranks() {
    let steps = 3;
    let report = Cluster::builder(4)
        .tracing_subscribers()
        .build()
        .run_blocking(move |rank| async move {
            for step in 0..steps {
                let span = if rank.rank == 0 {
                    info_span!("train_step", step)
                } else {
                    tracing::Span::none()
                };
                let remote = lens_tracing::broadcast_current(&*rank.broadcaster, 0, &span).await?;
                if rank.rank > 0 {
                    let stage =
                        lens_tracing::linked(info_span!("pp.recv_forward.linked", step), &remote)
                            .parent(Parent::Remote)
                            .link_attributes([KeyValue::new("pp.microbatch", 0)])
                            .start()?;
                    stage.in_scope(|| tracing::info!("forward"));
                }
            }
            Ok(())
        })
        .expect("run");
    report.outcomes().expect("every rank");
    for r in 1..4 {
        report
            .check_links(r, "pp.recv_forward.linked", 0, "train_step")
            .expect("links");
    }
    let roots = report.named(0, "train_step");
    assert_eq!(roots.len(), steps as usize);
    for r in 1..4 {
        for (i, s) in report
            .named(r, "pp.recv_forward.linked")
            .into_iter()
            .enumerate()
        {
            assert_eq!(
                s.span_context.trace_id(),
                roots[i].span_context.trace_id(),
                "rank {r} step {i}: same trace"
            );
            assert_eq!(
                s.parent_span_id,
                roots[i].span_context.span_id(),
                "rank {r} step {i}: child of the step"
            );
        }
    }
}

/// Records the links each span showed the sampler.
#[derive(Debug, Clone, Default)]
struct Sampler(Arc<Mutex<Vec<(String, Vec<Link>)>>>);

impl ShouldSample for Sampler {
    fn should_sample(
        &self,
        _parent: Option<&Context>,
        _trace_id: TraceId,
        name: &str,
        _kind: &SpanKind,
        _attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        self.0
            .lock()
            .expect("lock")
            .push((name.to_owned(), links.to_vec()));
        SamplingResult {
            decision: SamplingDecision::RecordAndSample,
            attributes: Vec::new(),
            trace_state: TraceState::default(),
        }
    }
}

fn remote(i: u64) -> Remote {
    Remote::from(SpanContext::new(
        TraceId::from(u128::from(i) + 100),
        SpanId::from(i + 100),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    ))
    .with_link_attributes([KeyValue::new("request.index", i as i64)])
}

/// Runs `f` under a subscriber exporting to memory. The provider is kept alive by the
/// returned exporter's owner: the in-memory exporter forgets its spans at shutdown.
fn with_subscriber<R>(f: impl FnOnce() -> R) -> (R, Captured, Sampler) {
    let exporter = InMemorySpanExporter::default();
    let sampler = Sampler::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .with_sampler(sampler.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("t")));
    let out = tracing::subscriber::with_default(subscriber, f);
    (
        out,
        Captured {
            exporter,
            _provider: provider,
        },
        sampler,
    )
}

struct Captured {
    exporter: InMemorySpanExporter,
    _provider: SdkTracerProvider,
}

impl Captured {
    fn get_finished_spans(&self) -> Result<Vec<opentelemetry_sdk::trace::SpanData>, String> {
        self.exporter
            .get_finished_spans()
            .map_err(|e| e.to_string())
    }
}

#[test]
fn the_sampler_sees_the_links_and_the_remote_parent() {
    let ((), exporter, sampler) = with_subscriber(|| {
        let span = lens_tracing::linked(info_span!("stage"), remote(1).with_source_rank(0))
            .parent(Parent::Remote)
            .start()
            .expect("linked");
        span.in_scope(|| {});
    });
    let seen = sampler.0.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].1.len(), 1, "the sampler was shown the link");
    let span = &exporter.get_finished_spans().expect("spans")[0];
    assert_eq!(
        span.span_context.trace_id(),
        TraceId::from(101u128),
        "remote trace"
    );
    assert_eq!(span.parent_span_id, SpanId::from(101u64), "remote parent");
    let rank = span.links[0]
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == LINK_SOURCE_RANK);
    assert_eq!(rank.map(|kv| kv.value.clone()), Some(Value::I64(0)));
}

#[test]
fn parents_table() {
    // (parent, inside a local span, expect the remote's trace)
    let rows = [
        (
            Parent::Auto,
            false,
            true,
            "auto without a local span joins the remote",
        ),
        (Parent::Auto, true, false, "auto with a local span keeps it"),
        (
            Parent::Current,
            false,
            false,
            "current without a local span starts a trace",
        ),
        (Parent::Remote, true, true, "remote always joins"),
        (Parent::Root, true, false, "root starts a trace"),
    ];
    for (parent, local, joins, why) in rows {
        let ((), exporter, _) = with_subscriber(|| {
            let outer = local.then(|| info_span!("local"));
            let _entered = outer.as_ref().map(|s| s.enter());
            let span = lens_tracing::linked(info_span!("stage"), remote(2))
                .parent(parent)
                .start()
                .expect("linked");
            span.in_scope(|| {});
        });
        let spans = exporter.get_finished_spans().expect("spans");
        let stage = spans.iter().find(|s| s.name == "stage").expect("stage");
        assert_eq!(
            stage.span_context.trace_id() == TraceId::from(102u128),
            joins,
            "{why}"
        );
        assert_eq!(stage.links.len(), 1, "{why}: linked either way");
        if let Some(local) = spans.iter().find(|s| s.name == "local") {
            let child = stage.parent_span_id == local.span_context.span_id();
            assert_eq!(
                child,
                parent == Parent::Auto,
                "{why}: child of the local span"
            );
        }
    }
}

#[test]
fn linking_a_span_that_already_started_is_an_error_not_a_silent_miss() {
    let (err, _, _) = with_subscriber(|| {
        let span = info_span!("stage");
        span.in_scope(|| {}); // entering builds the OTel span
        lens_tracing::linked(span, remote(3))
            .parent(Parent::Remote)
            .start()
            .expect_err("too late")
    });
    assert!(err.to_string().contains("already started"), "{err}");
}

#[test]
fn fan_in_through_tracing_counts_what_the_limit_dropped() {
    let ((), exporter, _) = with_subscriber(|| {
        let span = lens_tracing::linked(info_span!("infer.batch"), remote(0))
            .remotes((1..10).map(remote))
            .link_limit(4)
            .parent(Parent::Root)
            .start()
            .expect("linked");
        span.in_scope(|| {});
    });
    let span = &exporter.get_finished_spans().expect("spans")[0];
    assert_eq!(span.links.len(), 4);
    let dropped = span
        .attributes
        .iter()
        .find(|kv| kv.key.as_str() == LINKS_DROPPED);
    assert_eq!(dropped.map(|kv| kv.value.clone()), Some(Value::I64(6)));
}

/// The blocking twin, in a loop with no async runtime: every rank receives the source's
/// span context, and a stage linked to it joins the source's trace.
#[test]
fn broadcast_current_blocking_carries_the_source_span_to_every_rank() {
    let ranks = lens_testkit::LocalCluster::new(3).broadcasters();
    let got = lens_testkit::on_each_rank(&ranks, |b| {
        let rank = lens_core::Broadcaster::rank(b);
        let (result, captured, _) = with_subscriber(|| {
            let step = if rank == 0 {
                info_span!("train_step")
            } else {
                tracing::Span::none()
            };
            let remote = lens_tracing::broadcast_current_blocking(b, 0, &step)
                .expect("broadcast")
                .expect("the source has a span");
            let sent = lens_tracing::context_of(&step);
            if rank > 0 {
                let stage = lens_tracing::linked(info_span!("stage"), &remote)
                    .parent(Parent::Remote)
                    .start()
                    .expect("linked");
                stage.in_scope(|| {});
            }
            drop(step);
            (remote, sent)
        });
        let spans = captured.exporter.get_finished_spans().expect("spans");
        (rank, result, spans)
    });
    let source = got[0].1.1.span().span_context().clone();
    assert!(source.is_valid());
    for (rank, (remote, _), spans) in &got {
        let received = remote.span_context().expect("valid");
        assert_eq!(received.trace_id(), source.trace_id(), "rank {rank}");
        assert_eq!(received.span_id(), source.span_id(), "rank {rank}");
        if *rank > 0 {
            let stage = spans.iter().find(|s| s.name == "stage").expect("stage");
            assert_eq!(
                stage.span_context.trace_id(),
                source.trace_id(),
                "rank {rank}"
            );
        }
    }
}

/// The function that does a stage's work, instrumented as usual; its span's tracing parent
/// is the linked stage span the caller made, so it lands in the job's trace.
#[tracing::instrument(parent = stage, skip_all)]
fn forward_pass(stage: &tracing::Span, layers: usize) -> usize {
    layers * 2
}

/// `#[instrument]` opens its span on entry, before lens could set its remote parent, so
/// on its own it starts a trace of the rank's own. The pattern: receive the remote first,
/// make the stage span with `linked(..).parent(Parent::Remote)`, and give it to the
/// instrumented function as its `parent`. The function's span is then in the source's
/// trace, a child of the stage.
#[test]
fn an_instrumented_function_joins_the_job_trace_through_its_parent() {
    let ((), captured, _) = with_subscriber(|| {
        let stage = lens_tracing::linked(info_span!("pp.recv_forward"), remote(5))
            .parent(Parent::Remote)
            .start()
            .expect("linked");
        assert_eq!(forward_pass(&stage, 3), 6);
        drop(stage);
    });
    let spans = captured.exporter.get_finished_spans().expect("spans");
    let stage = spans
        .iter()
        .find(|s| s.name == "pp.recv_forward")
        .expect("stage");
    let work = spans
        .iter()
        .find(|s| s.name == "forward_pass")
        .expect("the instrumented function's span");
    assert_eq!(work.span_context.trace_id(), TraceId::from(105u128));
    assert_eq!(work.parent_span_id, stage.span_context.span_id());
}
