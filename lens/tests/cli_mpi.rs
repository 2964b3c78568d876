//! The `lens` program on the MPI backend, under mpirun, with a deadline.
//! `scripts/test.sh` installs Open MPI and runs these with `--ignored`.
#![cfg(feature = "mpi")]

use std::process::Stdio;
use std::time::Duration;

use lens::testkit::process::{self, Supervised};

mod common;

fn mpirun(n: usize, args: &[&str]) -> (bool, String) {
    mpirun_with(n, args, &[])
}

/// `mpirun -n N lens ARGS` with `vars` set for every rank.
fn mpirun_with(n: usize, args: &[&str], vars: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = process::mpirun(n).expect("mpirun on the PATH (install openmpi-bin)");
    cmd.arg(env!("CARGO_BIN_EXE_lens"))
        .args(args)
        .envs(vars.iter().copied())
        .stdin(Stdio::null());
    let done = Supervised::spawn(&mut cmd, Duration::from_secs(120))
        .expect("mpirun starts (install openmpi-bin)")
        .wait();
    assert!(
        !done.timed_out,
        "mpirun lens {args:?} ran past its deadline and was killed"
    );
    (done.success(), done.output())
}

#[test]
#[ignore = "needs mpirun: scripts/test.sh installs Open MPI and runs it with --ignored"]
fn mpi_demo_under_mpirun() {
    let (ok, out) = mpirun(3, &["demo", "--backend", "mpi", "--steps", "2"]);
    assert!(ok, "{out}");
    assert!(out.contains("on the mpi backend"), "{out}");
    assert!(
        out.contains("ok: 3 rank(s), 2 step(s), 4 cross-rank link(s) verified"),
        "{out}"
    );
}

/// `--inject delay:R:MS` under MPI: the ranks gather their arrival times every round, and
/// every step's header names rank R.
#[test]
#[ignore = "needs mpirun: scripts/test.sh installs Open MPI and runs it with --ignored"]
fn mpi_demo_names_the_straggler_in_every_step() {
    let (ok, out) = mpirun(
        3,
        &[
            "demo",
            "--backend",
            "mpi",
            "--steps",
            "3",
            "--inject",
            "delay:2:40",
        ],
    );
    assert!(ok, "{out}");
    for ms in common::steps_naming_the_straggler(&out, 2, 3) {
        // The spread runs from the first rank's arrival, which a busy machine can delay
        // by a few ms too: the 40 ms shows as at least 30.
        assert!(ms >= 30.0, "a 40 ms delay, spread {ms} ms: {out}");
    }
}

/// `--sample` under mpirun: every rank's sampler keeps the same steps, the slow ones among
/// them, and only those reach the receiver, whole, each with its threshold.
#[test]
#[ignore = "needs mpirun: scripts/test.sh installs Open MPI and runs it with --ignored"]
fn mpi_demo_keeps_the_slow_steps_whole_on_every_rank() {
    use lens::testkit::otlp::Receiver;
    let receiver = Receiver::start().expect("receiver");
    let endpoint = receiver.http_endpoint();
    let (ok, out) = mpirun(
        3,
        &[
            "demo",
            "--backend",
            "mpi",
            "--steps",
            "20",
            "--quiet",
            "--sample",
            "slower-than=40ms",
            "--inject",
            "delay:1:60@5,11",
            "--otlp",
            &endpoint,
        ],
    );
    assert!(ok, "{out}");
    // Kept as slow by the source, or by rank 1's own vote: either way, on every rank.
    assert!(out.contains("on every rank"), "{out}");
    let spans = receiver.wait_for(3 * 4, Duration::from_secs(20));
    let mut by_step: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
    for s in &spans {
        assert!(s.trace_state.contains("ot=th:"), "{s:?}");
        by_step
            .entry(s.int("nv.dl.step").expect("step"))
            .or_default()
            .push(s.rank().expect("rank"));
    }
    for step in [5, 11] {
        let mut ranks = by_step.get(&step).cloned().unwrap_or_default();
        ranks.sort_unstable();
        assert_eq!(ranks, vec![0, 1, 2], "step {step} whole: {by_step:?}");
    }
    assert!(by_step.len() < 12, "most steps dropped: {by_step:?}");
}

