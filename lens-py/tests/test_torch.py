"""On real torch (gloo, processes on 127.0.0.1): the NeMo Lens loop unchanged but the import,
run with both imports; a subgroup; a rank that skips a step; no group with and without
``init_process_group``."""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from conftest import TESTS, Procs, free_port, read_spans

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_NEMO = HAS_TORCH and importlib.util.find_spec("nemo") is not None and importlib.util.find_spec("nemo.lens") is not None

pytestmark = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (scripts/test.sh installs it)")

WORLD, STEPS = 4, 3


def torch_env(rank, world, port, **extra):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.update(GLOO_SOCKET_IFNAME="lo", PYTHONPATH=str(TESTS))
    env.update(extra)
    return env


def run_job(procs: Procs, script: Path, args, world=WORLD, deadline=180, **extra):
    port = free_port()
    for r in range(world):
        procs.start([sys.executable, str(script), *[a.format(rank=r) for a in args]], torch_env(r, world, port, **extra))
    return procs.wait_all(deadline)


def nemo_variant(tmp_path: Path) -> Path:
    """tests/nemo_loop.py with NeMo Lens's import put back: the only line that differs."""
    text = (TESTS / "nemo_loop.py").read_text()
    ours = "from lens_trace.distributed import broadcast_trace_context, create_linked_span"
    assert text.count(ours) == 1
    path = tmp_path / "nemo_loop_nemo.py"
    path.write_text(text.replace(ours, "from nemo.lens.distributed import broadcast_trace_context, create_linked_span"))
    return path


def loop_result(spans):
    """What the loop recorded, by step: the source's span, and each stage's link and
    attributes (ids replaced by whom they point to)."""
    steps = {s["step"]: s for s in spans if s["name"] == "train_step"}
    assert sorted(steps) == list(range(STEPS)) and all(s["rank"] == 0 for s in steps.values()), steps
    out = []
    for s in sorted((s for s in spans if s["name"] == "pp.recv_forward"), key=lambda s: (s["step"], s["rank"])):
        src = steps[s["step"]]
        linked = [(link["trace_id"], link["span_id"]) for link in s["links"]] == [(src["trace_id"], src["span_id"])]
        attrs = {k: v for k, v in s["attributes"].items()}
        out.append((s["step"], s["rank"], linked, s["kind"], attrs))
    assert len(out) == (WORLD - 1) * STEPS
    return out


# How many times the clean-exit tests run their job (the package README gives the result
# of 50).
EXIT_RUNS = int(os.environ.get("LENS_EXIT_RUNS", "3"))


def test_a_torch_job_with_lens_exits_with_status_0_every_time(tmp_path):
    """The NeMo loop over torch (4 ranks, gloo) returns normally on every rank, run after
    run: nothing in it leaves by ``os._exit``, and torch's and lens's teardown at
    interpreter exit must not abort."""
    for i in range(EXIT_RUNS):
        ps = Procs()
        try:
            res = run_job(ps, TESTS / "nemo_loop.py", ["torch", str(tmp_path / f"{i}-{{rank}}.jsonl")])
        finally:
            ps.kill()
        for r, (code, text) in enumerate(res):
            assert code == 0, f"run {i}, rank {r} exited with {code}:\n{text}"


def test_the_nemo_loop_runs_unchanged_on_torch_with_lens(procs: Procs, tmp_path):
    outs = [tmp_path / f"{r}.jsonl" for r in range(WORLD)]
    res = run_job(procs, TESTS / "nemo_loop.py", ["torch", str(tmp_path / "{rank}.jsonl")])
    for r, (code, text) in enumerate(res):
        assert code == 0, f"rank {r}:\n{text}"
    result = loop_result(read_spans(outs))
    for step, rank, linked, kind, attrs in result:
        assert linked, f"step {step} rank {rank}: not linked to rank 0's step span"
        assert kind == "INTERNAL" and attrs == {"step": step, "stage": rank, "kind": "forward", "token": "[REDACTED]"}


@pytest.mark.skipif(not HAS_NEMO, reason="nemo-lens is not installed (it needs Python 3.13; scripts/test.sh installs it there)")
def test_the_same_loop_gives_the_same_result_with_nemo_lens_and_lens(procs: Procs, tmp_path):
    results = {}
    for name, script in [("lens", TESTS / "nemo_loop.py"), ("nemo", nemo_variant(tmp_path))]:
        d = tmp_path / name
        d.mkdir()
        ps = Procs()
        try:
            res = run_job(ps, script, ["torch", str(d / "{rank}.jsonl")])
        finally:
            ps.kill()
        for r, (code, text) in enumerate(res):
            assert code == 0, f"{name} rank {r}:\n{text}"
        results[name] = loop_result(read_spans([d / f"{r}.jsonl" for r in range(WORLD)]))
    assert results["lens"] == results["nemo"]
    assert all(linked for _, _, linked, _, _ in results["lens"])


