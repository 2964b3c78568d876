"""A lens group over an existing ``torch.distributed`` process group.

One collective per carrier: a fixed-size byte tensor (the slab, with lens's header) is
broadcast with ``async_op=True`` and waited for against a deadline, so a rank that never
arrives raises :class:`~lens_trace.errors.BroadcastTimeout` instead of hanging (NeMo Lens
sends two collectives, a length then the bytes, and waits forever). torch is imported only
when :func:`torch_group` is called.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from datetime import timedelta
from typing import Any, Optional

from . import _native
from .errors import UnavailableError

__all__ = ["torch_group", "DEFAULT_SLAB_SIZE"]

#: Bytes per broadcast, header included: a carrier of a traceparent, a tracestate and some
#: baggage fits; a longer one costs a second collective.
DEFAULT_SLAB_SIZE = 256


_last_timedelta: "tuple[int, timedelta]" = (-1, timedelta(0))

# Every group torch_group made and not yet collected, closed at exit: each holds torch's
# process group (through its collective), which must go while the interpreter is whole,
# not in its teardown, where a gloo group's threads have been seen to end the process
# with "terminate called without an active exception".
_made: "weakref.WeakSet[Any]" = weakref.WeakSet()
_made_lock = threading.Lock()
_atexit_registered = False


def _close_made() -> None:
    with _made_lock:
        groups = list(_made)
    for g in groups:
        g.close()


def _remember(group: Any) -> None:
    global _atexit_registered
    with _made_lock:
        _made.add(group)
        if not _atexit_registered:
            # Registered after torch was imported, so it runs before torch's own hooks.
            atexit.register(_close_made)
            _atexit_registered = True


def _timedelta(seconds: float) -> timedelta:
    """``seconds`` (at least 1 ms) as a ``timedelta``, in whole milliseconds rounded down.
    A round's time left barely changes from one round to the next, so the last one made is
    usually the one asked for (a new one costs about 1.5 µs)."""
    global _last_timedelta
    ms = max(int(seconds * 1000), 1)
    last_ms, td = _last_timedelta
    if ms != last_ms:
        td = timedelta(milliseconds=ms)
        _last_timedelta = (ms, td)
    return td


# How long a GPU collective's wait polls before its first sleep, in seconds.
_SPIN = 50e-6


def _wait(work: Any, timeout: float, cpu: bool) -> None:
    """Waits for an async torch collective within ``timeout`` seconds.

    On the CPU (gloo) ``Work.wait`` blocks this thread, with the GIL released, until the
    collective completes or the timeout passes: no polling, so no sleep is added to a round
    that takes microseconds. On a GPU ``Work.wait`` only orders the stream, so the deadline
    is kept by polling ``is_completed``: without sleeping for the first ``_SPIN`` seconds
    (a broadcast of a slab on a GPU takes tens of µs), then with the shortest sleeps, then
    longer and longer ones. ``time.sleep(0)`` is a timed sleep like any other: about 80 µs
    under Linux's default timer slack, which a poll that only yields would add to a round.
    """
    if cpu:
        try:
            done = work.wait(timeout=_timedelta(timeout))
        except RuntimeError as e:
            if "timed out" in str(e).lower() or "timeout" in str(e).lower():
                raise TimeoutError(f"the torch collective did not complete within {timeout:.3f} s: {e}") from e
            raise
        if done is False:
            raise TimeoutError(f"the torch collective did not complete within {timeout:.3f} s")
        return
    start = time.monotonic()
    deadline = start + timeout
    busy_until = start + _SPIN
    spins = 0
    pause = 20e-6
    while not work.is_completed():
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutError(f"the torch collective did not complete within {timeout:.3f} s")
        if now < busy_until:
            continue
        if spins < 200:
            spins += 1
            time.sleep(0)  # the shortest sleep: about 80 µs with the default timer slack
        else:
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
    work.wait()  # raises the backend's own error, if it failed


def torch_group(
    process_group: Any = None,
    *,
    timeout: float = 30.0,
    slab_size: int = DEFAULT_SLAB_SIZE,
    device: Any = None,
    arrivals_every: int = 0,
) -> "_native.Group":
    """A lens group on ``process_group`` (default: the world), any torch backend.

    Every rank of the process group must call it. ``device`` is where the byte tensor lives
    (default: ``cuda`` for NCCL groups, ``cpu`` otherwise). After a failed round (a
    timeout) the group refuses later rounds with ``GroupClosed``: this rank is out of step
    with its peers, and the torch group should be torn down.

    ``arrivals_every=n`` (default 0: never): every n rounds each rank's entry time (its
    wall clock) goes to the source after the broadcast, one ``all_gather`` of an int64
    per rank, so the source's step span gets ``lens.round.last_rank`` and
    ``lens.round.spread_ns`` (:mod:`lens_trace.observe`). Such a round waits for every rank
    on every rank, and ranks on hosts whose clocks differ add their offsets to the spread.

    :raises UnavailableError: torch is not installed or ``torch.distributed`` is not
        initialised.
    """
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise UnavailableError(f"torch is not importable: {e}", kind="unavailable") from e
    if not dist.is_available() or not dist.is_initialized():
        raise UnavailableError(
            "torch.distributed is not initialised: call init_process_group first", kind="unavailable"
        )
    pg = process_group if process_group is not None else dist.group.WORLD
    rank = dist.get_rank(pg)
    world_size = dist.get_world_size(pg)
    if device is None:
        device = "cuda" if dist.get_backend(pg) == "nccl" else "cpu"
    device = torch.device(device)

    cpu = device.type == "cpu"
    # The process group's own broadcast, with the group's rank as the root: what
    # `dist.broadcast` calls after its checks (about 6 µs of Python per call, which lens's
    # arguments never need: one tensor, a root inside the group).
    direct = hasattr(dist, "BroadcastOptions") and callable(getattr(pg, "broadcast", None))
    world = pg is dist.group.WORLD
    global_rank = [r if world else dist.get_global_rank(pg, r) for r in range(world_size)]

    options: "dict[int, Any]" = {}  # BroadcastOptions by root, made once each

    def launch(t: Any, root: int) -> Any:
        if direct:
            opts = options.get(root)
            if opts is None:
                opts = dist.BroadcastOptions()
                opts.rootRank = root
                opts.rootTensor = 0
                options[root] = opts
            return pg.broadcast([t], opts)
        return dist.broadcast(t, src=global_rank[root], group=pg, async_op=True)

    def collective(buf: bytearray, root: int, left: float) -> None:
        if len(buf) == slab_size:
            slab[:] = buf
            host = slab_tensor
            t = host if cpu else on_device
            if t is not host:
                t.copy_(host)
        else:  # a long carrier's rest: once in a while
            host = torch.frombuffer(buf, dtype=torch.uint8)  # shares buf's memory
            t = host if cpu else host.to(device)
        _wait(launch(t, root), left, cpu)
        if t is not host:
            host.copy_(t.cpu())
        if host is slab_tensor:
            buf[:] = slab

    def gather(value: int, root: int, left: float) -> "list[int]":
        mine = torch.tensor([value], dtype=torch.int64, device=device)
        every = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world_size)]
        _wait(dist.all_gather(every, mine, group=pg, async_op=True), left, cpu)
        return torch.cat(every).cpu().tolist()  # one copy to the host, not one per rank

    group = _native.callback_group(
        collective,
        rank,
        world_size,
        timeout=timeout,
        slab_size=slab_size,
        gather=gather,
        arrivals_every=arrivals_every,
    )
    # Made once the slab size is known to be good: each round's slab is copied into this
    # buffer, whose tensor is made once (cheaper than a tensor over each round's new one).
    slab = bytearray(slab_size)
    slab_tensor = torch.frombuffer(slab, dtype=torch.uint8)
    on_device = None if cpu else slab_tensor.to(device)
    _remember(group)
    return group
