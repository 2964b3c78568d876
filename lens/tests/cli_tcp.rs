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

/// `--processes`: every rank its own process, lens and the baselines in the same tree
/// (fan-out 2 over 5 ranks: two levels); rank 0's CPU and every rank's together.
#[test]
fn tcp_bench_with_processes_runs_a_tree_of_processes() {
    let run = lens(
        &[
            "bench",
            "--backend",
            "tcp",
            "--processes",
            "--ranks",
            "5",
            "--fan-out",
            "2",
            "--iters",
            "30",
            "--json",
        ],
        &[],
        DEADLINE,
    );
    let lines = run.bench_lines(
        "tcp",
        &[(5, "raw"), (5, "raw_zmq"), (5, "lens_bytes"), (5, "lens")],
        30,
    );
    for line in &lines {
        let rank0 = line["cpu_us_rank0"].as_f64().expect("rank 0's CPU");
        let all = line["cpu_us_all_ranks"].as_f64().expect("every rank's CPU");
        assert!(rank0 > 0.0 && all > rank0, "{line}");
    }
    // Over the in-process limit of 256 threads is fine for processes; a group of one is not.
    let run = lens(
        &["bench", "--backend", "tcp", "--processes", "--ranks", "1"],
        &[],
        DEADLINE,
    );
    assert!(!run.ok);
    assert!(run.stderr.contains("at least 2 ranks"), "{}", run.stderr);
}

/// `--only OP` times that operation alone, on every rank process, for a profiler: one line,
/// no ratio (nothing to divide by); an operation the backend lacks is refused by name.
#[test]
fn tcp_bench_only_times_one_operation() {
    let run = lens(
        &[
            "bench",
            "--backend",
            "tcp",
            "--processes",
            "--ranks",
            "3",
            "--iters",
            "20",
            "--only",
            "lens_bytes",
            "--json",
        ],
        &[],
        DEADLINE,
    );
    assert!(run.ok, "stderr: {}", run.stderr);
    let lines: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", run.stdout);
    assert_eq!(lines[0]["op"], "lens_bytes", "{}", run.stdout);
    assert_eq!(lines[0]["iters"], 20, "{}", run.stdout);
    assert!(lines[0].get("ratio_vs_raw").is_none(), "{}", run.stdout);
    let run = lens(
        &["bench", "--backend", "tcp", "--only", "lens_raw"],
        &[],
        DEADLINE,
    );
    assert!(!run.ok);
    assert!(
        run.stderr.contains("--only lens_raw")
            && run.stderr.contains("raw, raw_zmq, lens_bytes, lens"),
        "{}",
        run.stderr
    );
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
        &[
            (2, "raw"),
            (2, "raw_zmq"),
            (2, "lens_bytes"),
            (2, "lens"),
            (3, "raw"),
            (3, "raw_zmq"),
            (3, "lens_bytes"),
            (3, "lens"),
        ],
        30,
    );
}

