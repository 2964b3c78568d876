//! TCP: a demo job of N processes on 127.0.0.1 (or one rank of a real job with `--rank`),
//! and the bench against the same fan-out over bare sockets and over bare ZeroMQ. The NCCL backend
//! meets its ranks the same way (`nccl.rs`).

use std::time::Duration;

use lens::tcp::{TcpBroadcaster, TcpConfigBuilder};
use lens::testkit::{Corruption, Fault, Faulty};

use super::super::args::{BenchArgs, DemoArgs, ParentArg, secs_arg};
use super::super::backend::{Backend, BenchReport, DemoRun};
use super::super::export::OtlpChoice;
use super::super::hosts::Placement;
use super::super::launcher;
use super::super::measure::{Measured, Plan, on_threads};
use super::super::rank::{RankJob, run_one_rank};
use super::super::record::Job;
use super::job_key::{KeyFile, random_hex};
use super::tcp_raw::{self, TcpRank};
use super::{Injected, demo_clock};

/// Most ranks the bench runs, one thread (and two sockets) each.
const MAX_BENCH_RANKS: usize = 256;

pub(crate) struct Tcp;

impl Backend for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn baselines(&self) -> &'static [&'static str] {
        tcp_raw::BASELINES
    }

    fn demo(&self, args: &DemoArgs, timeout: Duration) -> Result<DemoRun, String> {
        match args.rank {
            Some(rank) => {
                let rank = rank as usize;
                let n = args.world.map_or(args.ranks as usize, |w| w as usize);
                let mine = args
                    .inject
                    .iter()
                    .map(|spec| Injected::parse(spec, n))
                    .collect::<Result<Vec<_>, _>>()?
                    .into_iter()
                    .filter(|f| f.rank() == rank)
                    .collect::<Vec<_>>();
                let group = join(args, rank, timeout)?;
                // Where this rank's clock stands against rank 0's, so that what it exports
                // and what the job's view shows are on rank 0's clock.
                let clock = demo_clock(&group)?;
                // It joins, and leaves before the first step: the others name it.
                let absent = mine.iter().any(|f| matches!(f, Injected::Absent(_)));
                let faults = mine
                    .iter()
                    .filter_map(|f| match *f {
                        Injected::Delay(_, d) => Some(Fault::Delay(d)),
                        Injected::Corrupt(_) => Some(Fault::Corrupt(Corruption::Truncate)),
                        // `rank_main` sleeps in those steps.
                        Injected::Absent(_) | Injected::DelayAt(..) => None,
                    })
                    .collect();
                let group = Faulty::new(group, faults);
                let otlp = OtlpChoice::from_args(args)?;
                let job = RankJob::of(args, rank, n, otlp.as_ref(), clock, absent)?;
                let run = run_one_rank(&group, &job)?;
                Ok(DemoRun::Rank { rank, run })
            }
            None => spawn_job(self.name(), args, timeout).map(DemoRun::Job),
        }
    }

    fn bench(&self, args: &BenchArgs, plan: &Plan) -> Result<Option<BenchReport>, String> {
        if let Some(rank) = args.spawned.rank {
            // A rank process that `--processes` started.
            super::tcp_procs::rank_main(args, plan, rank)?;
            return Ok(None);
        }
        if args.processes {
            if let Some(bad) = args.ranks.iter().find(|n| **n < 2) {
                return Err(format!("--ranks {bad}: a group has at least 2 ranks"));
            }
            return super::tcp_procs::bench(args, self.baselines()).map(Some);
        }
        if let Some(bad) = args.ranks.iter().find(|n| **n < 2 || **n > MAX_BENCH_RANKS) {
            return Err(format!(
                "--ranks {bad}: the tcp bench takes 2 to {MAX_BENCH_RANKS} ranks (more with --processes)"
            ));
        }
        let mut groups = Vec::new();
        for &n in &args.ranks {
            let lens = lens_group(n, args.fan_out)?;
            // The baselines in lens's layout: the same star, or the same tree.
            let k = args.fan_out.unwrap_or(n - 1);
            let raw = super::tcp_raw_sockets::in_process(n, k)?;
            let raw_zmq = tcp_raw::in_process(n, k)?;
            let ranks: Vec<TcpRank> = lens
                .into_iter()
                .zip(raw.into_iter().zip(raw_zmq))
                .map(|(lens, (raw, raw_zmq))| TcpRank { lens, raw, raw_zmq })
                .collect();
            groups.push(Measured::new(n, self.baselines(), on_threads(ranks, plan)?));
        }
        let shape = args
            .fan_out
            .map_or("lens and raw as a star".to_owned(), |k| {
                format!("lens and raw as a tree of fan-out {k}")
            });
        Ok(Some(BenchReport {
            setting: format!("loopback, one thread per rank, {shape}"),
            groups,
        }))
    }
}

