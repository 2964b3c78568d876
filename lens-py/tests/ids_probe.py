"""Seeds ``random`` as training frameworks do on every rank, then prints the trace and span
id of one span: from lens_trace's provider, or (--sdk-default) from the SDK's own."""

import json
import random
import sys

from opentelemetry.sdk.trace import TracerProvider

import lens_trace

random.seed(1234)
if "--sdk-default" in sys.argv:
    provider = TracerProvider()
else:
    provider = lens_trace.tracer_provider(rank=0, world_size=1)
span = provider.get_tracer("ids").start_span("step")
sc = span.get_span_context()
print(json.dumps([sc.trace_id, sc.span_id]))
