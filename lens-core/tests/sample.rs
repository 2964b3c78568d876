//! The step sampler on the in-process backend: every rank keeps the same steps, whole; a
//! slow step, an error on one rank, a vote, a hang and the end are each kept; the baseline
//! keeps 1 in K with its threshold; the cap is held.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use lens_core::sample::{Reason, SampleRules, StepSampler, Threshold, keys};
use lens_core::{Broadcaster, Error, blocking};
use lens_testkit::{LocalBroadcaster, LocalCluster};
use opentelemetry::trace::{
    Span as _, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, Value};
use opentelemetry_sdk::trace::{
    InMemorySpanExporter, SdkTracerProvider, SimpleSpanProcessor, SpanData,
};

fn attr<'a>(s: &'a SpanData, k: &str) -> Option<&'a Value> {
    s.attributes
        .iter()
        .find(|kv| kv.key.as_str() == k)
        .map(|kv| &kv.value)
}

fn step_of(s: &SpanData) -> i64 {
    match attr(s, keys::STEP) {
        Some(Value::I64(n)) => *n,
        other => panic!("a kept span without its step: {other:?} on {s:?}"),
    }
}

fn reason_of(s: &SpanData) -> String {
    attr(s, keys::REASON)
        .map(|v| v.as_str().into_owned())
        .unwrap_or_default()
}

/// What a rank does in a step, told by the test.
#[derive(Clone, Copy, Default)]
struct Act {
    sleep: Option<Duration>,
    vote: bool,
    error: bool,
    spans: usize,
}

struct Rank {
    exporter: InMemorySpanExporter,
    sampler: StepSampler,
    provider: SdkTracerProvider,
}

fn rank_with(rules: &SampleRules) -> Rank {
    let exporter = InMemorySpanExporter::default();
    let sampler = StepSampler::new(rules.clone(), SimpleSpanProcessor::new(exporter.clone()));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(sampler.processor())
        .build();
    Rank {
        exporter,
        sampler,
        provider,
    }
}

