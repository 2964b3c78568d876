//! `lens demo --sample`: through a real OTLP receiver, the steps the sampler keeps arrive
//! whole from every rank, each span with `ot=th:` in its tracestate, and most steps do not
//! arrive at all; on the in-process backend and on TCP processes.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::lens_with_env as lens;
use lens::testkit::otlp::{ReceivedSpan, Receiver};

const DEADLINE: Duration = Duration::from_secs(180);

/// The spans the receiver got, by step, with the ranks each came from; every one carries
/// an `ot=th:` threshold.
fn by_step(spans: &[ReceivedSpan]) -> BTreeMap<i64, BTreeSet<usize>> {
    let mut m: BTreeMap<i64, BTreeSet<usize>> = BTreeMap::new();
    for s in spans {
        assert!(
            s.trace_state.contains("ot=th:"),
            "a kept span without its threshold: {s:?}"
        );
        m.entry(s.int("nv.dl.step").expect("step"))
            .or_default()
            .insert(s.rank().expect("rank"));
    }
    m
}

/// What a backend gets of a sampled job of `ranks` ranks and `total` steps: the `slow`
/// steps whole, every step whole or absent, every span saying why it was kept, and on each
/// rank's spans the count of the steps it dropped, which is all the steps that did not
/// arrive. The steps that arrived, with the ranks they came from.
fn check_kept(
    spans: &[ReceivedSpan],
    slow: &[i64],
    ranks: usize,
    total: usize,
) -> BTreeMap<i64, BTreeSet<usize>> {
    let steps = by_step(spans);
    for s in slow {
        assert_eq!(
            steps.get(s).map(BTreeSet::len),
            Some(ranks),
            "step {s} arrived whole: {:?}",
            steps.get(s)
        );
    }
    for (s, from) in &steps {
        assert_eq!(from.len(), ranks, "step {s} is whole or absent: {from:?}");
    }
    for rank in 0..ranks {
        let mine: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.rank() == Some(rank)).collect();
        assert!(
            mine.iter().all(|s| s.str("lens.sample.reason").is_some()),
            "rank {rank}: every kept span says why"
        );
        let dropped: i64 = mine
            .iter()
            .filter_map(|s| s.int("lens.sample.dropped_steps"))
            .sum();
        assert_eq!(
            dropped as usize,
            total - steps.len(),
            "rank {rank}: the dropped steps are counted in what it exported"
        );
    }
    steps
}

/// What the receiver has once `sent` spans came (the demo's own count), and no more come.
fn received(receiver: &Receiver, sent: usize) -> Vec<ReceivedSpan> {
    let spans = receiver.wait_for(sent, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    let again = receiver.wait_for(spans.len() + 1, Duration::from_millis(10));
    assert_eq!(
        again.len(),
        spans.len(),
        "no span came after the demo's count"
    );
    spans
}

/// The count in the demo's line "otlp: sent N span(s) from ...".
fn sent_count(stdout: &str) -> usize {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("otlp: sent "))
        .unwrap_or_else(|| panic!("no otlp line in\n{stdout}"));
    line["otlp: sent ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"))
}

