//! What one rank of the demo does, whatever carries its broadcasts: the pipeline of
//! [`rank_main`] and, for a rank in its own process, its tracer and span capture.

use std::time::Duration;

use lens::sample::{SampleRules, StepSampler};
use lens::{Broadcaster, ClockOffset, LinkedSpan, Parent, broadcast_context};
use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{
    InMemorySpanExporter, SdkTracer, SdkTracerProvider, SimpleSpanProcessor,
};

use super::args::{DemoArgs, ParentArg};
use super::backends::{StepDelays, step_delays};
use super::export::{ExportRecord, OtlpChoice, job_info};
use super::record::{Decided, SpanRecord};

/// The span rank 0 opens for each step.
pub(crate) const STEP_SPAN: &str = "train_step";
/// The later stages' span.
pub(crate) const STAGE_SPAN: &str = "pp.recv_forward.linked";
/// Step attribute.
pub(crate) const STEP_KEY: &str = "nv.dl.step";

pub(crate) fn parent_of(arg: ParentArg) -> Parent {
    match arg {
        ParentArg::Current => Parent::Current,
        ParentArg::Remote => Parent::Remote,
    }
}

/// Each stage waits for the one before it. Timer resolution is about 1 ms, so a slot is at
/// least that; a step of many ranks takes about `ranks` ms.
pub(crate) fn slot_for(ranks: usize) -> Duration {
    Duration::from_micros((40_000 / ranks.max(1) as u64).clamp(1_000, 4_000))
}

/// `--sample`'s rules, checked.
pub(crate) fn sample_rules(args: &DemoArgs) -> Result<Option<SampleRules>, String> {
    let Some(text) = &args.sample else {
        return Ok(None);
    };
    let rules = SampleRules::parse(text).map_err(|e| format!("--sample {text:?}: {e}"))?;
    if rules.is_off() {
        return Err(format!("--sample {text:?}: no rule keeps any step"));
    }
    Ok(Some(rules))
}

/// One rank of the pipeline: rank 0 opens each step and broadcasts it; the later stages
/// open linked spans once the activations would reach them. A rank with `delays` sleeps
/// inside those steps (after the broadcast).
pub(crate) async fn rank_main(
    b: &dyn Broadcaster,
    tracer: &SdkTracer,
    steps: usize,
    parent: Parent,
    slot: Duration,
    delays: &StepDelays,
) -> lens::Result<()> {
    let r = b.rank();
    for step in 0..steps {
        let late = delays.in_step(step);
        let step_attr = KeyValue::new(STEP_KEY, step as i64);
        if r == 0 {
            let span = tracer
                .span_builder(STEP_SPAN)
                .with_attributes([step_attr])
                .start(tracer);
            let cx = Context::new().with_span(span);
            broadcast_context(b, 0, &cx).await?;
            // The step lasts until the last stage is done.
            tokio::time::sleep(slot * b.world_size() as u32 + late).await;
            cx.span().end();
        } else {
            let remote = broadcast_context(b, 0, &Context::new()).await?;
            // Activations reach stage r after the r stages before it.
            tokio::time::sleep(slot * r as u32).await;
            let mut span = LinkedSpan::builder(STAGE_SPAN)
                .remote(&remote)
                .parent(parent)
                .kind(SpanKind::Consumer)
                .attributes([step_attr, KeyValue::new("pp.stage", r as i64)])
                .start_with_context(tracer, &Context::new());
            tokio::time::sleep(slot + late).await;
            span.end();
        }
    }
    Ok(())
}

/// What one rank of a multi-process job gives back: its outcome, its finished spans (on
/// rank 0's clock where the offset was measured), its clock, with `--otlp` what became of
/// its exported spans, and with `--sample` the steps its sampler decided.
#[cfg_attr(not(any(feature = "tcp", feature = "mpi")), allow(dead_code))]
pub(crate) struct RankRun {
    /// The steps' result, or why the rank took no part (`--inject absent:R`).
    pub(crate) outcome: Result<(), String>,
    pub(crate) spans: Vec<SpanRecord>,
    pub(crate) clock: Option<ClockOffset>,
    pub(crate) export: Option<ExportRecord>,
    pub(crate) kept: Option<Vec<Decided>>,
}

/// The demo's steps as a rank's sampler decided them. Each demo step is one broadcast, the
/// sampler's step `s` being the demo's `s - 1`.
pub(crate) fn decided(sampler: &StepSampler) -> Vec<Decided> {
    sampler
        .decisions()
        .into_iter()
        .map(|(s, keep)| (s as i64 - 1, keep.map(|r| r.as_str().to_owned())))
        .collect()
}

