//! What measuring every rank's clock offset costs when a group forms, on the in-process
//! backend (threads) and on TCP over loopback (threads, a star): the wall time of one
//! `measure_clock_offsets` on every rank at once, and the broadcasts it takes.
//!
//! ```text
//! cargo run --release -p lens-trace --features tcp,testkit --example clock_cost
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::{Duration, Instant};

use lens::Broadcaster;
use lens::local::LocalCluster;

const REPETITIONS: usize = 4;

/// The slowest rank's time for one measurement, the median of `runs`.
fn cost<B: Broadcaster + Sync>(ranks: &[B], runs: usize) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            let out = lens::testkit::on_each_rank(ranks, |b| {
                lens::measure_clock_offsets(b, 0, REPETITIONS)
            });
            let took = start.elapsed();
            for t in out {
                if let Err(e) = t {
                    eprintln!("measuring failed: {e}");
                    std::process::exit(1);
                }
            }
            took
        })
        .collect();
    times.sort_unstable();
    times[times.len() / 2]
}

fn main() {
    println!(
        "clock offsets, {REPETITIONS} exchanges per rank: the slowest rank's wall time (median of 5)"
    );
    println!(
        "{:>10} {:>6} {:>11} {:>12}",
        "backend", "ranks", "broadcasts", "ms"
    );
    for n in [4usize, 16, 64] {
        let broadcasts = REPETITIONS * (n - 1) * 2 + 1;
        let ranks = LocalCluster::new(n)
            .timeout(Duration::from_secs(30))
            .broadcasters();
        let t = cost(&ranks, 5);
        println!(
            "{:>10} {n:>6} {broadcasts:>11} {:>12.2}",
            "local",
            t.as_secs_f64() * 1e3
        );
        let key: String = (0..32).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        match lens::tcp::loopback_group(n, |b| b.key(&key).timeout(Duration::from_secs(30))) {
            Ok(group) => {
                let t = cost(&group.ranks, 5);
                println!(
                    "{:>10} {n:>6} {broadcasts:>11} {:>12.2}",
                    "tcp",
                    t.as_secs_f64() * 1e3
                );
            }
            Err(e) => println!("{:>10} {n:>6} cannot form: {e}", "tcp"),
        }
    }
}