/// `steps` steps on every rank: a step span around the broadcast and `act`'s work; the
/// group is dropped at the end (what is held is then kept). Returns each rank's exported
/// spans and its broadcast results.
fn run(
    ranks: Vec<LocalBroadcaster>,
    rules: &SampleRules,
    steps: u64,
    act: impl Fn(usize, u64) -> Act + Sync,
) -> Vec<(Vec<SpanData>, Vec<lens_core::Result<()>>, StepSampler)> {
    let rs: Vec<Rank> = ranks.iter().map(|_| rank_with(rules)).collect();
    let pairs: Vec<(LocalBroadcaster, &Rank)> = ranks.into_iter().zip(rs.iter()).collect();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = pairs
            .into_iter()
            .map(|(b, r)| {
                let act = &act;
                s.spawn(move || {
                    let rank = b.rank();
                    let group = r.sampler.group(b);
                    let tracer = r.provider.tracer("test");
                    let mut results = Vec::new();
                    for step in 1..=steps {
                        let a = act(rank, step);
                        let span = tracer.start(format!("step on rank {rank}"));
                        let cx = Context::current_with_span(span);
                        let _guard = cx.clone().attach();
                        let got = blocking::broadcast_trace_context(&group, 0).map(|_| ());
                        let failed = got.is_err();
                        results.push(got);
                        if let Some(d) = a.sleep {
                            std::thread::sleep(d);
                        }
                        for i in 0..a.spans {
                            tracer.start(format!("extra {i}")).end();
                        }
                        if a.vote {
                            r.sampler.keep_this_step();
                        }
                        if a.error {
                            cx.span().set_status(Status::error("it broke"));
                        }
                        cx.span().end();
                        if failed {
                            break;
                        }
                    }
                    results
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect::<Vec<_>>()
    });
    rs.into_iter()
        .zip(results)
        .map(|(r, results)| {
            let spans = r.exporter.get_finished_spans().expect("spans");
            (spans, results, r.sampler)
        })
        .collect()
}

/// Per rank: the steps it kept, with the reasons its spans give.
fn kept_steps(spans: &[SpanData]) -> BTreeMap<i64, BTreeSet<String>> {
    let mut m: BTreeMap<i64, BTreeSet<String>> = BTreeMap::new();
    for s in spans {
        m.entry(step_of(s)).or_default().insert(reason_of(s));
    }
    m
}

#[test]
fn sixty_four_ranks_keep_the_same_steps_whole() {
    const N: usize = 64;
    const STEPS: u64 = 40;
    let rules = SampleRules::parse("slower-than=400ms").expect("rules");
    // Step 9: rank 17 is slow; step 15: rank 40 votes; step 22: a span of rank 3 fails.
    let act = |rank: usize, step: u64| Act {
        sleep: (rank == 17 && step == 9).then_some(Duration::from_millis(900)),
        vote: rank == 40 && step == 15,
        error: rank == 3 && step == 22,
        spans: 1,
    };
    let got = run(
        LocalCluster::new(N)
            .timeout(Duration::from_secs(30))
            .broadcasters(),
        &rules,
        STEPS,
        act,
    );
    let mut first: Option<BTreeSet<i64>> = None;
    for (rank, (spans, results, sampler)) in got.iter().enumerate() {
        assert!(
            results.iter().all(Result::is_ok),
            "rank {rank}: {results:?}"
        );
        let kept = kept_steps(spans);
        let steps: BTreeSet<i64> = kept.keys().copied().collect();
        // Every kept step is whole on this rank: its step span and its extra span.
        for &step in &steps {
            let n = spans.iter().filter(|s| step_of(s) == step).count();
            assert_eq!(n, 2, "rank {rank}, step {step}: {spans:#?}");
        }
        for (step, why) in [(9, "slow"), (15, "vote"), (22, "vote")] {
            assert!(
                kept.get(&step).is_some_and(|r| r.contains(why)),
                "rank {rank} keeps step {step} ({why}): {kept:?}"
            );
        }
        // The last two were undecided when the group ended.
        for step in [STEPS as i64 - 1, STEPS as i64] {
            assert!(
                kept.get(&step).is_some_and(|r| r.contains("exit")),
                "rank {rank}, step {step}: {kept:?}"
            );
        }
        match &first {
            None => first = Some(steps.clone()),
            Some(f) => assert_eq!(&steps, f, "rank {rank} keeps what rank 0 keeps"),
        }
        // Its record of the decisions says the same.
        let decided: BTreeSet<i64> = sampler
            .decisions()
            .iter()
            .filter(|(_, keep)| keep.is_some())
            .map(|&(step, _)| step as i64)
            .collect();
        assert_eq!(decided, steps, "rank {rank}: {:?}", sampler.decisions());
        assert!(
            sampler.decisions().contains(&(9, Some(Reason::Slow))),
            "rank {rank}: {:?}",
            sampler.decisions()
        );
        let st = sampler.stats();
        assert_eq!(st.held_spans, 0, "rank {rank} holds nothing at the end");
        assert_eq!(
            st.spans_kept + st.spans_dropped,
            2 * STEPS,
            "rank {rank}: every span kept or counted as dropped"
        );
        assert!(
            st.steps_dropped > 0,
            "rank {rank} dropped the ordinary steps"
        );
    }
    let kept = first.expect("ranks");
    assert!(
        kept.len() < STEPS as usize / 2,
        "most ordinary steps were dropped: {kept:?}"
    );
    // Dropped steps are counted on the next kept span.
    let (spans, _, _) = &got[5];
    let counted: i64 = spans
        .iter()
        .filter_map(|s| match attr(s, keys::DROPPED_STEPS) {
            Some(Value::I64(n)) => Some(*n),
            _ => None,
        })
        .sum();
    assert_eq!(counted, STEPS as i64 - kept.len() as i64, "{kept:?}");
    // With the spans they held: two a step on this rank.
    let spans_counted: i64 = spans
        .iter()
        .filter_map(|s| match attr(s, keys::DROPPED_SPANS) {
            Some(Value::I64(n)) => Some(*n),
            _ => None,
        })
        .sum();
    assert_eq!(spans_counted, 2 * counted, "two spans a dropped step");
    // The log another SDK's sampler reads: what came after a step, in order.
    let (_, _, sampler) = &got[5];
    let after: Vec<u64> = sampler.decision_log(20).iter().map(|d| d.0).collect();
    let all: Vec<u64> = sampler
        .decisions()
        .iter()
        .map(|d| d.0)
        .filter(|&s| s > 20)
        .collect();
    assert_eq!(after, all);
    // Kept by a rule: probability 1 in the tracestate.
    assert!(
        spans
            .iter()
            .all(|s| s.span_context.trace_state().get("ot") == Some("th:0")),
        "{:?}",
        spans
            .iter()
            .map(|s| s.span_context.trace_state().header())
            .collect::<Vec<_>>()
    );
}

#[test]
fn the_baseline_keeps_one_in_k_with_its_threshold() {
    const STEPS: u64 = 10_000;
    const K: u64 = 50;
    let rules = SampleRules::default().with_baseline(K).expect("k");
    let got = run(
        LocalCluster::new(2).broadcasters(),
        &rules,
        STEPS,
        |_, _| Act::default(),
    );
    let th = format!("th:{}", Threshold::one_in(K).th());
    let mut counts = Vec::new();
    for (rank, (spans, results, _)) in got.iter().enumerate() {
        assert!(results.iter().all(Result::is_ok), "rank {rank}");
        let baseline: BTreeSet<i64> = spans
            .iter()
            .filter(|s| reason_of(s) == Reason::Baseline.as_str())
            .map(|s| {
                assert_eq!(
                    s.span_context.trace_state().get("ot"),
                    Some(&th[..]),
                    "{s:?}"
                );
                // Consistent with the step's trace (the source's spans are in it): its
                // randomness is over the threshold.
                if rank == 0 {
                    let id = s.span_context.trace_id().to_bytes();
                    let mut low = [0u8; 8];
                    low[1..].copy_from_slice(&id[9..]);
                    assert!(Threshold::one_in(K).keeps(u64::from_be_bytes(low)), "{s:?}");
                }
                step_of(s)
            })
            .collect();
        counts.push(baseline);
    }
    assert_eq!(counts[0], counts[1], "both ranks keep the same steps");
    // 1 in 50 of 10,000 (less the two undecided at the end): 200, sd 14; 5 sd either way.
    let n = counts[0].len();
    assert!((130..=270).contains(&n), "{n} steps kept of {STEPS}");
}

#[test]
fn a_step_over_the_cap_is_kept_early_and_everywhere() {
    let rules = SampleRules::parse("spread-over=10s,max-spans=8").expect("rules");
    // Step 5: rank 1 makes 30 spans, over its cap of 8.
    let act = |rank: usize, step: u64| Act {
        spans: if rank == 1 && step == 5 { 30 } else { 1 },
        ..Act::default()
    };
    let got = run(LocalCluster::new(3).broadcasters(), &rules, 12, act);
    for (rank, (spans, _, sampler)) in got.iter().enumerate() {
        let kept = kept_steps(spans);
        assert!(kept.contains_key(&5), "rank {rank} keeps step 5: {kept:?}");
        let on_5 = spans.iter().filter(|s| step_of(s) == 5).count();
        assert_eq!(
            on_5,
            if rank == 1 { 31 } else { 2 },
            "rank {rank}: step 5 whole"
        );
        if rank == 1 {
            assert!(kept[&5].contains("cap"), "{kept:?}");
        } else {
            assert!(kept[&5].contains("vote"), "rank 1's vote: {kept:?}");
        }
        let st = sampler.stats();
        assert_eq!(st.held_spans, 0, "rank {rank}: {st:?}");
        // Never more than the cap and the span that crossed it.
        let most = if rank == 1 { 9 } else { 4 };
        assert_eq!(st.peak_spans, most, "rank {rank}: {st:?}");
    }
}

#[test]
fn a_hang_keeps_what_every_waiting_rank_held() {
    let rules = SampleRules::parse("slower-than=10s").expect("rules");
    let ranks = LocalCluster::new(4)
        .timeout(Duration::from_millis(300))
        .broadcasters();
    // Rank 2 leaves after step 6: round 7 times out on the others.
    let mut ranks = ranks;
    let leaver = ranks.remove(2);
    let got = std::thread::scope(|s| {
        let h = s.spawn(|| run(ranks, &rules, 10, |_, _| Act::default()));
        // The leaver takes part in six rounds, then its group goes.
        let r = rank_with(&rules);
        let group = r.sampler.group(leaver);
        for _ in 0..6 {
            blocking::broadcast_trace_context(&group, 0).expect("the first six rounds");
        }
        drop(group);
        h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    });
    for (i, (spans, results, _)) in got.iter().enumerate() {
        assert!(
            matches!(results.last(), Some(Err(Error::Timeout { .. }))),
            "rank index {i}: {results:?}"
        );
        let kept = kept_steps(spans);
        // The source's round 7 failed: step 6 was undecided (its decision for step 5 went
        // out with round 7, and holds), and its step 7 span ended after the failure, still
        // in step 6. The others had round 7, and failed in round 8 with steps 6 and 7
        // undecided; their step 8 span ended after it.
        let (steps, spans_kept): (&[i64], usize) = if i == 0 { (&[6], 2) } else { (&[6, 7], 3) };
        assert_eq!(
            kept.keys().copied().collect::<Vec<_>>(),
            steps,
            "rank index {i}"
        );
        assert!(kept.values().all(|r| r.contains("error")), "{kept:?}");
        assert_eq!(spans.len(), spans_kept, "rank index {i}: {spans:#?}");
    }
}

#[test]
fn rules_that_are_off_pass_every_span() {
    let got = run(
        LocalCluster::new(2).broadcasters(),
        &SampleRules::default(),
        5,
        |_, _| Act::default(),
    );
    for (spans, _, sampler) in &got {
        assert_eq!(spans.len(), 5);
        assert!(spans.iter().all(|s| attr(s, keys::REASON).is_none()));
        assert_eq!(sampler.stats().peak_bytes, 0);
    }
}

#[test]
fn a_source_without_a_sampler_leaves_the_carrier_clean() {
    // Rank 0 samples, rank 1 does not: rank 1's carrier has no word in it.
    let ranks = LocalCluster::new(2).broadcasters();
    let r = rank_with(&SampleRules::parse("baseline=2").expect("rules"));
    let tracer = r.provider.tracer("t");
    let mut it = ranks.into_iter();
    let (zero, one) = (it.next().expect("0"), it.next().expect("1"));
    let group = r.sampler.group(zero);
    std::thread::scope(|s| {
        let h = s.spawn(|| blocking::broadcast_trace_context(&one, 0));
        let span = tracer.start("step");
        let _g = Context::current_with_span(span).attach();
        blocking::broadcast_trace_context(&group, 0).expect("source");
        let got = h
            .join()
            .expect("rank 1")
            .expect("carrier")
            .expect("a context");
        assert!(got.get(lens_core::sample::CARRIER_KEY).is_none(), "{got:?}");
    });
}

/// The provider's shutdown keeps what is held, with the group still open; a force flush
/// before it leaves held steps held (their decision is still to come).
#[test]
fn shutdown_keeps_what_is_held_and_a_flush_does_not() {
    /// Keeps what reaches it, past its shutdown (the in-memory exporter forgets then).
    #[derive(Debug, Clone, Default)]
    struct Record(std::sync::Arc<std::sync::Mutex<Vec<SpanData>>>);
    impl opentelemetry_sdk::trace::SpanProcessor for Record {
        fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &Context) {}
        fn on_end(&self, span: SpanData) {
            self.0.lock().expect("no panic while holding it").push(span);
        }
        fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
            Ok(())
        }
    }
    let rules = SampleRules::parse("slower-than=60s").expect("rules");
    let record = Record::default();
    let sampler = StepSampler::new(rules, record.clone());
    let provider = SdkTracerProvider::builder()
        .with_span_processor(sampler.processor())
        .build();
    let tracer = provider.tracer("t");
    let group = sampler.group(LocalCluster::new(1).broadcasters().remove(0));
    for _ in 0..4 {
        blocking::broadcast_trace_context(&group, 0).expect("round");
        tracer.start("work").end();
    }
    // Steps 1 and 2 were decided (dropped); 3 and 4 are held.
    provider.force_flush().expect("flush");
    assert!(record.0.lock().expect("lock").is_empty());
    assert_eq!(sampler.stats().held_spans, 2);
    provider.shutdown().expect("shutdown");
    let spans = record.0.lock().expect("lock").clone();
    let kept = kept_steps(&spans);
    assert_eq!(
        kept.keys().copied().collect::<Vec<_>>(),
        vec![3, 4],
        "{kept:?}"
    );
    assert!(kept.values().all(|why| why.contains("exit")), "{kept:?}");
    drop(group);
}

