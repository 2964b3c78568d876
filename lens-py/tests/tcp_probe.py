"""One rank of a TCP test: joins the group from the environment, then (unless --idle) makes
one broadcast from rank 0 inside a span (two with --twice), and prints what happened as one
JSON line."""

import json
import sys
import time

from opentelemetry.sdk.trace import TracerProvider

import lens_trace
from lens_trace.distributed import broadcast_trace_context


def outcome() -> dict:
    try:
        group = lens_trace.tcp_group()
    except lens_trace.LensError as e:
        return {"stage": "join", "error": type(e).__name__, "kind": e.kind, "missing": getattr(e, "missing_ranks", None), "text": str(e)}
    if "--idle" in sys.argv:
        time.sleep(60)  # in the group, never broadcasting; the test kills it
        return {"stage": "idle"}
    tracer = TracerProvider().get_tracer("probe")
    t0 = time.monotonic()
    done = []
    try:
        for _ in range(2 if "--twice" in sys.argv else 1):
            t0 = time.monotonic()
            if group.rank == 0:
                with tracer.start_as_current_span("train_step"):
                    carrier = broadcast_trace_context(group.rank, group=group)
            else:
                carrier = broadcast_trace_context(group.rank, group=group)
            done.append({"carrier": carrier, "took": time.monotonic() - t0})
        res = {"stage": "broadcast", "carrier": carrier, "done": done}
        if "--flush" in sys.argv:
            res.update(flushed(group))
        return res
    except lens_trace.LensError as e:
        return {
            "stage": "broadcast",
            "error": type(e).__name__,
            "kind": e.kind,
            "missing": getattr(e, "missing_ranks", None),
            "waited": time.monotonic() - t0,
            "text": str(e),
            "done": done,
            **(flushed(group) if "--flush" in sys.argv else {}),
        }


def flushed(group) -> dict:
    """With --flush: what ``group.flush()`` then ``group.close()`` said."""
    out = {}
    for step in ("flush", "close"):
        try:
            getattr(group, step)()
            out[step] = "ok"
        except lens_trace.LensError as e:
            out[step] = type(e).__name__
            out[step + "_missing"] = getattr(e, "missing_ranks", None)
    return out


if __name__ == "__main__":
    print(json.dumps(outcome()), flush=True)
