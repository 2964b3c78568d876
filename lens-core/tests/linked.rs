//! Linked spans: what the sampler sees, parents, links and their attributes.

use std::sync::{Arc, Mutex};

use lens_core::link::attributes::{LINK_SOURCE, LINK_SOURCE_RANK};
use lens_core::{Carrier, LinkedSpan, Parent, Remote, create_linked_span};
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::trace::{
    InMemorySpanExporter, SamplingDecision, SamplingResult, SdkTracerProvider, ShouldSample,
    SpanData,
};

#[derive(Debug, Clone, Default)]
struct Seen {
    name: String,
    kind: Option<SpanKind>,
    attributes: Vec<KeyValue>,
    links: Vec<Link>,
}

/// A sampler that records what it was shown, then samples.
#[derive(Debug, Clone, Default)]
struct RecordingSampler(Arc<Mutex<Vec<Seen>>>);

impl ShouldSample for RecordingSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        _trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        self.0.lock().expect("lock").push(Seen {
            name: name.to_owned(),
            kind: Some(span_kind.clone()),
            attributes: attributes.to_vec(),
            links: links.to_vec(),
        });
        SamplingResult {
            decision: SamplingDecision::RecordAndSample,
            attributes: Vec::new(),
            trace_state: parent_context
                .map(|cx| cx.span().span_context().trace_state().clone())
                .unwrap_or_default(),
        }
    }
}

fn setup() -> (SdkTracerProvider, InMemorySpanExporter, RecordingSampler) {
    let exporter = InMemorySpanExporter::default();
    let sampler = RecordingSampler::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .with_sampler(sampler.clone())
        .build();
    (provider, exporter, sampler)
}

fn remote_sc() -> SpanContext {
    SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex"),
        SpanId::from_hex("00f067aa0ba902b7").expect("hex"),
        TraceFlags::new(0x03),
        true,
        TraceState::NONE,
    )
}

fn finished(exporter: &InMemorySpanExporter) -> Vec<SpanData> {
    exporter.get_finished_spans().expect("spans")
}

fn attr<'a>(kvs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    kvs.iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

#[test]
fn sampler_sees_links_and_attributes_at_creation() {
    let (provider, exporter, sampler) = setup();
    let tracer = provider.tracer("t");
    let carrier = Carrier::from_context(&Context::new().with_remote_span_context(remote_sc()))
        .with_source_rank(3);
    drop(
        LinkedSpan::builder("pp.recv_forward.linked")
            .remote(&carrier)
            .attributes([KeyValue::new("pp.stage", 1)])
            .link_attributes([KeyValue::new("pp.microbatch", 4)])
            .kind(SpanKind::Consumer)
            .start(&tracer),
    );
    let seen = sampler.0.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1);
    let seen = &seen[0];
    assert_eq!(seen.name, "pp.recv_forward.linked");
    assert_eq!(seen.kind, Some(SpanKind::Consumer));
    assert_eq!(
        attr(&seen.attributes, "pp.stage"),
        Some(&Value::I64(1)),
        "sampler saw the attribute"
    );
    assert_eq!(seen.links.len(), 1, "sampler saw the link");
    let link = &seen.links[0];
    assert_eq!(link.span_context.span_id(), remote_sc().span_id());
    assert_eq!(
        attr(&link.attributes, LINK_SOURCE_RANK),
        Some(&Value::I64(3))
    );
    assert_eq!(
        attr(&link.attributes, LINK_SOURCE),
        Some(&Value::from("broadcast"))
    );
    assert_eq!(
        attr(&link.attributes, "pp.microbatch"),
        Some(&Value::I64(4))
    );

    let spans = finished(&exporter);
    assert_eq!(spans.len(), 1);
    assert_eq!(spans[0].links.len(), 1);
    assert_eq!(attr(&spans[0].attributes, "pp.stage"), Some(&Value::I64(1)));
}

#[test]
fn parent_current_keeps_local_parent() {
    let (provider, exporter, _) = setup();
    let tracer = provider.tracer("t");
    let local = tracer.start("local");
    let local_sc = local.span_context().clone();
    let cx = Context::current_with_span(local);
    let _g = cx.clone().attach();
    drop(create_linked_span(&tracer, "linked", remote_sc(), vec![]));
    let spans = finished(&exporter);
    let linked = spans
        .iter()
        .find(|s| s.name == "linked")
        .expect("linked span");
    assert_eq!(linked.span_context.trace_id(), local_sc.trace_id());
    assert_eq!(linked.parent_span_id, local_sc.span_id());
    assert_eq!(linked.links.len(), 1);
    assert_eq!(
        linked.links[0].span_context.trace_id(),
        remote_sc().trace_id()
    );
}

