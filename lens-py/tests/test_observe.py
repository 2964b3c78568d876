"""Which rank is slow, which is stuck, and where the clocks stand, from Python: the same
names lens's Rust crates write."""

import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import lens_trace
from lens_trace.distributed import broadcast_trace_context, get_group


def provider_with(exporter):
    provider = TracerProvider()
    provider.add_span_processor(lens_trace.OpenSpans())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_the_source_span_names_the_straggler():
    exporter = InMemorySpanExporter()
    tracer = provider_with(exporter).get_tracer("test")
    lens_trace.set_late_threshold(0.02)

    def rank_main(rank):
        if rank == 2:
            time.sleep(0.08)
        if rank == 0:
            with tracer.start_as_current_span("train_step"):
                broadcast_trace_context(rank, src_rank=0)
        else:
            broadcast_trace_context(rank, src_rank=0)

    try:
        lens_trace.run_local(3, rank_main, timeout=10)
    finally:
        lens_trace.set_late_threshold(0.001)
    (step,) = [s for s in exporter.get_finished_spans() if s.name == "train_step"]
    assert step.attributes["lens.round.last_rank"] == 2
    assert 70_000_000 <= step.attributes["lens.round.spread_ns"] < 5_000_000_000
    late = [e for e in step.events if e.name == "lens.round.late_rank"]
    assert [e.attributes["lens.round.rank"] for e in late] == [2], "punctual ranks are not named"


def test_a_context_passed_to_the_source_gets_the_arrivals_not_the_current_span():
    # The source looks its span up once, for the carrier and for the arrivals after the
    # round: with context=, both come from that context, not from the span current there.
    exporter = InMemorySpanExporter()
    tracer = provider_with(exporter).get_tracer("test")
    from opentelemetry import trace

    def rank_main(rank):
        if rank == 1:
            time.sleep(0.03)
        if rank != 0:
            return dict(broadcast_trace_context(rank, src_rank=0))
        step = tracer.start_span("train_step")
        cx = trace.set_span_in_context(step)
        try:
            with tracer.start_as_current_span("elsewhere"):
                return dict(broadcast_trace_context(rank, src_rank=0, context=cx))
        finally:
            step.end()

    got = lens_trace.run_local(2, rank_main, timeout=10)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    step, elsewhere = spans["train_step"], spans["elsewhere"]
    assert step.attributes["lens.round.last_rank"] == 1
    assert "lens.round.last_rank" not in elsewhere.attributes, "the current span is not the context's"
    want = f"{step.context.span_id:016x}"
    assert all(c["traceparent"].split("-")[2] == want for c in got), got


def test_a_timeout_leaves_a_hang_report_first():
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter)
    lens_trace.set_hang_provider(provider)
    tracer = provider.get_tracer("test")

    def rank_main(rank):
        # Rank 1 never comes to the second broadcast.
        broadcast_trace_context(rank, src_rank=0)
        if rank == 1:
            return None
        with tracer.start_as_current_span("train_step"):
            with pytest.raises(lens_trace.BroadcastTimeout) as e:
                broadcast_trace_context(rank, src_rank=0)
            # Already there when the error reaches the caller.
            reports = [s for s in exporter.get_finished_spans() if s.name == "lens.hang"]
            return e.value.missing_ranks, e.value.last_seen, reports

    try:
        missing, last_seen, reports = lens_trace.run_local(2, rank_main, timeout=0.3)[0]
    finally:
        lens_trace.set_hang_provider(None)
    assert missing == [1]
    assert last_seen == {1: 1}, "rank 1 took part in the first round only"
    (hang,) = reports
    assert hang.attributes["lens.hang.rank"] == 0
    assert list(hang.attributes["lens.hang.missing_ranks"]) == [1]
    assert hang.attributes["lens.hang.round"] == 2
    assert list(hang.attributes["lens.hang.missing_last_seen"]) == [1]
    assert hang.attributes["lens.hang.waited_ns"] >= 200_000_000
    open_names = [e.attributes["lens.hang.span_name"] for e in hang.events if e.name == "lens.hang.open_span"]
    assert "train_step" in open_names and "lens.hang" not in open_names