TORCH_RANK = '''
import os, sys, time, warnings
import torch.distributed as dist
from opentelemetry.sdk.trace import TracerProvider
import lens_trace
from lens_trace.distributed import broadcast_trace_context
mode = sys.argv[1]
tracer = TracerProvider().get_tracer("t")
def out(*a):
    print(*a, flush=True)
if mode == "no_init":
    # The same call before init_process_group: no group, None, as NeMo Lens.
    out("none" if broadcast_trace_context(int(os.environ["RANK"]), 0) is None else "carrier")
    sys.exit(0)
dist.init_process_group("gloo")
r, n = dist.get_rank(), dist.get_world_size()
if mode == "subgroup":
    # Two pipeline groups, {0, 2} and {1, 3}, each broadcasting from its first rank.
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    g = lens_trace.torch_group(groups[r % 2], timeout=20)
    if g.rank == 0:
        with tracer.start_as_current_span("s") as s:
            c = broadcast_trace_context(g.rank, 0, group=g)
    else:
        c = broadcast_trace_context(g.rank, 0, group=g)
    out("tp", r % 2, c["traceparent"])
    dist.destroy_process_group()
elif mode == "wrong_rank":
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(2):
            if r == 0:
                with tracer.start_as_current_span("s"):
                    c = broadcast_trace_context(0, 0)
            else:
                # An off-by-one in the caller: lens uses the group's rank, and warns once.
                c = broadcast_trace_context(r - 1, 0)
        out("tp", c["traceparent"], "warnings", sum(issubclass(x.category, RuntimeWarning) for x in w))
    dist.destroy_process_group()
elif mode == "sizes":
    # Carriers short, past the slab (its rest in a second collective), then short again:
    # every rank gets each one whole, nothing of a longer one left in the reused slab.
    from opentelemetry import baggage, context
    sizes = [0, 600, 3, 0, 1200, 1]
    got = []
    for i, size in enumerate(sizes):
        if r == 0:
            token = context.attach(baggage.set_baggage("k", "v" * size)) if size else None
            with tracer.start_as_current_span(f"s{i}"):
                c = broadcast_trace_context(r, 0)
            if token is not None:
                context.detach(token)
        else:
            c = broadcast_trace_context(r, 0)
        got.append((len(c.get("baggage", "")), c["traceparent"][:2]))
    out(*[f"{b}:{t}" for b, t in got])
    dist.destroy_process_group()
elif mode == "straggler":
    # Arrival times gathered every round: rank 2 comes 60 ms late to the second step, and
    # the source's span names it.
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace import TracerProvider as Provider
    exporter = InMemorySpanExporter()
    provider = Provider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    lens_trace.set_group(lens_trace.torch_group(timeout=20, arrivals_every=1))
    for step in range(2):
        dist.barrier()
        if r == 2 and step == 1:
            time.sleep(0.06)
        if r == 0:
            with provider.get_tracer("t").start_as_current_span(f"step{step}"):
                broadcast_trace_context(r, 0)
        else:
            broadcast_trace_context(r, 0)
    if r == 0:
        (span,) = [s for s in exporter.get_finished_spans() if s.name == "step1"]
        out("last", span.attributes.get("lens.round.last_rank"), "spread_ms", span.attributes.get("lens.round.spread_ns", 0) // 1_000_000)
    else:
        out("ok")
    dist.barrier()
    dist.destroy_process_group()
elif mode == "votes":
    # The step sampler over torch, arrival times gathered every round: rank 2's vote in
    # step 3 rides in the gather, and every rank keeps that step.
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace import TracerProvider as Provider
    lens_trace.set_group(lens_trace.torch_group(timeout=20, arrivals_every=1))
    exporter = InMemorySpanExporter()
    provider = Provider()
    sampler = lens_trace.StepSampler(SimpleSpanProcessor(exporter), rules="slower-than=60s")
    provider.add_span_processor(sampler)
    for step in range(8):
        with provider.get_tracer("t").start_as_current_span("step", attributes={"step": step}):
            broadcast_trace_context(r, 0)
            if r == 2 and step == 3:
                sampler.keep_this_step()
    provider.shutdown()
    kept = sorted({s.attributes["lens.sample.step"] for s in exporter.get_finished_spans()})
    out("kept", *kept)
    dist.barrier()
    dist.destroy_process_group()
elif mode == "skip":
    lens_trace.set_group(lens_trace.torch_group(timeout=2))
    if r == 0:
        with tracer.start_as_current_span("s"):
            broadcast_trace_context(r, 0)
    else:
        broadcast_trace_context(r, 0)
    if r == 0:
        out("skipped")  # the source skips the next step: the others time out, bounded
        time.sleep(4)
    else:
        t = time.monotonic()
        try:
            broadcast_trace_context(r, 0)
            out("no error")
        except lens_trace.BroadcastTimeout as e:
            out("timeout", isinstance(e, TimeoutError), round(time.monotonic() - t, 1), e.missing_ranks)
    # The gloo group is out of step (one broadcast never matched): it is torn down all the
    # same, and every rank returns with status 0.
    dist.destroy_process_group()
# Every mode returns normally: the job checks each rank's exit status.
'''


