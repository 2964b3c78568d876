//! MPI, run under mpirun: one rank per process, the group is MPI_COMM_WORLD. Rank 0 gathers
//! the demo's spans and the bench's times over MPI and reports them.

use std::time::Duration;

use lens::mpi::{MpiBroadcaster, MpiBroadcasterBuilder, Transfer};
use lens::testkit::Faulty;

use super::{collective_faults, demo_clock};

use lens::{Broadcaster, Carrier};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use opentelemetry::Context;

use super::super::args::{BenchArgs, DemoArgs};
use super::super::backend::{Backend, BenchReport, DemoRun};
use super::super::export::{ExportRecord, OtlpChoice};
use super::super::measure::{BenchRank, Measured, Plan, Timed, run_rank};
use super::super::rank::{RankJob, run_one_rank};
use super::super::record::{
    Job, SpanRecord, clock_from_json, clock_json, kept_from_json, kept_json,
};

pub(crate) struct Mpi;

/// Ends this rank at once: a collective may be pending, so MPI cannot be finalised, and the
/// launcher stops the other ranks when one exits non-zero.
fn die(rank: i32, why: &str) -> ! {
    say_why(rank, why);
    std::process::exit(1)
}

/// The rank's last line on stderr, in one write: the ranks share mpirun's stderr, and a
/// line written in pieces interleaves with theirs.
fn say_why(rank: i32, why: &str) {
    use std::io::Write as _;
    let line = format!("lens: rank {rank}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Ends this rank after `linger`: the launcher stops every rank when one exits non-zero,
/// so a rank whose round failed gives the others the time to finish theirs (the roll call
/// after a timeout takes up to one more timeout) and to send their hang reports.
fn die_after(rank: i32, why: &str, linger: Duration) -> ! {
    say_why(rank, why);
    std::thread::sleep(linger);
    std::process::exit(1)
}

impl Backend for Mpi {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn demo(&self, args: &DemoArgs, timeout: Duration) -> Result<DemoRun, String> {
        if args.rank.is_some() {
            return Err("with --backend mpi the rank comes from mpirun".into());
        }
        let universe = mpi::initialize().ok_or("MPI was already initialised")?;
        let world = universe.world();
        let (rank, size) = (world.rank(), world.size());
        let me = usize::try_from(rank).unwrap_or_default();
        let n = usize::try_from(size).unwrap_or(1);
        // An absent rank builds the group, then takes part in no step: the others time out
        // and the roll call that follows names it on every rank.
        let (faults, absent) = collective_faults(&args.inject, n, Some(me), None)?;
        // Every round gathers the ranks' arrival times, so each step names its straggler;
        // offsets measured first, so ranks on hosts whose clocks differ compare.
        let group = MpiBroadcaster::builder(world.duplicate())
            .timeout(timeout)
            .arrivals_every(1)
            .build()
            .map_err(|e| e.to_string())?;
        let clock = demo_clock(&group)?;
        if let Some(c) = clock {
            group.set_clock_offset(c);
        }
        let group = Faulty::new(group, faults);
        let otlp = OtlpChoice::from_args(args)?;
        let job = RankJob::of(args, me, n, otlp.as_ref(), clock, absent)?;
        let run = run_one_rank(&group, &job)?;
        if let Err(e) = run.outcome {
            if absent {
                // Away until the others have failed and the launcher stops the job.
                die_after(rank, &e, timeout * args.steps.saturating_add(3));
            }
            die_after(rank, &e, timeout);
        }
        let mine = run.spans;
        // Rank 0 collects every rank's spans (and export report) to check and draw the job.
        let bytes = serde_json::to_vec(&serde_json::json!({
            "spans": mine.iter().map(SpanRecord::to_json).collect::<Vec<_>>(),
            "clock": run.clock.as_ref().map(clock_json),
            "otlp": run.export.as_ref().map(ExportRecord::to_json),
            "kept": run.kept.as_ref().map(|k| kept_json(k)),
        }))
        .map_err(|e| e.to_string())?;
        if rank != 0 {
            world.process_at_rank(0).send(&bytes[..]);
            return Ok(DemoRun::Reported);
        }
        let mut job = Job::default();
        job.ranks.push(mine);
        job.clocks.push(run.clock);
        job.exports.extend(run.export);
        job.kept.push(run.kept);
        for r in 1..size {
            let (theirs, _) = world.process_at_rank(r).receive_vec::<u8>();
            let report: serde_json::Value =
                serde_json::from_slice(&theirs).map_err(|e| format!("rank {r}'s spans: {e}"))?;
            let list = report
                .get("spans")
                .and_then(|s| s.as_array())
                .cloned()
                .unwrap_or_default();
            job.ranks
                .push(list.iter().filter_map(SpanRecord::from_json).collect());
            job.clocks
                .push(report.get("clock").and_then(clock_from_json));
            job.exports
                .extend(report.get("otlp").and_then(ExportRecord::from_json));
            job.kept.push(report.get("kept").and_then(kept_from_json));
        }
        Ok(DemoRun::Job(job))
    }

    /// `raw` is one `MPI_Bcast` of the bytes: the transport's floor. `two_collective` is
    /// NeMo Lens's broadcast done in Rust with lens's codec: the source injects and encodes
    /// the context, an int64 length goes in one `MPI_Bcast` and the bytes in a second, and
    /// every other rank decodes them; so beside `lens` only the collectives differ.
    fn baselines(&self) -> &'static [&'static str] {
        &["raw", "two_collective"]
    }

    fn bench(&self, args: &BenchArgs, plan: &Plan) -> Result<Option<BenchReport>, String> {
        if args.fan_out.is_some() {
            return Err("--fan-out applies to --backend tcp".into());
        }
        let universe = mpi::initialize().ok_or("MPI was already initialised")?;
        let world = universe.world();
        let mut me = MpiRank {
            group: MpiBroadcasterBuilder::from_env(world.duplicate())
                .build()
                .map_err(|e| e.to_string())?,
            world: &world,
        };
        let mine = match run_rank(
            &mut me,
            &mut || {
                world.barrier();
                Ok(())
            },
            plan,
        ) {
            Ok(t) => t,
            Err(e) => die(world.rank(), &e),
        };
        // The slowest rank's time of each round, on rank 0.
        let root = world.process_at_rank(0);
        let max = mpi::collective::SystemOperation::max();
        let mut slowest = Vec::with_capacity(mine.times.len());
        for op_times in &mine.times {
            if world.rank() == 0 {
                let mut out = vec![0.0f64; op_times.len()];
                root.reduce_into_root(&op_times[..], &mut out[..], max);
                slowest.push(out);
            } else {
                root.reduce_into(&op_times[..], max);
            }
        }
        if world.rank() != 0 {
            return Ok(None);
        }
        let n = usize::try_from(world.size()).unwrap_or(0);
        Ok(Some(BenchReport {
            setting: format!(
                "MPI_COMM_WORLD under mpirun, one process per rank; lens's rounds: {}{}",
                way(me.group.transfer()),
                measured(me.group.transfer_measured()),
            ),
            groups: vec![Measured::new(
                n,
                self.baselines(),
                Timed {
                    times: slowest,
                    cpu_us: mine.cpu_us,
                },
            )],
        }))
    }
}

struct MpiRank<'a> {
    group: MpiBroadcaster,
    world: &'a SimpleCommunicator,
}

