//! NCCL, one rank per GPU. The demo runs N processes on this machine (or one rank of a real
//! job with `--rank`) that meet over TCP, which then carries the NCCL id
//! (`NcclBroadcaster::bootstrap`); the bench uses every local GPU from one process.

use std::time::Duration;

use lens::Broadcaster;
use lens::nccl::{NcclBroadcaster, NcclOptions};
use opentelemetry::Context;

use super::super::args::{BenchArgs, DemoArgs};
use super::super::backend::{Backend, BenchReport, DemoRun};
use super::super::measure::{BenchRank, Measured, Plan, on_threads};

pub(crate) struct Nccl;

impl Backend for Nccl {
    fn name(&self) -> &'static str {
        "nccl"
    }

    #[cfg(feature = "tcp")]
    fn demo(&self, args: &DemoArgs, timeout: Duration) -> Result<DemoRun, String> {
        use super::super::rank::{RankJob, run_one_rank};
        use super::{demo_clock, tcp};
        use lens::testkit::Faulty;

        let n = args.world.map_or(args.ranks as usize, |w| w as usize);
        let (faults, _) = super::collective_faults(
            &args.inject,
            n,
            args.rank.map(|r| r as usize),
            Some(
                "a rank that misses an NCCL collective leaves the communicator stuck (NCCL cannot tell which rank is missing); stop a rank's process instead",
            ),
        )?;
        let Some(rank) = args.rank else {
            let found = lens::nccl::probe().map_err(|e| e.to_string())?;
            if args.ranks as usize > found.devices {
                return Err(format!(
                    "--ranks {} needs {} GPUs; this machine has {} (NCCL refuses two ranks on one GPU)",
                    args.ranks, args.ranks, found.devices
                ));
            }
            return tcp::spawn_job(self.name(), args, timeout).map(DemoRun::Job);
        };
        let rank = rank as usize;
        let group = tcp::join(args, rank, timeout)?;
        let device = match args.device {
            Some(d) => d as usize,
            None => lens::RankInfo::from_env()
                .ok()
                .and_then(|i| i.local_rank)
                .unwrap_or(0),
        };
        // Every round gathers the ranks' arrival times (one ncclAllGather of 8 bytes each),
        // so each step names its straggler; offsets measured first, on the GPUs' group.
        let opts = NcclOptions::default().timeout(timeout).arrivals_every(1);
        let gpu =
            futures::executor::block_on(NcclBroadcaster::bootstrap_with(&group, device, &opts))
                .map_err(|e| format!("rank {rank} (GPU {device}): {e}"))?;
        let clock = demo_clock(&gpu)?;
        if let Some(c) = clock {
            gpu.set_clock_offset(c);
        }
        let gpu = Faulty::new(gpu, faults);
        let otlp = super::super::export::OtlpChoice::from_args(args)?;
        let n = args.world.map_or(args.ranks as usize, |w| w as usize);
        let job = RankJob::of(args, rank, n, otlp.as_ref(), clock, false)?;
        let run = run_one_rank(&gpu, &job)?;
        Ok(DemoRun::Rank { rank, run })
    }

    #[cfg(not(feature = "tcp"))]
    fn demo(&self, _: &DemoArgs, _: Duration) -> Result<DemoRun, String> {
        Err(
            "the nccl demo bootstraps its ranks over TCP: build lens with the tcp and nccl features"
                .into(),
        )
    }

    fn bench(&self, args: &BenchArgs, plan: &Plan) -> Result<Option<BenchReport>, String> {
        if args.fan_out.is_some() {
            return Err("--fan-out applies to --backend tcp".into());
        }
        let ranks: Vec<NcclRank> = NcclBroadcaster::on_every_device(&NcclOptions::default())
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(NcclRank)
            .collect();
        let n = ranks.len();
        Ok(Some(BenchReport {
            setting: format!("every local GPU ({n}), one thread per GPU"),
            groups: vec![Measured::new(n, self.baselines(), on_threads(ranks, plan)?)],
        }))
    }
}

/// A rank of the NCCL bench: its raw baseline is one `ncclBroadcast` of the bytes (copy in,
/// broadcast, wait, copy out), with no lens framing.
struct NcclRank(NcclBroadcaster);

impl BenchRank for NcclRank {
    fn group(&self) -> &dyn Broadcaster {
        &self.0
    }

    fn baseline(&mut self, _: usize, bytes: &[u8], _: &Context) -> Result<(), String> {
        let payload = (self.0.rank() == 0).then_some(bytes);
        let got = self
            .0
            .raw_broadcast(0, payload, bytes.len())
            .map_err(|e| format!("raw: {e}"))?;
        std::hint::black_box(got);
        Ok(())
    }
}