#[test]
fn parent_remote_joins_the_source_trace() {
    let (provider, exporter, _) = setup();
    let tracer = provider.tracer("t");
    let _g = Context::current_with_span(tracer.start("local")).attach();
    drop(
        LinkedSpan::builder("linked")
            .remote(remote_sc())
            .parent(Parent::Remote)
            .start(&tracer),
    );
    let spans = finished(&exporter);
    let linked = spans
        .iter()
        .find(|s| s.name == "linked")
        .expect("linked span");
    assert_eq!(linked.span_context.trace_id(), remote_sc().trace_id());
    assert_eq!(linked.parent_span_id, remote_sc().span_id());
    assert!(linked.parent_span_is_remote);
    assert_eq!(linked.links.len(), 1);
}

#[test]
fn parent_root_starts_a_new_trace() {
    let (provider, exporter, _) = setup();
    let tracer = provider.tracer("t");
    let local = tracer.start("local");
    let local_trace = local.span_context().trace_id();
    let _g = Context::current_with_span(local).attach();
    drop(
        LinkedSpan::builder("linked")
            .remote(remote_sc())
            .parent(Parent::Root)
            .start(&tracer),
    );
    let spans = finished(&exporter);
    let linked = spans
        .iter()
        .find(|s| s.name == "linked")
        .expect("linked span");
    assert_ne!(linked.span_context.trace_id(), local_trace);
    assert_ne!(linked.span_context.trace_id(), remote_sc().trace_id());
    assert_eq!(linked.parent_span_id, SpanId::INVALID);
    assert_eq!(linked.links.len(), 1);
}

#[test]
fn absent_or_invalid_remote_gives_an_unlinked_span() {
    let (provider, exporter, _) = setup();
    let tracer = provider.tracer("t");
    let invalid: Carrier = [(
        "traceparent",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    )]
    .into_iter()
    .collect();
    let remotes: Vec<(&str, Remote)> = vec![
        ("none", Remote::none()),
        ("None carrier", Remote::from(None::<Carrier>)),
        ("empty carrier", Remote::from(&Carrier::new())),
        ("invalid carrier", Remote::from(&invalid)),
        ("empty context", Remote::from(&Context::new())),
        (
            "invalid span context",
            Remote::from(SpanContext::empty_context()),
        ),
    ];
    for (why, remote) in remotes {
        drop(
            LinkedSpan::builder(why)
                .remote(remote)
                .parent(Parent::Remote)
                .start(&tracer),
        );
    }
    for span in finished(&exporter) {
        assert!(span.links.is_empty(), "{}: no link expected", span.name);
    }
}

#[test]
fn remote_from_context_and_option() {
    let cx = Context::new().with_remote_span_context(remote_sc());
    assert!(Remote::from(&cx).span_context().is_some());
    let carrier = Carrier::from_context(&cx).with_source_rank(2);
    let r = Remote::from(Some(carrier.clone()));
    assert_eq!(r.source_rank(), Some(2));
    assert_eq!(
        Remote::from(&Some(carrier))
            .span_context()
            .map(SpanContext::span_id),
        Some(remote_sc().span_id())
    );
}

/// Every way to name a remote, with the `lens.link.source` value its link carries (one row
/// per documented value).
#[test]
fn link_source_names_how_the_remote_arrived() {
    use lens_core::link::attributes::{
        SOURCE_BROADCAST, SOURCE_CARRIER, SOURCE_CONTEXT, SOURCE_SPAN_CONTEXT,
    };
    let carrier = Carrier::from_context(&Context::new().with_remote_span_context(remote_sc()));
    let broadcast = carrier.clone().with_source_rank(2);
    let rows: [(&str, Remote, &str); 4] = [
        (
            "a broadcast carrier",
            Remote::from(&broadcast),
            SOURCE_BROADCAST,
        ),
        (
            "a carrier passed along",
            Remote::from(&carrier),
            SOURCE_CARRIER,
        ),
        (
            "a Context",
            Remote::from(Context::new().with_remote_span_context(remote_sc())),
            SOURCE_CONTEXT,
        ),
        (
            "a SpanContext",
            Remote::from(remote_sc()),
            SOURCE_SPAN_CONTEXT,
        ),
    ];
    for (why, remote, want) in rows {
        let (provider, exporter, _) = setup();
        let tracer = provider.tracer("t");
        create_linked_span(&tracer, "s", remote, vec![]).end();
        let spans = finished(&exporter);
        let link = spans[0].links.iter().next().expect("a link");
        assert_eq!(
            attr(&link.attributes, LINK_SOURCE),
            Some(&Value::from(want)),
            "{why}"
        );
    }
}

