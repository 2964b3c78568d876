"""A training loop written against NeMo Lens's ``nemo.lens.distributed``.

The import below is the only line changed from the NeMo Lens version (it read
``from nemo.lens.distributed import broadcast_trace_context, create_linked_span``; the torch
tests run this file with that line put back, beside this one). On torch there is nothing
else to add: the broadcast uses the initialised ``torch.distributed`` world. Run as a script,
it is one rank of a job: ``torch`` (gloo, the launcher's RANK/WORLD_SIZE/MASTER_*), or
``tcp`` (lens's TCP group, chosen with one line).
"""

from lens_trace.distributed import broadcast_trace_context, create_linked_span


def train(rank, tracer, steps=3):
    for step in range(steps):
        if rank == 0:
            with tracer.start_as_current_span("train_step", attributes={"step": step}):
                carrier = broadcast_trace_context(rank, src_rank=0)
        else:
            carrier = broadcast_trace_context(rank, src_rank=0)
            span = create_linked_span(
                tracer, "pp.recv_forward", remote_carrier=carrier, step=step, stage=rank, kind="forward", token="s3cret"
            )
            span.end()


if __name__ == "__main__":
    import sys

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from jsonl import dump

    transport, out = sys.argv[1], sys.argv[2]
    if transport == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
    else:
        import lens_trace

        lens_trace.set_group(lens_trace.tcp_group())  # the one added line on TCP
        rank = lens_trace.get_group().rank
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    train(rank, provider.get_tracer("nemo_loop"))
    dump(exporter.get_finished_spans(), rank, out, step_key="step")
    if transport == "torch":
        dist.destroy_process_group()
