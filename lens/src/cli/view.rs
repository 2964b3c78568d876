//! Terminal waterfall and Chrome trace event output of a demo run.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde_json::json;

use super::args::ParentArg;
use super::rank::STEP_SPAN;
use lens::ClockOffset;

use super::record::{HangRecord, Job, SpanRecord};

const WIDTH: usize = 48;
const MAX_STEPS_SHOWN: usize = 3;
const MAX_RANKS_SHOWN: usize = 12;

/// Rank `rank`'s span in the step `root` (rank 0's step span) opened: the step span itself
/// on rank 0, a stage's span elsewhere.
pub(crate) fn span_in_step<'a>(
    job: &'a Job,
    rank: usize,
    root: &SpanRecord,
) -> Option<&'a SpanRecord> {
    job.ranks
        .get(rank)?
        .iter()
        .find(|s| s.step == root.step && (rank == 0) == (s.name == STEP_SPAN))
}

/// "rank R came last, X ms after the first", where the step's source knows how the ranks
/// came.
pub(crate) fn came_last(root: &SpanRecord) -> Option<String> {
    let (last, spread) = (root.last_rank?, root.spread_ns?);
    Some(format!(
        "rank {last} came last, {:.2} ms after the first",
        spread as f64 / 1e6
    ))
}

/// A waterfall per step: one bar per rank, with the link each stage's span carries.
pub(crate) fn waterfall(job: &Job, parent: ParentArg, backend: &str) -> String {
    let mut out = String::new();
    let n = job.ranks.len();
    let roots = job.named(0, STEP_SPAN);
    let _ = writeln!(
        out,
        "lens demo: {n} rank(s) on the {backend} backend, parent = {}",
        if parent == ParentArg::Remote {
            "remote (one trace per step)"
        } else {
            "current (linked only)"
        }
    );
    let clocks: Vec<(usize, &ClockOffset)> = job
        .clocks
        .iter()
        .enumerate()
        .filter_map(|(r, c)| Some((r, c.as_ref()?)))
        .filter(|(r, _)| *r != 0)
        .collect();
    if !clocks.is_empty() {
        let shown: Vec<String> = clocks
            .iter()
            .take(MAX_RANKS_SHOWN)
            .map(|(r, c)| {
                format!(
                    "rank {r} {:+.3} ms (±{:.3})",
                    c.offset_ns as f64 / 1e6,
                    c.error_ns as f64 / 1e6
                )
            })
            .collect();
        let more = clocks.len().saturating_sub(MAX_RANKS_SHOWN);
        let _ = writeln!(
            out,
            "clock offsets from rank 0 (spans shown on rank 0's clock): {}{}",
            shown.join(", "),
            if more > 0 {
                format!(", … {more} more")
            } else {
                String::new()
            }
        );
    }
    // With --sample: why rank 0's sampler kept each step (None: dropped); the steps kept
    // by a rule come first.
    let kept: Option<HashMap<i64, Option<&str>>> = job
        .kept
        .first()
        .and_then(Option::as_ref)
        .map(|k| k.iter().map(|(s, r)| (*s, r.as_deref())).collect());
    let mut roots = roots;
    if let Some(k) = &kept {
        let order = |s: &&SpanRecord| match s.step.and_then(|st| k.get(&st).copied().flatten()) {
            Some("baseline") => 1,
            Some("exit" | "undecided") => 2,
            Some(_) => 0,
            None => 3,
        };
        roots.sort_by_key(|s| (order(s), s.step));
    }
    for root in roots.iter().take(MAX_STEPS_SHOWN) {
        let (t0, span_us) = (root.start_us, (root.end_us - root.start_us).max(1.0));
        let mark = match (&kept, root.step) {
            (Some(k), Some(step)) => match k.get(&step) {
                Some(Some(why)) => format!("  kept ({why})"),
                Some(None) => "  dropped".to_owned(),
                None => "  undecided".to_owned(),
            },
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "\nstep {}  trace {}  {STEP_SPAN} {}{mark}",
            root.step.unwrap_or(-1),
            root.trace_id,
            root.span_id
        );
        if let Some(line) = came_last(root) {
            let _ = writeln!(out, "  arrivals: {line}");
        }
        let shown: Vec<usize> = if n <= MAX_RANKS_SHOWN {
            (0..n).collect()
        } else {
            (0..MAX_RANKS_SHOWN - 2).chain(n - 2..n).collect()
        };
        for (i, &rank) in shown.iter().enumerate() {
            if i > 0 && rank != shown[i - 1] + 1 {
                let _ = writeln!(
                    out,
                    "  {:>7}",
                    format!("… {} more", rank - shown[i - 1] - 1)
                );
            }
            let Some(span) = span_in_step(job, rank, root) else {
                let _ = writeln!(out, "  rank {rank:<4} (no span)");
                continue;
            };
            let col =
                |t: f64| (((t - t0) / span_us) * WIDTH as f64).clamp(0.0, WIDTH as f64) as usize;
            let (a, b) = (col(span.start_us), col(span.end_us));
            let bar: String = (0..WIDTH)
                .map(|c| if c >= a && c <= b.max(a) { '█' } else { '·' })
                .collect();
            let link = span.links.first().map_or(String::new(), |l| {
                let same = if l.trace_id == span.trace_id {
                    "child of + "
                } else {
                    ""
                };
                format!("  {same}↳ link {}", l.span_id)
            });
            let _ = writeln!(
                out,
                "  rank {rank:<4} {:<24} |{bar}| {:>8.2} ms{link}",
                span.name,
                (span.end_us - span.start_us) / 1000.0
            );
        }
    }
    if roots.len() > MAX_STEPS_SHOWN {
        let _ = writeln!(out, "\n… {} more step(s)", roots.len() - MAX_STEPS_SHOWN);
    }
    hang_reports(&mut out, job);
    out
}

