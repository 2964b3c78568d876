//! The `lens` program, run as a user would, each run with a deadline.

mod common;

use std::time::{Duration, Instant};

use common::lens;

const DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn demo_verifies_correlation_and_writes_a_chrome_trace() {
    let out = std::env::temp_dir().join(format!("lens-demo-{}.json", std::process::id()));
    let run = lens(
        &[
            "demo",
            "--ranks",
            "4",
            "--steps",
            "2",
            "--out",
            out.to_str().expect("utf-8"),
        ],
        DEADLINE,
    );
    assert!(run.ok, "stderr: {}", run.stderr);
    assert!(
        run.stdout
            .contains("ok: 4 rank(s), 2 step(s), 6 cross-rank link(s) verified"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("rank 3"),
        "terminal view shows every rank:\n{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("↳ link"),
        "terminal view shows links:\n{}",
        run.stdout
    );

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("trace file"))
            .expect("valid JSON");
    let _ = std::fs::remove_file(&out);
    let events = json["traceEvents"].as_array().expect("traceEvents");
    let spans: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(spans.len(), 2 + 3 * 2, "2 train_step + 6 stage spans");
    assert!(
        spans
            .iter()
            .all(|e| e["dur"].as_f64().is_some_and(|d| d >= 0.0) && e["ts"].as_f64().is_some())
    );
    let starts = events.iter().filter(|e| e["ph"] == "s").count();
    let finishes = events.iter().filter(|e| e["ph"] == "f").count();
    assert_eq!((starts, finishes), (6, 6), "one flow arrow per link");
    let processes = events.iter().filter(|e| e["ph"] == "M").count();
    assert_eq!(processes, 4);
    // With --parent remote every stage span shares its step's trace id.
    for step in spans.iter().filter(|e| e["name"] == "train_step") {
        let trace = &step["args"]["trace_id"];
        let same = spans
            .iter()
            .filter(|e| e["args"]["trace_id"] == *trace)
            .count();
        assert_eq!(same, 4, "train_step and three stages in one trace");
    }
}

#[test]
fn demo_with_current_parent() {
    let run = lens(
        &[
            "demo", "--ranks", "3", "--steps", "1", "--parent", "current",
        ],
        DEADLINE,
    );
    assert!(run.ok, "stderr: {}", run.stderr);
    assert!(
        run.stdout.contains("each rank keeps its own parent"),
        "{}",
        run.stdout
    );
}

