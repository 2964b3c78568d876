"""Finished spans as JSON lines, in the shape lens-trace/examples/mixed_rank.rs writes."""

import json
from typing import Iterable

from opentelemetry import trace


def dump(spans: Iterable, rank: int, path: str, step_key: str = "nv.dl.step") -> None:
    with open(path, "w") as f:
        for s in spans:
            sc = s.get_span_context()
            row = {
                "rank": rank,
                "lang": "python",
                "name": s.name,
                "step": s.attributes.get(step_key),
                "trace_id": trace.format_trace_id(sc.trace_id),
                "span_id": trace.format_span_id(sc.span_id),
                "parent_span_id": trace.format_span_id(s.parent.span_id) if s.parent else None,
                "kind": s.kind.name,
                "attributes": {k: v if isinstance(v, (bool, int, float, str)) else list(v) for k, v in (s.attributes or {}).items()},
                "links": [
                    {
                        "trace_id": trace.format_trace_id(link.context.trace_id),
                        "span_id": trace.format_span_id(link.context.span_id),
                        "attributes": {k: str(v) for k, v in (link.attributes or {}).items()},
                    }
                    for link in s.links
                ],
            }
            f.write(json.dumps(row) + "\n")
