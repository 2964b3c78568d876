"""lens_trace.StepSampler: NeMo Lens-style code (one broadcast_trace_context a step) keeps or
drops each step whole on every rank, as lens's source decided it."""

import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

import lens_trace
from lens_trace.distributed import broadcast_trace_context, create_linked_span

STEPS = 10


def _run(rules, act, world=3, steps=STEPS, timeout=10):
    """Each rank: a provider through a StepSampler; a span per step around the
    broadcast, and ``act(rank, step, span, sampler)`` in it. Returns each rank's exported
    spans."""

    def rank_main(rank):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        sampler = lens_trace.StepSampler(SimpleSpanProcessor(exporter), rules=rules)
        provider.add_span_processor(sampler)
        tracer = provider.get_tracer("test")
        for step in range(steps):
            with tracer.start_as_current_span("train_step", attributes={"nv.dl.step": step}) as span:
                carrier = broadcast_trace_context(rank, src_rank=0)
                create_linked_span(tracer, "stage", remote_carrier=carrier, step=step).end()
                act(rank, step, span, sampler)
        provider.shutdown()
        return list(exporter.get_finished_spans())

    return lens_trace.run_local(world, rank_main, timeout=timeout)


def _steps(spans):
    out = {}
    for s in spans:
        out.setdefault(s.attributes["lens.sample.step"], []).append(s)
    return out


def test_every_rank_keeps_the_steps_a_vote_or_an_error_kept_whole():
    def act(rank, step, span, sampler):
        if rank == 2 and step == 3:
            sampler.keep_this_step()
        if rank == 1 and step == 6:
            span.set_status(Status(StatusCode.ERROR, "it broke"))

    got = _run("slower-than=60s", act)
    kept = [sorted(_steps(spans)) for spans in got]
    # lens's steps count from 1 (the first broadcast): steps 3 and 6 are its 4 and 7; the
    # last two were undecided when the providers shut down.
    assert kept[0] == [4, 7, STEPS - 1, STEPS], kept
    assert kept[1] == kept[0] and kept[2] == kept[0], kept
    for spans in got:
        for step, of_step in _steps(spans).items():
            assert len(of_step) == 2, f"step {step} whole: {of_step}"
        for s in spans:
            assert s.get_span_context().trace_state.get("ot") == "th:0", s
        reasons = {s.attributes["lens.sample.step"]: s.attributes["lens.sample.reason"] for s in spans}
        assert reasons[4] == "vote" and reasons[7] == "vote" and reasons[STEPS] == "exit", reasons
        counted = sum(s.attributes.get("lens.sample.dropped_steps", 0) for s in spans)
        assert counted == STEPS - 4, "the dropped steps are counted on the next kept span"


def test_a_slow_step_is_kept_whole_on_every_rank():
    def act(rank, step, span, sampler):
        if rank == 1 and step == 4:
            time.sleep(0.15)

    got = _run("slower-than=100ms", act)
    for rank, spans in enumerate(got):
        steps = _steps(spans)
        assert 5 in steps and len(steps[5]) == 2, (rank, sorted(steps))
        # Slow at the source, or by rank 1's own vote (its part was over the threshold).
        assert steps[5][0].attributes["lens.sample.reason"] in ("slow", "vote")


def test_the_baseline_carries_its_threshold():
    got = _run("baseline=2", lambda *a: None, world=2, steps=200)
    kept = [sorted(s for s, of in _steps(spans).items() if of[0].attributes["lens.sample.reason"] == "baseline") for spans in got]
    assert kept[0] == kept[1]
    # 1 in 2 of 198 decided steps: 99, sd 7.
    assert 60 <= len(kept[0]) <= 140, len(kept[0])
    for s in got[0]:
        if s.attributes["lens.sample.reason"] == "baseline":
            assert s.get_span_context().trace_state.get("ot") == "th:8", s


def test_bad_rules_are_refused_saying_which():
    def rank_main(rank):
        with pytest.raises(lens_trace.ConfigError) as e:
            lens_trace.StepSampler(SimpleSpanProcessor(InMemorySpanExporter()), rules="faster-than=1ms")
        return str(e.value)

    (message,) = lens_trace.run_local(1, rank_main)
    assert "LENS_SAMPLE" in message and "faster-than" in message, message


def test_the_source_span_still_names_the_straggler_when_sampling():
    def act(rank, step, span, sampler):
        if rank == 1 and step == 4:
            time.sleep(0.1)

    lens_trace.set_late_threshold(0.05)
    try:
        got = _run("baseline=1", act, steps=7)
    finally:
        lens_trace.set_late_threshold(0.001)
    # Rank 1 came late to the broadcast of loop step 5: the source's span of that step.
    (after,) = [s for s in got[0] if s.name == "train_step" and s.attributes["nv.dl.step"] == 5]
    assert after.attributes.get("lens.round.last_rank") == 1, dict(after.attributes)
