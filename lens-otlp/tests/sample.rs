//! The step sampler in front of the OTLP export (`OtlpBuilder::sample`, `LENS_SAMPLE`):
//! through a real receiver, only the kept steps arrive, whole from every rank, each span
//! with `ot=th:` in its tracestate; the guard's shutdown keeps what was still undecided.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use lens_core::sample::SampleRules;
use lens_core::{Broadcaster as _, LinkedSpan, Parent, RankInfo, blocking};
use lens_otlp::{OtlpBuilder, Protocol};
use lens_testkit::otlp::Receiver;
use lens_testkit::{LocalCluster, on_each_rank};
use opentelemetry::trace::{Span as _, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};

#[test]
fn only_kept_steps_reach_the_receiver_whole_with_their_threshold() {
    const WORLD: usize = 4;
    const STEPS: i64 = 12;
    let receiver = Receiver::start().expect("receiver");
    let endpoint = receiver.http_endpoint();
    let ranks = LocalCluster::new(WORLD).broadcasters();
    let stats = on_each_rank(&ranks, |b| {
        let info = RankInfo::new(b.rank(), WORLD).expect("rank");
        // The rules from the variables, as a job sets them.
        let vars = |k: &str| (k == "LENS_SAMPLE").then(|| "slower-than=60s".to_owned());
        let guard = OtlpBuilder::from_vars(info, vars)
            .endpoint(endpoint.clone())
            .protocol(Protocol::HttpProtobuf)
            .build()
            .expect("guard");
        let sampler = guard.sampler().expect("sampling is on").clone();
        let group = sampler.group(b);
        let tracer = guard.tracer("pipeline");
        for step in 0..STEPS {
            let attr = KeyValue::new("nv.dl.step", step);
            if b.rank() == 0 {
                let cx = Context::new().with_span(
                    tracer
                        .span_builder("train_step")
                        .with_attributes([attr])
                        .start(&tracer),
                );
                blocking::broadcast_context(&group, 0, &cx).expect("broadcast");
                cx.span().end();
            } else {
                let remote =
                    blocking::broadcast_context(&group, 0, &Context::new()).expect("broadcast");
                LinkedSpan::builder("stage")
                    .remote(&remote)
                    .parent(Parent::Remote)
                    .attributes([attr])
                    .start_with_context(&tracer, &Context::new())
                    .end();
                // Rank 2 votes for step 4 (the sampler's step 5).
                if b.rank() == 2 && step == 4 {
                    sampler.keep_this_step();
                }
            }
        }
        drop(group);
        guard.shutdown().expect("shutdown")
    });
    // Steps 4 and the last two (undecided at the end) on each of the 4 ranks.
    let want: BTreeSet<i64> = [4, STEPS - 2, STEPS - 1].into();
    let spans = receiver.wait_for(want.len() * WORLD, Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(200));
    let spans = receiver.wait_for(spans.len(), Duration::from_millis(10));
    let mut by_step: BTreeMap<i64, BTreeSet<usize>> = BTreeMap::new();
    for s in &spans {
        assert!(s.trace_state.contains("ot=th:0"), "{:?}", s.trace_state);
        by_step
            .entry(s.int("nv.dl.step").expect("step"))
            .or_default()
            .insert(s.rank().expect("rank"));
    }
    assert_eq!(
        by_step.keys().copied().collect::<BTreeSet<_>>(),
        want,
        "{by_step:?}"
    );
    for (step, from) in &by_step {
        assert_eq!(from.len(), WORLD, "step {step} from every rank");
    }
    for st in &stats {
        assert_eq!(st.lost(), 0, "{st:?}");
        assert_eq!(
            st.exported as usize,
            want.len(),
            "only the kept steps were sent: {st:?}"
        );
    }
    // The rules in code win over the variables; off is off.
    let info = RankInfo::new(0, 1).expect("rank");
    let guard = OtlpBuilder::from_vars(info, |k| (k == "LENS_SAMPLE").then(|| "nonsense".into()))
        .sample(SampleRules::default())
        .endpoint(receiver.http_endpoint())
        .build()
        .expect("code overrides the bad variable");
    assert!(guard.sampler().is_none());
    let info = RankInfo::new(0, 1).expect("rank");
    let e = OtlpBuilder::from_vars(info, |k| (k == "LENS_SAMPLE").then(|| "nonsense".into()))
        .build()
        .expect_err("a bad LENS_SAMPLE");
    assert!(e.to_string().contains("LENS_SAMPLE"), "{e}");
}
