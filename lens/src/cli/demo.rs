//! `lens demo`: a pipeline-parallel job, on N in-process ranks or N processes over TCP.

use std::time::Duration;

use lens::testkit::{Cluster, ClusterBuilder, Corruption, Fault};
use lens::{Broadcaster, LinkedSpan, Parent, broadcast_context};
use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::SdkTracer;

use super::record::{Job, SpanRecord};
use super::{BackendArg, DemoArgs, ParentArg, view};

/// Span names the demo writes.
pub const STEP_SPAN: &str = "train_step";
/// The later stages' span.
pub const STAGE_SPAN: &str = "pp.recv_forward.linked";
/// Step attribute.
pub const STEP_KEY: &str = "nv.dl.step";

/// A deadline given in seconds on the command line: positive and at most
/// [`lens::MAX_TIMEOUT`] (a larger one would overflow the clock).
pub fn secs_arg(name: &str, secs: f64) -> Result<Duration, String> {
    let d = Duration::try_from_secs_f64(secs)
        .map_err(|_| format!("{name} {secs} is not a positive number of seconds"))?;
    lens::check_timeout(name, d).map_err(|e| e.to_string())
}

pub fn run(args: &DemoArgs) -> Result<(), String> {
    let timeout = secs_arg("--timeout", args.timeout)?;
    match (args.backend, args.rank) {
        (BackendArg::Local, None) => run_local(args, timeout),
        (BackendArg::Local, Some(_)) => {
            Err("--rank runs one rank of a multi-process job: add --backend tcp (or nccl)".into())
        }
        #[cfg(feature = "tcp")]
        (BackendArg::Tcp, rank) => super::tcp::demo(args, rank, timeout),
        #[cfg(feature = "mpi")]
        (BackendArg::Mpi, None) => super::mpi::demo(args, timeout),
        #[cfg(feature = "mpi")]
        (BackendArg::Mpi, Some(_)) => Err("with --backend mpi the rank comes from mpirun".into()),
        #[cfg(all(feature = "nccl", feature = "tcp"))]
        (BackendArg::Nccl, rank) => super::tcp::demo(args, rank, timeout),
        #[cfg(all(feature = "nccl", not(feature = "tcp")))]
        (BackendArg::Nccl, _) => Err(
            "the nccl demo bootstraps its ranks over TCP: build lens with the tcp and nccl features"
                .into(),
        ),
    }
}

pub fn parent_of(arg: ParentArg) -> Parent {
    match arg {
        ParentArg::Current => Parent::Current,
        ParentArg::Remote => Parent::Remote,
    }
}

/// Each stage waits for the one before it. Timer resolution is about 1 ms, so a slot is at
/// least that; a step of many ranks takes about `ranks` ms.
pub fn slot_for(ranks: usize) -> Duration {
    Duration::from_micros((40_000 / ranks.max(1) as u64).clamp(1_000, 4_000))
}

fn run_local(args: &DemoArgs, timeout: Duration) -> Result<(), String> {
    let n = args.ranks as usize;
    let steps = args.steps as usize;
    let mut builder = Cluster::builder(n).timeout(timeout);
    for spec in &args.inject {
        builder = inject(builder, spec, n)?;
    }
    let parent = parent_of(args.parent);
    let slot = slot_for(n);
    let report = builder
        .build()
        .run_blocking(move |rank| async move {
            rank_main(&*rank.broadcaster, &rank.tracer, steps, parent, slot).await
        })
        .map_err(|e| format!("could not run the ranks: {e}"))?;
    let mut job = Job::default();
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
    finish(&job, args, "local", steps)
}

/// Prints the view, writes `--out`, checks correlation; `Err` is the one-line reason.
pub fn finish(job: &Job, args: &DemoArgs, backend: &str, steps: usize) -> Result<(), String> {
    if !args.quiet {
        print!("{}", view::waterfall(job, args.parent, backend));
    }
    if let Some(path) = &args.out {
        std::fs::write(path, view::chrome_trace(job))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!(
            "wrote Chrome trace events to {} (open in https://ui.perfetto.dev or chrome://tracing)",
            path.display()
        );
    }
    let summary = verify(job, steps, parent_of(args.parent))?;
    println!("{summary}");
    Ok(())
}

fn inject(builder: ClusterBuilder, spec: &str, n: usize) -> Result<ClusterBuilder, String> {
    let parts: Vec<&str> = spec.split(':').collect();
    let rank = |s: &str| -> Result<usize, String> {
        s.parse::<usize>()
            .ok()
            .filter(|r| *r < n)
            .ok_or_else(|| format!("--inject {spec:?}: {s:?} is not a rank below {n}"))
    };
    match parts.as_slice() {
        ["absent", r] => Ok(builder.absent(rank(r)?)),
        ["corrupt", r] => Ok(builder.fault(rank(r)?, Fault::Corrupt(Corruption::Truncate))),
        ["delay", r, ms] => {
            let ms: u64 = ms
                .parse()
                .map_err(|_| format!("--inject {spec:?}: {ms:?} is not milliseconds"))?;
            Ok(builder.fault(rank(r)?, Fault::Delay(Duration::from_millis(ms))))
        }
        _ => Err(format!(
            "--inject {spec:?}: expected absent:R, corrupt:R or delay:R:MS"
        )),
    }
}

