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
        assert!(ms >= 39.0, "a 40 ms delay, spread {ms} ms: {out}");
    }
    let (ok, out) = mpirun(2, &["demo", "--backend", "mpi", "--inject", "absent:1"]);
    assert!(
        !ok && out.contains("stop a rank's process instead"),
        "{out}"
    );
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
