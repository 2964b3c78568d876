"""Run code written for one rank on N in-process ranks, for unit tests."""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

from . import _native, distributed

__all__ = ["run_local"]


def run_local(world_size: int, fn: Callable[[int], Any], *, timeout: Optional[float] = 30.0) -> List[Any]:
    """Calls ``fn(rank)`` for every rank of a new in-process cluster, each in its own
    thread whose default group (what :func:`~lens_trace.distributed.broadcast_trace_context`
    uses without ``group=``) is that rank's. Returns the results in rank order; re-raises
    the first rank's exception (lowest rank first) after every thread has ended.

    ``timeout`` bounds each broadcast, so a rank that fails or skips one makes the others
    raise :class:`~lens_trace.errors.BroadcastTimeout` instead of waiting forever.
    """
    groups = _native.local_cluster(world_size, timeout=timeout)
    results: List[Any] = [None] * world_size
    errors: List[Optional[BaseException]] = [None] * world_size

    def body(group: Any) -> None:
        distributed._thread.group = group
        try:
            results[group.rank] = fn(group.rank)
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            errors[group.rank] = e
        finally:
            distributed._thread.group = None
            group.close()

    threads = [threading.Thread(target=body, args=(g,), name=f"lens-rank-{g.rank}", daemon=True) for g in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results
