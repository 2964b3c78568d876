//! A group of 8 separate processes on loopback, configured from the environment as torchrun
//! would, running the conformance suite. The test binary starts copies of itself.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lens_tcp::{TcpBroadcaster, TcpConfig};
use lens_testkit::conformance::{Options, run_rank};

const WORLD: usize = 8;
const DEADLINE: Duration = Duration::from_secs(120);

/// Kills every child still running when dropped (a failed assertion included).
struct Children(Vec<(usize, Child)>);

impl Drop for Children {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

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
    let mut children = Children(Vec::new());
    for rank in 0..WORLD {
        let child = Command::new(&exe)
            .args([
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
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a rank");
        children.0.push((rank, child));
    }
    let started = Instant::now();
    let mut done = vec![false; WORLD];
    while done.iter().any(|d| !d) {
        assert!(
            started.elapsed() < DEADLINE,
            "ranks still running after {DEADLINE:?}: {done:?}"
        );
        for (rank, child) in &mut children.0 {
            if done[*rank] {
                continue;
            }
            if let Some(status) = child.try_wait().expect("wait") {
                done[*rank] = true;
                let out = child.wait_with_output_lossy();
                assert!(status.success(), "rank {rank} failed ({status}):\n{out}");
                // The child really ran its rank (a filter that matched nothing would pass).
                assert!(out.contains("1 passed"), "rank {rank} ran no test:\n{out}");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

trait Lossy {
    fn wait_with_output_lossy(&mut self) -> String;
}

impl Lossy for Child {
    fn wait_with_output_lossy(&mut self) -> String {
        use std::io::Read as _;
        let mut s = String::new();
        if let Some(mut o) = self.stdout.take() {
            let _ = o.read_to_string(&mut s);
        }
        if let Some(mut e) = self.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }
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
