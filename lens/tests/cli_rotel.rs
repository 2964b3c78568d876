//! Through a collector lens did not write: lens ranks → `rotel-agent` (the OTLP collector of
//! the `rotel` package on PyPI) → the test kit's receiver. `scripts/test.sh` installs rotel
//! into a venv it makes and runs this with `--ignored`, naming the binary in
//! `LENS_ROTEL_AGENT`.
#![cfg(feature = "tcp")]

mod common;

use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::lens_with_env as lens;
use common::otlp::check_demo_spans;
use lens::testkit::otlp::{Receiver, Via};
use lens::testkit::process::Supervised;

fn free_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("address")
}

fn wait_listening(addr: SocketAddr, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
#[ignore = "needs rotel-agent: scripts/test.sh installs rotel from PyPI and runs this with --ignored"]
fn a_multi_process_job_reaches_the_receiver_through_rotel() {
    let agent = std::env::var("LENS_ROTEL_AGENT")
        .expect("LENS_ROTEL_AGENT names the rotel-agent binary (scripts/test.sh sets it)");
    let receiver = Receiver::start().expect("receiver");
    let (grpc, http) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("lens-rotel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut cmd = Command::new(&agent);
    cmd.arg("start")
        .args(["--otlp-grpc-endpoint", &grpc.to_string()])
        .args(["--otlp-http-endpoint", &http.to_string()])
        .args(["--exporter", "otlp"])
        .args(["--otlp-exporter-endpoint", &receiver.grpc_endpoint()])
        .args(["--otlp-exporter-protocol", "grpc"])
        .args(["--batch-timeout", "100ms"])
        .arg("--pid-file")
        .arg(dir.join("rotel.pid"))
        .arg("--log-file")
        .arg(dir.join("rotel.log"))
        .stdin(Stdio::null());
    // Killed when dropped, whatever happens below.
    let collector =
        Supervised::spawn(&mut cmd, Duration::from_secs(120)).expect("rotel-agent starts");
    assert!(
        wait_listening(http, Duration::from_secs(20))
            && wait_listening(grpc, Duration::from_secs(5)),
        "rotel-agent did not listen on {http} and {grpc}"
    );
    // Three rank processes over TCP; HTTP into rotel, gRPC out of it.
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
            &format!("http://{http}"),
            "--otlp-protocol",
            "http/protobuf",
        ],
        &[],
        Duration::from_secs(90),
    );
    assert!(run.ok, "{}", run.stderr);
    assert!(
        run.stdout
            .contains("otlp: sent 6 span(s) from 3 of 3 rank(s)"),
        "{}",
        run.stdout
    );
    check_demo_spans(&receiver, 3, 2, Via::Grpc);
    drop(collector);
    let _ = std::fs::remove_dir_all(&dir);
}
