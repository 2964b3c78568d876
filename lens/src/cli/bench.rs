//! `lens bench`: a raw broadcast of the carrier's bytes beside lens's trace-context
//! broadcast, on the same group, in the same run.
//!
//! What one sample is: the ranks run rounds back to back; the time of round `i` is from the
//! moment the last rank finished round `i - 1` to the moment the last rank finished round
//! `i` (so it includes the slowest rank's decode). Both operations are measured the same way,
//! interleaved in blocks, so their ratio is what lens adds on top of the transport.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lens::testkit::{LocalBroadcaster, LocalCluster};
use lens::{Broadcaster, Carrier, broadcast_context};
use opentelemetry::baggage::BaggageExt;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use serde_json::json;

#[cfg(any(feature = "tcp", feature = "mpi", feature = "nccl"))]
use super::BackendArg;
use super::BenchArgs;

pub const BLOCKS: usize = 64;
pub const WARMUP: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Raw,
    Lens,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Raw => "raw",
            Op::Lens => "lens",
        }
    }
}

/// The context the source broadcasts: a sampled span with flags 03 and a little baggage,
/// as a training step would carry.
pub fn source_context() -> Context {
    let sc = SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap_or(TraceId::INVALID),
        SpanId::from_hex("00f067aa0ba902b7").unwrap_or(SpanId::INVALID),
        TraceFlags::new(0x03),
        true,
        TraceState::NONE,
    );
    Context::new().with_remote_span_context(sc).with_baggage([
        KeyValue::new("nv.dl.step", "17"),
        KeyValue::new("job.id", "job-42"),
    ])
}

pub fn run(args: &BenchArgs) -> Result<(), String> {
    #[cfg(feature = "tcp")]
    if args.backend == BackendArg::Tcp {
        return super::tcp::bench(args);
    }
    #[cfg(feature = "mpi")]
    if args.backend == BackendArg::Mpi {
        return super::mpi::bench(args);
    }
    #[cfg(feature = "nccl")]
    if args.backend == BackendArg::Nccl {
        return nccl(args);
    }
    if args.fan_out.is_some() {
        return Err("--fan-out applies to --backend tcp".into());
    }
    if args.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    if let Some(bad) = args.ranks.iter().find(|n| **n == 0 || **n > 4096) {
        return Err(format!("--ranks {bad}: a group has 1 to 4096 ranks"));
    }
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let cx = source_context();
    let bytes = Carrier::from_context(&cx).encode();
    if !args.json {
        println!(
            "lens bench: backend local, {} carrier bytes, {} timed rounds per op, {workers} worker thread(s)",
            bytes.len(),
            args.iters
        );
        print_header();
    }
    for &n in &args.ranks {
        let ranks: Vec<Arc<LocalBroadcaster>> = LocalCluster::new(n)
            .timeout(Duration::from_secs(30))
            .broadcasters()
            .into_iter()
            .map(Arc::new)
            .collect();
        let (mut raw, mut lens) = (Vec::new(), Vec::new());
        for block in 0..BLOCKS {
            // Spread the rounds over the blocks so that exactly `iters` are timed.
            let per_block = args.iters / BLOCKS + usize::from(block < args.iters % BLOCKS);
            if per_block == 0 {
                continue;
            }
            raw.extend(rt.block_on(measure(&ranks, Op::Raw, per_block, &bytes, &cx))?);
            lens.extend(rt.block_on(measure(&ranks, Op::Lens, per_block, &bytes, &cx))?);
        }
        print_pair(args, n, bytes.len(), &mut raw, &mut lens);
    }
    Ok(())
}

