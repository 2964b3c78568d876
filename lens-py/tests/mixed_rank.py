"""One Python rank of a mixed Python/Rust job: the twin of lens-trace/examples/mixed_rank.rs.

Each step, the step's source rank opens ``train_step`` and broadcasts its context; every
other rank opens ``pp.stage`` as its child, linked to it. Spans go to --out as JSON lines.
The group comes from the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
LENS_TCP_KEY), as under torchrun.
"""

import argparse

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import lens_trace
from jsonl import dump
from lens_trace.distributed import broadcast_trace_context, start_linked_span


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--sources", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    sources = [int(s) for s in args.sources.split(",")]

    group = lens_trace.tcp_group()
    lens_trace.set_group(group)
    rank = group.rank
    exporter = InMemorySpanExporter()
    provider = lens_trace.tracer_provider(rank, group.world_size, span_processors=[SimpleSpanProcessor(exporter)])
    tracer = provider.get_tracer("mixed_rank")
    for step in range(args.steps):
        src = sources[step % len(sources)]
        attrs = {"nv.dl.step": step, "nv.dl.rank": rank}
        if rank == src:
            with tracer.start_as_current_span("train_step", attributes=attrs):
                broadcast_trace_context(rank, src_rank=src)
        else:
            carrier = broadcast_trace_context(rank, src_rank=src)
            start_linked_span(tracer, "pp.stage", remote_carrier=carrier, parent="remote", attributes=attrs).end()
    group.close()
    dump(exporter.get_finished_spans(), rank, args.out)

if __name__ == "__main__":
    main()
