//! `lens soak`: a TCP job left running, to see what grows. Rank processes on simulated
//! hosts run a round every `--every` ms (on a common tick of the wall clock), while a
//! stranger on host 0 knocks at rank 0's port and the switch resets a connection of host 1
//! every `--reset-every` seconds. Each rank reports every `--sample-every` seconds: its
//! rounds' p50 and p99, failures, RSS, open descriptors and threads. The run ends with the
//! table, each series' slope (the median of pairwise slopes, first sample left out as warm-up), a verdict
//! per series (it grows when even the least slope it shows with 95% confidence passes its
//! allowance), and an SVG plot with `--svg`.

use std::io::{BufRead as _, BufReader, Read, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lens::blocking;
use lens::tcp::{TcpBroadcaster, TcpConfigBuilder};
use lens::testkit::hosts::{Link, Network};

use super::args::SoakArgs;
use super::backends::tcp_key;
use super::hosts::Placement;
use super::launcher::{reason_of, run_collect};
use super::plot;
use super::soak_sample::Sample;

/// What a rank prints each sample.
const SAMPLE_LINE: &str = "lens-soak ";

pub(crate) fn run(args: &SoakArgs) -> Result<(), String> {
    if let Some(rank) = args.spawned.rank {
        return rank_main(args, rank);
    }
    if args.ranks < 2 {
        return Err(format!(
            "--ranks {}: a group has at least 2 ranks",
            args.ranks
        ));
    }
    let hosts = super::args::HostsArgs {
        hosts: Some(args.hosts),
        link: args.link.clone(),
    };
    let place = Placement::new(&hosts, args.ranks)?;
    let net = place.network().ok_or("the soak runs on simulated hosts")?;
    let link =
        Link::parse(args.link.as_deref().unwrap_or("")).map_err(|e| format!("--link: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let key = tcp_key()?;
    let addr = place.rendezvous();
    let command = |rank: usize| {
        let mut c = place.command(rank, &exe);
        c.args([
            "soak",
            "--rank",
            &rank.to_string(),
            "--world",
            &args.ranks.to_string(),
        ])
        .args(["--addr", &addr, "--every", &args.every.to_string()])
        .args(["--duration", &args.duration.to_string()])
        .args(["--sample-every", &args.sample_every.to_string()])
        .env(lens::tcp::env::KEY_FILE, &key.0)
        .env_remove(lens::tcp::env::KEY);
        c
    };
    let (stop, knocks) = (&AtomicBool::new(false), &AtomicU64::new(0));
    let deadline = Duration::from_secs_f64(args.duration) + Duration::from_secs(120);
    println!(
        "lens soak: {} ranks on {} simulated hosts, a round every {} ms for {} s; a stranger \
         knocks {} times a second; a connection of host 1 reset every {} s",
        args.ranks, args.hosts, args.every, args.duration, args.knocks_per_sec, args.reset_every
    );
    let (exited, resets) = std::thread::scope(|s| {
        let rank0: SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
        let stranger = (args.knocks_per_sec > 0.0)
            .then(|| s.spawn(move || knock(net, rank0, args.knocks_per_sec, stop, knocks)));
        let resetter = s.spawn(|| reset_host_1(net, link, args.reset_every, stop));
        let exited = run_collect(args.ranks, command, deadline, read_samples);
        stop.store(true, Ordering::Release);
        if let Some(t) = stranger {
            t.join().map_err(|_| "the stranger's thread failed")??;
        }
        let resets = resetter
            .join()
            .map_err(|_| "the resetter's thread failed")?;
        Ok::<_, String>((exited?, resets))
    })?;
    let mut per_rank = Vec::with_capacity(exited.len());
    for (rank, e) in exited.into_iter().enumerate() {
        if !e.ok {
            return Err(format!("rank {rank}: {}", reason_of(rank, &e.stderr)));
        }
        per_rank.push(e.out);
    }
    let rows = combine(&per_rank);
    let stats = net.stats();
    println!(
        "{} knocks, {resets} connections reset by the switch ({} in all), {} packets through it",
        knocks.load(Ordering::Relaxed),
        stats.resets,
        stats.forwarded
    );
    let verdict = print_table(&rows, args.sample_every);
    if let Some(path) = &args.svg {
        let svg = plot::soak_svg(&rows, args.sample_every);
        std::fs::write(path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("plot: {}", path.display());
    }
    verdict
}

/// A stranger on host 0 (rank 0's): connects to rank 0's port `per_sec` times a second,
/// sends bytes that are not lens's and leaves. Its traffic stays on host 0, so the resets
/// on host 1's link hit only the job's connections.
fn knock(
    net: &Network,
    to: SocketAddr,
    per_sec: f64,
    stop: &AtomicBool,
    count: &AtomicU64,
) -> Result<(), String> {
    net.hosts()[0]
        .enter()
        .map_err(|e| format!("the stranger cannot enter host 0: {e}"))?;
    let gap = Duration::from_secs_f64(1.0 / per_sec);
    let mut next = Instant::now();
    while !stop.load(Ordering::Acquire) {
        if let Ok(mut c) = TcpStream::connect_timeout(&to, Duration::from_millis(200)) {
            let _ = c.write_all(b"LENS\x01\x00\x00\x00not a frame of this job");
            count.fetch_add(1, Ordering::Relaxed);
        }
        next += gap;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    Ok(())
}

/// Every `every` seconds, makes host 1's link reset the next TCP segment with data that
/// crosses it, then puts the link back; returns how many it reset.
fn reset_host_1(net: &Network, link: Link, every: f64, stop: &AtomicBool) -> u64 {
    let mut done = 0;
    let mut next = Instant::now() + Duration::from_secs_f64(every);
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(50));
        if Instant::now() < next {
            continue;
        }
        let before = net.stats().resets;
        net.set_link(1, link.reset(1.0));
        let until = Instant::now() + Duration::from_secs(2);
        while net.stats().resets == before && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        net.set_link(1, link);
        done += net.stats().resets - before;
        next += Duration::from_secs_f64(every);
    }
    done
}

fn read_samples(r: BufReader<Box<dyn Read + Send>>) -> Vec<Sample> {
    r.lines()
        .map_while(Result::ok)
        .filter_map(|l| l.strip_prefix(SAMPLE_LINE).and_then(Sample::from_json))
        .collect()
}

/// Per sample period: rounds and failures of all ranks, rank 0's p50 and p99, and the
/// largest RSS, descriptors and threads of any rank.
fn combine(per_rank: &[Vec<Sample>]) -> Vec<Sample> {
    let n = per_rank.iter().map(Vec::len).min().unwrap_or(0);
    (0..n)
        .map(|i| {
            let all = per_rank.iter().map(|r| r[i]);
            let max = |f: fn(&Sample) -> f64| all.clone().map(|s| f(&s)).fold(0.0, f64::max);
            Sample {
                rounds: all.clone().map(|s| s.rounds).sum(),
                failed: all.clone().map(|s| s.failed).sum(),
                p50_us: per_rank[0][i].p50_us,
                p99_us: per_rank[0][i].p99_us,
                rss_kib: max(|s| s.rss_kib),
                fds: max(|s| s.fds),
                threads: max(|s| s.threads),
            }
        })
        .collect()
}

/// The slopes between every pair of samples of `ys`, per sample, in ascending order.
fn pairwise_slopes(ys: &[f64]) -> Vec<f64> {
    let mut slopes = Vec::with_capacity(ys.len() * ys.len().saturating_sub(1) / 2);
    for (i, a) in ys.iter().enumerate() {
        for (j, b) in ys.iter().enumerate().skip(i + 1) {
            slopes.push((b - a) / (j - i) as f64);
        }
    }
    slopes.sort_by(f64::total_cmp);
    slopes
}

/// The slope of `ys` per sample: the median of the slopes between every pair of samples
/// (Theil-Sen), so that one slow sample in a short run (a busy machine's moment) is not
/// read as a trend, while a series that keeps growing still is.
pub(crate) fn slope(ys: &[f64]) -> f64 {
    let slopes = pairwise_slopes(ys);
    if slopes.is_empty() {
        return 0.0;
    }
    let mid = slopes.len() / 2;
    if slopes.len() % 2 == 1 {
        slopes[mid]
    } else {
        (slopes[mid - 1] + slopes[mid]) / 2.0
    }
}

/// The least slope per sample that `ys` shows with 95% confidence (one-sided; Sen's bound
/// from the normal approximation of Kendall's S, ties ignored): the pairwise slope of rank
/// (N - 1.645 sd(S)) / 2, where N is the number of pairs. A series is judged to grow only
/// when this bound does: with five samples of a noisy percentile, the median slope alone
/// calls a busy machine's last seconds a trend about one run in six, while a steady leak
/// raises every pairwise slope and so this bound too.
pub(crate) fn slope_at_least(ys: &[f64]) -> f64 {
    let slopes = pairwise_slopes(ys);
    let Some(&least) = slopes.first() else {
        return 0.0;
    };
    let n = ys.len() as f64;
    let sd = (n * (n - 1.0) * (2.0 * n + 5.0) / 18.0).sqrt();
    let rank = ((slopes.len() as f64 - 1.645 * sd) / 2.0).floor();
    // Below rank 1 the bound is unbounded below; the least slope is the most the samples say.
    if rank < 1.0 {
        return least;
    }
    slopes.get(rank as usize - 1).copied().unwrap_or(least)
}

/// Prints the table and each series' slope and verdict; an error when a round failed or a
/// series grew past its allowance over the run.
fn print_table(rows: &[Sample], sample_every: f64) -> Result<(), String> {
    println!("\n| at (s) | rounds | failed | p50 µs | p99 µs | RSS MiB | fds | threads |");
    println!("|---|---|---|---|---|---|---|---|");
    for (i, r) in rows.iter().enumerate() {
        println!(
            "| {:.0} | {} | {} | {:.0} | {:.0} | {:.1} | {:.0} | {:.0} |",
            (i + 1) as f64 * sample_every,
            r.rounds,
            r.failed,
            r.p50_us,
            r.p99_us,
            r.rss_kib / 1024.0,
            r.fds,
            r.threads
        );
    }
    // The first period includes the join and the first allocations: left out.
    let steady = rows.get(1..).unwrap_or(&[]);
    if steady.len() < 3 {
        return Err(format!(
            "{} samples after the first: too few to judge a slope (run longer)",
            steady.len()
        ));
    }
    let span = (steady.len() - 1) as f64;
    let mut bad = Vec::new();
    // (series, value, what growth over the run is allowed: absolute, and a share of the mean)
    let series: [(&str, fn(&Sample) -> f64, f64, f64); 5] = [
        ("p50 µs", |s| s.p50_us, 0.0, 0.25),
        ("p99 µs", |s| s.p99_us, 0.0, 0.5),
        ("RSS KiB", |s| s.rss_kib, 1024.0, 0.05),
        ("fds", |s| s.fds, 2.0, 0.0),
        ("threads", |s| s.threads, 1.0, 0.0),
    ];
    println!();
    for (name, f, abs, share) in series {
        let ys: Vec<f64> = steady.iter().map(f).collect();
        let mean = ys.iter().sum::<f64>() / ys.len() as f64;
        let per_sample = slope(&ys);
        let growth = per_sample * span;
        let at_least = slope_at_least(&ys) * span;
        let allowed = abs + share * mean;
        let flat = at_least <= allowed;
        println!(
            "{name}: mean {mean:.1}, slope {per_sample:.3} per sample, {growth:+.1} over the run, at least {at_least:+.1} at 95% (allowed {allowed:.1}): {}",
            if flat { "flat" } else { "GROWS" }
        );
        if !flat {
            bad.push(name);
        }
    }
    let failed: u64 = rows.iter().map(|r| r.failed).sum();
    if failed > 0 {
        bad.push("rounds (some failed)");
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the soak found growth or failures in: {}",
            bad.join(", ")
        ))
    }
}

/// One rank process of the soak.
fn rank_main(args: &SoakArgs, rank: usize) -> Result<(), String> {
    let (Some(n), Some(addr)) = (args.spawned.world, &args.spawned.addr) else {
        return Err("a soak rank needs --world and --addr".into());
    };
    let group = TcpConfigBuilder::from_env()
        .rank(rank)
        .world_size(n)
        .addr(addr.clone())
        .timeout(Duration::from_secs(5))
        .build()
        .and_then(TcpBroadcaster::connect)
        .map_err(|e| format!("rank {rank}: {e}"))?;
    let every = Duration::from_secs_f64(args.every / 1000.0);
    // Every rank runs the same rounds and samples after the same ones: counted, not timed,
    // so that no rank stops a round before the others (which would fail their last).
    let rounds = (args.duration * 1000.0 / args.every).round() as u64;
    let per_sample = ((args.sample_every * 1000.0 / args.every).round() as u64).max(1);
    let payload = [7u8; 200];
    let mut times: Vec<f64> = Vec::new();
    let mut failed = 0u64;
    let mut stdout = std::io::stdout();
    for k in 1..=rounds {
        lens::testkit::sleep_to_next_tick(every);
        let t = Instant::now();
        match blocking::broadcast(&group, 0, (rank == 0).then_some(&payload[..])) {
            Ok(_) => times.push(t.elapsed().as_secs_f64() * 1e6),
            // Counted in the sample; the table shows where.
            Err(_) => failed += 1,
        }
        if k % per_sample == 0 {
            times.sort_by(f64::total_cmp);
            let q = |p: f64| {
                times
                    .get(((times.len() as f64 - 1.0) * p).round() as usize)
                    .copied()
                    .unwrap_or(0.0)
            };
            let (rss_kib, threads) = own_status();
            let sample = Sample {
                rounds: times.len() as u64 + failed,
                failed,
                p50_us: q(0.5),
                p99_us: q(0.99),
                rss_kib,
                fds: std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count) as f64,
                threads,
            };
            // One write per line: ranks' lines must not interleave.
            let _ = stdout.write_all(format!("{SAMPLE_LINE}{}\n", sample.to_json()).as_bytes());
            let _ = stdout.flush();
            times.clear();
            failed = 0;
        }
    }
    Ok(())
}