impl BenchRank for MpiRank<'_> {
    fn group(&self) -> &dyn Broadcaster {
        &self.group
    }

    fn baseline(&mut self, i: usize, carrier: &[u8], cx: &Context) -> Result<(), String> {
        let rank = self.world.rank();
        let root = self.world.process_at_rank(0);
        if i == 1 {
            let mut buf = if rank == 0 {
                Carrier::from_context(cx).encode()
            } else {
                Vec::new()
            };
            let mut len = buf.len() as i64;
            root.broadcast_into(&mut len);
            buf.resize(usize::try_from(len).unwrap_or(0), 0);
            root.broadcast_into(&mut buf[..]);
            if rank != 0 {
                let got = Carrier::decode(&buf).map_err(|e| format!("two_collective: {e}"))?;
                std::hint::black_box(got.has_span_context());
            }
        } else {
            let mut buf = if rank == 0 {
                carrier.to_vec()
            } else {
                vec![0u8; carrier.len()]
            };
            root.broadcast_into(&mut buf[..]);
            std::hint::black_box(&buf);
        }
        Ok(())
    }
}

/// How lens's rounds move the slab, in words.
fn way(t: Transfer) -> &'static str {
    match t {
        Transfer::Direct => "direct sends from the root",
        Transfer::Persistent => "a persistent broadcast",
        Transfer::Ibcast => "MPI_Ibcast",
        _ => "another way",
    }
}

/// What each way cost when the broadcaster measured them, where it did.
fn measured(m: &[(Transfer, Duration)]) -> String {
    if m.is_empty() {
        return " (as configured)".into();
    }
    let each: Vec<String> = m
        .iter()
        .map(|(t, d)| format!("{} {:.1} µs", way(*t), d.as_secs_f64() * 1e6))
        .collect();
    format!(", chosen by measurement at build ({})", each.join(", "))
}