#[test]
fn demo_fails_with_one_line_reason_when_a_rank_never_joins() {
    let started = Instant::now();
    let run = lens(
        &[
            "demo",
            "--ranks",
            "3",
            "--inject",
            "absent:0",
            "--timeout",
            "0.3",
            "--quiet",
        ],
        DEADLINE,
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    let line = run.failure_line();
    assert!(
        line.contains("timed out") && line.contains("[0]") && line.contains("never joined: [0]"),
        "{line}"
    );
}

#[test]
fn demo_fails_on_a_corrupted_payload() {
    let run = lens(
        &[
            "demo",
            "--ranks",
            "3",
            "--inject",
            "corrupt:1",
            "--timeout",
            "0.5",
            "--quiet",
        ],
        DEADLINE,
    );
    assert!(!run.ok);
    assert!(
        run.stderr.contains("rank 1: received carrier is corrupt"),
        "{}",
        run.stderr
    );
}

#[test]
fn demo_rejects_bad_arguments() {
    for args in [
        &["demo", "--ranks", "0"][..],
        &["demo", "--inject", "absent:9"],
        &["demo", "--inject", "explode:1"],
        &["demo", "--timeout", "-1"],
        // Would overflow the clock: a configuration error, not a panic.
        &["demo", "--timeout", "1e19"],
        &["bench", "--ranks", "0"],
    ] {
        let run = lens(args, DEADLINE);
        assert!(!run.ok, "{args:?} should fail");
        assert!(!run.stderr.is_empty(), "{args:?} should say why");
        assert!(
            !run.stderr.contains("panicked"),
            "{args:?} panicked: {}",
            run.stderr
        );
    }
}

#[test]
fn bench_prints_json_lines_for_raw_and_lens() {
    let run = lens(
        &["bench", "--ranks", "2,3", "--iters", "40", "--json"],
        DEADLINE,
    );
    run.bench_lines(
        "local",
        &[
            (2, "raw"),
            (2, "lens_bytes"),
            (2, "lens"),
            (3, "raw"),
            (3, "lens_bytes"),
            (3, "lens"),
        ],
        40,
    );
}

/// The table has one line per operation, the ratio on the two lens lines only, and `--help`
/// says what a sample is.
#[test]
fn bench_table_and_help_say_what_is_measured() {
    let run = lens(&["bench", "--ranks", "2", "--iters", "20"], DEADLINE);
    assert!(run.ok, "{}", run.stderr);
    let rows: Vec<Vec<&str>> = run
        .stdout
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{}", run.stdout);
    assert_eq!((rows[0][1], rows[0].len()), ("raw", 5), "{}", run.stdout);
    assert_eq!(
        (rows[1][1], rows[1].len()),
        ("lens_bytes", 6),
        "{}",
        run.stdout
    );
    assert_eq!((rows[2][1], rows[2].len()), ("lens", 6), "{}", run.stdout);
    assert!(
        rows[1][5].ends_with('x') && rows[2][5].ends_with('x'),
        "{}",
        run.stdout
    );
    // The CPU column: a positive number of µs per rank and round.
    for row in &rows {
        let cpu: f64 = row[4].parse().expect("cpu_us");
        assert!(cpu > 0.0 && cpu.is_finite(), "{}", run.stdout);
    }
    let help = lens(&["bench", "--help"], DEADLINE);
    assert!(
        help.ok && help.stdout.contains("slowest rank's"),
        "{}",
        help.stdout
    );
}

/// Without CUDA (as on CI) the NCCL bench says why, in one line, and fails; with a GPU it
/// runs.
#[cfg(feature = "nccl")]
#[test]
fn nccl_bench_runs_or_says_why_not() {
    let run = lens(
        &["bench", "--backend", "nccl", "--iters", "5", "--json"],
        DEADLINE,
    );
    run.ran_or_unavailable(lens::nccl::probe().is_ok(), "nccl");
}

/// The NCCL demo (ranks bootstrapped over TCP) fails in one line without CUDA, before any
/// rank starts, and a lone rank of a real job says which rank and GPU could not start.
#[cfg(all(feature = "nccl", feature = "tcp"))]
#[test]
fn nccl_demo_runs_or_says_why_not() {
    let run = lens(
        &["demo", "--backend", "nccl", "--ranks", "1", "--quiet"],
        DEADLINE,
    );
    if run.ran_or_unavailable(lens::nccl::probe().is_ok(), "nccl") {
        return;
    }

    let run = common::lens_with_env(
        &[
            "demo",
            "--backend",
            "nccl",
            "--rank",
            "0",
            "--world",
            "1",
            "--addr",
            "127.0.0.1:0",
            "--device",
            "3",
            "--timeout",
            "2",
        ],
        &[("LENS_TCP_KEY", "0123456789abcdef0123456789abcdef")],
        DEADLINE,
    );
    let line = run.failure_line();
    assert!(
        line.contains("rank 0 (GPU 3)") && line.contains("nccl backend is unavailable"),
        "{line}"
    );
}

/// The NCCL bench and demo on the testkit's fake CUDA driver and NCCL (two fake GPUs): the
/// whole program path, processes and all, runs without a GPU.
#[cfg(all(feature = "nccl", feature = "tcp"))]
#[test]
fn nccl_bench_and_demo_on_a_fake_gpu() {
    let fake = lens::testkit::fake_gpu::FakeGpu::build(2).expect("build the fake (needs cc)");
    let vars = fake.env();
    let env: Vec<(&str, &str)> = vars
        .iter()
        .map(|(k, v)| (*k, v.to_str().expect("UTF-8 temp dir")))
        .collect();
    let run = common::lens_with_env(
        &["bench", "--backend", "nccl", "--iters", "30", "--json"],
        &env,
        DEADLINE,
    );
    run.bench_lines("nccl", &[(2, "raw"), (2, "lens_bytes"), (2, "lens")], 30);

    // Two processes, one per fake GPU: TCP rendezvous, the NCCL id over TCP, NCCL init and
    // the demo's broadcasts across processes, spans gathered and checked.
    let run = common::lens_with_env(
        &["demo", "--backend", "nccl", "--ranks", "2", "--steps", "2"],
        &env,
        DEADLINE,
    );
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("ok: 2 rank(s), 2 step(s), 2 cross-rank link(s)"),
        "{}",
        run.stdout
    );

    // `--inject delay:1:40`: every step, gathered by one ncclAllGather per round, names
    // rank 1 as the rank that came last.
    let run = common::lens_with_env(
        &[
            "demo",
            "--backend",
            "nccl",
            "--ranks",
            "2",
            "--steps",
            "2",
            "--inject",
            "delay:1:40",
        ],
        &env,
        DEADLINE,
    );
    assert!(run.ok, "{}", run.stderr);
    for ms in common::steps_naming_the_straggler(&run.stdout, 1, 2) {
        // The spread runs from the first rank's arrival, which a busy machine can delay
        // by a few ms too: the 40 ms shows as at least 30.
        assert!(ms >= 30.0, "a 40 ms delay, spread {ms} ms: {}", run.stdout);
    }

    // `--sample`: the step sampler on both GPU processes; rank 1 sleeps 60 ms in step 5,
    // which every rank keeps.
    let run = common::lens_with_env(
        &[
            "demo",
            "--backend",
            "nccl",
            "--ranks",
            "2",
            "--steps",
            "12",
            "--sample",
            "slower-than=45ms",
            "--inject",
            "delay:1:60@5",
        ],
        &env,
        DEADLINE,
    );
    assert!(run.ok, "{}", run.stderr);
    // Kept as slow, or by rank 1's own vote: the view marks step 5 kept.
    assert!(
        run.stdout.contains("on every rank")
            && run
                .stdout
                .lines()
                .any(|l| l.starts_with("step 5 ") && l.contains("kept (")),
        "{}",
        run.stdout
    );

    let run = common::lens_with_env(
        &["demo", "--backend", "nccl", "--ranks", "3"],
        &env,
        DEADLINE,
    );
    let line = run.failure_line();
    assert!(line.contains("needs 3 GPUs; this machine has 2"), "{line}");
}
