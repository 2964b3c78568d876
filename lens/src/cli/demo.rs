//! `lens demo`: a pipeline-parallel job on N in-process ranks.

use std::time::Duration;

use lens::testkit::{Cluster, ClusterBuilder, Corruption, Fault, RankCtx, Report};
use lens::{LinkedSpan, Parent, broadcast_context};
use opentelemetry::trace::{Span as _, SpanKind, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_sdk::trace::SpanData;

use super::{BackendArg, DemoArgs, ParentArg, view};

/// Span names the demo writes.
pub const STEP_SPAN: &str = "train_step";
/// The later stages' span.
pub const STAGE_SPAN: &str = "pp.recv_forward.linked";
/// Step attribute.
pub const STEP_KEY: &str = "nv.dl.step";

pub fn run(args: &DemoArgs) -> Result<(), String> {
    match args.backend {
        BackendArg::Local => {}
    }
    let n = args.ranks as usize;
    let steps = args.steps as usize;
    let timeout = Duration::try_from_secs_f64(args.timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            format!(
                "--timeout {} is not a positive number of seconds",
                args.timeout
            )
        })?;
    let mut builder = Cluster::builder(n).timeout(timeout);
    for spec in &args.inject {
        builder = inject(builder, spec, n)?;
    }
    let parent = match args.parent {
        ParentArg::Current => Parent::Current,
        ParentArg::Remote => Parent::Remote,
    };
    // Each stage waits for the one before it. Timer resolution is about 1 ms, so a slot is
    // at least that; a step of many ranks takes about `ranks` ms.
    let slot = Duration::from_micros((40_000 / n as u64).clamp(1_000, 4_000));
    let report = builder
        .build()
        .run_blocking(move |rank| rank_main(rank, steps, parent, slot))
        .map_err(|e| format!("could not run the ranks: {e}"))?;

    if !args.quiet {
        print!("{}", view::waterfall(&report, args.parent));
    }
    if let Some(path) = &args.out {
        let json = view::chrome_trace(&report);
        std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!(
            "wrote Chrome trace events to {} (open in https://ui.perfetto.dev or chrome://tracing)",
            path.display()
        );
    }
    let summary = verify(&report, steps, parent)?;
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

async fn rank_main(
    rank: RankCtx,
    steps: usize,
    parent: Parent,
    slot: Duration,
) -> lens::Result<()> {
    let r = rank.rank;
    for step in 0..steps {
        let step_attr = KeyValue::new(STEP_KEY, step as i64);
        if r == 0 {
            let span = rank
                .tracer
                .span_builder(STEP_SPAN)
                .with_attributes([step_attr])
                .start(&rank.tracer);
            let cx = Context::new().with_span(span);
            broadcast_context(&*rank.broadcaster, 0, &cx).await?;
            // The step lasts until the last stage is done.
            tokio::time::sleep(slot * rank.world_size as u32).await;
            cx.span().end();
        } else {
            let remote = broadcast_context(&*rank.broadcaster, 0, &Context::new()).await?;
            // Activations reach stage r after the r stages before it.
            tokio::time::sleep(slot * r as u32).await;
            let mut span = LinkedSpan::builder(STAGE_SPAN)
                .remote(&remote)
                .parent(parent)
                .kind(SpanKind::Consumer)
                .attributes([step_attr, KeyValue::new("pp.stage", r as i64)])
                .start_with_context(&rank.tracer, &Context::new());
            tokio::time::sleep(slot).await;
            span.end();
        }
    }
    Ok(())
}

pub fn step_of(span: &SpanData) -> Option<i64> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == STEP_KEY)
        .and_then(|kv| match kv.value {
            Value::I64(v) => Some(v),
            _ => None,
        })
}

/// Checks the correlation the demo promises; returns a one-line summary or a one-line reason.
fn verify(report: &Report<()>, steps: usize, parent: Parent) -> Result<String, String> {
    let mut errors = report.errors();
    let absent: Vec<usize> = report
        .ranks
        .iter()
        .filter(|r| r.outcome.is_none())
        .map(|r| r.rank)
        .collect();
    if !errors.is_empty() || !absent.is_empty() {
        // Root causes first: a timeout is usually the echo of another rank's failure.
        errors.sort_by_key(|(rank, e)| (e.is_timeout(), *rank));
        let mut parts: Vec<String> = errors
            .iter()
            .take(3)
            .map(|(rank, e)| format!("rank {rank}: {e}"))
            .collect();
        if errors.len() > 3 {
            parts.push(format!("{} more", errors.len() - 3));
        }
        if !absent.is_empty() {
            parts.push(format!("never joined: {absent:?}"));
        }
        return Err(format!("job failed: {}", parts.join("; ")));
    }
    let n = report.ranks.len();
    let roots = report.named(0, STEP_SPAN);
    if roots.len() != steps {
        return Err(format!(
            "rank 0 recorded {} {STEP_SPAN} spans, expected {steps}",
            roots.len()
        ));
    }
    let mut links = 0;
    for rank in 1..n {
        report
            .check_links(rank, STAGE_SPAN, 0, STEP_SPAN)
            .map_err(|e| e.to_string())?;
        let spans = report.named(rank, STAGE_SPAN);
        if spans.len() != steps {
            return Err(format!(
                "rank {rank} recorded {} {STAGE_SPAN} spans, expected {steps}",
                spans.len()
            ));
        }
        for span in spans {
            let step = step_of(span);
            let root = roots
                .iter()
                .find(|s| step_of(s) == step)
                .ok_or_else(|| format!("rank {rank}: no {STEP_SPAN} for step {step:?}"))?;
            let linked = span
                .links
                .iter()
                .any(|l| l.span_context.span_id() == root.span_context.span_id());
            if !linked {
                return Err(format!(
                    "rank {rank}, step {step:?}: linked to another step's {STEP_SPAN}"
                ));
            }
            if parent == Parent::Remote
                && (span.span_context.trace_id() != root.span_context.trace_id()
                    || span.parent_span_id != root.span_context.span_id())
            {
                return Err(format!(
                    "rank {rank}, step {step:?}: not a child of rank 0's {STEP_SPAN}"
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
