//! Groups of separate processes on loopback, configured from the environment as torchrun
//! would: 8 running the conformance suite, and 1,024 forming a tree under `ulimit -n 1024`.
//! The test binary starts copies of itself.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// A free loopback port for rank 0 (it binds it a moment later).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// This test binary as rank `rank` of a job of `world` at `port`, configured from the
/// environment as torchrun would, running the ignored test `child`.
fn rank_command(
    cmd: &mut Command,
    child: &str,
    rank: usize,
    world: usize,
    port: u16,
    fan_out: usize,
) {
    cmd.arg(std::env::current_exe().expect("test binary"))
        .args(["--exact", child, "--ignored", "--test-threads=1", "--quiet"])
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env(
            "LENS_TCP_KEY",
            "the processes of this test share this job key",
        )
        .env("LENS_TCP_FAN_OUT", fan_out.to_string())
        .env("LENS_TCP_TEST_CHILD", "1");
}

fn run_processes(fan_out: Option<usize>) {
    let port = free_port();
    let mut children = Vec::new();
    for rank in 0..WORLD {
        // `env` runs the binary: rank_command names it as the first argument.
        let mut cmd = Command::new("env");
        rank_command(
            &mut cmd,
            "child_rank",
            rank,
            WORLD,
            port,
            fan_out.unwrap_or(WORLD - 1),
        );
        cmd.env("LENS_TCP_TIMEOUT", "20");
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
    let group = join_from_env();
    futures::executor::block_on(run_rank(&group, &Options::default().rounds(300)))
        .expect("conformance");
}

/// A child's rank, configured from the environment its parent test set.
fn join_from_env() -> TcpBroadcaster {
    assert_eq!(
        std::env::var("LENS_TCP_TEST_CHILD").as_deref(),
        Ok("1"),
        "run by the parent test only"
    );
    let config = TcpConfig::from_env().expect("config from the environment");
    TcpBroadcaster::connect(config).expect("join the group")
}

/// Ranks of the large tree job.
const LARGE: usize = 1024;
const LARGE_FAN_OUT: usize = 4;
/// How many descriptors rank 0's process may hold in the large tree job once the group has
/// formed: its own (the test binary, its epoll instances and sockets) and its four children,
/// never one per rank. While the group forms it also holds the ranks whose parent has not
/// joined yet, which depends on the order the processes start in (checked against the
/// process's limit only: the job succeeds under `ulimit -n 1024`).
const LARGE_RANK0_FDS: usize = 64;

/// Every child of a test, killed when dropped (a failed assertion). Not
/// `lens_testkit::process::Supervised`, which drains each child's pipes on two threads of
/// its own: 2,048 threads here, for output nobody reads.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// 1,024 processes, each limited to 1,024 descriptors (`prlimit`), form a tree of fan-out
/// 4 and run three rounds with different roots. No rank keeps a connection per rank, so
/// the job fits (in a star rank 0 alone would need more than 1,024) and every rank
/// succeeds; once formed, rank 0's process holds at most [`LARGE_RANK0_FDS`] descriptors
/// (checked by rank 0 itself). Rank 0's peak descriptors over the whole job, formation
/// included, and the time the job took are printed.
#[test]
#[allow(clippy::print_stderr)]
fn a_thousand_processes_form_a_tree_under_ulimit_1024() {
    let port = free_port();
    let started = Instant::now();
    let mut children = Children(Vec::with_capacity(LARGE));
    for rank in 0..LARGE {
        let mut cmd = Command::new("prlimit");
        cmd.args(["--nofile=1024:1024", "--"]);
        rank_command(&mut cmd, "tree_child", rank, LARGE, port, LARGE_FAN_OUT);
        // Rank 0 prints what it holds once formed.
        cmd.arg("--nocapture");
        cmd.env("LENS_TCP_TIMEOUT", "60")
            .env("LENS_TCP_JOIN_TIMEOUT", "240")
            .stdin(Stdio::null())
            .stdout(if SAMPLED.contains(&rank) {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(if rank < 2 {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        children.0.push(cmd.spawn().expect("start a rank"));
    }
    let rank0 = children.0[0].id();
    let mut peak = 0;
    let mut failed = Vec::new();
    let mut left: Vec<usize> = (0..LARGE).collect();
    while !left.is_empty() && started.elapsed() < Duration::from_secs(420) {
        peak = peak.max(std::fs::read_dir(format!("/proc/{rank0}/fd")).map_or(0, Iterator::count));
        left.retain(|&r| match children.0[r].try_wait() {
            Ok(Some(status)) => {
                if !status.success() {
                    failed.push(r);
                }
                false
            }
            Ok(None) => true,
            Err(_) => {
                failed.push(r);
                false
            }
        });
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "{LARGE} processes, fan-out {LARGE_FAN_OUT}, ulimit -n 1024: done in {:.1} s; rank 0 held at most {peak} descriptors",
        started.elapsed().as_secs_f64()
    );
    assert!(
        left.is_empty(),
        "{} rank(s) still running: {:?}",
        left.len(),
        &left[..left.len().min(8)]
    );
    failed.sort_unstable();
    assert!(
        failed.is_empty(),
        "{} rank(s) failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(8)]
    );
    // The sampled ranks really ran their rank (a filter that matched nothing would pass).
    for &r in SAMPLED {
        let mut out = String::new();
        if let Some(mut pipe) = children.0[r].stdout.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut out);
        }
        assert!(out.contains("1 passed"), "rank {r} ran no test:\n{out}");
        if r == 0 {
            let after = out
                .lines()
                .find(|l| l.starts_with("rank 0 after formation"));
            assert!(
                after.is_some(),
                "rank 0 did not count its descriptors:\n{out}"
            );
            eprintln!("{}", after.unwrap_or_default());
        }
    }
}

/// Ranks of the large job whose output is read, to see that they ran their rank.
const SAMPLED: &[usize] = &[0, 1, 5, 511, 1023];

/// One rank of `a_thousand_processes_form_a_tree_under_ulimit_1024`.
#[test]
#[ignore = "a child process of a_thousand_processes_form_a_tree_under_ulimit_1024, not a test on its own"]
#[allow(clippy::print_stdout)]
fn tree_child() {
    let group = join_from_env();
    for root in [0, LARGE - 1, LARGE / 2] {
        let want = format!("from {root}").into_bytes();
        let mine = (lens_core::Broadcaster::rank(&group) == root).then_some(want.as_slice());
        let got = lens_core::blocking::broadcast(&group, root, mine).expect("a round");
        assert_eq!(got, want);
    }
    if lens_core::Broadcaster::rank(&group) == 0 {
        // Once formed, rank 0 keeps its children only: its descriptors no longer depend on
        // the world. The connections of ranks that left it for their parents close on
        // as the ranks' own reads find them closed, so give them a moment.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut held = own_descriptors();
        while held > LARGE_RANK0_FDS && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            held = own_descriptors();
        }
        println!("rank 0 after formation: {held} descriptors");
        assert!(
            held <= LARGE_RANK0_FDS,
            "rank 0 holds {held} descriptors after formation"
        );
    }
}

/// Descriptors this process has open.
fn own_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(usize::MAX, Iterator::count)
}