/// Prints the raw and lens lines of one group size, as a table row pair or JSON lines.
pub fn print_pair(args: &BenchArgs, n: usize, bytes: usize, raw: &mut [f64], lens: &mut [f64]) {
    let raw_stats = Stats::of(raw);
    let lens_stats = Stats::of(lens);
    let ratio = lens_stats.median / raw_stats.median;
    for (op, s) in [(Op::Raw, &raw_stats), (Op::Lens, &lens_stats)] {
        if args.json {
            let mut line = json!({
                "backend": args.backend.name(), "ranks": n, "op": op.name(), "bytes": bytes,
                "iters": s.count, "median_us": round2(s.median), "p99_us": round2(s.p99),
            });
            if op == Op::Lens {
                line["ratio_vs_raw"] = json!(round2(ratio));
            }
            println!("{line}");
        } else {
            let r = if op == Op::Lens {
                format!("{ratio:.2}x")
            } else {
                String::new()
            };
            println!(
                "{n:>6} {:>5} {:>10.2} {:>10.2} {r:>9}",
                op.name(),
                s.median,
                s.p99
            );
        }
    }
}

/// Round times in µs from every rank's completion instants: from the moment the last rank
/// finished round `i - 1` to the moment the last rank finished round `i`, after `warmup`.
pub fn samples_from_ends(all: &[Vec<Instant>], warmup: usize) -> Vec<f64> {
    let last_done = |i: usize| all.iter().filter_map(|e| e.get(i)).max().copied();
    let rounds = all.iter().map(Vec::len).min().unwrap_or(0);
    (warmup.max(1)..rounds)
        .filter_map(|i| {
            Some(
                last_done(i)?
                    .saturating_duration_since(last_done(i - 1)?)
                    .as_secs_f64()
                    * 1e6,
            )
        })
        .collect()
}

pub fn print_header() {
    println!(
        "{:>6} {:>5} {:>10} {:>10} {:>9}",
        "ranks", "op", "median_us", "p99_us", "lens/raw"
    );
}

pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

pub struct Stats {
    pub count: usize,
    pub median: f64,
    pub p99: f64,
}

impl Stats {
    pub fn of(samples: &mut [f64]) -> Stats {
        samples.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
            samples.get(i).copied().unwrap_or(f64::NAN)
        };
        Stats {
            count: samples.len(),
            median: at(0.5),
            p99: at(0.99),
        }
    }
}

/// Runs `WARMUP + iters` rounds of `op` on every rank; returns `iters` round times in µs.
async fn measure(
    ranks: &[Arc<LocalBroadcaster>],
    op: Op,
    iters: usize,
    bytes: &[u8],
    cx: &Context,
) -> Result<Vec<f64>, String> {
    let rounds = WARMUP + iters;
    let tasks: Vec<_> = ranks
        .iter()
        .map(|b| {
            let b = Arc::clone(b);
            let bytes = bytes.to_vec();
            let cx = if b.rank() == 0 {
                cx.clone()
            } else {
                Context::new()
            };
            tokio::spawn(async move {
                let mut ends = Vec::with_capacity(rounds);
                for _ in 0..rounds {
                    match op {
                        Op::Raw => {
                            let payload = (b.rank() == 0).then_some(bytes.as_slice());
                            std::hint::black_box(b.broadcast(0, payload).await?);
                        }
                        Op::Lens => {
                            std::hint::black_box(broadcast_context(&*b, 0, &cx).await?);
                        }
                    }
                    ends.push(Instant::now());
                }
                Ok::<_, lens::Error>(ends)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(tasks.len());
    for t in tasks {
        let ends = t
            .await
            .map_err(|e| format!("a rank's task failed: {e}"))?
            .map_err(|e| format!("broadcast failed: {e}"))?;
        all.push(ends);
    }
    Ok(samples_from_ends(&all, WARMUP))
}

/// `lens bench --backend nccl`: every local GPU, one rank each.
#[cfg(feature = "nccl")]
fn nccl(args: &BenchArgs) -> Result<(), String> {
    let figures =
        lens::nccl::bench::run(args.iters.max(1), &source_context()).map_err(|e| e.to_string())?;
    let mut samples: Vec<Vec<f64>> = figures.iter().map(|f| f.samples_us.clone()).collect();
    let (n, bytes) = figures.first().map_or((0, 0), |f| (f.ranks, f.bytes));
    if !args.json {
        println!(
            "lens bench: backend nccl, {n} GPU(s), {bytes} carrier bytes, {} rounds per op (rank 0)",
            args.iters
        );
        print_header();
    }
    if let [raw, lens] = &mut samples[..] {
        print_pair(args, n, bytes, raw, lens);
    }
    Ok(())
}
