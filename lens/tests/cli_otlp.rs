//! `lens demo --otlp`: every rank's spans reach a real OTLP receiver (the test kit's, decoding
//! with the official protobuf definitions), over gRPC and HTTP.

mod common;

use std::time::Duration;

use common::lens_with_env as lens;
use common::otlp::check_demo_spans;
use lens::testkit::otlp::{Receiver, TestCa, Via, closed_port_endpoint};

const DEADLINE: Duration = Duration::from_secs(90);

#[test]
fn local_demo_exports_every_rank_over_grpc_and_http() {
    for (protocol, via) in [("grpc", Via::Grpc), ("http/protobuf", Via::Http)] {
        let receiver = Receiver::start().expect("receiver");
        let endpoint = receiver.endpoint(via);
        let run = lens(
            &[
                "demo",
                "--ranks",
                "3",
                "--steps",
                "2",
                "--otlp",
                &endpoint,
                "--otlp-protocol",
                protocol,
            ],
            &[],
            DEADLINE,
        );
        assert!(run.ok, "{protocol}: {}", run.stderr);
        assert!(
            run.stdout.contains("↳ link"),
            "the waterfall stays:\n{}",
            run.stdout
        );
        let want = format!("otlp: sent 6 span(s) from 3 of 3 rank(s) to {endpoint}");
        assert!(run.stdout.contains(&want), "{protocol}: {}", run.stdout);
        check_demo_spans(&receiver, 3, 2, via);
    }
}

/// `lens demo --otlp https://…` exports over TLS (both transports), trusting the authority
/// named by `OTEL_EXPORTER_OTLP_CERTIFICATE`, gzip-compressed as `OTEL_EXPORTER_OTLP_COMPRESSION`
/// says (it used to panic with exit code 101 for gRPC and lose every span over HTTP).
#[test]
fn an_https_endpoint_exports_over_tls() {
    let ca = TestCa::new().expect("a CA");
    let ca_file = ca.ca_file().display().to_string();
    for (protocol, via) in [("grpc", Via::Grpc), ("http/protobuf", Via::Http)] {
        let receiver = Receiver::start_tls(&ca, false).expect("a TLS receiver");
        let endpoint = receiver.endpoint(via);
        let run = lens(
            &[
                "demo",
                "--ranks",
                "2",
                "--steps",
                "2",
                "--quiet",
                "--otlp",
                &endpoint,
                "--otlp-protocol",
                protocol,
            ],
            &[
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca_file),
                ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ],
            DEADLINE,
        );
        assert!(run.ok, "{protocol}: {}", run.stderr);
        check_demo_spans(&receiver, 2, 2, via);
        assert_eq!(receiver.compressed(), receiver.requests(), "{protocol}");
    }
}

/// A full traces URL given to --otlp is used as given (HTTP used to add /v1/traces to it a
/// second time, and every span was lost).
#[test]
fn a_full_traces_url_is_used_as_given() {
    let receiver = Receiver::start().expect("receiver");
    let url = format!("{}/v1/traces", receiver.http_endpoint());
    let run = lens(
        &[
            "demo", "--ranks", "2", "--steps", "2", "--quiet", "--otlp", &url,
        ],
        &[],
        DEADLINE,
    );
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("otlp: sent 4 span(s) from 2 of 2 rank(s)"),
        "{}",
        run.stdout
    );
    check_demo_spans(&receiver, 2, 2, Via::Http);
}

#[test]
fn the_standard_variables_choose_the_receiver_when_no_endpoint_is_given() {
    let receiver = Receiver::start().expect("receiver");
    let run = lens(
        &["demo", "--ranks", "2", "--steps", "2", "--quiet", "--otlp"],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.grpc_endpoint()),
            ("LENS_OTLP_EXPORT_RANKS", "ranks:1"),
        ],
        DEADLINE,
    );
    assert!(run.ok, "{}", run.stderr);
    assert!(run.stdout.contains("from 1 of 2 rank(s)"), "{}", run.stdout);
    let spans = receiver.wait_for(2, Duration::from_secs(10));
    assert_eq!(spans.len(), 2, "only rank 1's two spans");
    assert!(spans.iter().all(|s| s.rank() == Some(1)));
}

#[test]
fn a_receiver_that_is_down_fails_the_demo_saying_how_many_spans_were_lost() {
    let down = closed_port_endpoint().expect("port");
    let run = lens(
        &[
            "demo",
            "--ranks",
            "2",
            "--steps",
            "1",
            "--quiet",
            "--otlp",
            &down,
            "--otlp-protocol",
            "grpc",
        ],
        &[("LENS_OTLP_TIMEOUT", "1")],
        DEADLINE,
    );
    let line = run.failure_line();
    assert!(line.contains("span(s) were not exported"), "{line}");
    assert!(line.contains(&down), "names the endpoint: {line}");
}

#[cfg(feature = "tcp")]
#[test]
fn tcp_demo_exports_from_every_rank_process() {
    let receiver = Receiver::start().expect("receiver");
    let run = lens(
        &[
            "demo",
            "--backend",
            "tcp",
            "--ranks",
            "3",
            "--steps",
            "2",
            "--quiet",
            "--otlp",
            &receiver.http_endpoint(),
        ],
        &[],
        DEADLINE,
    );
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("otlp: sent 6 span(s) from 3 of 3 rank(s)"),
        "{}",
        run.stdout
    );
    check_demo_spans(&receiver, 3, 2, Via::Http);
}

/// `--inject absent:3` on four TCP processes with `--otlp`: rank 0's step fails waiting for
/// rank 3; ranks 1 and 2, which had that step's data, fail in the next one waiting for
/// rank 0 (and, in a tree, rank 2 for rank 1). Every rank's exported `lens.hang` names
/// rank 3, with the path to it. As a star and as a tree (0 → 1 → 2 → 3).
#[cfg(feature = "tcp")]
#[test]
fn tcp_hang_reports_name_the_absent_rank_on_every_rank() {
    // (layout, its variables, each rank's path to rank 3)
    let star: &[(usize, &[i64])] = &[(0, &[]), (1, &[0]), (2, &[0])];
    let tree: &[(usize, &[i64])] = &[(0, &[]), (1, &[0]), (2, &[1, 0])];
    for (layout, vars, paths) in [
        ("star", &[][..], star),
        ("tree", &[("LENS_TCP_FAN_OUT", "1")][..], tree),
    ] {
        let receiver = Receiver::start().expect("receiver");
        let endpoint = receiver.http_endpoint();
        let run = lens(
            &[
                "demo",
                "--backend",
                "tcp",
                "--ranks",
                "4",
                "--steps",
                "2",
                "--inject",
                "absent:3",
                "--timeout",
                "1",
                "--otlp",
                &endpoint,
            ],
            vars,
            DEADLINE,
        );
        assert!(!run.ok, "{layout}: {}", run.stdout);
        common::otlp::check_hang_reports(&receiver, 3, paths);
        // The terminal says the same.
        for (rank, via) in paths.iter().filter(|(_, via)| !via.is_empty()) {
            let words = format!(
                "timed out waiting for rank {}, which is waiting for",
                via[0]
            );
            assert!(
                run.stdout
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("rank {rank} "))
                        && l.contains(&words)),
                "{layout}: rank {rank}'s report: {}",
                run.stdout
            );
        }
    }
}
