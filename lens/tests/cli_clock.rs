//! Real clocks in the demo: two `lens demo --backend tcp --rank R` processes, rank 1 under
//! libfaketime 2.5 s ahead. Rank 1 measures its offset within 1 ms of 2.5 s, and its
//! spans, moved onto rank 0's clock by that offset, fall inside rank 0's step (unmoved they
//! would be 2.5 s after it).
#![cfg(feature = "tcp")]

use std::process::{Command, Stdio};
use std::time::Duration;

use lens::testkit::process::{Supervised, wait_all};
use serde_json::Value;

const AHEAD_NS: f64 = 2.5e9;

fn lines(out: &str, prefix: &str) -> Vec<Value> {
    out.lines()
        .filter_map(|l| l.strip_prefix(prefix))
        .filter_map(|j| serde_json::from_str(j).ok())
        .collect()
}

#[test]
#[allow(clippy::print_stderr)]
#[ignore = "needs faketime (Debian package faketime): scripts/test.sh installs it and runs this with --ignored"]
fn a_rank_2_5_s_ahead_lines_up_with_its_step() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port();
    let exe = env!("CARGO_BIN_EXE_lens");
    let mut children = Vec::new();
    for rank in 0..2 {
        let mut cmd = if rank == 1 {
            let mut c = Command::new("faketime");
            // Only the wall clock: libzmq's timers keep the real monotonic clock.
            c.env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .args(["-f", "+2.5s", exe]);
            c
        } else {
            Command::new(exe)
        };
        cmd.args(["demo", "--backend", "tcp", "--emit-spans", "--quiet"])
            .args(["--rank", &rank.to_string(), "--world", "2", "--steps", "3"])
            .args(["--addr", &format!("127.0.0.1:{port}"), "--timeout", "10"])
            .env("LENS_TCP_KEY", "the demo clock test's job key, long enough")
            .env_remove("LENS_TCP_KEY_FILE")
            .stdin(Stdio::null());
        children.push(
            Supervised::spawn(&mut cmd, Duration::from_secs(90))
                .expect("start a rank (is faketime installed?)"),
        );
    }
    let outs: Vec<String> = wait_all(children, |_, _| {})
        .into_iter()
        .map(|done| {
            assert!(done.success(), "{}", done.output());
            done.stdout
        })
        .collect();
    let clock = lines(&outs[1], "lens-clock ");
    let offset = clock
        .first()
        .and_then(|c| c.get("offset_ns")?.as_f64())
        .unwrap_or_else(|| panic!("rank 1 printed no clock line:\n{}", outs[1]));
    eprintln!("rank 1 under faketime +2.5 s: offset {offset} ns");
    assert!(
        (offset - AHEAD_NS).abs() < 1e6,
        "offset {offset} ns, not 2.5 s within 1 ms"
    );

    let steps = lines(&outs[0], "lens-span ");
    let stages = lines(&outs[1], "lens-span ");
    assert_eq!(stages.len(), 3, "{}", outs[1]);
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
        let moved = start - offset / 1000.0;
        assert!(
            r0 <= moved && moved <= r1,
            "step {step}: rank 1's span at {moved} µs (moved) is not inside rank 0's step [{r0}, {r1}]"
        );
        assert!(
            start > r1 + 2e6,
            "step {step}: unmoved, rank 1's span is 2.5 s late"
        );
    }
}
