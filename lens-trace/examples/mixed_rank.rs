//! One rank of a job whose ranks may be Rust or Python processes (the `lens_trace` Python
//! package joins the same TCP group): each step, the step's source rank opens `train_step`
//! and broadcasts its context; every other rank opens `pp.stage` as its child, linked to it.
//! The rank's spans are written as JSON lines, for a test to check across ranks.
//!
//! ```sh
//! RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 LENS_TCP_KEY=... \
//!   cargo run -p lens-trace --features tcp --example mixed_rank -- --steps 4 --sources 0,1 --out spans.jsonl
//! ```
#![allow(clippy::print_stderr)]

use std::io::Write as _;

use lens::tcp::{TcpBroadcaster, TcpConfigBuilder};
use lens::{LinkedSpan, Parent, blocking};
use opentelemetry::trace::{Span as _, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};

struct Args {
    steps: usize,
    sources: Vec<usize>,
    out: String,
}

fn parse() -> Result<Args, String> {
    let (mut steps, mut sources, mut out) = (None, None, None);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--steps" => steps = Some(value()?.parse().map_err(|e| format!("--steps: {e}"))?),
            "--sources" => {
                let list = value()?
                    .split(',')
                    .map(|s| s.trim().parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("--sources: {e}"))?;
                sources = Some(list);
            }
            "--out" => out = Some(value()?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(Args {
        steps: steps.ok_or("--steps is required")?,
        sources: sources
            .filter(|s| !s.is_empty())
            .ok_or("--sources is required")?,
        out: out.ok_or("--out is required")?,
    })
}

fn links_json(span: &SpanData) -> Vec<serde_json::Value> {
    span.links
        .iter()
        .map(|l| {
            let attrs: serde_json::Map<_, _> = l
                .attributes
                .iter()
                .map(|kv| (kv.key.to_string(), serde_json::json!(kv.value.to_string())))
                .collect();
            serde_json::json!({
                "trace_id": l.span_context.trace_id().to_string(),
                "span_id": l.span_context.span_id().to_string(),
                "attributes": attrs,
            })
        })
        .collect()
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let group = TcpBroadcaster::connect(TcpConfigBuilder::from_env().build()?)?;
    let rank = lens::Broadcaster::rank(&group);
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let tracer = provider.tracer("mixed_rank");
    for step in 0..args.steps {
        let src = args.sources[step % args.sources.len()];
        let attrs = [
            KeyValue::new("nv.dl.step", step as i64),
            KeyValue::new("nv.dl.rank", rank as i64),
        ];
        if rank == src {
            let span = tracer
                .span_builder("train_step")
                .with_attributes(attrs)
                .start(&tracer);
            let cx = Context::new().with_span(span);
            blocking::broadcast_context(&group, src, &cx)?;
            cx.span().end();
        } else {
            let remote = blocking::broadcast_context(&group, src, &Context::new())?;
            LinkedSpan::builder("pp.stage")
                .remote(&remote)
                .parent(Parent::Remote)
                .attributes(attrs)
                .start_with_context(&tracer, &Context::new())
                .end();
        }
    }
    provider.force_flush()?;
    let mut file = std::fs::File::create(&args.out)?;
    for span in exporter.get_finished_spans()? {
        let step = span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "nv.dl.step")
            .and_then(|kv| match kv.value {
                opentelemetry::Value::I64(s) => Some(s),
                _ => None,
            });
        let parent = span.parent_span_id;
        let line = serde_json::json!({
            "rank": rank,
            "lang": "rust",
            "name": span.name,
            "step": step,
            "trace_id": span.span_context.trace_id().to_string(),
            "span_id": span.span_context.span_id().to_string(),
            "parent_span_id": (parent != opentelemetry::trace::SpanId::INVALID).then(|| parent.to_string()),
            "links": links_json(&span),
        });
        writeln!(file, "{line}")?;
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mixed_rank: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mixed_rank: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
