"""Keep or drop each step whole, on every rank, decided after the step: lens's step sampler
for the OpenTelemetry Python SDK.

::

    provider.add_span_processor(
        lens_trace.StepSampler(BatchSpanProcessor(exporter), rules="slower-than=25ms,baseline=50")
    )

A *step* is what a rank records between two :func:`lens_trace.distributed.broadcast_trace_context`
calls of its group (code written for NeMo Lens calls it once a step). The processor holds
each span until its step is decided; the group's source decides it (the rules of
``LENS_SAMPLE``: ``slower-than``, ``spread-over``, votes, ``baseline``) and its decision
travels in a later broadcast's carrier, so every rank keeps or drops the same steps. A kept
span carries ``lens.sample.reason`` and ``lens.sample.step`` and the tracestate
``ot=th:...`` (``0`` when a rule kept it, the 1/K threshold for the baseline); the first
kept span after dropped steps carries ``lens.sample.dropped_steps`` and
``lens.sample.dropped_spans``. A span with an error status, or :meth:`StepSampler.keep_this_step`,
votes for its step. What the processor holds is kept when a broadcast fails and when it
shuts down; past ``max_spans`` it keeps the step at once and votes for it.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanContext, StatusCode, TraceState

__all__ = ["StepSampler", "REASON", "STEP", "DROPPED_STEPS", "DROPPED_SPANS"]

#: Why a step was kept (``slow``, ``vote``, ``baseline``, ``error``, ``exit``, ...).
REASON = "lens.sample.reason"
#: The step, in the source's count.
STEP = "lens.sample.step"
#: On the first kept span after dropped steps: how many steps this rank dropped since.
DROPPED_STEPS = "lens.sample.dropped_steps"
#: With it: how many spans those steps held on this rank.
DROPPED_SPANS = "lens.sample.dropped_spans"

_registry_lock = threading.Lock()
# id(group) -> the samplers that follow it (one rank's group: one, usually).
_registry: Dict[int, List["StepSampler"]] = {}


def after_round(group: Any) -> None:
    """Called by the broadcasts after each round: the samplers of ``group`` apply what
    was decided."""
    for s in _samplers_of(group):
        s._apply()


def round_failed(group: Any) -> None:
    """Called by the broadcasts when a round fails: what is held is kept."""
    for s in _samplers_of(group):
        s._keep_all("error")


def _samplers_of(group: Any) -> List["StepSampler"]:
    if not _registry:  # no sampler anywhere, the usual case: no lock on every round
        return []
    with _registry_lock:
        return list(_registry.get(id(group), ()))


def _with_threshold(state: TraceState, th: str) -> TraceState:
    value = "th:" + th
    old = state.get("ot")
    if old:
        rest = [p for p in old.split(";") if p and not p.startswith("th:")]
        value = ";".join([value] + rest)
        return state.update("ot", value)
    return state.add("ot", value)


class StepSampler(SpanProcessor):
    """A span processor in front of ``next`` (the processor that exports): holds each
    span until its step is decided on the group's source, then passes it on or drops it.

    :param next: the processor kept spans go to (a batch or simple processor with the
        rank's exporter).
    :param rules: the rules, as ``LENS_SAMPLE`` takes them; ``None``: that variable's.
    :param group: the rank's lens group (by default :func:`lens_trace.distributed.get_group`);
        it is made to sample, which every rank must do before the steps it samples.
    :param max_spans: the most spans held; past it the step is kept at once (and voted for).
    :raises ConfigError: bad rules.
    """

    def __init__(
        self,
        next: SpanProcessor,
        rules: Optional[str] = None,
        group: Any = None,
        max_spans: int = 65536,
    ) -> None:
        if group is None:
            from .distributed import get_group

            group = get_group()
        group.sample(rules)
        self._next = next
        self._group = group
        self._max = max_spans
        self._lock = threading.Lock()
        self._held: Dict[int, List[ReadableSpan]] = {}
        self._count = 0
        self._passing: Optional[str] = None
        self._passing_step = -1
        # The latest step whose decision was applied.
        self._decided = 0
        self._dropped_steps = 0
        self._dropped_spans = 0
        with _registry_lock:
            _registry.setdefault(id(group), []).append(self)

    def keep_this_step(self) -> None:
        """Votes to keep this rank's current step, on every rank."""
        self._group.sample_vote()

    def on_start(self, span: Span, parent_context: Optional[Context] = None) -> None:
        self._next.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        step = self._group.sample_step() or 0
        out: List[ReadableSpan] = []
        with self._lock:
            if step == 0:
                out.append(span)
            elif self._passing is not None and self._passing_step == step:
                out.append(self._kept(span, step, self._passing, "0", False))
            else:
                if span.status is not None and span.status.status_code == StatusCode.ERROR:
                    self._group.sample_vote()
                self._held.setdefault(step, []).append(span)
                self._count += 1
                if self._count > self._max:
                    # Over the cap: this step is kept at once, and voted for everywhere.
                    self._group.sample_vote()
                    out.extend(self._release(step, "cap", "0"))
                    self._passing, self._passing_step = "cap", step
        for s in out:
            self._next.on_end(s)

    def _kept(self, span: ReadableSpan, step: int, reason: str, th: str, first: bool) -> ReadableSpan:
        attributes = dict(span.attributes or {})
        attributes[REASON] = reason
        attributes[STEP] = step
        if first and self._dropped_steps:
            attributes[DROPPED_STEPS] = self._dropped_steps
            attributes[DROPPED_SPANS] = self._dropped_spans
            self._dropped_steps = self._dropped_spans = 0
        sc = span.get_span_context()
        context = SpanContext(
            sc.trace_id,
            sc.span_id,
            sc.is_remote,
            sc.trace_flags,
            _with_threshold(sc.trace_state, th),
        )
        return ReadableSpan(
            name=span.name,
            context=context,
            parent=span.parent,
            resource=span.resource,
            attributes=attributes,
            events=span.events,
            links=span.links,
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    def _release(self, step: int, reason: Optional[str], th: str) -> List[ReadableSpan]:
        """Passes on (or, for ``reason`` None, drops) held step ``step``; under the lock."""
        spans = self._held.pop(step, None)
        if spans is None:
            return []
        self._count -= len(spans)
        if reason is None:
            self._dropped_steps += 1
            self._dropped_spans += len(spans)
            return []
        return [self._kept(s, step, reason, th, i == 0) for i, s in enumerate(spans)]

    def _apply(self) -> None:
        out: List[ReadableSpan] = []
        current = self._group.sample_step() or 0
        with self._lock:
            for step, reason, th in self._group.sample_decisions(self._decided):
                self._decided = max(self._decided, step)
                out.extend(self._release(step, reason, th))
            # Too old for a decision to come (a source that does not sample, a lost one).
            for step in [s for s in self._held if s + 1 < current]:
                out.extend(self._release(step, "undecided", "0"))
            self._passing = None
        for s in out:
            self._next.on_end(s)

    def _keep_all(self, reason: str) -> None:
        out: List[ReadableSpan] = []
        with self._lock:
            for step in sorted(self._held):
                out.extend(self._release(step, reason, "0"))
            self._passing, self._passing_step = reason, self._group.sample_step() or 0
        for s in out:
            self._next.on_end(s)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flushes the next processor; held steps stay held (their decision is to come)."""
        return self._next.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Keeps what is held, then shuts the next processor down."""
        self._keep_all("exit")
        with _registry_lock:
            mine = _registry.get(id(self._group), [])
            if self in mine:
                mine.remove(self)
        self._next.shutdown()
