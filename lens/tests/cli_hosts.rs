//! The `lens` program's ranks on simulated hosts (`--hosts`, `--link`) and `lens soak`, run
//! as a user would. Those that make hosts need root, /dev/net/tun and `ip`
//! (`scripts/test.sh` runs them with `--ignored`); the refusals of bad input run anywhere.
#![cfg(feature = "tcp")]

mod common;

use std::time::Duration;

use common::lens;
use lens::testkit::otlp::{Receiver, Via};

/// `lens bench` of 4 rank processes on 2 simulated hosts joined by `link`.
fn bench_on_two_hosts(link: &str, iters: u32, more: &[&str]) -> common::Run {
    let iters = iters.to_string();
    let mut args = vec![
        "bench",
        "--backend",
        "tcp",
        "--processes",
        "--ranks",
        "4",
        "--hosts",
        "2",
        "--link",
        link,
        "--iters",
        &iters,
    ];
    args.extend_from_slice(more);
    lens(&args, Duration::from_secs(180))
}

#[test]
#[ignore = "needs root, /dev/net/tun and ip: scripts/test.sh runs it with --ignored"]
fn bench_on_simulated_hosts_crosses_the_links_and_says_so() {
    let run = bench_on_two_hosts("rtt=2ms", 40, &["--json"]);
    let lines = run.bench_lines(
        "tcp",
        &[(4, "raw"), (4, "raw_zmq"), (4, "lens_bytes"), (4, "lens")],
        40,
    );
    // Ranks 2 and 3 are on host 1, 2 ms of round trip from rank 0: every round crosses it.
    for line in &lines {
        let median = line["median_us"].as_f64().expect("median");
        assert!(
            median >= 2000.0,
            "a round faster than the link's round trip: {line}"
        );
    }
}

#[test]
#[ignore = "needs root, /dev/net/tun and ip: scripts/test.sh runs it with --ignored"]
fn bench_table_names_the_hosts_and_the_switch_cost() {
    let run = bench_on_two_hosts("rtt=400us", 20, &[]);
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout.contains("2 simulated hosts, link \"rtt=400us\"")
            && run.stdout.contains("µs late on average"),
        "{}",
        run.stdout
    );
}

/// `lens demo` of 4 rank processes on 2 simulated hosts, 1 ms apart, for `steps` steps.
fn demo_on_two_hosts(steps: u32, more: &[&str]) -> common::Run {
    let steps = steps.to_string();
    let mut args = vec![
        "demo",
        "--backend",
        "tcp",
        "--ranks",
        "4",
        "--hosts",
        "2",
        "--link",
        "rtt=1ms",
        "--steps",
        &steps,
    ];
    args.extend_from_slice(more);
    lens(&args, Duration::from_secs(180))
}

#[test]
#[ignore = "needs root, /dev/net/tun and ip: scripts/test.sh runs it with --ignored"]
fn demo_across_hosts_names_the_late_rank() {
    let run = demo_on_two_hosts(3, &["--inject", "delay:3:30"]);
    assert!(run.ok, "{}", run.stderr);
    let spreads = common::steps_naming_the_straggler(&run.stdout, 3, 3);
    assert!(spreads.iter().all(|&ms| ms >= 25.0), "{spreads:?}");
}

#[test]
#[ignore = "needs root, /dev/net/tun and ip: scripts/test.sh runs it with --ignored"]
fn demo_across_hosts_exports_every_rank_to_a_collector_on_this_machine() {
    // The receiver on this machine's loopback, which the hosts reach only through the
    // demo's relay on host 0; ranks 2 and 3 cross the switch to it.
    for (protocol, via) in [("grpc", Via::Grpc), ("http/protobuf", Via::Http)] {
        let receiver = Receiver::start().expect("receiver");
        let endpoint = receiver.endpoint(via);
        let run = demo_on_two_hosts(2, &["--otlp", &endpoint, "--otlp-protocol", protocol]);
        assert!(run.ok, "{protocol}: {}", run.stderr);
        // Said with the endpoint the user gave, not the relay's address.
        assert!(
            run.stdout.contains(&format!(
                "otlp: sent 8 span(s) from 4 of 4 rank(s) to {endpoint}"
            )) && run.stdout.contains("through host 0's relay"),
            "{protocol}: {}",
            run.stdout
        );
        common::otlp::check_demo_spans_on_hosts(&receiver, 4, 2, via, 2);
    }
}

#[test]
#[ignore = "needs root, /dev/net/tun and ip: scripts/test.sh runs it with --ignored"]
fn a_short_soak_is_flat_resets_and_plots() {
    let dir = std::env::temp_dir().join(format!("lens-soak-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let svg = dir.join("soak.svg");
    let run = lens(
        &[
            "soak",
            "--duration",
            "24",
            "--sample-every",
            "4",
            "--reset-every",
            "5",
            "--svg",
            svg.to_str().expect("a UTF-8 path"),
        ],
        Duration::from_secs(180),
    );
    let plot = std::fs::read_to_string(&svg).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.ok, "{}\n{}", run.stdout, run.stderr);
    let rows = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| at"))
        .count();
    assert!(rows >= 5, "a row every 4 s of 24: {}", run.stdout);
    assert_eq!(run.stdout.matches(": flat").count(), 5, "{}", run.stdout);
    let resets: u64 = run
        .stdout
        .lines()
        .find_map(|l| l.split(" knocks, ").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no reset count: {}", run.stdout));
    assert!(resets >= 3, "a reset every 5 s of 24: {resets}");
    let knocks: u64 = run
        .stdout
        .lines()
        .find_map(|l| l.split(" knocks").next()?.parse().ok())
        .unwrap_or(0);
    assert!(knocks >= 150, "10 knocks a second for 24 s: {knocks}");
    assert_eq!(plot.matches("<polyline").count(), 5, "{plot}");
}

#[test]
fn bad_hosts_settings_are_refused_in_one_line() {
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["demo", "--backend", "tcp", "--ranks", "2", "--hosts", "3"],
            "more hosts than",
            "more hosts than ranks",
        ),
        (
            &[
                "demo",
                "--backend",
                "tcp",
                "--hosts",
                "2",
                "--link",
                "speed=1ms",
            ],
            "--link",
            "an unknown link key",
        ),
        (
            &["demo", "--hosts", "2"],
            "applies to --backend tcp",
            "the in-process backend has no hosts",
        ),
        (
            &["bench", "--backend", "tcp", "--hosts", "2"],
            "--processes",
            "threads cannot be on hosts",
        ),
        (
            &[
                "demo",
                "--backend",
                "tcp",
                "--hosts",
                "2",
                "--otlp",
                "https://127.0.0.1:4318",
            ],
            "only http://HOST:PORT",
            "a certificate would not name the relay",
        ),
        (
            &["demo", "--backend", "tcp", "--hosts", "2", "--otlp", ""],
            "needs the endpoint on the command line",
            "the relay must know where to forward",
        ),
    ];
    for (args, says, why) in cases {
        let run = lens(args, Duration::from_secs(60));
        let line = run.failure_line();
        assert!(line.contains(says), "{why}: {args:?}: {line}");
    }
}
