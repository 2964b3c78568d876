"""A training loop written against NeMo Lens's ``nemo.lens.distributed``.

The import below is the only line changed from the NeMo Lens version (it read
``from nemo.lens.distributed import broadcast_trace_context, create_linked_span``); the
caller picks the group with one line (``lens_trace.set_group(...)``, or ``run_local`` in
tests). Run as a script, it is one rank of a TCP job.
"""

from lens_trace.distributed import broadcast_trace_context, create_linked_span


def train(rank, tracer, steps=3):
    for step in range(steps):
        if rank == 0:
            with tracer.start_as_current_span("train_step", attributes={"step": step}):
                carrier = broadcast_trace_context(rank, src_rank=0)
        else:
            carrier = broadcast_trace_context(rank, src_rank=0)
            span = create_linked_span(tracer, "pp.recv_forward", remote_carrier=carrier, step=step, stage=rank)
            span.end()


if __name__ == "__main__":
    import sys

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import lens_trace
    from jsonl import dump

    lens_trace.set_group(lens_trace.tcp_group())  # the one added line
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    rank = lens_trace.get_group().rank
    train(rank, provider.get_tracer("nemo_loop"))
    dump(exporter.get_finished_spans(), rank, sys.argv[1], step_key="step")
