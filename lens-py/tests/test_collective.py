"""Groups over a collective written in Python: lens's slab round on a real in-process
collective made of threads, and on torch.distributed (gloo) when torch is importable."""

import importlib.util
import os
import threading
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider

import lens_trace
from conftest import free_port
from lens_trace.distributed import broadcast_trace_context


class ThreadCollective:
    """A broadcast among threads: the root publishes its buffer, the others copy it; each
    call waits at most its timeout (and raises TimeoutError past it), like a real one.
    ``calls`` counts collectives per rank."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.cond = threading.Condition()
        self.rounds = {}
        self.calls = [0] * world
        self.skip_rank = None

    def for_rank(self, rank: int):
        count = [0]

        def collective(buf: bytearray, root: int, timeout: float) -> None:
            n = count[0]
            count[0] += 1
            self.calls[rank] += 1
            deadline = time.monotonic() + timeout
            with self.cond:
                if rank == root:
                    self.rounds[n] = bytes(buf)
                    self.cond.notify_all()
                    return
                while n not in self.rounds:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"round {n}: root {root} never sent")
                    self.cond.wait(left)
                buf[:] = self.rounds[n]

        return collective


def run_ranks(world, fn):
    out, errs = [None] * world, [None] * world

    def body(r):
        try:
            out[r] = fn(r)
        except Exception as e:  # noqa: BLE001
            errs[r] = e

    ts = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    return out, errs


def test_one_collective_per_carrier_and_a_second_only_for_a_long_one():
    world = 3
    coll = ThreadCollective(world)
    groups = [lens_trace.callback_group(coll.for_rank(r), r, world, timeout=5, slab_size=256) for r in range(world)]
    tracer = TracerProvider().get_tracer("t")

    def rank_main(r):
        if r == 0:
            with tracer.start_as_current_span("step"):
                return broadcast_trace_context(r, group=groups[r])
        return broadcast_trace_context(r, group=groups[r])

    out, errs = run_ranks(world, rank_main)
    assert errs == [None] * world, errs
    assert out[0] and out.count(out[0]) == world
    assert coll.calls == [1] * world, "one collective per carrier"
    long = b"x" * 1000
    out, errs = run_ranks(world, lambda r: groups[r].broadcast(0, long if r == 0 else None))
    assert errs == [None] * world and out == [long] * world
    assert coll.calls == [3] * world, "a payload over the slab takes exactly one more"


def test_a_collective_that_times_out_raises_and_the_group_then_refuses_rounds():
    coll = ThreadCollective(2)
    g1 = lens_trace.callback_group(coll.for_rank(1), 1, 2, timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(lens_trace.BroadcastTimeout):
        broadcast_trace_context(1, group=g1)  # rank 0 never calls
    assert time.monotonic() - t0 < 5
    with pytest.raises(lens_trace.GroupClosed):
        broadcast_trace_context(1, group=g1)


def test_a_failing_collective_keeps_its_error():
    def broken(buf, root, timeout):
        raise RuntimeError("the device fell off the bus")

    g = lens_trace.callback_group(broken, 1, 2, timeout=1)
    with pytest.raises(lens_trace.TransportError, match="fell off the bus") as got:
        g.broadcast(0)
    # The message is the whole chain, each part once: what lens did, then what Python raised.
    text = str(got.value)
    assert text.count("the collective raised") == 1 and text.count("fell off the bus") == 1, text


def test_callback_group_checks_its_arguments():
    with pytest.raises(TypeError):
        lens_trace.callback_group("not callable", 0, 2)
    with pytest.raises(lens_trace.ConfigError):
        lens_trace.callback_group(lambda *a: None, 2, 2)
    with pytest.raises(lens_trace.ConfigError):
        lens_trace.callback_group(lambda *a: None, 0, 2, slab_size=8)


HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_torch_group_without_an_initialised_torch_is_unavailable():
    if HAS_TORCH:
        pytest.skip("torch is installed: this checks the message without it")
    with pytest.raises(lens_trace.UnavailableError, match="torch"):
        lens_trace.torch_group()


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (scripts/test.sh does not download it)")
def test_torch_group_over_gloo_in_two_processes(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys, torch.distributed as dist\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "import lens_trace\n"
        "from lens_trace.distributed import broadcast_trace_context\n"
        "dist.init_process_group('gloo')\n"
        "g = lens_trace.torch_group(timeout=10)\n"
        "t = TracerProvider().get_tracer('t')\n"
        "r = dist.get_rank()\n"
        "if r == 0:\n"
        "    with t.start_as_current_span('s'):\n"
        "        c = broadcast_trace_context(r, group=g)\n"
        "else:\n"
        "    c = broadcast_trace_context(r, group=g)\n"
        "print(c['traceparent'])\n"
        "dist.destroy_process_group()\n"
    )
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120)[0])
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), outs
    assert outs[0].strip().splitlines()[-1] == outs[1].strip().splitlines()[-1]


def test_closing_a_callback_group_lets_go_of_its_collective_at_once():
    # A torch group's collective holds torch's process group: close() must drop it then
    # (with the GIL), not whenever the extension next takes the GIL.
    import gc
    import weakref

    class Collective:
        def __call__(self, buf, root, left):
            pass

    coll = Collective()
    gone = weakref.ref(coll)
    g = lens_trace.callback_group(coll, 0, 1, timeout=5)
    del coll
    gc.collect()
    assert gone() is not None, "the open group holds its collective"
    g.close()
    assert gone() is None, "close() let go of the collective"


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (scripts/test.sh installs it)")
def test_a_torch_group_left_open_is_closed_at_exit(tmp_path):
    # A script that keeps its group in a global and never closes it: lens closes it at exit,
    # before the interpreter's teardown. An exit hook registered before torch and lens were
    # imported runs after theirs, and sees the group closed.
    import subprocess
    import sys

    script = tmp_path / "rank.py"
    script.write_text(
        "import atexit\n"
        "kept = {}\n"
        "atexit.register(lambda: print('closed at exit:', kept['g'].closed, flush=True))\n"
        "import torch.distributed as dist\n"
        "import lens_trace\n"
        "dist.init_process_group('gloo')\n"
        "kept['g'] = lens_trace.torch_group(timeout=10)\n"
        "kept['g'].broadcast(0, b'x' if dist.get_rank() == 0 else None)\n"
        "print('open after a round:', not kept['g'].closed, flush=True)\n"
        "dist.destroy_process_group()\n"
    )
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
        assert "open after a round: True" in out and "closed at exit: True" in out, out
