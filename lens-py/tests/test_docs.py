"""Every Python block of the README, the package README and the guide runs: on each rank of an in-process
cluster of 3, with ``rank`` and ``tracer`` defined as a training loop has them, rank 0
inside its step's span. Every rank must end with the source's context."""

import re

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import lens_trace
from conftest import REPO

PAGES = [REPO / "README.md", REPO / "lens-py" / "README.md"] + sorted((REPO / "docs" / "guide").glob("*.md"))


def python_blocks():
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^```python[^\n]*\n(.*?)^```", text, re.M | re.S):
            line = text[: m.start()].count("\n") + 1
            yield pytest.param(m.group(1), id=f"{page.relative_to(REPO)}:{line}")


BLOCKS = list(python_blocks())


def test_the_pages_have_python_blocks():
    # The README's example and the Python guide's, at least: a parser that finds none fails.
    assert len(BLOCKS) >= 2, BLOCKS


@pytest.mark.parametrize("code", BLOCKS)
def test_a_python_block_runs_on_every_rank(code):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("docs")
    compiled = compile(code, "<docs block>", "exec")

    def rank_fn(rank):
        names = {"rank": rank, "tracer": tracer}
        if rank == 0:
            with tracer.start_as_current_span("train_step") as step:
                exec(compiled, names)
            return names, step.get_span_context()
        exec(compiled, names)
        return names, None

    results = lens_trace.run_local(3, rank_fn, timeout=10)
    step = results[0][1]
    for rank, (names, _) in enumerate(results):
        carrier = names.get("carrier")
        if carrier is not None:
            assert carrier["traceparent"].split("-")[1] == f"{step.trace_id:032x}", (rank, carrier)
    provider.shutdown()