/// What one rank process is asked to do.
#[cfg_attr(not(any(feature = "tcp", feature = "mpi")), allow(dead_code))]
pub(crate) struct RankJob<'a> {
    pub(crate) steps: usize,
    pub(crate) parent: ParentArg,
    pub(crate) otlp: Option<&'a OtlpChoice>,
    /// This rank's clock offset from rank 0.
    pub(crate) clock: Option<ClockOffset>,
    /// It sets up as the others do (the job id, its provider) and then takes part in no
    /// step, so the others' steps fail naming it.
    pub(crate) absent: bool,
    pub(crate) delays: StepDelays,
    pub(crate) sample: Option<SampleRules>,
}

impl<'a> RankJob<'a> {
    /// Rank `rank` of `n` as the command line asks.
    #[cfg_attr(not(any(feature = "tcp", feature = "mpi")), allow(dead_code))]
    pub(crate) fn of(
        args: &DemoArgs,
        rank: usize,
        n: usize,
        otlp: Option<&'a OtlpChoice>,
        clock: Option<ClockOffset>,
        absent: bool,
    ) -> Result<Self, String> {
        Ok(RankJob {
            steps: args.steps as usize,
            parent: args.parent,
            otlp,
            clock,
            absent,
            delays: step_delays(&args.inject, n, rank)?,
            sample: sample_rules(args)?,
        })
    }
}

/// This process's rank of a multi-process job: runs [`rank_main`] over `b` with its own
/// tracer provider (exporting over OTLP with `otlp`, through a step sampler with
/// `sample`). With this rank's `clock` offset from rank 0, what it exports is on rank 0's
/// clock (its resource names the offset), and so are the spans it gives back.
#[cfg_attr(not(any(feature = "tcp", feature = "mpi")), allow(dead_code))]
pub(crate) fn run_one_rank(b: &dyn Broadcaster, job: &RankJob<'_>) -> Result<RankRun, String> {
    let exporter = InMemorySpanExporter::default();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let (provider, guard, sampler) = match job.otlp {
        Some(choice) => {
            let info = rt.block_on(job_info(b)).map_err(|e| e.to_string())?;
            let guard = choice
                .guard(info, exporter.clone(), job.clock, job.sample.as_ref())
                .map_err(|e| format!("--otlp: {e}"))?;
            let sampler = guard.sampler().cloned();
            (guard.provider().clone(), Some(guard), sampler)
        }
        None => {
            let info = lens::RankInfo::of_group(b);
            let mut builder = SdkTracerProvider::builder()
                .with_span_processor(lens::hang::OpenSpans)
                .with_simple_exporter(exporter.clone())
                .with_resource(info.resource());
            // Without an export the sampler still decides; what it keeps goes nowhere.
            let sampler = job.sample.clone().map(|rules| {
                StepSampler::new(
                    rules,
                    SimpleSpanProcessor::new(InMemorySpanExporter::default()),
                )
            });
            if let Some(s) = &sampler {
                builder = builder.with_span_processor(s.processor());
            }
            (builder.build(), None, sampler)
        }
    };
    // This process is one rank: a round that times out reports (`lens.hang`) through the
    // global provider, which is this rank's.
    match &guard {
        Some(g) => g.set_global(),
        None => opentelemetry::global::set_tracer_provider(provider.clone()),
    }
    let tracer = provider.tracer("lens-demo");
    let outcome = if job.absent {
        Err(format!("absent (--inject absent:{})", b.rank()))
    } else {
        let sampled = sampler.as_ref().map(|s| s.group(b));
        let group: &dyn Broadcaster = match &sampled {
            Some(g) => g,
            None => b,
        };
        let done = rt.block_on(rank_main(
            group,
            &tracer,
            job.steps,
            parent_of(job.parent),
            slot_for(b.world_size()),
            &job.delays,
        ));
        // The end of the steps: what the sampler still holds is kept.
        drop(sampled);
        done.map_err(|e| e.to_string())
    };
    let _ = provider.force_flush();
    let shift_ns = job.clock.map_or(0, |c| c.offset_ns);
    let spans = exporter
        .get_finished_spans()
        .unwrap_or_default()
        .iter()
        .map(|s| SpanRecord::from_span(b.rank(), s, STEP_KEY).moved_back(shift_ns))
        .collect();
    Ok(RankRun {
        outcome,
        spans,
        clock: job.clock,
        export: guard.map(ExportRecord::finish),
        kept: sampler.as_ref().map(decided),
    })
}