/// The cap on bytes, as on spans: past it the step is kept at once.
#[test]
fn a_step_over_the_byte_cap_is_kept_early() {
    let rules = SampleRules::parse("slower-than=60s,max-bytes=4096").expect("rules");
    let r = rank_with(&rules);
    let tracer = r.provider.tracer("t");
    let group = r
        .sampler
        .group(LocalCluster::new(1).broadcasters().remove(0));
    for step in 1..=6 {
        blocking::broadcast_trace_context(&group, 0).expect("round");
        // Step 3: spans of a kilobyte of attributes each.
        let n = if step == 3 { 10 } else { 1 };
        for _ in 0..n {
            tracer
                .span_builder("big")
                .with_attributes([opentelemetry::KeyValue::new("blob", "x".repeat(1024))])
                .start(&tracer)
                .end();
        }
    }
    let st = r.sampler.stats();
    assert!(
        st.peak_bytes <= 4096 + 2048,
        "held at most the cap and a span: {st:?}"
    );
    drop(group);
    let spans = r.exporter.get_finished_spans().expect("spans");
    let kept = kept_steps(&spans);
    assert!(kept.get(&3).is_some_and(|w| w.contains("cap")), "{kept:?}");
    assert_eq!(
        spans.iter().filter(|s| step_of(s) == 3).count(),
        10,
        "step 3 whole"
    );
}
