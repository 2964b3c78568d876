//! Resource pressure from strangers, each case in a child process of its own so that what
//! it measures (peak memory) or limits (descriptors) is the group's alone: a flood of
//! keyless data at rank 0, and 100 idle connections against a limit of 128 descriptors.

mod common;

use std::io::Write as _;
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lens_core::{Broadcaster as _, blocking};
use lens_tcp::TcpBroadcaster;
use lens_testkit::process::Supervised;

const CHILD_VAR: &str = "LENS_PRESSURE_CHILD";
const DEADLINE: Duration = Duration::from_secs(120);
const ROUNDS: usize = 1500;
/// What a flooder pushes: 3,000 messages of 64 KiB per connection slot.
const FLOOD_CHUNKS: usize = 3000;

fn child(case: &str, wrapper: &[&str]) -> Supervised {
    let exe = std::env::current_exe().expect("test binary");
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args(["--exact", "pressure_child", "--ignored", "--nocapture"])
        .env(CHILD_VAR, case)
        .stdin(Stdio::piped());
    Supervised::spawn(&mut cmd, DEADLINE).expect("start the child")
}

/// Whether the child succeeded, and all it printed, once it exits within the deadline.
fn finish(g: Supervised) -> (bool, String) {
    let done = g.wait();
    assert!(!done.timed_out, "the child ran past {DEADLINE:?}");
    (done.success(), format!("{}\n{}", done.stdout, done.stderr))
}

/// `(seconds for the rounds, peak RSS in KiB)` from a child's report.
fn result(out: &str) -> (f64, u64) {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no result in:\n{out}"));
    let mut parts = line.split_whitespace();
    let secs = parts.next().and_then(|s| s.parse().ok()).expect("secs");
    let kib = parts.next().and_then(|s| s.parse().ok()).expect("kib");
    (secs, kib)
}

/// Four keyless connection slots, each pushing 3,000 × 64 KiB (garbage, and junk that looks
/// like frames) at rank 0 while the group runs rounds: rank 0 closes each connection at its
/// first bad frame, and the process stays under 64 MiB. The time against a run without the
/// flood is printed (a figure, not asserted: timing on a shared 2-core machine is noise).
#[test]
#[allow(clippy::print_stderr)]
fn flood_of_keyless_data_keeps_memory_bounded() {
    let (ok, quiet) = finish(child("quiet", &[]));
    assert!(ok, "{quiet}");
    let (ok, flooded) = finish(child("flood", &[]));
    assert!(ok, "{flooded}");
    let (t0, m0) = result(&quiet);
    let (t1, m1) = result(&flooded);
    eprintln!(
        "flood: {ROUNDS} rounds in {t0:.2} s without, {t1:.2} s with ({:.2}x); peak RSS {} KiB without, {} KiB with",
        t1 / t0,
        m0,
        m1
    );
    assert!(m1 < 64 * 1024, "peak RSS under the flood: {m1} KiB");
    let pushed: u64 = flooded
        .lines()
        .find_map(|l| l.strip_prefix("PUSHED "))
        .and_then(|s| s.trim().parse().ok())
        .expect("pushed");
    assert!(pushed > 0, "the flood reached rank 0");
}

/// 100 idle stranger connections, with rank 0's process limited to 96 descriptors (the
/// issue asked for 128; 96 is where they used to lock honest ranks out): the
/// oldest unproven connections are closed, and the honest ranks still join.
#[test]
fn idle_connections_cannot_exhaust_descriptors() {
    let mut g = child("idle", &["prlimit", "--nofile=96:96", "--"]);
    let addr = g
        .wait_for_line("ADDR ", Duration::from_secs(60))
        .map(|a| a.trim().to_owned())
        .expect("the child printed its address");
    let idle: Vec<TcpStream> = (0..100)
        .filter_map(|_| TcpStream::connect(&addr).ok())
        .collect();
    assert!(idle.len() >= 64, "only {} connections opened", idle.len());
    writeln!(g.stdin().expect("stdin"), "go").expect("go");
    let go = Instant::now();
    // Ranks 1 and 2 live here, as they would on other hosts: only rank 0 is limited.
    let others: Vec<TcpBroadcaster> = std::thread::scope(|s| {
        let t: Vec<_> = (1..3)
            .map(|r| {
                let addr = &addr;
                s.spawn(move || {
                    TcpBroadcaster::connect(common::config(r, 3, addr, Duration::from_secs(10)))
                })
            })
            .collect();
        t.into_iter()
            .map(|t| t.join().expect("thread").expect("the honest ranks join"))
            .collect()
    });
    // Well before the 5 s handshake deadline would free the descriptors: the cap on
    // unproven connections did (a bound, not a speed claim; this takes ~0.05 s).
    assert!(
        go.elapsed() < Duration::from_secs(3),
        "joined after {:?}",
        go.elapsed()
    );
    for r in lens_testkit::on_each_rank(&others, |b| {
        (0..10)
            .map(|_| blocking::broadcast(b, 0, None))
            .collect::<Result<Vec<_>, _>>()
    }) {
        assert_eq!(r.expect("rounds from rank 0").len(), 10);
    }
    let (ok, rest) = finish(g);
    assert!(ok && rest.contains("JOINED"), "{rest}");
    drop(idle);
}

