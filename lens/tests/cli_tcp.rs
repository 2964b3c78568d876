//! The `lens` program on the TCP backend: N processes on loopback, each with a deadline.
#![cfg(feature = "tcp")]

mod common;

use std::time::{Duration, Instant};

use common::lens_with_env as lens;

const DEADLINE: Duration = Duration::from_secs(90);

#[test]
fn tcp_demo_runs_four_processes_and_verifies_correlation() {
    let out = std::env::temp_dir().join(format!("lens-tcp-demo-{}.json", std::process::id()));
    let run = lens(
        &[
            "demo",
            "--backend",
            "tcp",
            "--ranks",
            "4",
            "--steps",
            "2",
            "--out",
            out.to_str().expect("utf-8"),
        ],
        &[],
        DEADLINE,
    );
    assert!(run.ok, "stderr: {}\nstdout: {}", run.stderr, run.stdout);
    assert!(run.stdout.contains("on the tcp backend"), "{}", run.stdout);
    assert!(
        run.stdout
            .contains("ok: 4 rank(s), 2 step(s), 6 cross-rank link(s) verified"),
        "{}",
        run.stdout
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("trace")).expect("JSON");
    let _ = std::fs::remove_file(&out);
    let flows = json["traceEvents"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["ph"] == "f")
        .count();
    assert_eq!(flows, 6, "one flow arrow per cross-process link");
}

#[test]
fn tcp_rank_without_a_group_fails_with_one_line() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let started = Instant::now();
    let run = lens(
        &[
            "demo",
            "--backend",
            "tcp",
            "--rank",
            "1",
            "--world",
            "2",
            "--addr",
            &addr,
            "--join-timeout",
            "1",
            "--timeout",
            "1",
        ],
        &[("LENS_TCP_KEY", "a key of at least sixteen bytes")],
        DEADLINE,
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    let line = run.failure_line();
    assert!(
        line.contains("rank 1") && line.contains("timed out") && line.contains("[0]"),
        "{line}"
    );
}

#[test]
fn tcp_rank_needs_a_key() {
    let run = lens(
        &[
            "demo",
            "--backend",
            "tcp",
            "--rank",
            "0",
            "--world",
            "2",
            "--addr",
            "127.0.0.1:1",
        ],
        &[],
        DEADLINE,
    );
    assert!(!run.ok);
    assert!(run.stderr.contains("LENS_TCP_KEY"), "{}", run.stderr);
}

#[test]
fn tcp_bench_prints_raw_and_lens_lines() {
    let run = lens(
        &[
            "bench",
            "--backend",
            "tcp",
            "--ranks",
            "2,3",
            "--iters",
            "30",
            "--json",
        ],
        &[],
        DEADLINE,
    );
    run.bench_lines(
        "tcp",
        &[(2, "raw"), (2, "lens"), (3, "raw"), (3, "lens")],
        30,
    );
}