def torch_job(procs, tmp_path, mode, world=WORLD, deadline=120):
    script = tmp_path / "torch_rank.py"
    script.write_text(TORCH_RANK)
    res = run_job(procs, script, [mode], world=world, deadline=deadline)
    for r, (code, text) in enumerate(res):
        assert code == 0, f"{mode} rank {r}:\n{text}"
    return [text.strip().splitlines()[-1].split() for _, text in res]


def test_a_gpu_collective_s_wait_polls_without_a_timer_per_poll():
    """On a GPU, ``Work.wait`` only orders the stream, so lens polls ``is_completed``; its
    first polls do not sleep. ``time.sleep(0)`` there would be a timed sleep of its own,
    about 80 µs each under Linux's default timer slack: 100 polls, over 5 ms."""
    import time

    from lens_trace.torch_group import _wait

    class GpuWork:
        """Stands for a GPU collective's ``Work`` (no GPU here): done at the 100th poll."""

        def __init__(self) -> None:
            self.polls = 0

        def is_completed(self) -> bool:
            self.polls += 1
            return self.polls >= 100

        def wait(self) -> bool:
            return True

    work = GpuWork()
    start = time.perf_counter()
    _wait(work, 5.0, cpu=False)
    took = time.perf_counter() - start
    assert work.polls == 100
    assert took < 0.003, f"100 polls of a collective took {took * 1e3:.1f} ms: each slept on a timer"


def test_no_group_returns_none_before_init_process_group(procs: Procs, tmp_path):
    assert torch_job(procs, tmp_path, "no_init", world=2) == [["none"], ["none"]]


def test_a_subgroup_broadcasts_within_itself(procs: Procs, tmp_path):
    lines = torch_job(procs, tmp_path, "subgroup")
    by_group = {}
    for line in lines:
        assert line[0] == "tp"
        by_group.setdefault(line[1], set()).add(line[2])
    assert sorted(by_group) == ["0", "1"]
    assert all(len(tps) == 1 for tps in by_group.values()), by_group
    assert by_group["0"] != by_group["1"], "each subgroup has its own source"


def test_a_wrong_rank_argument_uses_the_group_s_rank_and_warns_once(procs: Procs, tmp_path):
    lines = torch_job(procs, tmp_path, "wrong_rank")
    assert len({line[1] for line in lines}) == 1, lines
    assert [line[3] for line in lines] == ["0"] + ["1"] * (WORLD - 1), lines


def test_carriers_of_every_size_arrive_whole_in_turn(procs: Procs, tmp_path):
    lines = torch_job(procs, tmp_path, "sizes", world=3)
    # "k=" and the value: 0 where no baggage was set.
    want = [f"{n + 2 if n else 0}:00" for n in (0, 600, 3, 0, 1200, 1)]
    assert lines == [want] * 3, lines


def test_gathered_arrivals_name_the_straggler_on_the_source_s_span(procs: Procs, tmp_path):
    lines = torch_job(procs, tmp_path, "straggler", world=3)
    assert lines[0][:2] == ["last", "2"], lines[0]
    assert int(lines[0][3]) >= 50, f"rank 2 came 60 ms late: {lines[0]}"
    assert lines[1:] == [["ok"], ["ok"]]


def test_a_vote_rides_in_the_gathered_arrivals_over_torch(procs: Procs, tmp_path):
    lines = torch_job(procs, tmp_path, "votes", world=3)
    # Loop step 3 is lens's step 4; the last two were undecided at shutdown.
    assert lines == [["kept", "4", "7", "8"]] * 3, lines


def test_a_source_that_skips_a_step_times_the_others_out_bounded(procs: Procs, tmp_path):
    lines = torch_job(procs, tmp_path, "skip")
    assert lines[0] == ["skipped"]
    for line in lines[1:]:
        assert line[0] == "timeout" and line[1] == "True", line
        assert float(line[2]) < 6, f"the 2 s deadline was not kept: {line}"
