"""Which rank is slow and which rank is stuck, written into the trace as lens's Rust crates
write it (the same names, read by the same checks):

* after a broadcast whose source is this rank, where the group knows how the ranks came
  (``tcp_group``, ``local_cluster``), the source's current span
  gets ``lens.round.last_rank`` and ``lens.round.spread_ns``, and one ``lens.round.late_rank``
  event per rank later than :func:`set_late_threshold` after the first;
* when a broadcast times out, the rank leaves a ``lens.hang`` span (``lens.hang.round``,
  ``lens.hang.missing_ranks``, ``lens.hang.via`` where another rank found them missing,
  ``lens.hang.rank``, ``lens.hang.waited_ns``) with one
  ``lens.hang.open_span`` event per span still open, as far as an :class:`OpenSpans`
  processor on the provider has seen them, and flushes the provider before the error
  reaches the caller.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

__all__ = ["OpenSpans", "set_late_threshold", "set_hang_provider", "open_spans"]

LAST_RANK = "lens.round.last_rank"
SPREAD_NS = "lens.round.spread_ns"
LATE_EVENT = "lens.round.late_rank"
LATE_RANK = "lens.round.rank"
LATE_NS = "lens.round.late_ns"
MAX_LATE_EVENTS = 16

HANG_SPAN = "lens.hang"
HANG_ROUND = "lens.hang.round"
HANG_MISSING = "lens.hang.missing_ranks"
#: For each missing rank, the last round this rank knows it took part in (-1: unknown).
HANG_MISSING_LAST_SEEN = "lens.hang.missing_last_seen"
#: Where this rank learnt of the missing ranks when another rank found them missing.
HANG_VIA = "lens.hang.via"
HANG_RANK = "lens.hang.rank"
HANG_WAITED_NS = "lens.hang.waited_ns"
HANG_OPEN_EVENT = "lens.hang.open_span"
HANG_SPAN_NAME = "lens.hang.span_name"
HANG_SPAN_AGE_NS = "lens.hang.span_age_ns"
MAX_OPEN = 4096
MAX_HANG_EVENTS = 64

_late_threshold_ns = 1_000_000
_hang_provider: Any = None
_open: Dict[Tuple[int, int], Tuple[str, int]] = {}
_open_lock = threading.Lock()


def set_late_threshold(seconds: float) -> None:
    """How late after the first rank a rank must come to get a ``lens.round.late_rank``
    event on the source's span (default 1 ms), for this process."""
    global _late_threshold_ns
    if seconds < 0:
        raise ValueError(f"the late threshold must not be negative, got {seconds}")
    _late_threshold_ns = int(seconds * 1e9)


def set_hang_provider(provider: Any) -> None:
    """Where hang reports go: this tracer provider (flushed after each report), or the
    global one again with ``None`` (the default)."""
    global _hang_provider
    _hang_provider = provider


class OpenSpans(SpanProcessor):
    """A span processor that keeps the spans open in this process (name and start), so
    that a hang report names where the rank was (reports themselves are left out: another
    rank's, open for a moment in the same process, says nothing). Add it to the tracer
    provider."""

    def on_start(self, span: Span, parent_context: Optional[Context] = None) -> None:
        if span.name == HANG_SPAN:
            return
        sc = span.get_span_context()
        with _open_lock:
            if len(_open) < MAX_OPEN:
                _open[(sc.trace_id, sc.span_id)] = (span.name, span.start_time or time.time_ns())

    def on_end(self, span: ReadableSpan) -> None:
        sc = span.get_span_context()
        with _open_lock:
            _open.pop((sc.trace_id, sc.span_id), None)

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def open_spans() -> List[Tuple[str, int]]:
    """The spans open in this process now, oldest first: name and start (ns since the
    epoch)."""
    with _open_lock:
        spans = list(_open.values())
    return sorted(spans, key=lambda s: (s[1], s[0]))


def record_arrivals(group: Any, context: Optional[Context], span: Optional[trace.Span] = None) -> None:
    """The source, after its broadcast: how the ranks came, on its current span (``span``,
    where the caller has it already)."""
    take = getattr(group, "take_arrivals", None)
    if take is None:
        return
    try:  # lens's groups pick the late ranks natively; another group's may not take arguments
        got = take(_late_threshold_ns, MAX_LATE_EVENTS)
    except TypeError:
        got = take()
    if got is None:
        return
    last_rank, spread_ns, ranks = got
    if span is None:
        span = trace.get_current_span(context)
    if not span.is_recording():
        return
    # Two calls, not one `set_attributes`: the SDK (1.45) cleans a mapping as one value
    # first, and one call of two attributes took 7.3-8.0 µs against 5.4-5.8 for two calls.
    span.set_attribute(LAST_RANK, int(last_rank))
    span.set_attribute(SPREAD_NS, int(spread_ns))
    late = [(r, ns) for r, ns in ranks if ns > _late_threshold_ns][:MAX_LATE_EVENTS]
    for r, ns in late:
        span.add_event(LATE_EVENT, {LATE_RANK: int(r), LATE_NS: int(ns)})


def report_hang(
    group: Any,
    missing: List[int],
    after: Optional[float],
    last_seen: Optional[Dict[int, int]] = None,
    via: Optional[List[int]] = None,
) -> None:
    """A broadcast timed out on this rank: the ``lens.hang`` span, flushed."""
    open_now = open_spans()
    attributes: Dict[str, Any] = {
        HANG_RANK: int(group.rank),
        HANG_MISSING: [int(r) for r in missing],
    }
    if last_seen:
        attributes[HANG_MISSING_LAST_SEEN] = [int(last_seen.get(r, -1)) for r in missing]
    if via:
        attributes[HANG_VIA] = [int(r) for r in via]
    if after is not None:
        attributes[HANG_WAITED_NS] = int(after * 1e9)
    rounds = getattr(group, "rounds_started", None)
    round_no = rounds() if rounds is not None else None
    if round_no is not None:
        attributes[HANG_ROUND] = int(round_no)
    provider = _hang_provider if _hang_provider is not None else trace.get_tracer_provider()
    tracer = provider.get_tracer("lens_trace")
    span = tracer.start_span(HANG_SPAN, attributes=attributes)
    now = time.time_ns()
    for name, started in open_now[:MAX_HANG_EVENTS]:
        span.add_event(HANG_OPEN_EVENT, {HANG_SPAN_NAME: name, HANG_SPAN_AGE_NS: max(0, now - started)})
    through = "".join(f"waiting for rank {r}, which is " for r in (via or []))
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"timed out {through}waiting for rank(s) {missing}"))
    span.end()
    flush = getattr(provider, "force_flush", None)
    if flush is not None:
        try:
            flush()
        except Exception:  # noqa: BLE001 - a report must never hide the timeout itself
            pass
