"""A drop-in for ``nemo.lens.distributed``.

Change the import, pick the group once, and keep the calls::

    from lens_trace.distributed import broadcast_trace_context, create_linked_span
    import lens_trace
    lens_trace.set_group(lens_trace.tcp_group())      # the one added line

    carrier = broadcast_trace_context(rank, src_rank=0)
    span = create_linked_span(tracer, "pp.recv_forward", remote_carrier=carrier,
                              parent="remote", microbatch=3)

What differs from NeMo Lens, on purpose: one collective per broadcast (not a length then
the bytes), a deadline on every broadcast (:class:`~lens_trace.errors.BroadcastTimeout`
names the ranks that never came), ``None`` instead of ``{}`` when the source has no span,
attributes and links given when the span starts (so samplers see them), and
``parent="remote"`` to give every rank the source's trace id.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Optional, Union

from opentelemetry import trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .errors import ConfigError

__all__ = [
    "RemoteCarrier",
    "broadcast_trace_context",
    "create_linked_span",
    "get_group",
    "set_group",
    "inject_carrier",
    "LINK_SOURCE",
    "LINK_SOURCE_RANK",
]

#: Link attribute: how the remote context arrived ("broadcast", "carrier", "context",
#: "span_context"), as lens's Rust crates write it.
LINK_SOURCE = "lens.link.source"
#: Link attribute: the rank the remote context was broadcast from.
LINK_SOURCE_RANK = "lens.link.source_rank"

# W3C TraceContext then Baggage: the carrier's keys in the order NeMo Lens's bytes have.
_W3C = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
_PARENTS = ("current", "remote", "root", "auto")

_group_lock = threading.Lock()
_group: Optional[Any] = None
# Set by run_local: each thread of an in-process cluster has its own rank's group.
_thread = threading.local()


class RemoteCarrier(dict):
    """The carrier a broadcast returned: a plain ``dict`` of W3C headers (as NeMo Lens
    returns), which also remembers the rank it came from."""

    source_rank: Optional[int]

    def __init__(self, entries: Mapping[str, str], source_rank: Optional[int] = None) -> None:
        super().__init__(entries)
        self.source_rank = source_rank

    def context(self) -> Context:
        """The OpenTelemetry context it carries (remote span context and baggage)."""
        return _W3C.extract(self)

    def span_context(self) -> SpanContext:
        """The remote span context (invalid when the carrier holds none)."""
        return trace.get_current_span(self.context()).get_span_context()


def set_group(group: Any) -> None:
    """Makes ``group`` the one the module-level functions use when none is passed: a
    :func:`lens_trace.tcp_group`, a rank of :func:`lens_trace.local_cluster`, or a
    :func:`lens_trace.torch_group`. Pass ``None`` to forget it."""
    global _group
    if group is not None and not hasattr(group, "broadcast_carrier"):
        raise TypeError(f"not a lens group: {type(group).__name__}")
    with _group_lock:
        _group = group


def get_group() -> Any:
    """The group of this thread's rank under :func:`lens_trace.run_local`, else the one
    :func:`set_group` chose; :class:`ConfigError` when there is none."""
    group = getattr(_thread, "group", None) or _group
    if group is None:
        raise ConfigError(
            "no lens group: call lens_trace.set_group(lens_trace.tcp_group()) once per process "
            "(or pass group=...)",
            kind="config",
        )
    return group


def inject_carrier(context: Optional[Context] = None) -> dict:
    """The W3C carrier (``traceparent``, ``tracestate``, ``baggage``) of ``context``, or of
    the current context: what the source of a broadcast sends."""
    carrier: dict = {}
    _W3C.inject(carrier, context=context)
    return carrier


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value


def broadcast_trace_context(
    rank: int,
    src_rank: int = 0,
    *,
    group: Any = None,
    context: Optional[Context] = None,
) -> Optional[RemoteCarrier]:
    """Broadcasts the source rank's current trace context to every rank of the group.

    Collective: every rank calls it with the same ``src_rank``. Returns the carrier on every
    rank, or ``None`` on every rank when the source had no valid span (NeMo Lens returns
    ``{}`` there). The wait is bounded by the group's timeout and releases the GIL.

    :param rank: this process's rank in the group (checked against the group's).
    :param src_rank: the rank whose context is sent.
    :param group: the group; by default the one :func:`set_group` chose.
    :param context: on the source, the context to send instead of the current one.
    :raises BroadcastTimeout: a rank did not take part in time (``missing_ranks``).
    :raises ValueError: ``rank`` is not this process's rank, ``src_rank`` is outside the group.
    :raises TypeError: a rank that is not an int.
    """
    rank = _check_int("rank", rank)
    src_rank = _check_int("src_rank", src_rank)
    g = group if group is not None else get_group()
    if rank != g.rank:
        raise ValueError(f"rank {rank} was passed, but this process is rank {g.rank} of its group")
    if src_rank >= g.world_size:
        raise ValueError(f"src_rank {src_rank} is outside a group of {g.world_size} rank(s)")
    mine = inject_carrier(context) if rank == src_rank else None
    got = g.broadcast_carrier(src_rank, mine)
    return None if got is None else RemoteCarrier(got, source_rank=src_rank)


RemoteLike = Union[Context, SpanContext, None]


def _remote(
    remote_context: RemoteLike, remote_carrier: Optional[Mapping[str, str]]
) -> "tuple[Optional[Context], SpanContext, dict]":
    """The remote's context (for a remote parent), span context and link attributes."""
    if remote_context is not None:
        if isinstance(remote_context, SpanContext):
            sc = remote_context
            cx = trace.set_span_in_context(trace.NonRecordingSpan(sc))
            return cx, sc, {LINK_SOURCE: "span_context"}
        if isinstance(remote_context, Context):
            sc = trace.get_current_span(remote_context).get_span_context()
            return remote_context, sc, {LINK_SOURCE: "context"}
        raise TypeError(
            f"remote_context must be an opentelemetry Context or SpanContext, not {type(remote_context).__name__}"
        )
    if remote_carrier is not None:
        if not isinstance(remote_carrier, Mapping):
            raise TypeError(f"remote_carrier must be a dict, not {type(remote_carrier).__name__}")
        cx = _W3C.extract(remote_carrier)
        sc = trace.get_current_span(cx).get_span_context()
        source_rank = getattr(remote_carrier, "source_rank", None)
        if source_rank is None:
            return cx, sc, {LINK_SOURCE: "carrier"}
        return cx, sc, {LINK_SOURCE: "broadcast", LINK_SOURCE_RANK: source_rank}
    return None, trace.INVALID_SPAN_CONTEXT, {}


