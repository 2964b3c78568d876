//! Real clocks: a TCP job of two processes in which rank 1 runs under libfaketime 2.5 s
//! ahead. The offset lens measures is within 1 ms of 2.5 s, and its bound under 1 ms.
//! And one clock read by a rank that stalls: the offsets stay within their bounds.

use std::process::{Command, Stdio};
use std::time::Duration;

use lens_tcp::{TcpBroadcaster, TcpConfig};
use lens_testkit::process::{Supervised, wait_all};

mod common;

const AHEAD_NS: i64 = 2_500_000_000;

/// The reference stalls 30 ms right after every third reading of its clock (the one after
/// each rank's answer came, in the present order), as a rank preempted on a busy host does. A reading of when the data came must not be pushed earlier by the
/// stall (it was, once: the time since the data came was measured after the clock was
/// read, so a stall in between made the data seem to come before it was sent and the
/// bound read zero while the offset read 15 ms). One host, one clock: every offset must be
/// within its bound of zero.
#[test]
fn a_reference_that_stalls_after_reading_its_clock_keeps_every_offset_within_its_bound() {
    const REFERENCE: usize = 2;
    let ranks = common::group(3, Duration::from_secs(10));
    let tables: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(rank, b)| {
                s.spawn(move || {
                    let readings = std::sync::atomic::AtomicUsize::new(0);
                    let now = move || {
                        let t = lens_core::clock::system_now_ns();
                        let nth = 1 + readings.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if rank == REFERENCE && nth % 3 == 0 {
                            std::thread::sleep(Duration::from_millis(30));
                        }
                        t
                    };
                    lens_core::clock::measure_clock_offsets_with(b, REFERENCE, 2, &now)
                        .expect("measured")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    for (r, c) in tables[0].iter().enumerate() {
        assert!(
            c.offset_ns.unsigned_abs() <= c.error_ns,
            "rank {r}: offset {} ns outside its bound {} ns on one clock",
            c.offset_ns,
            c.error_ns
        );
    }
}

#[test]
#[ignore = "needs faketime (Debian package faketime): scripts/test.sh installs it and runs this with --ignored"]
#[allow(clippy::print_stderr)]
fn a_rank_under_faketime_is_measured_2_5_s_ahead() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a port")
        .port();
    let exe = std::env::current_exe().expect("test binary");
    let mut children = Vec::new();
    for rank in 0..2 {
        let mut cmd = if rank == 1 {
            let mut c = Command::new("faketime");
            // Only the wall clock: deadlines and timers keep the real monotonic clock.
            c.env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .arg("-f")
                .arg("+2.5s")
                .arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        cmd.args([
            "--exact",
            "clock_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LENS_TCP_TEST_CHILD", "1")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("LENS_TCP_ADDR", format!("127.0.0.1:{port}"))
        .env("LENS_TCP_KEY", "the clock test's job key, long enough")
        .env("LENS_TCP_TIMEOUT", "10")
        .stdin(Stdio::null());
        // Each killed at its deadline (or when a failed assertion drops it), pipes drained.
        children.push(
            Supervised::spawn(&mut cmd, Duration::from_secs(60))
                .expect("start a rank (is faketime installed?)"),
        );
    }
    let mut outs = Vec::new();
    for done in wait_all(children, |_, _| {}) {
        assert!(done.success(), "{}", done.output());
        outs.push(done.stdout);
    }
    let line = outs[0]
        .lines()
        .find_map(|l| l.split("offset ").nth(1))
        .unwrap_or_else(|| panic!("rank 0 printed no offset:\n{}", outs[0]));
    let mut parts = line
        .split_whitespace()
        .map(|p| p.parse::<i64>().expect("a number"));
    let (offset, error) = (parts.next().expect("offset"), parts.next().expect("error"));
    eprintln!("rank 1 under faketime +2.5 s: offset {offset} ns, error bound {error} ns");
    assert!(
        (offset - AHEAD_NS).abs() < 1_000_000,
        "offset {offset} ns, not 2.5 s within 1 ms"
    );
    assert!(error < 1_000_000, "error bound {error} ns");
}

/// One rank of `a_rank_under_faketime_is_measured_2_5_s_ahead`.
#[test]
#[ignore = "a child process of a_rank_under_faketime_is_measured_2_5_s_ahead, not a test on its own"]
#[allow(clippy::print_stdout)]
fn clock_child() {
    assert_eq!(std::env::var("LENS_TCP_TEST_CHILD").as_deref(), Ok("1"));
    let group = TcpBroadcaster::connect(TcpConfig::from_env().expect("config")).expect("join");
    let table = lens_core::measure_clock_offsets(&group, 0, 16).expect("measured");
    println!("offset {} {}", table[1].offset_ns, table[1].error_ns);
}