/// Two `lens` processes form a job on loopback while a stranger attacks rank 0's port:
/// ZeroMQ peers claiming routing ids (one of them libzmq's first automatic id), plain ZeroMQ
/// peers, raw connections that send garbage and never read, and idle ones. The job still
/// forms and verifies its trace. Rank 0 reads its key from a file, rank 1 the same bytes
/// from `LENS_TCP_KEY` as hex.
#[test]
fn tcp_job_forms_and_runs_under_attack() {
    use std::io::Write as _;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let key = b"black-box attack test key, 32 b!";
    let key_file = std::env::temp_dir().join(format!("lens-attack-{}.key", std::process::id()));
    std::fs::write(&key_file, key).expect("key file");
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let rank = |r: &'static str, env: Vec<(&'static str, String)>| {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            lens(
                &[
                    "demo",
                    "--backend",
                    "tcp",
                    "--rank",
                    r,
                    "--world",
                    "2",
                    "--addr",
                    &addr,
                    "--steps",
                    "3",
                    "--timeout",
                    "10",
                    "--join-timeout",
                    "30",
                ],
                &env,
                DEADLINE,
            )
        })
    };
    let zero = rank(
        "0",
        vec![("LENS_TCP_KEY_FILE", key_file.display().to_string())],
    );
    // The attack, before rank 1 exists.
    let started = Instant::now();
    let ctx = zmq::Context::new();
    let mut held = Vec::new();
    let mut raw = Vec::new();
    while started.elapsed() < Duration::from_secs(10) && raw.len() < 40 {
        if let Ok(mut t) = std::net::TcpStream::connect(&addr) {
            let _ = t.write_all(&[0x41; 4096]);
            raw.push(t); // never read
            let idle = std::net::TcpStream::connect(&addr).expect("connect");
            raw.push(idle);
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for id in [[0u8, 0x6b, 0x8b, 0x45, 0x67], [0, 0x6b, 0x8b, 0x45, 0x68]] {
        let claim = ctx.socket(zmq::DEALER).expect("socket");
        claim.set_linger(0).expect("linger");
        claim.set_identity(&id).expect("claim");
        claim.connect(&format!("tcp://{addr}")).expect("connect");
        claim.send(&b"hello"[..], 0).expect("send");
        held.push(claim);
        let plain = ctx.socket(zmq::DEALER).expect("socket");
        plain.set_linger(0).expect("linger");
        plain.connect(&format!("tcp://{addr}")).expect("connect");
        plain.send(&b"hello"[..], 0).expect("send");
        held.push(plain);
    }
    let one = rank("1", vec![("LENS_TCP_KEY", format!("hex:{hex}"))]);
    let (zero, one) = (zero.join().expect("rank 0"), one.join().expect("rank 1"));
    let _ = std::fs::remove_file(&key_file);
    for (r, run) in [(0, &zero), (1, &one)] {
        assert!(run.ok, "rank {r}: {}\n{}", run.stderr, run.stdout);
        let want = format!("ok: rank {r}, 3 step(s) correlated with rank 0");
        assert!(run.stdout.contains(&want), "rank {r}: {}", run.stdout);
    }
    drop((held, raw));
}

/// `--inject delay:R:MS` on TCP processes: every step's header names rank R as the rank
/// that came last, at least the delay after the first.
#[test]
fn tcp_demo_names_the_straggler_in_every_step() {
    let run = lens(
        &[
            "demo",
            "--backend",
            "tcp",
            "--ranks",
            "4",
            "--steps",
            "3",
            "--inject",
            "delay:2:40",
        ],
        &[],
        DEADLINE,
    );
    assert!(run.ok, "stderr: {}\nstdout: {}", run.stderr, run.stdout);
    for ms in common::steps_naming_the_straggler(&run.stdout, 2, 3) {
        // The spread runs from the first rank's arrival, which a busy machine can delay
        // by a few ms too: the 40 ms shows as at least 30.
        assert!(ms >= 30.0, "a 40 ms delay, spread {ms} ms: {}", run.stdout);
    }
}

/// `--inject absent:R` on TCP processes: the rank joins and leaves before the first step;
/// the others fail naming it, and each leaves a hang report (`lens.hang`) naming the round,
/// the rank it waited for and the spans it had open.
#[test]
fn tcp_demo_with_an_absent_rank_names_it_and_reports_the_hang() {
    let run = lens(
        &[
            "demo",
            "--backend",
            "tcp",
            "--ranks",
            "3",
            "--steps",
            "2",
            "--inject",
            "absent:1",
            "--timeout",
            "2",
        ],
        &[],
        DEADLINE,
    );
    assert!(!run.ok, "{}", run.stdout);
    assert!(
        run.stderr.contains("waiting for rank(s) [1]"),
        "{}",
        run.stderr
    );
    let line = run
        .stdout
        .split("hang reports (lens.hang):")
        .nth(1)
        .and_then(|rest| rest.lines().find(|l| l.trim_start().starts_with("rank 0 ")))
        .unwrap_or_else(|| panic!("no hang report of rank 0: {}", run.stdout));
    assert!(
        // The ranks measure their clocks first: 4 exchanges × 2 other ranks × 2 + 1 = 17
        // rounds; the first step's is the 18th.
        line.contains("round 18 timed out waiting for [1]") && line.contains("open: train_step ("),
        "{line}"
    );
}