/// One rank of the pipeline: rank 0 opens each step and broadcasts it; the later stages
/// open linked spans once the activations would reach them.
pub async fn rank_main(
    b: &dyn Broadcaster,
    tracer: &SdkTracer,
    steps: usize,
    parent: Parent,
    slot: Duration,
) -> lens::Result<()> {
    let r = b.rank();
    for step in 0..steps {
        let step_attr = KeyValue::new(STEP_KEY, step as i64);
        if r == 0 {
            let span = tracer
                .span_builder(STEP_SPAN)
                .with_attributes([step_attr])
                .start(tracer);
            let cx = Context::new().with_span(span);
            broadcast_context(b, 0, &cx).await?;
            // The step lasts until the last stage is done.
            tokio::time::sleep(slot * b.world_size() as u32).await;
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
            tokio::time::sleep(slot).await;
            span.end();
        }
    }
    Ok(())
}

fn failure_line(job: &Job) -> Option<String> {
    if job.failures.is_empty() && job.absent.is_empty() {
        return None;
    }
    let mut errors: Vec<&(usize, String, bool)> = job.failures.iter().collect();
    // Root causes first: a timeout is usually the echo of another rank's failure.
    errors.sort_by_key(|(rank, _, timeout)| (*timeout, *rank));
    let mut parts: Vec<String> = errors
        .iter()
        .take(3)
        .map(|(rank, e, _)| format!("rank {rank}: {e}"))
        .collect();
    if errors.len() > 3 {
        parts.push(format!("{} more", errors.len() - 3));
    }
    if !job.absent.is_empty() {
        parts.push(format!("never joined: {:?}", job.absent));
    }
    Some(format!("job failed: {}", parts.join("; ")))
}

/// Checks the correlation the demo promises; returns a one-line summary or a one-line reason.
pub fn verify(job: &Job, steps: usize, parent: Parent) -> Result<String, String> {
    if let Some(line) = failure_line(job) {
        return Err(line);
    }
    let n = job.ranks.len();
    let roots = job.named(0, STEP_SPAN);
    if roots.len() != steps {
        return Err(format!(
            "rank 0 recorded {} {STEP_SPAN} spans, expected {steps}",
            roots.len()
        ));
    }
    let mut links = 0;
    for rank in 1..n {
        let spans = job.named(rank, STAGE_SPAN);
        if spans.len() != steps {
            return Err(format!(
                "rank {rank} recorded {} {STAGE_SPAN} spans, expected {steps}",
                spans.len()
            ));
        }
        for span in spans {
            let root = roots
                .iter()
                .find(|s| s.step == span.step)
                .ok_or_else(|| format!("rank {rank}: no {STEP_SPAN} for step {:?}", span.step))?;
            let linked = span.links.iter().any(|l| {
                l.span_id == root.span_id && l.trace_id == root.trace_id && l.source_rank == Some(0)
            });
            if !linked {
                return Err(format!(
                    "rank {rank}, step {:?}: no link to rank 0's {STEP_SPAN} of that step",
                    span.step
                ));
            }
            if parent == Parent::Remote
                && (span.trace_id != root.trace_id || span.parent_span_id != root.span_id)
            {
                return Err(format!(
                    "rank {rank}, step {:?}: not a child of rank 0's {STEP_SPAN}",
                    span.step
                ));
            }
            links += 1;
        }
    }
    let shape = if parent == Parent::Remote {
        "each step is one trace across all ranks"
    } else {
        "each rank keeps its own parent"
    };
    Ok(format!(
        "ok: {n} rank(s), {steps} step(s), {links} cross-rank link(s) verified; {shape}"
    ))
}

/// Runs the demo as the one rank `b` of a multi-process job, with its own tracer provider,
/// and returns its outcome and its finished spans.
#[cfg(any(feature = "tcp", feature = "mpi"))]
pub fn run_one_rank(
    b: &dyn Broadcaster,
    args: &DemoArgs,
) -> Result<(lens::Result<()>, Vec<SpanRecord>), String> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};

    let exporter = InMemorySpanExporter::default();
    let info = lens::RankInfo::new(b.rank(), b.world_size()).map_err(|e| e.to_string())?;
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .with_resource(info.resource())
        .build();
    let tracer = provider.tracer("lens-demo");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let steps = args.steps as usize;
    let outcome = rt.block_on(rank_main(
        b,
        &tracer,
        steps,
        parent_of(args.parent),
        slot_for(b.world_size()),
    ));
    let _ = provider.force_flush();
    let spans = exporter
        .get_finished_spans()
        .unwrap_or_default()
        .iter()
        .map(|s| SpanRecord::from_span(b.rank(), s, STEP_KEY))
        .collect();
    Ok((outcome, spans))
}