/// The default parent, `Auto`: the local current span where there is one (as Python), the
/// remote where there is none (so the rank still lands in the job's trace), and a new trace
/// only when there is neither.
#[test]
fn parent_auto_is_local_when_there_is_one_else_the_remote() {
    let (provider, exporter, _) = setup();
    let tracer = provider.tracer("t");
    let local = tracer.start("local");
    let local_sc = local.span_context().clone();
    let with_local = Context::current_with_span(local);
    // (why, context the span starts in, remote, expected trace id, expected parent)
    let rows: [(&str, Context, Remote, TraceId, SpanId); 3] = [
        (
            "a current span: its child",
            with_local.clone(),
            Remote::from(remote_sc()),
            local_sc.trace_id(),
            local_sc.span_id(),
        ),
        (
            "no current span: the remote's child",
            Context::new(),
            Remote::from(remote_sc()),
            remote_sc().trace_id(),
            remote_sc().span_id(),
        ),
        (
            "neither: a root",
            Context::new(),
            Remote::none(),
            TraceId::INVALID,
            SpanId::INVALID,
        ),
    ];
    for (why, cx, remote, trace, parent) in rows {
        exporter.reset();
        drop(
            LinkedSpan::builder("linked")
                .remote(remote)
                .start_with_context(&tracer, &cx),
        );
        let spans = finished(&exporter);
        let linked = spans.iter().find(|s| s.name == "linked").expect(why);
        assert_eq!(linked.parent_span_id, parent, "{why}");
        if trace != TraceId::INVALID {
            assert_eq!(linked.span_context.trace_id(), trace, "{why}");
        }
    }
    // `create_linked_span` has the same default.
    exporter.reset();
    drop(create_linked_span(&tracer, "linked", remote_sc(), vec![]));
    let spans = finished(&exporter);
    assert_eq!(spans[0].parent_span_id, remote_sc().span_id());
}

fn remote_number(i: u64) -> Remote {
    let sc = SpanContext::new(
        TraceId::from(u128::from(i) + 1),
        SpanId::from(i + 1),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    Remote::from(sc).with_link_attributes([KeyValue::new("request.index", i as i64)])
}

#[test]
fn fan_in_links_every_remote_with_its_own_attributes_up_to_the_limit() {
    use lens_core::link::DEFAULT_LINK_LIMIT;
    use lens_core::link::attributes::LINKS_DROPPED;
    // (remotes given, absent ones among them, limit, links expected, dropped attribute)
    let rows: &[(u64, usize, Option<usize>, usize, Option<i64>, &str)] = &[
        (
            3,
            0,
            None,
            3,
            None,
            "a few requests: all linked, nothing dropped",
        ),
        (128, 0, None, 128, None, "exactly the SDK's default limit"),
        (
            200,
            0,
            None,
            DEFAULT_LINK_LIMIT,
            Some(72),
            "past the limit: the rest counted",
        ),
        (
            10,
            4,
            Some(5),
            5,
            Some(5),
            "a lower limit; absent remotes are not counted as dropped",
        ),
        (
            0,
            3,
            None,
            0,
            None,
            "only absent remotes: no link, no attribute",
        ),
    ];
    for (given, absent, limit, want_links, want_dropped, why) in rows {
        let (provider, exporter, sampler) = setup();
        let tracer = provider.tracer("fan-in");
        let mut remotes: Vec<Remote> = (0..*given).map(remote_number).collect();
        remotes.extend((0..*absent).map(|_| Remote::none()));
        let mut b = LinkedSpan::builder("infer.batch")
            .remotes(remotes)
            .parent(Parent::Root);
        if let Some(l) = limit {
            b = b.link_limit(*l);
        }
        b.start(&tracer).end();
        let span = &exporter.get_finished_spans().expect("spans")[0];
        assert_eq!(span.links.len(), *want_links, "{why}: links kept");
        assert_eq!(
            span.links.dropped_count, 0,
            "{why}: the SDK dropped none itself"
        );
        let seen = sampler.0.lock().expect("lock")[0].clone();
        assert_eq!(
            seen.links.len(),
            *want_links,
            "{why}: the sampler saw every link"
        );
        for (i, link) in span.links.iter().enumerate() {
            let index = link
                .attributes
                .iter()
                .find(|kv| kv.key.as_str() == "request.index")
                .map(|kv| kv.value.clone());
            assert_eq!(
                index,
                Some(Value::I64(i as i64)),
                "{why}: link {i}'s own attribute"
            );
        }
        let dropped = span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == LINKS_DROPPED)
            .map(|kv| kv.value.clone());
        assert_eq!(
            dropped,
            want_dropped.map(Value::I64),
            "{why}: {LINKS_DROPPED}"
        );
    }
}

#[test]
fn fan_in_with_a_remote_parent_takes_the_first_valid_remote() {
    let (provider, exporter, _) = setup();
    let tracer = provider.tracer("fan-in");
    LinkedSpan::builder("allreduce")
        .remote(Remote::none())
        .remotes([remote_number(7), remote_number(8)])
        .parent(Parent::Remote)
        .start_with_context(&tracer, &Context::new())
        .end();
    let span = &exporter.get_finished_spans().expect("spans")[0];
    assert_eq!(span.span_context.trace_id(), TraceId::from(8u128));
    assert_eq!(span.parent_span_id, SpanId::from(8u64));
    assert_eq!(span.links.len(), 2);
}