#[test]
#[ignore = "needs mpirun: scripts/test.sh installs Open MPI and runs it with --ignored"]
fn mpi_demo_exports_every_rank_over_otlp() {
    use lens::testkit::otlp::{Receiver, Via};
    let receiver = Receiver::start().expect("receiver");
    let endpoint = receiver.grpc_endpoint();
    let args = [
        "demo",
        "--backend",
        "mpi",
        "--steps",
        "2",
        "--quiet",
        "--otlp",
        &endpoint,
    ];
    let (ok, out) = mpirun(3, &[&args[..], &["--otlp-protocol", "grpc"]].concat());
    assert!(ok, "{out}");
    assert!(
        out.contains("otlp: sent 6 span(s) from 3 of 3 rank(s)"),
        "{out}"
    );
    common::otlp::check_demo_spans(&receiver, 3, 2, Via::Grpc);
}

#[test]
#[ignore = "needs mpirun: scripts/test.sh installs Open MPI and runs it with --ignored"]
fn mpi_bench_under_mpirun() {
    let (ok, out) = mpirun(2, &["bench", "--backend", "mpi", "--iters", "50", "--json"]);
    assert!(ok, "{out}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let ops: Vec<&str> = lines.iter().filter_map(|l| l["op"].as_str()).collect();
    assert_eq!(
        ops,
        ["raw", "two_collective", "lens_bytes", "lens"],
        "{out}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l["backend"] == "mpi" && l["ranks"] == 2 && l["iters"] == 50)
    );
    assert!(lines[3]["ratio_vs_raw"].as_f64().is_some());
}

/// The bench builds its group from the environment and says how lens's rounds travel:
/// measured by default (each way's cost printed), or the way the variables name.
#[test]
#[ignore = "needs mpirun: scripts/test.sh installs Open MPI and runs it with --ignored"]
fn mpi_bench_reads_the_settings_from_the_environment() {
    let args = ["bench", "--backend", "mpi", "--iters", "20"];
    for (vars, way) in [
        (
            &[][..],
            "chosen by measurement at build (direct sends from the root ",
        ),
        (
            &[(lens::mpi::env::TRANSFER, "direct")][..],
            "lens's rounds: direct sends from the root (as configured)",
        ),
        (
            &[(lens::mpi::env::DIRECT_MAX, "1")][..],
            "lens's rounds: a persistent broadcast",
        ),
        (
            &[
                (lens::mpi::env::DIRECT_MAX, "0"),
                (lens::mpi::env::PERSISTENT, "0"),
            ][..],
            "lens's rounds: MPI_Ibcast",
        ),
    ] {
        let (ok, out) = mpirun_with(2, &args, vars);
        assert!(ok && out.contains(way), "{vars:?}: {out}");
        assert!(out.contains("lens_bytes"), "{out}");
    }
}

/// `--inject absent:3` under mpirun with `--otlp`: the others' collectives time out, the
/// roll call after it finds rank 3 missing, and every live rank's exported `lens.hang`
/// names rank 3: rank 0 itself, ranks 1 and 2 through rank 0.
#[test]
#[ignore = "needs mpirun: scripts/test.sh installs Open MPI and runs it with --ignored"]
fn mpi_hang_reports_name_the_absent_rank_on_every_rank() {
    use lens::testkit::otlp::Receiver;
    let receiver = Receiver::start().expect("receiver");
    let endpoint = receiver.http_endpoint();
    let args = [
        "demo",
        "--backend",
        "mpi",
        "--steps",
        "2",
        "--quiet",
        "--inject",
        "absent:3",
        "--timeout",
        "1",
        "--otlp",
        &endpoint,
    ];
    let (ok, out) = mpirun(4, &args);
    assert!(!ok, "{out}");
    assert!(
        out.contains("rank 1: timed out after")
            && out.contains("waiting for rank 0, which is waiting for rank(s) [3]"),
        "{out}"
    );
    common::otlp::check_hang_reports(&receiver, 3, &[(0, &[]), (1, &[0]), (2, &[0])]);
}

/// Three ranks under mpirun, rank 2 under libfaketime 2.5 s ahead (an MPMD launch): what
/// the OTLP receiver gets is on rank 0's clock (every resource names its offset; rank 2's
/// spans start inside their steps), and so is the Chrome trace of `--out`.
#[test]
#[ignore = "needs mpirun and faketime: scripts/test.sh installs both and runs it with --ignored"]
fn mpi_demo_under_faketime_is_exported_on_rank_0s_clock() {
    use lens::testkit::otlp::Receiver;
    let receiver = Receiver::start().expect("receiver");
    let endpoint = receiver.http_endpoint();
    let out_file = std::env::temp_dir().join(format!("lens-mpi-clock-{}.json", std::process::id()));
    let out_arg = out_file.to_string_lossy().into_owned();
    let exe = env!("CARGO_BIN_EXE_lens");
    let args = [
        "demo",
        "--backend",
        "mpi",
        "--steps",
        "3",
        "--otlp",
        &endpoint,
        "--out",
        &out_arg,
    ];
    let mut cmd = process::mpirun(2).expect("mpirun on the PATH (install openmpi-bin)");
    cmd.arg(exe)
        .args(args)
        .args([":", "-n", "1", "faketime", "-f", "+2.5s", exe])
        .args(args)
        // Only the wall clock: MPI's timers keep the real monotonic clock.
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdin(Stdio::null());
    let done = Supervised::spawn(&mut cmd, Duration::from_secs(120))
        .expect("mpirun starts")
        .wait();
    assert!(done.success(), "{}", done.output());
    common::otlp::check_on_rank_0s_clock(&receiver, 3, 3, 2, 2.5e9);

    let written = std::fs::read(&out_file);
    let _ = std::fs::remove_file(&out_file);
    let trace: serde_json::Value =
        serde_json::from_slice(&written.expect("--out was written")).expect("Chrome trace JSON");
    let events = trace["traceEvents"].as_array().expect("events");
    let spans = |pid: i64, name: &str| -> Vec<&serde_json::Value> {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["name"] == name)
            .collect()
    };
    let steps = spans(0, "train_step");
    let stages = spans(2, "pp.recv_forward.linked");
    assert_eq!((steps.len(), stages.len()), (3, 3), "{trace}");
    for s in stages {
        let step = &s["args"]["step"];
        let root = steps
            .iter()
            .find(|r| &r["args"]["step"] == step)
            .expect("rank 0's step");
        let (t0, dur) = (
            root["ts"].as_f64().expect("ts"),
            root["dur"].as_f64().expect("dur"),
        );
        let ts = s["ts"].as_f64().expect("ts");
        // The stage starts a slot (4 ms) before rank 0's step ends, by the ranks' timers
        // alone: a busy machine can wake rank 2 later than that (once 45 µs past the end,
        // in scripts/test.sh). The margins are those of the OTLP check above; a clock left
        // uncorrected would put the stage 2.5 s away.
        assert!(
            t0 - 1_000.0 <= ts && ts <= t0 + dur + 100_000.0,
            "step {step}: rank 2 at {ts} µs, outside rank 0's step [{t0}, {}]",
            t0 + dur
        );
    }
    assert!(
        events
            .iter()
            .any(|e| e["name"] == "process_labels" && e["pid"] == 2),
        "rank 2's clock offset is labelled: {trace}"
    );
}