def create_linked_span(
    tracer: trace.Tracer,
    name: str,
    remote_context: RemoteLike = None,
    remote_carrier: Optional[Mapping[str, str]] = None,
    *,
    parent: str = "current",
    kind: SpanKind = SpanKind.INTERNAL,
    link_attributes: Optional[Mapping[str, Any]] = None,
    **attributes: Any,
) -> trace.Span:
    """Starts a span linked to a span on another rank, and returns it (end it, or use it as
    ``with trace.use_span(span, end_on_exit=True)``).

    The remote comes from ``remote_context`` (a ``Context`` or ``SpanContext``) or else
    ``remote_carrier`` (what :func:`broadcast_trace_context` returned). An absent or invalid
    remote gives an unlinked span, as in NeMo Lens. The link and ``attributes`` are given at
    creation, so samplers see them; the link carries ``lens.link.source`` and, after a
    broadcast, ``lens.link.source_rank``.

    :param parent: ``"current"`` (default, as NeMo Lens: the local current span),
        ``"remote"`` (a child of the remote span: every rank shares its trace id),
        ``"auto"`` (the current span if there is one, else the remote) or ``"root"``.
    :raises ValueError: an unknown ``parent``.
    :raises TypeError: a name that is not a str, a remote of the wrong type.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if parent not in _PARENTS:
        raise ValueError(f"parent must be one of {', '.join(_PARENTS)}; got {parent!r}")
    remote_cx, sc, link_attrs = _remote(remote_context, remote_carrier)
    links = []
    if sc.is_valid:
        link_attrs.update(link_attributes or {})
        links.append(Link(sc, link_attrs))
    if parent == "auto":
        has_current = trace.get_current_span().get_span_context().is_valid
        parent = "current" if has_current else "remote"
    if parent == "root":
        cx: Optional[Context] = Context()
    elif parent == "remote" and sc.is_valid:
        cx = remote_cx
    else:
        cx = None  # the current context
    return tracer.start_span(name, context=cx, kind=kind, attributes=attributes or None, links=links)