/// This process's resident memory (KiB) and thread count, from /proc.
fn own_status() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field("VmRSS:"), field("Threads:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slopes_of_lines_and_noise() {
        let rows: &[(&[f64], f64, &str)] = &[
            (&[1.0, 2.0, 3.0, 4.0], 1.0, "a line"),
            (&[5.0, 5.0, 5.0], 0.0, "flat"),
            (&[3.0, 1.0, 3.0, 1.0, 3.0], 0.0, "noise around a level"),
            (&[4.0], 0.0, "one point has no slope"),
            (&[1.0, 1.0, 1.0, 9.0, 1.0], 0.0, "one outlier is no trend"),
            // The short soak of 5 December: p99 with one busy moment, judged to grow by a
            // least-squares slope (248 per sample).
            (
                &[1410.0, 1448.0, 1685.0, 3903.0, 1422.0],
                87.75,
                "a busy moment",
            ),
            (
                &[1.0, 2.0, 30.0, 4.0, 5.0, 6.0],
                1.0,
                "a line with an outlier",
            ),
        ];
        for (ys, want, why) in rows {
            assert!((slope(ys) - want).abs() < 1e-9, "{why}: {}", slope(ys));
        }
    }

    #[test]
    fn the_least_slope_shown_at_95_percent() {
        let line: Vec<f64> = (0..59).map(f64::from).collect();
        let rows: &[(&[f64], f64, &str)] = &[
            (&[1.0, 2.0, 3.0, 4.0, 5.0], 1.0, "a line shows its slope"),
            (&[5.0, 5.0, 5.0, 5.0, 5.0], 0.0, "flat"),
            (&[4.0], 0.0, "one point shows nothing"),
            (
                &[1.0, 3.0, 2.0],
                -1.0,
                "three points: the least pairwise slope",
            ),
            // The 24-second soak of CI on 6 December: p99 over the five samples after the
            // first; its median slope (621 a sample) read a busy machine as growth.
            (
                &[1374.0, 2154.0, 1632.0, 2580.0, 3950.0],
                -522.0,
                "five noisy samples show no growth for sure",
            ),
            (&line, 1.0, "an hour's line"),
        ];
        for (ys, want, why) in rows {
            let got = slope_at_least(ys);
            assert!((got - want).abs() < 1e-9, "{why}: {got}");
        }
        // Over an hour, noise of ±1 around a slope of 1 leaves the bound near 1.
        let noisy: Vec<f64> = (0..59)
            .map(|i| f64::from(i) + if i % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let got = slope_at_least(&noisy);
        assert!((0.9..=1.0).contains(&got), "an hour's noisy line: {got}");
    }

    #[test]
    fn samples_read_back() {
        let s = Sample {
            rounds: 6000,
            failed: 1,
            p50_us: 310.0,
            p99_us: 900.5,
            rss_kib: 8000.0,
            fds: 21.0,
            threads: 5.0,
        };
        let back = Sample::from_json(&s.to_json()).expect("reads back");
        assert_eq!(
            (back.rounds, back.failed, back.p99_us, back.fds),
            (6000, 1, 900.5, 21.0)
        );
        assert!(Sample::from_json("{}").is_none());
    }

    #[test]
    fn a_growing_series_fails_the_verdict() {
        let row = |rss: f64| Sample {
            rounds: 100,
            p50_us: 300.0,
            p99_us: 800.0,
            rss_kib: rss,
            fds: 20.0,
            threads: 5.0,
            ..Sample::default()
        };
        let flat: Vec<Sample> = (0..6).map(|_| row(8000.0)).collect();
        assert!(print_table(&flat, 60.0).is_ok());
        let leak: Vec<Sample> = (0..6)
            .map(|i| row(8000.0 + 2000.0 * f64::from(i)))
            .collect();
        let e = print_table(&leak, 60.0).expect_err("RSS grows 2 MiB a sample");
        assert!(e.contains("RSS"), "{e}");
        // A p99 that climbs every sample grows, whatever the bound's width.
        let climb: Vec<Sample> = (0..6)
            .map(|i| Sample {
                p99_us: 1000.0 + 500.0 * f64::from(i),
                ..row(8000.0)
            })
            .collect();
        let e = print_table(&climb, 4.0).expect_err("p99 climbs 500 µs a sample");
        assert!(e.contains("p99"), "{e}");
        // CI's 24-second soak of 6 December: a busy machine, not a trend.
        let busy: Vec<Sample> = [1410.0, 1374.0, 2154.0, 1632.0, 2580.0, 3950.0]
            .into_iter()
            .map(|p99_us| Sample {
                p99_us,
                ..row(8000.0)
            })
            .collect();
        assert!(print_table(&busy, 4.0).is_ok());
    }
}