#[test]
fn local_demo_keeps_the_slow_steps_whole_and_drops_most() {
    const RANKS: usize = 16;
    const STEPS: usize = 400;
    let slow: [i64; 4] = [50, 150, 250, 350];
    let receiver = Receiver::start().expect("receiver");
    let inject = format!(
        "delay:3:40@{}",
        slow.iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    // A step takes about 40 ms here (16 stages of 2.5 ms); rank 3's 40 ms make one last
    // at least 50.
    let run = lens(
        &[
            "demo",
            "--ranks",
            &RANKS.to_string(),
            "--steps",
            &STEPS.to_string(),
            "--quiet",
            "--sample",
            "slower-than=46ms,baseline=100",
            "--inject",
            &inject,
            "--otlp",
            &receiver.http_endpoint(),
        ],
        &[],
        DEADLINE,
    );
    assert!(run.ok, "{}\n{}", run.stdout, run.stderr);
    // Kept as slow by the source, or by rank 3's own vote (its part of the step was over
    // the threshold whatever the others did): either way, on every rank.
    assert!(run.stdout.contains("on every rank"), "{}", run.stdout);
    let spans = received(&receiver, sent_count(&run.stdout));
    check_kept(&spans, &slow, RANKS, STEPS);
    // All would be 6,400 spans; the baseline keeps about 4 steps, the end 2, the slow 4,
    // and a loaded machine a few more.
    assert!(
        spans.len() < STEPS * RANKS / 10,
        "{} spans of {}: most steps were dropped",
        spans.len(),
        STEPS * RANKS
    );
}

#[cfg(feature = "tcp")]
#[test]
fn tcp_demo_keeps_the_slow_steps_whole_on_every_rank_process() {
    const RANKS: usize = 4;
    let receiver = Receiver::start().expect("receiver");
    // A step takes about 16 ms (4 stages of 4 ms); rank 2's 60 ms make one last over 70.
    let run = lens(
        &[
            "demo",
            "--backend",
            "tcp",
            "--ranks",
            &RANKS.to_string(),
            "--steps",
            "30",
            "--quiet",
            "--sample",
            "slower-than=45ms",
            "--inject",
            "delay:2:60@7,19",
            "--otlp",
            &receiver.http_endpoint(),
        ],
        &[],
        DEADLINE,
    );
    assert!(run.ok, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("on every rank"), "{}", run.stdout);
    let spans = received(&receiver, sent_count(&run.stdout));
    let steps = check_kept(&spans, &[7, 19], RANKS, 30);
    assert!(steps.len() < 15, "most steps were dropped: {steps:?}");
}

#[test]
fn bad_sampling_rules_and_step_delays_are_refused_saying_why() {
    // (why, arguments, what the error says)
    let rows: &[(&str, &[&str], &str)] = &[
        (
            "an unknown rule",
            &["--sample", "faster-than=1ms"],
            "is not a sampling rule",
        ),
        ("no rule", &["--sample", ""], "no rule keeps any step"),
        (
            "a bad baseline",
            &["--sample", "baseline=0"],
            "outside 1 to 2^56",
        ),
        (
            "a step that is no number",
            &["--inject", "delay:1:5@x"],
            "is not a step number",
        ),
    ];
    for (why, extra, words) in rows {
        let mut args = vec!["demo", "--ranks", "2", "--steps", "2", "--quiet"];
        args.extend_from_slice(extra);
        let run = lens(&args, &[], DEADLINE);
        assert!(!run.ok, "{why}: {}", run.stdout);
        assert!(run.stderr.contains(words), "{why}: {}", run.stderr);
    }
}

/// `lens sample-bench` runs the same job twice and reports what the sampler kept: every
/// slow step whole, the same steps on every rank (in process here; its figures at scale
/// are in docs/guide/sampling.md).
#[test]
fn the_sample_bench_keeps_every_slow_step_whole() {
    let mut backends = vec!["local"];
    if cfg!(feature = "tcp") {
        backends.push("tcp");
    }
    for backend in backends {
        let run = lens(
            &[
                "sample-bench",
                "--backend",
                backend,
                "--ranks",
                "4",
                "--steps",
                "300",
                "--slow-every",
                "30",
                "--slow-ms",
                "40",
                "--sample",
                "slower-than=25ms,baseline=100",
            ],
            &[],
            DEADLINE,
        );
        assert!(run.ok, "{backend}: {}\n{}", run.stdout, run.stderr);
        assert!(
            run.stdout.contains("steps kept on every rank alike: yes"),
            "{backend}: {}",
            run.stdout
        );
        let line = run
            .stdout
            .lines()
            .find(|l| l.starts_with("slow steps kept whole"))
            .unwrap_or_else(|| panic!("{backend}: {}", run.stdout));
        let counts: Vec<usize> = line
            .rsplit(": ")
            .next()
            .unwrap_or_default()
            .split(" of ")
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        assert!(
            counts.len() == 2 && counts[0] == counts[1] && counts[1] > 0,
            "{backend}: {line}"
        );
    }
}

/// `--only` makes one run of the two (for an instruction counter), on the local backend.
#[test]
fn the_sample_bench_makes_one_run_when_asked() {
    let run = lens(
        &[
            "sample-bench",
            "--ranks",
            "2",
            "--steps",
            "50",
            "--only",
            "sampled",
        ],
        &[],
        DEADLINE,
    );
    assert!(run.ok, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("one run, 50 steps on 2 ranks"),
        "{}",
        run.stdout
    );
    if cfg!(feature = "tcp") {
        let run = lens(
            &["sample-bench", "--backend", "tcp", "--only", "all"],
            &[],
            DEADLINE,
        );
        assert!(
            !run.ok && run.stderr.contains("--only applies to --backend local"),
            "{}",
            run.stderr
        );
    }
}
