//! A group of 8 separate processes on loopback, configured from the environment as torchrun
//! would, running the conformance suite. The test binary starts copies of itself.

use std::process::Command;
use std::time::Duration;

use lens_tcp::{TcpBroadcaster, TcpConfig};
use lens_testkit::conformance::{Options, run_rank};
use lens_testkit::process::{Supervised, wait_all};

const WORLD: usize = 8;
const DEADLINE: Duration = Duration::from_secs(120);

#[test]
fn eight_processes_pass_conformance() {
    run_processes(None);
}

#[test]
fn eight_processes_pass_conformance_with_tree_fan_out() {
    run_processes(Some(2));
}

fn run_processes(fan_out: Option<usize>) {
    // A free loopback port for rank 0 (it binds it a moment later).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let exe = std::env::current_exe().expect("test binary");
    let mut children = Vec::new();
    for rank in 0..WORLD {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "--exact",
            "child_rank",
            "--ignored",
            "--test-threads=1",
            "--quiet",
        ])
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", WORLD.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("LENS_TCP_KEY", "eight processes share this job key")
        .env("LENS_TCP_TIMEOUT", "20")
        .env("LENS_TCP_TEST_CHILD", "1")
        .env(
            "LENS_TCP_FAN_OUT",
            fan_out.map_or(String::from("7"), |k| k.to_string()),
        );
        children.push(Supervised::spawn(&mut cmd, DEADLINE).expect("start a rank"));
    }
    // Fails at the first rank that fails; the others are killed as they are dropped.
    wait_all(children, |rank, done| {
        let out = done.output();
        assert!(
            !done.timed_out,
            "rank {rank} still running after {DEADLINE:?}:\n{out}"
        );
        assert!(
            done.success(),
            "rank {rank} failed ({:?}):\n{out}",
            done.status
        );
        // The child really ran its rank (a filter that matched nothing would pass).
        assert!(out.contains("1 passed"), "rank {rank} ran no test:\n{out}");
    });
}

/// One rank of `eight_processes_pass_conformance`, started by it in its own process.
#[test]
#[ignore = "a child process of eight_processes_pass_conformance, not a test on its own"]
fn child_rank() {
    assert_eq!(
        std::env::var("LENS_TCP_TEST_CHILD").as_deref(),
        Ok("1"),
        "run by the parent test only"
    );
    let config = TcpConfig::from_env().expect("config from the environment");
    let group = TcpBroadcaster::connect(config).expect("join the group");
    futures::executor::block_on(run_rank(&group, &Options::default().rounds(300)))
        .expect("conformance");
}
