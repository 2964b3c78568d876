"""The same NeMo Lens-style loop (tests/nemo_loop.py) runs unchanged on the in-process
cluster and on TCP processes; every stage span links to rank 0's step span."""

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import lens_trace
import nemo_loop
from conftest import Procs, free_port, python_cmd, rank_env, read_spans
from jsonl import dump

WORLD, STEPS = 4, 3


def check(spans):
    steps = {s["step"]: s for s in spans if s["name"] == "train_step"}
    assert sorted(steps) == list(range(STEPS)) and all(s["rank"] == 0 for s in steps.values())
    stages = [s for s in spans if s["name"] == "pp.recv_forward"]
    assert len(stages) == (WORLD - 1) * STEPS
    for s in stages:
        src = steps[s["step"]]
        assert [(link["trace_id"], link["span_id"]) for link in s["links"]] == [(src["trace_id"], src["span_id"])], s
        assert s["links"][0]["attributes"]["lens.link.source_rank"] == "0"
        # NeMo Lens's keywords are attributes, cleaned as NeMo Lens cleans them.
        assert s["kind"] == "INTERNAL" and s["attributes"]["kind"] == "forward", s
        assert s["attributes"]["token"] == "[REDACTED]", s


def test_the_nemo_loop_runs_on_the_in_process_cluster(tmp_path):
    exporters = [InMemorySpanExporter() for _ in range(WORLD)]

    def rank_main(rank):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporters[rank]))
        nemo_loop.train(rank, provider.get_tracer("nemo_loop"), steps=STEPS)

    lens_trace.run_local(WORLD, rank_main, timeout=10)
    paths = []
    for r, e in enumerate(exporters):
        paths.append(tmp_path / f"{r}.jsonl")
        dump(e.get_finished_spans(), r, paths[-1], step_key="step")
    check(read_spans(paths))


def test_the_nemo_loop_runs_on_tcp_processes(procs: Procs, tmp_path):
    port = free_port()
    paths = [tmp_path / f"{r}.jsonl" for r in range(WORLD)]
    for r in range(WORLD):
        procs.start(python_cmd("nemo_loop.py", "tcp", str(paths[r])), rank_env(r, WORLD, port))
    for r, (code, text) in enumerate(procs.wait_all(90)):
        assert code == 0, f"rank {r}:\n{text}"
    check(read_spans(paths))
