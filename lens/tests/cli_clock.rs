//! Real clocks in the demo, through a real OTLP receiver: three `lens demo --backend tcp
//! --rank R --otlp` processes, rank 2 under libfaketime 2.5 s ahead, as a star and as a
//! tree (0 → 1 → 2). What the receiver gets is on rank 0's clock: every resource names its
//! offset, and rank 2's spans start inside the step they belong to (unmoved they would be
//! 2.5 s after it). What each rank prints for the job's view (the waterfall and `--out`
//! draw these lines as they are) is moved too.
#![cfg(feature = "tcp")]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use lens::testkit::otlp::Receiver;
use lens::testkit::process::{Supervised, wait_all};
use serde_json::Value;

const AHEAD_NS: f64 = 2.5e9;
const RANKS: usize = 3;
const STEPS: usize = 3;

fn lines(out: &str, prefix: &str) -> Vec<Value> {
    out.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|j| serde_json::from_str(j).ok())
        .collect()
}

/// Runs the three ranks with `vars`, rank 2 under faketime; each rank's stdout.
fn run_job(receiver: &Receiver, vars: &[(&str, &str)]) -> Vec<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port();
    let exe = env!("CARGO_BIN_EXE_lens");
    let endpoint = receiver.http_endpoint();
    let mut children = Vec::new();
    for rank in 0..RANKS {
        let mut cmd = if rank == 2 {
            let mut c = Command::new("faketime");
            // Only the wall clock: libzmq's timers keep the real monotonic clock.
            c.env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .args(["-f", "+2.5s", exe]);
            c
        } else {
            Command::new(exe)
        };
        cmd.args(["demo", "--backend", "tcp", "--emit-spans", "--quiet"])
            .args(["--rank", &rank.to_string(), "--world", &RANKS.to_string()])
            .args(["--steps", &STEPS.to_string(), "--otlp", &endpoint])
            .args(["--addr", &format!("127.0.0.1:{port}"), "--timeout", "10"])
            .env("LENS_TCP_KEY", "the demo clock test's job key, long enough")
            .env_remove("LENS_TCP_KEY_FILE")
            .envs(vars.iter().copied())
            .stdin(Stdio::null());
        children.push(
            Supervised::spawn(&mut cmd, Duration::from_secs(90))
                .expect("start a rank (is faketime installed?)"),
        );
    }
    wait_all(children, |_, _| {})
        .into_iter()
        .map(|done| {
            assert!(done.success(), "{}", done.output());
            done.stdout
        })
        .collect()
}

#[test]
#[ignore = "needs faketime (Debian package faketime): scripts/test.sh installs it and runs this with --ignored"]
fn a_rank_2_5_s_ahead_is_exported_on_rank_0s_clock() {
    // (layout, its variables)
    for (layout, vars) in [
        ("star", &[][..]),
        ("tree 0 → 1 → 2", &[("LENS_TCP_FAN_OUT", "1")][..]),
    ] {
        let receiver = Receiver::start().expect("receiver");
        let outs = run_job(&receiver, vars);
        common::otlp::check_on_rank_0s_clock(&receiver, RANKS, STEPS, 2, AHEAD_NS);

        // What rank 2 printed for the job's view: its offset, and its spans moved.
        let offset = lines(&outs[2], "lens-clock ")
            .first()
            .and_then(|c| c.get("offset_ns")?.as_f64())
            .unwrap_or_else(|| panic!("{layout}: rank 2 printed no clock line:\n{}", outs[2]));
        assert!(
            (offset - AHEAD_NS).abs() < 1e6,
            "{layout}: offset {offset} ns, not 2.5 s within 1 ms"
        );
        let steps = lines(&outs[0], "lens-span ");
        let stages = lines(&outs[2], "lens-span ");
        assert_eq!(stages.len(), STEPS, "{layout}: {}", outs[2]);
        for s in &stages {
            let step = s.get("step").and_then(Value::as_i64).expect("step");
            let root = steps
                .iter()
                .find(|r| r.get("step").and_then(Value::as_i64) == Some(step))
                .expect("rank 0's step");
            let (r0, r1) = (
                root["start_us"].as_f64().expect("start"),
                root["end_us"].as_f64().expect("end"),
            );
            let start = s["start_us"].as_f64().expect("start");
            assert!(
                r0 <= start && start <= r1,
                "{layout}, step {step}: rank 2's span at {start} µs is not inside rank 0's step [{r0}, {r1}]"
            );
        }
    }
}
