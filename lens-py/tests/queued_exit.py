"""One rank of a queued TCP group held in a module global and never closed: rank 0 makes
one broadcast and falls off the end of the script (with --os-exit, leaves by os._exit);
rank 1 joins, waits 1.5 s, then takes part and prints the carrier as a JSON line."""

import json
import os
import sys
import time

from opentelemetry.sdk.trace import TracerProvider

import lens_trace
from lens_trace.distributed import broadcast_trace_context

GROUP = lens_trace.tcp_group()  # LENS_TCP_SOURCE_RETURNS=queued comes from the test

if GROUP.rank == 0:
    t0 = time.monotonic()
    with TracerProvider().get_tracer("probe").start_as_current_span("train_step"):
        broadcast_trace_context(0, group=GROUP)
    print(json.dumps({"returned_after": time.monotonic() - t0}), flush=True)
    if "--os-exit" in sys.argv:
        os._exit(0)
else:
    time.sleep(1.5)
    print(json.dumps({"carrier": broadcast_trace_context(1, group=GROUP)}), flush=True)
