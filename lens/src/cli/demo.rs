//! `lens demo`: runs a pipeline-parallel job on a backend, then shows and checks its trace.
//! It knows no backend: each one forms its group and runs its ranks (`backends/`).

use std::collections::BTreeMap;

use lens::Parent;

use super::args::{DemoArgs, secs_arg};
use super::backend::{Backend, DemoRun};
use super::export::{self, OTLP_LINE};
use super::rank::{STAGE_SPAN, STEP_SPAN, parent_of};
use super::record::{CLOCK_LINE, Job, KEPT_LINE, SPAN_LINE, SpanRecord, clock_json, kept_json};
use super::trace_svg;
use super::view;

pub(crate) fn run(backend: &dyn Backend, args: &DemoArgs) -> Result<(), String> {
    let timeout = secs_arg("--timeout", args.timeout)?;
    let steps = args.steps as usize;
    if args.hosts.hosts.is_some() && backend.name() != "tcp" {
        return Err(format!(
            "--hosts applies to --backend tcp, not {}",
            backend.name()
        ));
    }
    match backend.demo(args, timeout)? {
        DemoRun::Job(job) => finish(&job, args, backend.name(), steps),
        DemoRun::Rank { rank, run } => {
            if args.emit_spans {
                // For the launcher that started this rank (`launcher.rs`).
                if let Some(clock) = &run.clock {
                    println!("{CLOCK_LINE}{}", clock_json(clock));
                }
                for s in &run.spans {
                    println!("{SPAN_LINE}{}", s.to_json());
                }
                if let Some(e) = &run.export {
                    println!("{OTLP_LINE}{}", e.to_json());
                }
                if let Some(k) = &run.kept {
                    println!("{KEPT_LINE}{}", kept_json(k));
                }
            }
            run.outcome.map_err(|e| format!("rank {rank}: {e}"))?;
            if !args.emit_spans {
                println!(
                    "{}",
                    verify_rank(rank, &run.spans, steps, parent_of(args.parent))?
                );
                if let Some(e) = &run.export {
                    println!("{}", export::rank_summary(e)?);
                }
            }
            Ok(())
        }
        DemoRun::Reported => Ok(()),
    }
}

/// Prints the view, writes `--out`, checks correlation; `Err` is the one-line reason.
fn finish(job: &Job, args: &DemoArgs, backend: &str, steps: usize) -> Result<(), String> {
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
    if let Some(path) = &args.svg {
        std::fs::write(path, trace_svg::trace_svg(job))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote a picture of the trace to {}", path.display());
    }
    let summary = verify(job, steps, parent_of(args.parent))?;
    println!("{summary}");
    if args.otlp.is_some() {
        println!("{}", export::summary(&job.exports, job.ranks.len())?);
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
fn verify(job: &Job, steps: usize, parent: Parent) -> Result<String, String> {
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
    let sampled = verify_sampling(job)?.map_or(String::new(), |s| format!("; {s}"));
    Ok(format!(
        "ok: {n} rank(s), {steps} step(s), {links} cross-rank link(s) verified; {shape}{sampled}"
    ))
}

/// With `--sample`: every rank kept the same steps. A summary of what was kept and why, or
/// the first rank that disagrees with rank 0.
fn verify_sampling(job: &Job) -> Result<Option<String>, String> {
    let Some(Some(zero)) = job.kept.first() else {
        return Ok(None);
    };
    let kept_by_0: BTreeMap<i64, bool> = zero.iter().map(|(s, r)| (*s, r.is_some())).collect();
    for (rank, kept) in job.kept.iter().enumerate().skip(1) {
        let Some(kept) = kept else {
            return Err(format!("sampling: rank {rank} has no step sampler"));
        };
        for (step, why) in kept {
            if let Some(&theirs) = kept_by_0.get(step)
                && theirs != why.is_some()
            {
                return Err(format!(
                    "sampling: rank {rank} {} step {step}, rank 0 {} it",
                    if why.is_some() { "kept" } else { "dropped" },
                    if theirs { "kept" } else { "dropped" }
                ));
            }
        }
    }
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for why in zero.iter().filter_map(|(_, r)| r.as_deref()) {
        *reasons.entry(why).or_default() += 1;
    }
    let kept: usize = reasons.values().sum();
    let why: Vec<String> = reasons.iter().map(|(r, c)| format!("{r} {c}")).collect();
    Ok(Some(format!(
        "sampling kept {kept} of {} step(s) on every rank ({})",
        zero.len(),
        why.join(", ")
    )))
}

/// What one rank can check alone: its spans link to rank 0's step span (and are its
/// children with --parent remote).
fn verify_rank(
    rank: usize,
    spans: &[SpanRecord],
    steps: usize,
    parent: Parent,
) -> Result<String, String> {
    let name = if rank == 0 { STEP_SPAN } else { STAGE_SPAN };
    let mine: Vec<_> = spans.iter().filter(|s| s.name == name).collect();
    if mine.len() != steps {
        return Err(format!(
            "rank {rank} recorded {} {name} spans, expected {steps}",
            mine.len()
        ));
    }
    if rank > 0 {
        for s in mine {
            let link = s
                .links
                .iter()
                .find(|l| l.source_rank == Some(0))
                .ok_or_else(|| format!("rank {rank}, step {:?}: no link to rank 0", s.step))?;
            if parent == Parent::Remote
                && (s.trace_id != link.trace_id || s.parent_span_id != link.span_id)
            {
                return Err(format!(
                    "rank {rank}, step {:?}: not a child of rank 0's {STEP_SPAN}",
                    s.step
                ));
            }
        }
    }
    Ok(format!(
        "ok: rank {rank}, {steps} step(s) correlated with rank 0"
    ))
}