def test_another_rank_s_report_is_not_an_open_span():
    # Two ranks of one process timing out together: one's report is open while the other
    # takes its list of open spans.
    tracer = provider_with(InMemorySpanExporter()).get_tracer("test")
    with tracer.start_as_current_span("lens.hang"), tracer.start_as_current_span("step"):
        names = [name for name, _ in lens_trace.observe.open_spans()]
    assert "step" in names and "lens.hang" not in names, names


def test_every_rank_s_hang_report_names_the_root_cause():
    exporter = InMemorySpanExporter()
    provider = provider_with(exporter)
    lens_trace.set_hang_provider(provider)

    def rank_main(rank):
        # Rank 2 never comes to the second step: rank 0 times out waiting for it; rank 1,
        # which had that step's context, times out in the third waiting for rank 0.
        broadcast_trace_context(rank, src_rank=0)
        if rank == 2:
            return None
        try:
            broadcast_trace_context(rank, src_rank=0)
            broadcast_trace_context(rank, src_rank=0)
        except lens_trace.BroadcastTimeout as e:
            return e.missing_ranks, e.via, str(e)
        return None

    try:
        got = lens_trace.run_local(3, rank_main, timeout=0.3)
    finally:
        lens_trace.set_hang_provider(None)
    assert got[0][:2] == ([2], [])
    assert got[1][:2] == ([2], [0]), got[1]
    assert "waiting for rank 0, which is waiting for rank(s) [2]" in got[1][2]
    reports = {s.attributes["lens.hang.rank"]: s for s in exporter.get_finished_spans() if s.name == "lens.hang"}
    assert sorted(reports) == [0, 1]
    assert list(reports[1].attributes["lens.hang.missing_ranks"]) == [2]
    assert list(reports[1].attributes["lens.hang.via"]) == [0]
    assert "lens.hang.via" not in reports[0].attributes


def test_clock_offsets_on_one_clock_are_within_their_bound():
    def rank_main(rank):
        return get_group().clock_offsets(reference=0, repetitions=3)

    tables = lens_trace.run_local(3, rank_main, timeout=10)
    assert all(t == tables[0] for t in tables), "every rank has the same table"
    assert tables[0][0] == (0, 0)
    for offset, error in tables[0]:
        assert abs(offset) <= error


def test_at_most_sixteen_late_ranks_reach_the_exported_span_latest_first():
    # The late ranks are picked in Rust (later than the threshold, at most 16): what the
    # exporter receives must be those, the latest first, and no punctual rank.
    from lens_trace.observe import MAX_LATE_EVENTS

    exporter = InMemorySpanExporter()
    tracer = provider_with(exporter).get_tracer("test")
    lens_trace.set_late_threshold(0.02)
    world = 20

    def rank_main(rank):
        if rank >= 2:
            time.sleep(0.06 + 0.004 * rank)  # 18 late ranks, each later than the one before
        if rank == 0:
            with tracer.start_as_current_span("train_step"):
                broadcast_trace_context(rank, src_rank=0)
        else:
            broadcast_trace_context(rank, src_rank=0)

    try:
        lens_trace.run_local(world, rank_main, timeout=10)
    finally:
        lens_trace.set_late_threshold(0.001)
    (step,) = [s for s in exporter.get_finished_spans() if s.name == "train_step"]
    late = [e.attributes for e in step.events if e.name == "lens.round.late_rank"]
    assert len(late) == MAX_LATE_EVENTS == 16, late
    ranks = [a["lens.round.rank"] for a in late]
    assert ranks == sorted(ranks, reverse=True) and min(ranks) >= 2, ranks
    assert all(a["lens.round.late_ns"] > 20_000_000 for a in late), late
    assert step.attributes["lens.round.last_rank"] == world - 1