/// This process's rank of a real (possibly multi-host) job: the environment as torchrun
/// sets it, with the command line on top.
pub(crate) fn join(
    args: &DemoArgs,
    rank: usize,
    timeout: Duration,
) -> Result<TcpBroadcaster, String> {
    let mut builder = TcpConfigBuilder::from_env().rank(rank).timeout(timeout);
    // With --rank, the launcher's rank variables may be absent while its LOCAL_RANK is not.
    if let Some(local) = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.trim().parse().ok())
    {
        builder = builder.local_rank(local);
    }
    if let Some(world) = args.world {
        builder = builder.world_size(world as usize);
    }
    if let Some(addr) = &args.addr {
        builder = builder.addr(addr.clone());
    }
    if let Some(secs) = args.join_timeout {
        builder = builder.join_timeout(secs_arg("--join-timeout", secs)?);
    }
    let config = builder.build().map_err(|e| format!("rank {rank}: {e}"))?;
    TcpBroadcaster::connect(config).map_err(|e| format!("rank {rank}: {e}"))
}

/// `--ranks N`: N processes of this program on 127.0.0.1, one rank each (rank r on GPU r
/// with nccl), meeting over TCP with a fresh job key.
pub(crate) fn spawn_job(backend: &str, args: &DemoArgs, timeout: Duration) -> Result<Job, String> {
    let n = args.ranks as usize;
    let steps = args.steps;
    if args.hosts.hosts.is_some() && backend != "tcp" {
        return Err(format!("--hosts applies to --backend tcp, not {backend}"));
    }
    let place = Placement::new(&args.hosts, n)?;
    let otlp = OtlpChoice::from_args(args)?;
    // The hosts' namespaces have no route out, by design: ranks on them export through a
    // relay on host 0 to the collector on this machine.
    let (otlp, relay) = match (&otlp, place.network()) {
        (Some(o), Some(net)) => {
            let (o, relay) = o.through_relay(net)?;
            (Some(o), Some(relay))
        }
        _ => (otlp, None),
    };
    let addr = place.rendezvous();
    let key = KeyFile::new(&random_hex(32)?)?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let parent = match args.parent {
        ParentArg::Current => "current",
        ParentArg::Remote => "remote",
    };
    let command = |rank: usize| {
        let mut c = place.command(rank, &exe);
        c.args(["demo", "--backend", backend, "--emit-spans", "--quiet"])
            .args(["--device", &rank.to_string()])
            .args(["--rank", &rank.to_string(), "--world", &n.to_string()])
            .args(["--addr", &addr])
            .args(["--steps", &steps.to_string(), "--parent", parent])
            .args(["--timeout", &args.timeout.to_string()])
            .args(
                args.inject
                    .iter()
                    .flat_map(|spec| ["--inject", spec.as_str()]),
            )
            .env(lens::tcp::env::KEY_FILE, &key.0)
            .env_remove(lens::tcp::env::KEY);
        c
    };
    let command = |rank: usize| {
        let mut c = command(rank);
        if let Some(o) = &otlp {
            o.forward(&mut c);
        }
        if let Some(rules) = &args.sample {
            c.args(["--sample", rules]);
        }
        c
    };
    // A bad --sample is refused here, not by every rank.
    super::super::rank::sample_rules(args)?;
    let deadline = Duration::from_secs(60) + timeout * (steps + 2);
    let mut job = launcher::run_ranks(n, command, deadline)?;
    if let (Some(relay), Some(endpoint)) = (&relay, &args.otlp) {
        // Said with the address the user gave: the relay's is the simulation's.
        let rest = endpoint.trim_start_matches("http://");
        let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
        let relayed = relay.addr().to_string();
        for e in &mut job.exports {
            if let Some(t) = &mut e.target {
                *t = t.replacen(&relayed, authority, 1) + " through host 0's relay";
            }
        }
    }
    Ok(job)
}

/// lens's group of `n` ranks on loopback, formed on one thread per rank.
fn lens_group(n: usize, fan_out: Option<usize>) -> Result<Vec<TcpBroadcaster>, String> {
    let key = random_hex(32)?;
    let group = lens::tcp::loopback_group(n, |b| {
        let b = b.key(&key).timeout(Duration::from_secs(30));
        match fan_out {
            Some(k) => b.fan_out(k),
            None => b,
        }
    })
    .map_err(|e| e.to_string())?;
    Ok(group.ranks)
}
