//! The in-process backend: N ranks in this process (`lens::testkit`), with faults on demand.

use std::time::Duration;

use super::{Injected, StepDelays, step_delays};
use lens::testkit::{Cluster, ClusterBuilder, Corruption, Fault, LocalBroadcaster, LocalCluster};
use lens::{Broadcaster, blocking};
use opentelemetry::Context;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use lens::sample::StepSampler;

use lens::otlp::OtlpGuard;
use opentelemetry_sdk::trace::{
    IdGenerator as _, InMemorySpanExporter, RandomIdGenerator, SdkTracerProvider,
    SimpleSpanProcessor,
};

use super::super::args::{BenchArgs, DemoArgs};
use super::super::backend::{Backend, BenchReport, DemoRun};
use super::super::export::{ExportRecord, OtlpChoice};
use super::super::measure::{BenchRank, Measured, Plan, on_threads};
use super::super::rank::{STEP_KEY, decided, parent_of, rank_main, sample_rules, slot_for};
use super::super::record::{Job, SpanRecord};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Most ranks the bench runs, one thread each.
const MAX_BENCH_RANKS: usize = 256;

pub(crate) struct Local;

impl Backend for Local {
    fn name(&self) -> &'static str {
        "local"
    }

    fn demo(&self, args: &DemoArgs, timeout: Duration) -> Result<DemoRun, String> {
        if args.rank.is_some() {
            return Err(
                "--rank runs one rank of a multi-process job: add --backend tcp (or nccl)".into(),
            );
        }
        let n = args.ranks as usize;
        let steps = args.steps as usize;
        // Routed globals: a rank's hang report (`lens.hang`, made through the global
        // tracer) lands with the rank's spans.
        let mut builder = Cluster::builder(n).timeout(timeout).route_globals();
        for spec in &args.inject {
            builder = inject(builder, spec, n)?;
        }
        let parent = parent_of(args.parent);
        let slot = slot_for(n);
        let delays: Arc<Vec<StepDelays>> = Arc::new(
            (0..n)
                .map(|r| step_delays(&args.inject, n, r))
                .collect::<Result<_, _>>()?,
        );
        let sample = sample_rules(args)?;
        // Each rank's step sampler, by rank, as its provider is made.
        let samplers: Arc<Mutex<HashMap<usize, StepSampler>>> = Arc::default();
        // With --otlp each rank's provider also exports; the guards are shut down (flushing
        // their spans) after the run.
        let unbuilt: Arc<Mutex<Vec<ExportRecord>>> = Arc::default();
        let open: Arc<Mutex<Vec<OtlpGuard>>> = Arc::default();
        if let Some(choice) = OtlpChoice::from_args(args)? {
            let job_id = format!("{:032x}", RandomIdGenerator::default().new_trace_id());
            let (failed, open) = (Arc::clone(&unbuilt), Arc::clone(&open));
            let (samplers, sample) = (Arc::clone(&samplers), sample.clone());
            builder = builder.tracer_provider(move |info, local| {
                let info = info.clone().with_job_id(job_id.clone());
                let rank = info.rank;
                // The ranks share this process's one clock: offset 0, exactly.
                let clock = lens::ClockOffset {
                    offset_ns: 0,
                    error_ns: 0,
                };
                match choice.guard(info.clone(), local.clone(), Some(clock), sample.as_ref()) {
                    Ok(g) => {
                        let provider = g.provider().clone();
                        if let Some(s) = g.sampler() {
                            lock(&samplers).insert(rank, s.clone());
                        }
                        lock(&open).push(g);
                        provider
                    }
                    Err(e) => {
                        lock(&failed).push(ExportRecord::failed(rank, format!("--otlp: {e}")));
                        SdkTracerProvider::builder()
                            .with_simple_exporter(local)
                            .with_resource(info.resource())
                            .build()
                    }
                }
            });
        } else if let Some(rules) = sample.clone() {
            // No export: the sampler still decides (the view marks its steps); what it
            // keeps goes nowhere.
            let samplers = Arc::clone(&samplers);
            builder = builder.tracer_provider(move |info, local| {
                let sampler = StepSampler::new(
                    rules.clone(),
                    SimpleSpanProcessor::new(InMemorySpanExporter::default()),
                );
                lock(&samplers).insert(info.rank, sampler.clone());
                SdkTracerProvider::builder()
                    .with_span_processor(lens::hang::OpenSpans)
                    .with_simple_exporter(local)
                    .with_span_processor(sampler.processor())
                    .with_resource(info.resource())
                    .build()
            });
        }
        let in_run = Arc::clone(&samplers);
        let report = builder
            .build()
            .run_blocking(move |rank| {
                let delays = Arc::clone(&delays);
                let sampler = lock(&in_run).get(&rank.rank).cloned();
                async move {
                    let mine = delays.get(rank.rank).cloned().unwrap_or_default();
                    let b: &dyn Broadcaster = &*rank.broadcaster;
                    match sampler {
                        Some(s) => {
                            // Dropped at the end of the steps: what it holds is kept.
                            let group = s.group(b);
                            rank_main(&group, &rank.tracer, steps, parent, slot, &mine).await
                        }
                        None => rank_main(b, &rank.tracer, steps, parent, slot, &mine).await,
                    }
                }
            })
            .map_err(|e| format!("could not run the ranks: {e}"))?;
        let mut job = Job {
            exports: std::mem::take(&mut *lock(&unbuilt)),
            ..Job::default()
        };
        job.exports.extend(
            std::mem::take(&mut *lock(&open))
                .into_iter()
                .map(ExportRecord::finish),
        );
        job.exports.sort_by_key(|e| e.rank);
        if sample.is_some() {
            let samplers = lock(&samplers);
            job.kept = (0..n).map(|r| samplers.get(&r).map(decided)).collect();
        }
        for r in &report.ranks {
            job.ranks.push(
                r.spans
                    .iter()
                    .map(|s| SpanRecord::from_span(r.rank, s, STEP_KEY))
                    .collect(),
            );
            match &r.outcome {
                None => job.absent.push(r.rank),
                Some(Err(e)) => job.failures.push((r.rank, e.to_string(), e.is_timeout())),
                Some(Ok(())) => {}
            }
        }
        Ok(DemoRun::Job(job))
    }

    fn bench(&self, args: &BenchArgs, plan: &Plan) -> Result<Option<BenchReport>, String> {
        if args.fan_out.is_some() {
            return Err("--fan-out applies to --backend tcp".into());
        }
        if let Some(bad) = args
            .ranks
            .iter()
            .find(|n| **n == 0 || **n > MAX_BENCH_RANKS)
        {
            return Err(format!(
                "--ranks {bad}: the local bench takes 1 to {MAX_BENCH_RANKS} ranks"
            ));
        }
        let mut groups = Vec::new();
        for &n in &args.ranks {
            let ranks: Vec<LocalRank> = LocalCluster::new(n)
                .timeout(Duration::from_secs(30))
                .broadcasters()
                .into_iter()
                .map(LocalRank)
                .collect();
            groups.push(Measured::new(n, self.baselines(), on_threads(ranks, plan)?));
        }
        Ok(Some(BenchReport {
            setting: "in-process channels, one thread per rank".into(),
            groups,
        }))
    }
}

/// A rank of the local bench: its raw baseline is the group's own broadcast of the bytes.
struct LocalRank(LocalBroadcaster);

impl BenchRank for LocalRank {
    fn group(&self) -> &dyn Broadcaster {
        &self.0
    }

    fn baseline(&mut self, _: usize, bytes: &[u8], _: &Context) -> Result<(), String> {
        let payload = (self.0.rank() == 0).then_some(bytes);
        let got = blocking::broadcast(&self.0, 0, payload).map_err(|e| format!("raw: {e}"))?;
        std::hint::black_box(got);
        Ok(())
    }
}

fn inject(builder: ClusterBuilder, spec: &str, n: usize) -> Result<ClusterBuilder, String> {
    Ok(match Injected::parse(spec, n)? {
        Injected::Absent(r) => builder.absent(r),
        Injected::Corrupt(r) => builder.fault(r, Fault::Corrupt(Corruption::Truncate)),
        Injected::Delay(r, d) => builder.fault(r, Fault::Delay(d)),
        // Not a fault of the transport: `rank_main` sleeps in those steps.
        Injected::DelayAt(..) => builder,
    })
}