/// Rank 0 of a star of 64 ranks in a process that may open 48 descriptors: it could never
/// hold its 63 peers, so `start` fails at once with a configuration error that names the
/// limit and the `ulimit -n` it needs, instead of running out of descriptors mid-join.
#[test]
fn a_descriptor_limit_too_low_is_named_at_start() {
    let (ok, out) = finish(child("lowlimit", &["prlimit", "--nofile=48:48", "--"]));
    assert!(ok, "{out}");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("ERROR "))
        .unwrap_or_else(|| panic!("no error in:\n{out}"));
    assert!(
        line.contains("invalid configuration")
            && line.contains("RLIMIT_NOFILE")
            && line.contains("only 48")
            && line.contains("ulimit -n"),
        "{line}"
    );
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn run_rounds(ranks: &[TcpBroadcaster], rounds: usize) {
    let n = ranks.len();
    for r in lens_testkit::on_each_rank(ranks, |b| {
        for round in 0..rounds {
            let root = round % n;
            let want = [u8::try_from(round % 251).unwrap_or(0); 100];
            let got = blocking::broadcast(b, root, (b.rank() == root).then_some(&want[..]))?;
            assert_eq!(got, want);
        }
        Ok::<_, lens_core::Error>(())
    }) {
        r.expect("rounds");
    }
}

/// One flooder: connects again whenever rank 0 closes it, until it pushed its chunks.
fn flooder(addr: &str, framed: bool, stop: &AtomicBool) -> usize {
    let mut chunk = vec![0x41u8; 64 * 1024];
    if framed {
        // Junk frames with a plausible length prefix: only the checks after it can tell.
        for f in chunk.chunks_mut(342) {
            if f.len() >= 4 {
                f[..4].copy_from_slice(&338u32.to_le_bytes());
            }
        }
    }
    let mut pushed = 0;
    while pushed < FLOOD_CHUNKS && !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect(addr) else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
        while pushed < FLOOD_CHUNKS && !stop.load(Ordering::Relaxed) {
            if s.write_all(&chunk).is_err() {
                break;
            }
            pushed += 1;
        }
    }
    pushed
}

/// The child side of the cases above; does nothing unless started by them.
#[test]
#[ignore = "a child process of the pressure tests, not a test on its own"]
#[allow(clippy::print_stdout)]
fn pressure_child() {
    let Ok(case) = std::env::var(CHILD_VAR) else {
        return;
    };
    match case.as_str() {
        "quiet" | "flood" => {
            let lens_tcp::LoopbackGroup { ranks, addr, .. } =
                common::group_at(2, Duration::from_secs(10), None);
            let addr = addr.to_string();
            let stop = AtomicBool::new(false);
            let (secs, pushed) = std::thread::scope(|s| {
                let flooders: Vec<_> = (0..if case == "flood" { 4 } else { 0 })
                    .map(|i| {
                        let (addr, stop) = (&addr, &stop);
                        s.spawn(move || flooder(addr, i % 2 == 1, stop))
                    })
                    .collect();
                let started = Instant::now();
                run_rounds(&ranks, ROUNDS);
                let secs = started.elapsed().as_secs_f64();
                stop.store(true, Ordering::Relaxed);
                let pushed: usize = flooders
                    .into_iter()
                    .map(|f| f.join().expect("flooder"))
                    .sum();
                (secs, pushed)
            });
            println!("PUSHED {pushed}");
            println!("RESULT {secs} {}", peak_rss_kib());
        }
        "idle" => {
            let hub =
                TcpBroadcaster::start(common::config(0, 3, "127.0.0.1:0", Duration::from_secs(10)))
                    .expect("bind");
            let addr = hub.local_addr().expect("addr").to_string();
            println!("ADDR {addr}");
            let mut go = String::new();
            std::io::stdin().read_line(&mut go).expect("go");
            let hub = hub.finish().expect("the honest ranks join");
            for round in 0..10u8 {
                blocking::broadcast(&hub, 0, Some(&[round][..])).expect("round");
            }
            println!("JOINED");
        }
        "lowlimit" => {
            let err = TcpBroadcaster::start(common::config(
                0,
                64,
                "127.0.0.1:0",
                Duration::from_secs(10),
            ))
            .expect_err("a limit too low for 63 peers");
            println!("ERROR {err}");
        }
        other => panic!("unknown case {other}"),
    }
}
