"""One rank of a TCP test: joins the group from the environment, then (unless --idle) makes
one broadcast from rank 0 inside a span, and prints what happened as one JSON line."""

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
    try:
        if group.rank == 0:
            with tracer.start_as_current_span("train_step"):
                carrier = broadcast_trace_context(group.rank, group=group)
        else:
            carrier = broadcast_trace_context(group.rank, group=group)
        return {"stage": "broadcast", "carrier": carrier}
    except lens_trace.LensError as e:
        return {
            "stage": "broadcast",
            "error": type(e).__name__,
            "kind": e.kind,
            "missing": getattr(e, "missing_ranks", None),
            "waited": time.monotonic() - t0,
            "text": str(e),
        }


if __name__ == "__main__":
    print(json.dumps(outcome()), flush=True)