/// Each rank's `lens.hang` reports: the round that timed out, whom it waited for, and the
/// spans open on the rank then.
fn hang_reports(out: &mut String, job: &Job) {
    let reports: Vec<(usize, &HangRecord)> = job
        .ranks
        .iter()
        .enumerate()
        .flat_map(|(rank, spans)| {
            spans
                .iter()
                .filter_map(move |s| Some((rank, s.hang.as_ref()?)))
        })
        .collect();
    if reports.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nhang reports (lens.hang):");
    for (rank, h) in reports.iter().take(MAX_RANKS_SHOWN) {
        let round = h.round.map_or(String::new(), |r| format!("round {r} "));
        let open: Vec<String> = h
            .open
            .iter()
            .map(|(name, age)| format!("{name} ({:.2} s)", *age as f64 / 1e9))
            .collect();
        let through: String = h
            .via
            .iter()
            .map(|r| format!("rank {r}, which is waiting for "))
            .collect();
        let _ = writeln!(
            out,
            "  rank {rank:<4} {round}timed out waiting for {through}{:?}; open: {}",
            h.missing,
            if open.is_empty() {
                "nothing".to_owned()
            } else {
                open.join(", ")
            }
        );
    }
    if reports.len() > MAX_RANKS_SHOWN {
        let _ = writeln!(out, "  … {} more", reports.len() - MAX_RANKS_SHOWN);
    }
}

/// Chrome trace event JSON: one process per rank, a complete event per span, and a flow
/// arrow from each linked span's source to the span.
pub(crate) fn chrome_trace(job: &Job) -> String {
    let zero = job
        .ranks
        .iter()
        .flatten()
        .map(|s| s.start_us)
        .fold(f64::INFINITY, f64::min);
    let zero = if zero.is_finite() { zero } else { 0.0 };
    let mut events = Vec::new();
    let mut where_is: HashMap<&str, (usize, f64)> = HashMap::new();
    for (rank, spans) in job.ranks.iter().enumerate() {
        events.push(json!({"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": format!("rank {rank}")}}));
        if let Some(Some(c)) = job.clocks.get(rank) {
            // The spans are on rank 0's clock already; the label says by how much.
            let labels = format!(
                "clock {:+.3} ms (±{:.3}) from rank 0's, spans moved onto rank 0's",
                c.offset_ns as f64 / 1e6,
                c.error_ns as f64 / 1e6
            );
            events.push(json!({"ph": "M", "name": "process_labels", "pid": rank, "tid": 0, "args": {"labels": labels}}));
        }
        for s in spans {
            where_is.insert(&s.span_id, (rank, s.start_us - zero));
        }
    }
    let mut flow_id = 0u64;
    for (rank, spans) in job.ranks.iter().enumerate() {
        for s in spans {
            let ts = s.start_us - zero;
            events.push(json!({
                "ph": "X", "cat": "lens", "name": s.name, "pid": rank, "tid": 0,
                "ts": ts, "dur": (s.end_us - s.start_us).max(0.0),
                "args": {
                    "trace_id": s.trace_id, "span_id": s.span_id,
                    "parent_span_id": s.parent_span_id, "step": s.step,
                }
            }));
            for link in &s.links {
                let Some(&(src_rank, src_ts)) = where_is.get(link.span_id.as_str()) else {
                    continue;
                };
                flow_id += 1;
                events.push(json!({"ph": "s", "cat": "link", "name": "link", "id": flow_id, "pid": src_rank, "tid": 0, "ts": src_ts}));
                events.push(json!({"ph": "f", "bp": "e", "cat": "link", "name": "link", "id": flow_id, "pid": rank, "tid": 0, "ts": ts}));
            }
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"}).to_string()
}
