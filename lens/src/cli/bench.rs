//! `lens bench`: lens's trace-context broadcast beside the backend's raw transport, on the
//! same group, in the same run, by the one method of `measure.rs`. It knows no backend:
//! each one forms its groups and runs the plan (`backends/`).

use lens::Carrier;
use opentelemetry::baggage::BaggageExt;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::{Context, KeyValue};
use serde_json::json;

use super::args::BenchArgs;
use super::backend::{Backend, BenchReport};
use super::measure::{LENS_OPS, Measured, Plan};

/// The context the source broadcasts: a sampled span with flags 03 and a little baggage,
/// as a training step would carry.
fn source_context() -> Context {
    let sc = SpanContext::new(
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap_or(TraceId::INVALID),
        SpanId::from_hex("00f067aa0ba902b7").unwrap_or(SpanId::INVALID),
        TraceFlags::new(0x03),
        true,
        TraceState::NONE,
    );
    Context::new().with_remote_span_context(sc).with_baggage([
        KeyValue::new("nv.dl.step", "17"),
        KeyValue::new("job.id", "job-42"),
    ])
}

pub(crate) fn run(backend: &dyn Backend, args: &BenchArgs) -> Result<(), String> {
    if args.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    if backend.name() != "tcp" && (args.processes || args.spawned.rank.is_some()) {
        return Err(format!(
            "--processes applies to --backend tcp (with {}, see its ranks in the bench's title)",
            backend.name()
        ));
    }
    if args.hosts.hosts.is_some() && !(backend.name() == "tcp" && args.processes) {
        return Err("--hosts applies to --backend tcp --processes".into());
    }
    let only = match &args.only {
        None => None,
        Some(name) => {
            let names: Vec<&str> = backend
                .baselines()
                .iter()
                .copied()
                .chain(LENS_OPS)
                .collect();
            let i = names.iter().position(|n| n == name).ok_or_else(|| {
                format!(
                    "--only {name}: the {} bench's operations are {}",
                    backend.name(),
                    names.join(", ")
                )
            })?;
            Some(i)
        }
    };
    let cx = source_context();
    let plan = Plan {
        baselines: backend.baselines().len(),
        iters: args.iters,
        bytes: Carrier::from_context(&cx).encode(),
        cx,
        only,
    };
    if let Some(report) = backend.bench(args, &plan)? {
        print_report(backend.name(), args, &plan, &report);
    }
    Ok(())
}

fn print_report(backend: &str, args: &BenchArgs, plan: &Plan, report: &BenchReport) {
    let bytes = plan.bytes.len();
    if !args.json {
        println!(
            "lens bench: backend {backend} ({}), {bytes} carrier bytes, {} timed rounds per op; \
             a round is the slowest rank's time from a common barrier",
            report.setting, plan.iters
        );
        let all = report.groups.iter().any(|g| !g.cpu_all_us.is_empty());
        println!(
            "{:>6} {:>15} {:>10} {:>10} {:>8} {:>9}{}",
            "ranks",
            "op",
            "median_us",
            "p99_us",
            "cpu_us",
            "lens/raw",
            if all { "   cpu_all" } else { "" }
        );
    }
    for group in &report.groups {
        print_group(backend, args.json, bytes, group);
    }
}

/// One line per operation; each lens line carries its ratio to each baseline.
fn print_group(backend: &str, json: bool, bytes: usize, group: &Measured) {
    let stats: Vec<(&str, Stats)> = group
        .ops
        .iter()
        .map(|(op, samples)| (*op, Stats::of(samples)))
        .collect();
    let is_lens = |op: &str| LENS_OPS.contains(&op);
    for (i, (op, s)) in stats.iter().enumerate() {
        if s.count == 0 {
            continue; // not run (--only)
        }
        let cpu = group.cpu_us.get(i).copied().unwrap_or(f64::NAN);
        let all = group.cpu_all_us.get(i).copied();
        if json {
            let mut line = json!({
                "backend": backend, "ranks": group.ranks, "op": op, "bytes": bytes,
                "iters": s.count, "median_us": round2(s.median), "p99_us": round2(s.p99),
                "cpu_us_per_rank": round2(cpu),
            });
            if let Some(all) = all {
                // Processes: `cpu_us_per_rank` is rank 0's; this, every rank's together.
                line["cpu_us_rank0"] = json!(round2(cpu));
                line["cpu_us_all_ranks"] = json!(round2(all));
            }
            if is_lens(op) {
                for (base, b) in stats.iter().filter(|(o, b)| !is_lens(o) && b.count > 0) {
                    line[format!("ratio_vs_{base}")] = json!(round2(s.median / b.median));
                }
            }
            println!("{line}");
        } else {
            let ratio = match stats.first() {
                Some((_, raw)) if is_lens(op) && raw.count > 0 => {
                    format!("{:.2}x", s.median / raw.median)
                }
                _ => String::new(),
            };
            let all = all.map_or(String::new(), |a| format!(" {a:>9.1}"));
            println!(
                "{:>6} {op:>15} {:>10.2} {:>10.2} {cpu:>8.2} {ratio:>9}{all}",
                group.ranks, s.median, s.p99
            );
        }
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

struct Stats {
    count: usize,
    median: f64,
    p99: f64,
}

impl Stats {
    fn of(samples: &[f64]) -> Stats {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
            sorted.get(i).copied().unwrap_or(f64::NAN)
        };
        Stats {
            count: sorted.len(),
            median: at(0.5),
            p99: at(0.99),
        }
    }
}
