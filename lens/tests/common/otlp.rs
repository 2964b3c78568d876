//! What `lens demo --otlp` must have delivered to a real OTLP receiver.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use lens::testkit::otlp::{ReceivedSpan, Receiver, Via};

/// Checks the demo's spans as the receiver decoded them: every rank's resource, one trace per
/// step across ranks (`--parent remote`), each stage span linked to rank 0's step span.
pub(crate) fn check_demo_spans(receiver: &Receiver, ranks: usize, steps: usize, via: Via) {
    check_demo_spans_on_hosts(receiver, ranks, steps, via, ranks);
}

/// [`check_demo_spans`] for ranks in blocks of `per_host` on hosts of their own: a rank's
/// local rank is its index among its host's ranks.
#[allow(dead_code)] // not every test binary has hosts
pub(crate) fn check_demo_spans_on_hosts(
    receiver: &Receiver,
    ranks: usize,
    steps: usize,
    via: Via,
    per_host: usize,
) {
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
        // The rank's index among its host's ranks (the in-process backend's rank, or the
        // launcher's LOCAL_RANK).
        assert_eq!(
            s.resource_int("nv.dl.local_rank"),
            Some((r % per_host) as i64),
            "rank {r}'s local rank"
        );
        assert!(s.resource_str("run.uuid").is_some(), "run.uuid");
        // Every rank's clock against rank 0's: one machine's clock, so zero within its
        // error bound (the in-process ranks share one clock: 0 ± 0).
        let offset = s.resource_int("lens.clock.offset_ns").expect("offset_ns");
        let error = s.resource_int("lens.clock.error_ns").expect("error_ns");
        assert!(
            offset.abs() <= error + 1_000,
            "rank {r}: offset {offset} ns beyond its bound {error} ns"
        );
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

/// Waits until the receiver holds a `lens.hang` span from each rank of `paths` and checks
/// each: it names `absent` as the missing rank and, as the path to it, `via` (empty: the
/// rank found it missing itself, and the span has no `lens.hang.via`).
pub(crate) fn check_hang_reports(receiver: &Receiver, absent: i64, paths: &[(usize, &[i64])]) {
    let until = std::time::Instant::now() + Duration::from_secs(15);
    let hangs = loop {
        let hangs: Vec<ReceivedSpan> = receiver
            .spans()
            .into_iter()
            .filter(|s| s.name == "lens.hang")
            .collect();
        let ranks: BTreeSet<usize> = hangs.iter().filter_map(ReceivedSpan::rank).collect();
        if paths.iter().all(|(r, _)| ranks.contains(r)) || std::time::Instant::now() > until {
            break hangs;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for (rank, via) in paths {
        let report = hangs
            .iter()
            .find(|s| s.rank() == Some(*rank))
            .unwrap_or_else(|| panic!("no lens.hang from rank {rank}: {hangs:#?}"));
        assert_eq!(
            report.ints("lens.hang.missing_ranks"),
            Some(vec![absent]),
            "rank {rank} names the absent rank: {report:#?}"
        );
        let got = report.ints("lens.hang.via");
        let want = (!via.is_empty()).then(|| via.to_vec());
        assert_eq!(got, want, "rank {rank}'s path to it: {report:#?}");
    }
}

/// Checks that every rank's spans arrived on rank 0's clock: each resource names its
/// offset and error, `skewed`'s offset is `ahead_ns` (within 1 ms) and the others' zero,
/// and each stage span starts inside rank 0's step span of its step: not before it (a rank
/// opens it after the step's broadcast reached it; 1 ms for the offset's error) and not
/// more than 100 ms after it ends (how late a rank of a loaded machine may be scheduled;
/// the step's end is not causal). Unmoved, the skewed rank's spans would start `ahead_ns`
/// after their step.
pub(crate) fn check_on_rank_0s_clock(
    receiver: &Receiver,
    ranks: usize,
    steps: usize,
    skewed: usize,
    ahead_ns: f64,
) {
    let spans = receiver.wait_for(ranks * steps, Duration::from_secs(10));
    assert_eq!(spans.len(), ranks * steps, "{spans:#?}");
    for s in &spans {
        let r = s.rank().expect("rank");
        let offset = s
            .resource_int("lens.clock.offset_ns")
            .unwrap_or_else(|| panic!("rank {r}: no lens.clock.offset_ns in {:?}", s.resource));
        let error = s.resource_int("lens.clock.error_ns").expect("error_ns");
        let truth = if r == skewed { ahead_ns } else { 0.0 };
        assert!(
            (offset as f64 - truth).abs() < 1e6 && (0..1_000_000).contains(&error),
            "rank {r}: offset {offset} ns ± {error}, truth {truth}"
        );
    }
    for s in spans.iter().filter(|s| s.rank() != Some(0)) {
        let step = s.int("nv.dl.step").expect("step");
        let root = spans
            .iter()
            .find(|t| t.rank() == Some(0) && t.int("nv.dl.step") == Some(step))
            .expect("rank 0's step");
        let (earliest, latest) = (
            root.start_unix_nano.saturating_sub(1_000_000),
            root.end_unix_nano + 100_000_000,
        );
        assert!(
            (earliest..=latest).contains(&s.start_unix_nano),
            "step {step}: rank {:?}'s span starts at {} ns, outside rank 0's step [{}, {}]",
            s.rank(),
            s.start_unix_nano,
            root.start_unix_nano,
            root.end_unix_nano
        );
    }
}
