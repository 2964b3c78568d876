//! What `lens demo --otlp` must have delivered to a real OTLP receiver.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use lens::testkit::otlp::{ReceivedSpan, Receiver, Via};

/// Checks the demo's spans as the receiver decoded them: every rank's resource, one trace per
/// step across ranks (`--parent remote`), each stage span linked to rank 0's step span.
pub(crate) fn check_demo_spans(receiver: &Receiver, ranks: usize, steps: usize, via: Via) {
    let spans = receiver.wait_for(ranks * steps, Duration::from_secs(10));
    assert_eq!(
        spans.len(),
        ranks * steps,
        "one span per rank and step arrived: {spans:#?}"
    );
    assert!(
        spans.iter().all(|s| s.via == via),
        "all arrived over {via:?}"
    );
    let seen: BTreeSet<usize> = spans.iter().filter_map(ReceivedSpan::rank).collect();
    assert_eq!(seen, (0..ranks).collect(), "every rank's resource");
    let jobs: HashSet<Option<String>> = spans
        .iter()
        .map(|s| s.resource_str("nv.dl.job_id"))
        .collect();
    assert_eq!(jobs.len(), 1, "one job id on every rank: {jobs:?}");
    assert!(jobs.iter().all(Option::is_some), "a job id");
    for s in &spans {
        let r = s.rank().expect("rank");
        assert_eq!(s.resource_int("nv.dl.world_size"), Some(ranks as i64));
        assert_eq!(s.resource_str("service.name").as_deref(), Some("lens-demo"));
        // One host: the local rank is the rank (the in-process backend's, or the
        // launcher's LOCAL_RANK).
        assert_eq!(
            s.resource_int("nv.dl.local_rank"),
            Some(r as i64),
            "local rank"
        );
        assert!(s.resource_str("run.uuid").is_some(), "run.uuid");
        let instance = s.resource_str("service.instance.id").expect("instance id");
        assert!(instance.ends_with(&format!("rank-{r}")), "{instance}");
    }
    let mut by_step: BTreeMap<i64, Vec<&ReceivedSpan>> = BTreeMap::new();
    for s in &spans {
        by_step
            .entry(s.int("nv.dl.step").expect("step"))
            .or_default()
            .push(s);
    }
    assert_eq!(by_step.len(), steps);
    for (step, group) in by_step {
        let root = group
            .iter()
            .find(|s| s.rank() == Some(0))
            .expect("rank 0's step span");
        for s in group.iter().filter(|s| s.rank() != Some(0)) {
            assert_eq!(
                s.trace_id,
                root.trace_id,
                "step {step}: rank {:?} in rank 0's trace",
                s.rank()
            );
            assert_eq!(
                s.parent_span_id, root.span_id,
                "step {step}: a child of the step span"
            );
            let link = s
                .links
                .iter()
                .find(|l| l.span_id == root.span_id)
                .expect("link to the step");
            assert_eq!(link.int("lens.link.source_rank"), Some(0));
        }
    }
}
