//! The MPI backend in the `lens` program, run under mpirun: one rank per process, the
//! group is MPI_COMM_WORLD.

use std::time::{Duration, Instant};

use lens::mpi::MpiBroadcaster;
use lens::{Carrier, blocking};
use mpi::traits::*;
use opentelemetry::Context;
use serde_json::json;

use super::bench::{Stats, round2, source_context};
use super::demo::{finish, run_one_rank};
use super::record::{Job, SpanRecord};
use super::{BenchArgs, DemoArgs};

/// Ends this rank at once: a collective may be pending, so MPI cannot be finalised, and the
/// launcher stops the other ranks when one exits non-zero.
fn die(rank: i32, why: &str) -> ! {
    eprintln!("lens: rank {rank}: {why}");
    std::process::exit(1)
}

pub fn demo(args: &DemoArgs, timeout: Duration) -> Result<(), String> {
    let universe = mpi::initialize().ok_or("MPI was already initialised")?;
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let group = MpiBroadcaster::builder(world.duplicate())
        .timeout(timeout)
        .build()
        .map_err(|e| e.to_string())?;
    let steps = args.steps as usize;
    let (outcome, mine) = run_one_rank(&group, args)?;
    if let Err(e) = outcome {
        die(rank, &e.to_string());
    }
    // Rank 0 collects every rank's spans to check and draw the whole job.
    let bytes = serde_json::to_vec(&mine.iter().map(SpanRecord::to_json).collect::<Vec<_>>())
        .map_err(|e| e.to_string())?;
    if rank != 0 {
        world.process_at_rank(0).send(&bytes[..]);
        return Ok(());
    }
    let mut job = Job::default();
    job.ranks.push(mine);
    for r in 1..size {
        let (theirs, _) = world.process_at_rank(r).receive_vec::<u8>();
        let list: Vec<serde_json::Value> =
            serde_json::from_slice(&theirs).map_err(|e| format!("rank {r}'s spans: {e}"))?;
        job.ranks
            .push(list.iter().filter_map(SpanRecord::from_json).collect());
    }
    finish(&job, args, "mpi", steps)
}

#[derive(Clone, Copy)]
enum Op {
    Raw,
    TwoCollective,
    Lens,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Raw => "raw",
            Op::TwoCollective => "two_collective",
            Op::Lens => "lens",
        }
    }
}

/// `lens bench --backend mpi`, under mpirun: per iteration every rank enters a barrier and
/// times one operation; the iteration's time is the slowest rank's. Operations, interleaved
/// in blocks: one `MPI_Bcast` of the carrier's bytes (raw), the Python reference's scheme
/// (an int64 length, then the bytes), and lens's `broadcast_trace_context`.
pub fn bench(args: &BenchArgs) -> Result<(), String> {
    let universe = mpi::initialize().ok_or("MPI was already initialised")?;
    let world = universe.world();
    let (rank, size) = (world.rank(), world.size());
    let group = MpiBroadcaster::new(world.duplicate()).map_err(|e| e.to_string())?;
    let cx = source_context();
    let carrier = Carrier::from_context(&cx).encode();
    let iters = args.iters.max(1);
    let root = world.process_at_rank(0);
    let empty = Context::new();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let blocks = 8;
    for block in 0..blocks {
        let per_block = iters / blocks + usize::from(block < iters % blocks);
        for (i, op) in [Op::Raw, Op::TwoCollective, Op::Lens]
            .into_iter()
            .enumerate()
        {
            for round in 0..per_block + 10 {
                world.barrier();
                let t0 = Instant::now();
                match op {
                    Op::Raw => {
                        let mut buf = if rank == 0 {
                            carrier.clone()
                        } else {
                            vec![0u8; carrier.len()]
                        };
                        root.broadcast_into(&mut buf[..]);
                        std::hint::black_box(&buf);
                    }
                    Op::TwoCollective => {
                        let mut len: i64 = if rank == 0 { carrier.len() as i64 } else { 0 };
                        root.broadcast_into(&mut len);
                        let mut buf = if rank == 0 {
                            carrier.clone()
                        } else {
                            vec![0u8; usize::try_from(len).unwrap_or(0)]
                        };
                        root.broadcast_into(&mut buf[..]);
                        std::hint::black_box(&buf);
                    }
                    Op::Lens => {
                        let cx = if rank == 0 { &cx } else { &empty };
                        let got = blocking::broadcast_context(&group, 0, cx)
                            .unwrap_or_else(|e| die(rank, &e.to_string()));
                        std::hint::black_box(got);
                    }
                }
                if round >= 10 {
                    times[i].push(t0.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
    }
    // The slowest rank's time of each iteration, on rank 0.
    for op_times in &mut times {
        let max = mpi::collective::SystemOperation::max();
        if rank == 0 {
            let mut slowest = vec![0.0f64; op_times.len()];
            root.reduce_into_root(&op_times[..], &mut slowest[..], max);
            *op_times = slowest;
        } else {
            root.reduce_into(&op_times[..], max);
        }
    }
    if rank != 0 {
        return Ok(());
    }
    let stats: Vec<Stats> = times.iter_mut().map(|t| Stats::of(t)).collect();
    if !args.json {
        println!(
            "lens bench: backend mpi, {size} rank(s), {} carrier bytes, {iters} timed rounds per op",
            carrier.len()
        );
        println!(
            "{:>6} {:>15} {:>10} {:>10} {:>9}",
            "ranks", "op", "median_us", "p99_us", "lens/op"
        );
    }
    for (op, s) in [Op::Raw, Op::TwoCollective, Op::Lens]
        .into_iter()
        .zip(&stats)
    {
        let lens_vs = stats[2].median / s.median;
        if args.json {
            let mut line = json!({
                "backend": "mpi", "ranks": size, "op": op.name(), "bytes": carrier.len(),
                "iters": s.count, "median_us": round2(s.median), "p99_us": round2(s.p99),
            });
            if let Op::Lens = op {
                line["ratio_vs_raw"] = json!(round2(stats[2].median / stats[0].median));
                line["ratio_vs_two_collective"] = json!(round2(stats[2].median / stats[1].median));
            }
            println!("{line}");
        } else {
            let r = if matches!(op, Op::Lens) {
                String::new()
            } else {
                format!("{lens_vs:.2}x")
            };
            println!(
                "{size:>6} {:>15} {:>10.2} {:>10.2} {r:>9}",
                op.name(),
                s.median,
                s.p99
            );
        }
    }
    Ok(())
}
