//! Limits that hold between rounds: a training loop calls `broadcast` once a step, and a
//! step takes seconds, so a group is idle nearly all the time. A stranger that opens
//! thousands of connections to rank 0's port meanwhile must not make the process hold
//! thousands of descriptors (the application's own files and sockets would then fail with
//! `EMFILE`). The group runs in a child process, whose descriptors and memory this test
//! reads from `/proc` while the stranger connects.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lens_core::blocking;
use lens_testkit::process::Supervised;

mod common;

const CHILD_VAR: &str = "LENS_IDLE_CHILD";
const DEADLINE: Duration = Duration::from_secs(120);
/// Connections the stranger opens while the group is idle...
const STRANGERS: usize = 4000;
/// ...at this many a second.
const RATE: u32 = 500;
/// How many descriptors above its idle baseline rank 0's process may hold meanwhile.
const FD_BUDGET: usize = 100;

fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

fn rss_kib_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// How many descriptors this process may open (its soft `RLIMIT_NOFILE`).
fn own_fd_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        })
        .unwrap_or(1024)
}

/// 4,000 stranger connections arrive at rank 0's port, 500 a second, while the group sits
/// between rounds (no `broadcast` is running on any rank). The stranger keeps as many of
/// them open as its own descriptor limit allows and never sends a byte. Rank 0's process stays within
/// [`FD_BUDGET`] descriptors of its idle baseline throughout, and the group's next rounds
/// succeed. Figures (peak descriptors, RSS) are printed.
#[test]
#[allow(clippy::print_stderr)]
fn stranger_connections_between_rounds_hold_no_descriptors() {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", "idle_child", "--ignored", "--nocapture"])
        .env(CHILD_VAR, "1")
        .stdin(Stdio::piped());
    let mut child = Supervised::spawn(&mut cmd, DEADLINE).expect("start the child");
    let pid = child.id();
    let addr = child
        .wait_for_line("ADDR ", Duration::from_secs(60))
        .map(|a| a.trim().to_owned())
        .expect("the child printed its address");
    // The group has formed and is idle; let it settle, then take the baseline.
    std::thread::sleep(Duration::from_millis(300));
    let (base_fds, base_rss) = (fds_of(pid), rss_kib_of(pid));

    // Four threads, each connecting at a steady pace (500 connections a second in all, the
    // rate a Python script reached against a real training job) and keeping its last
    // connections open, as many as this process may hold.
    let threads = 4;
    let pace = Duration::from_secs(1) * threads as u32 / RATE;
    let hold = own_fd_limit().saturating_sub(200).clamp(64, STRANGERS) / threads;
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let (opened, held, peak_fds, peak_rss) = std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let (mut fds, mut rss) = (base_fds, base_rss);
            while !stop.load(Ordering::Relaxed) {
                fds = fds.max(fds_of(pid));
                rss = rss.max(rss_kib_of(pid));
                std::thread::sleep(Duration::from_millis(2));
            }
            (fds, rss)
        });
        let strangers: Vec<_> = (0..threads)
            .map(|_| {
                let addr = &addr;
                s.spawn(move || {
                    let mut held = std::collections::VecDeque::new();
                    let mut opened = 0;
                    while opened < STRANGERS / threads
                        && started.elapsed() < Duration::from_secs(60)
                    {
                        let due = started + pace * opened as u32;
                        std::thread::sleep(due.saturating_duration_since(Instant::now()));
                        if let Ok(c) = TcpStream::connect(addr) {
                            opened += 1;
                            held.push_back(c);
                            if held.len() > hold {
                                held.pop_front();
                            }
                        }
                    }
                    (opened, held)
                })
            })
            .collect();
        let mut opened = 0;
        let mut held = Vec::new();
        for t in strangers {
            let (n, h) = t.join().expect("stranger");
            opened += n;
            held.extend(h);
        }
        // Still idle: give rank 0 a moment with every connection in, and look again.
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        let (fds, rss) = sampler.join().expect("sampler");
        (opened, held, fds, rss)
    });
    let flood_secs = started.elapsed().as_secs_f64();
    eprintln!(
        "idle rank 0: {opened} stranger connections in {flood_secs:.1} s ({} held at once); \
         descriptors {base_fds} idle, peak {peak_fds}; RSS {base_rss} KiB idle, peak {peak_rss} KiB",
        held.len()
    );
    assert_eq!(opened, STRANGERS, "the stranger opened every connection");
    assert!(
        peak_fds <= base_fds + FD_BUDGET,
        "rank 0's process held {peak_fds} descriptors, {} over its idle {base_fds}",
        peak_fds - base_fds
    );
    assert!(
        peak_rss < base_rss + 32 * 1024,
        "RSS grew from {base_rss} to {peak_rss} KiB"
    );
    // The group is unharmed: it runs rounds now.
    writeln!(child.stdin().expect("stdin"), "rounds").expect("tell the child");
    let done = child.wait();
    assert!(
        done.success() && done.stdout.contains("ROUNDS OK"),
        "{}",
        done.output()
    );
    drop(held);
}

/// The child side: a 2-rank group, idle until told to run rounds.
#[test]
#[ignore = "a child process of the idle tests, not a test on its own"]
#[allow(clippy::print_stdout)]
fn idle_child() {
    if std::env::var(CHILD_VAR).is_err() {
        return;
    }
    let lens_tcp::LoopbackGroup { ranks, addr, .. } =
        common::group_at(2, Duration::from_secs(10), None);
    println!("ADDR {addr}");
    let mut line = String::new();
    BufReader::new(std::io::stdin())
        .read_line(&mut line)
        .expect("read a command");
    for r in lens_testkit::on_each_rank(&ranks, |b| {
        (0..20u8)
            .map(|i| {
                let root = usize::from(i % 2);
                blocking::broadcast(
                    b,
                    root,
                    (lens_core::Broadcaster::rank(b) == root).then_some(&[i; 32][..]),
                )
            })
            .collect::<Result<Vec<_>, _>>()
    }) {
        assert_eq!(r.expect("rounds after the stranger").len(), 20);
    }
    println!("ROUNDS OK");
}
