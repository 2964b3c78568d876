//! Terminal waterfall and Chrome trace event output of a demo run.

use std::fmt::Write as _;
use std::time::SystemTime;

use lens::testkit::Report;
use opentelemetry_sdk::trace::SpanData;
use serde_json::json;

use super::ParentArg;
use super::demo::{STEP_SPAN, step_of};

const WIDTH: usize = 48;
const MAX_STEPS_SHOWN: usize = 3;
const MAX_RANKS_SHOWN: usize = 12;

fn micros(t: SystemTime, zero: SystemTime) -> f64 {
    t.duration_since(zero)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

fn zero_time<T>(report: &Report<T>) -> SystemTime {
    report
        .ranks
        .iter()
        .flat_map(|r| r.spans.iter().map(|s| s.start_time))
        .min()
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// A waterfall per step: one bar per rank, with the link each stage's span carries.
pub fn waterfall<T>(report: &Report<T>, parent: ParentArg) -> String {
    let mut out = String::new();
    let n = report.ranks.len();
    let roots = report.named(0, STEP_SPAN);
    let _ = writeln!(
        out,
        "lens demo: {n} in-process rank(s), parent = {}",
        if parent == ParentArg::Remote {
            "remote (one trace per step)"
        } else {
            "current (linked only)"
        }
    );
    for root in roots.iter().take(MAX_STEPS_SHOWN) {
        let step = step_of(root);
        let (t0, t1) = (root.start_time, root.end_time);
        let span_us = micros(t1, t0).max(1.0);
        let _ = writeln!(
            out,
            "\nstep {}  trace {}  {STEP_SPAN} {}",
            step.unwrap_or(-1),
            root.span_context.trace_id(),
            root.span_context.span_id()
        );
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
            let span: Option<&SpanData> = report
                .spans(rank)
                .iter()
                .find(|s| step_of(s) == step && (rank == 0) == (s.name == STEP_SPAN));
            let Some(span) = span else {
                let _ = writeln!(out, "  rank {rank:<4} (no span)");
                continue;
            };
            let a = (micros(span.start_time, t0) / span_us * WIDTH as f64).clamp(0.0, WIDTH as f64)
                as usize;
            let b = (micros(span.end_time, t0) / span_us * WIDTH as f64).clamp(0.0, WIDTH as f64)
                as usize;
            let bar: String = (0..WIDTH)
                .map(|c| if c >= a && c <= b.max(a) { '█' } else { '·' })
                .collect();
            let link = span.links.iter().next().map_or(String::new(), |l| {
                let same = if l.span_context.trace_id() == span.span_context.trace_id() {
                    "child of + "
                } else {
                    ""
                };
                format!("  {same}↳ link {}", l.span_context.span_id())
            });
            let _ = writeln!(
                out,
                "  rank {rank:<4} {:<24} |{bar}| {:>8.2} ms{link}",
                span.name,
                micros(span.end_time, span.start_time) / 1000.0
            );
        }
    }
    if roots.len() > MAX_STEPS_SHOWN {
        let _ = writeln!(out, "\n… {} more step(s)", roots.len() - MAX_STEPS_SHOWN);
    }
    out
}

/// Chrome trace event JSON: one process per rank, a complete event per span, and a flow
/// arrow from each linked span's source to the span.
pub fn chrome_trace<T>(report: &Report<T>) -> String {
    let zero = zero_time(report);
    let mut events = Vec::new();
    let mut where_is = std::collections::HashMap::new();
    for r in &report.ranks {
        events.push(json!({"ph": "M", "name": "process_name", "pid": r.rank, "tid": 0, "args": {"name": format!("rank {}", r.rank)}}));
        for s in &r.spans {
            where_is.insert(
                s.span_context.span_id(),
                (r.rank, micros(s.start_time, zero)),
            );
        }
    }
    let mut flow_id = 0u64;
    for r in &report.ranks {
        for s in &r.spans {
            let ts = micros(s.start_time, zero);
            let attrs: serde_json::Map<String, serde_json::Value> = s
                .attributes
                .iter()
                .map(|kv| (kv.key.to_string(), json!(kv.value.to_string())))
                .collect();
            events.push(json!({
                "ph": "X", "cat": "lens", "name": s.name, "pid": r.rank, "tid": 0,
                "ts": ts, "dur": micros(s.end_time, s.start_time),
                "args": {
                    "trace_id": s.span_context.trace_id().to_string(),
                    "span_id": s.span_context.span_id().to_string(),
                    "parent_span_id": s.parent_span_id.to_string(),
                    "attributes": attrs,
                }
            }));
            for link in s.links.iter() {
                let Some(&(src_rank, src_ts)) = where_is.get(&link.span_context.span_id()) else {
                    continue;
                };
                flow_id += 1;
                events.push(json!({"ph": "s", "cat": "link", "name": "link", "id": flow_id, "pid": src_rank, "tid": 0, "ts": src_ts}));
                events.push(json!({"ph": "f", "bp": "e", "cat": "link", "name": "link", "id": flow_id, "pid": r.rank, "tid": 0, "ts": ts}));
            }
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"}).to_string()
}
