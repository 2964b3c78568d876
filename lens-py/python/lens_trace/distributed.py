"""A drop-in for ``nemo.lens.distributed``: change the import, keep the calls::

    from lens_trace.distributed import broadcast_trace_context, create_linked_span

    carrier = broadcast_trace_context(rank, src_rank=0)
    span = create_linked_span(tracer, "pp.recv_forward", remote_carrier=carrier, microbatch=3)

Which group: the one :func:`set_group` chose (a :func:`lens_trace.tcp_group`, a subgroup, a
rank of :func:`lens_trace.run_local`); else, where ``torch.distributed`` is initialised,
its world group through :func:`lens_trace.torch_group` (one collective per broadcast, NCCL
groups on the GPU, gloo on the CPU); else none, and the broadcast returns ``None``, as NeMo
Lens does before ``init_process_group``.

The same results as NeMo Lens for the same calls: the global propagator's carrier (W3C
trace context and baggage by default, B3 or Jaeger when installed; a baggage-only carrier
is a dict with ``baggage``, an empty context gives ``{}``); every keyword of
:func:`create_linked_span` is a span attribute, cleaned as NeMo Lens cleans them
(:data:`REDACT_KEYS`' string values are ``"[REDACTED]"``, ``None``, dicts, bytes and mixed
lists are dropped); a ``rank`` argument that is not this process's rank is replaced by the
group's, with one warning. lens's own choices, none of which can break such a caller: one
collective per broadcast (NeMo Lens sends a length, then the bytes), a deadline on every
broadcast (:class:`~lens_trace.errors.BroadcastTimeout`, also a ``TimeoutError``, names the
ranks that never came), attributes and links given as the span starts (so samplers see
them). :func:`start_linked_span` takes lens's extras: the parent (``"remote"`` gives every
rank the source's trace id), the span kind and the link's attributes.
"""

from __future__ import annotations

import atexit
import threading
import warnings
from collections.abc import Mapping
from typing import Any, Optional, Union

from opentelemetry import baggage, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context, get_current
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .errors import BroadcastTimeout, ConfigError
from .observe import record_arrivals, report_hang
from .sample import after_round, round_failed

__all__ = [
    "RemoteCarrier",
    "broadcast_trace_context",
    "create_linked_span",
    "start_linked_span",
    "clean_attributes",
    "REDACT_KEYS",
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
_BAGGAGE = W3CBaggagePropagator()
_PARENTS = ("current", "remote", "root", "auto")

#: Keys whose string values are recorded as ``"[REDACTED]"``: NeMo Lens's
#: ``DEFAULT_REDACT_KEYS``.
REDACT_KEYS = frozenset({"prompt", "input_text", "output_text", "text", "password", "token", "secret", "key"})
_REDACTED = "[REDACTED]"
_SCALARS = (bool, int, float, str)

_group_lock = threading.Lock()
_group: Optional[Any] = None
# The torch world group lens made for the process group now initialised, by its identity.
_torch_world: "tuple[Any, Any]" = (None, None)
# torch.distributed, once imported for the world group.
_dist: Any = None
_warned_rank = False


class _ThreadGroup(threading.local):
    """Set by run_local: each thread of an in-process cluster has its own rank's group."""

    # A class default, so that a thread that never set it reads None without an exception:
    # a missing attribute of a threading.local makes and drops an AttributeError on every
    # broadcast (0.7 µs warm, about 5 µs just after a barrier).
    group: Any = None


_thread = _ThreadGroup()


class RemoteCarrier(dict):
    """The carrier a broadcast returned: a plain ``dict`` of W3C headers (as NeMo Lens
    returns), which also remembers the rank it came from."""

    source_rank: Optional[int]

    def __init__(self, entries: Mapping[str, str], source_rank: Optional[int] = None) -> None:
        super().__init__(entries)
        self.source_rank = source_rank

    def context(self) -> Context:
        """The OpenTelemetry context it carries (remote span context and baggage), read by
        the global propagator."""
        return _extract(self)

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
    :func:`set_group` chose, else the world group of an initialised ``torch.distributed``;
    :class:`ConfigError` when there is none."""
    group = _find_group()
    if group is None:
        raise ConfigError(
            "no lens group: call lens_trace.set_group(lens_trace.tcp_group()) once per process "
            "(or pass group=...), or initialise torch.distributed",
            kind="config",
        )
    return group


def _find_group() -> Any:
    group = _thread.group or _group
    if group is not None:
        return group
    # The common case, checked first: the world group made before is still torch's (a
    # destroyed process group reads as None, a new one as another object).
    pg, made = _torch_world
    if made is not None and _dist is not None and _dist.group.WORLD is pg:
        return made
    return _torch_world_group()


def _torch_world_group() -> Any:
    """lens's group over torch's world group, made once per initialised process group;
    ``None`` where torch is missing or ``torch.distributed`` is not initialised."""
    global _torch_world, _dist
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    _dist = dist
    if not dist.is_available() or not dist.is_initialized():
        return None
    world = dist.group.WORLD
    pg, made = _torch_world
    if pg is world and made is not None:
        return made
    from .torch_group import torch_group

    if made is not None:
        made.close()  # the process group it ran on is gone
    made = torch_group(world)
    _torch_world = (world, made)
    return made


@atexit.register
def _close_torch_world() -> None:
    # Before torch's own teardown: nothing of lens's outlives the process group.
    global _torch_world
    _, made = _torch_world
    _torch_world = (None, None)
    if made is not None:
        made.close()


def _default_textmap(textmap: Any) -> bool:
    """Whether ``textmap`` is OpenTelemetry's default: W3C trace context, then baggage.
    Asked on every broadcast, so the answer for the last global textmap is kept."""
    global _last_textmap
    seen, default = _last_textmap
    if seen is textmap:
        return default
    default = False
    if isinstance(textmap, CompositePropagator):
        kinds = [type(p) for p in getattr(textmap, "_propagators", ())]
        default = kinds == [TraceContextTextMapPropagator, W3CBaggagePropagator]
    _last_textmap = (textmap, default)
    return default


_last_textmap: "tuple[Any, bool]" = (None, False)


def inject_carrier(context: Optional[Context] = None) -> dict:
    """The carrier the global propagator makes from ``context``, or from the current
    context (W3C ``traceparent``, ``tracestate``, ``baggage`` by default): what the source
    of a broadcast sends, as NeMo Lens's ``inject_context`` makes it."""
    carrier: dict = {}
    textmap = propagate.get_global_textmap()
    if not _default_textmap(textmap):
        textmap.inject(carrier, context=context)
        return carrier
    # The default pair, written directly: the same headers the two propagators write.
    ids, tracestate, header = _w3c_parts(context)
    if ids is not None:
        trace_id, span_id, flags = ids
        carrier["traceparent"] = f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"
        if tracestate:
            carrier["tracestate"] = tracestate
    if header:
        carrier["baggage"] = header
    return carrier


def _w3c_parts(
    context: Optional[Context], span: Optional[trace.Span] = None
) -> "tuple[Optional[tuple[int, int, int]], Optional[str], Optional[str]]":
    """What the default W3C pair injects from ``context`` (or the current one), in parts:
    the span context's ids and flags where it is valid, its tracestate header, the baggage
    header. ``span``: the context's current span, where the caller has it already."""
    if context is None:
        context = get_current()  # once, for the span and the baggage
    if span is None:
        span = trace.get_current_span(context)
    sc = span.get_span_context()
    ids = tracestate = header = None
    if sc.is_valid:
        ids = (sc.trace_id, sc.span_id, sc.trace_flags)
        if sc.trace_state:
            tracestate = sc.trace_state.to_header()
    if baggage.get_all(context):
        written: dict = {}
        _BAGGAGE.inject(written, context=context)
        header = written.get("baggage")
    return ids, tracestate, header


def _new_remote_carrier(source_rank: int) -> "RemoteCarrier":
    """An empty :class:`RemoteCarrier` from ``source_rank``, made without its ``__init__``
    (the broadcast fills it)."""
    carrier = dict.__new__(RemoteCarrier)
    carrier.source_rank = source_rank
    return carrier


def _extract(carrier: Mapping[str, str]) -> Context:
    textmap = propagate.get_global_textmap()
    return (_W3C if _default_textmap(textmap) else textmap).extract(carrier)


def clean_attributes(attributes: Mapping[str, Any]) -> dict:
    """The attributes NeMo Lens would record: ``None`` dropped; ``bool``, ``int``,
    ``float`` and ``str`` kept, a string under a key of :data:`REDACT_KEYS` as
    ``"[REDACTED]"``; a list or tuple of those kept as a list (unredacted, as in NeMo
    Lens); anything else (dicts, bytes, objects, mixed lists) dropped."""
    out = {}
    for key, value in attributes.items():
        if value is None:
            continue
        if isinstance(value, _SCALARS):
            out[key] = _REDACTED if isinstance(value, str) and key in REDACT_KEYS else value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, _SCALARS) for v in value):
            out[key] = list(value)
    return out


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

    Collective: every rank calls it with the same ``src_rank``. Returns the source's
    carrier on every rank: a dict of what the global propagator injected there (``{}``
    when the source had no span and no baggage). Returns ``None`` when there is no group:
    none set and ``torch.distributed`` not initialised (a single-process run of the same
    script), as NeMo Lens does. The wait is bounded by the group's timeout and releases
    the GIL.

    :param rank: this process's rank in the group. One that is not (an off-by-one in the
        caller) is replaced by the group's rank, with one ``RuntimeWarning`` per process.
    :param src_rank: the rank whose context is sent.
    :param group: the group; by default as the module says.
    :param context: on the source, the context to send instead of the current one.
    :raises BroadcastTimeout: a rank did not take part in time (``missing_ranks``); also a
        ``TimeoutError``. This rank then leaves a ``lens.hang`` span first
        (:mod:`lens_trace.observe`). On the source, where the group knows how the ranks
        came, the current span gets ``lens.round.last_rank`` and ``lens.round.spread_ns``.
    :raises ValueError: ``src_rank`` is outside the group.
    :raises TypeError: a rank that is not an int.
    """
    global _warned_rank
    if type(rank) is not int or type(src_rank) is not int:  # checked in full off the hot path
        rank = _check_int("rank", rank)
        src_rank = _check_int("src_rank", src_rank)
    if rank < 0 or src_rank < 0:
        _check_int("rank", rank)
        _check_int("src_rank", src_rank)
    g = group if group is not None else _find_group()
    if g is None:
        return None
    if rank != g.rank:
        if not _warned_rank:
            _warned_rank = True
            warnings.warn(
                f"broadcast_trace_context: rank {rank} was passed, but this process is rank "
                f"{g.rank} of its group; using {g.rank} (warned once)",
                RuntimeWarning,
                stacklevel=2,
            )
        rank = g.rank
    if src_rank >= g.world_size:
        raise ValueError(f"src_rank {src_rank} is outside a group of {g.world_size} rank(s)")
    span = None
    if rank == src_rank:
        # Looked up once, for the carrier and for the arrivals written on the span after:
        # the call is synchronous, so neither can change in between.
        if context is None:
            context = get_current()
        span = trace.get_current_span(context)
    w3c = getattr(g, "broadcast_w3c", None)
    if w3c is not None and _default_textmap(propagate.get_global_textmap()):
        # The default pair: the carrier written natively from the span context's parts and
        # filled into the result, the same carrier with no dict made and read on the way.
        parts = _w3c_parts(context, span) if rank == src_rank else (None, None, None)
        got: Optional[RemoteCarrier] = _new_remote_carrier(src_rank)
    else:
        mine = inject_carrier(context) if rank == src_rank else None
        got = None
    try:
        if got is not None:
            w3c(src_rank, *parts, got)
        else:
            got = RemoteCarrier(g.broadcast_map(src_rank, mine), source_rank=src_rank)
    except BroadcastTimeout as e:
        round_failed(g)
        report_hang(g, e.missing_ranks, e.after, e.last_seen, e.via)
        raise
    except Exception:
        round_failed(g)
        raise
    if rank == src_rank:
        record_arrivals(g, context, span)
    after_round(g)
    return got


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
        cx = _extract(remote_carrier)
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
    **attributes: Any,
) -> trace.Span:
    """Starts a span linked to a span on another rank and returns it (end it, or use it as
    ``with trace.use_span(span, end_on_exit=True)``): NeMo Lens's signature and result.

    The remote comes from ``remote_context`` (a ``Context`` or ``SpanContext``) or else
    ``remote_carrier`` (what :func:`broadcast_trace_context` returned). An absent or invalid
    remote gives an unlinked span. The parent is the current span. Every keyword is a span
    attribute (``kind=``, ``parent=`` too), cleaned by :func:`clean_attributes`, and given as
    the span starts, with the link, so samplers see them; the link carries
    ``lens.link.source`` and, after a broadcast, ``lens.link.source_rank``. For a remote
    parent, a span kind or link attributes, use :func:`start_linked_span`.

    :raises TypeError: a name that is not a str, a remote of the wrong type.
    """
    return start_linked_span(
        tracer, name, remote_context=remote_context, remote_carrier=remote_carrier, attributes=attributes
    )


def start_linked_span(
    tracer: trace.Tracer,
    name: str,
    *,
    remote_context: RemoteLike = None,
    remote_carrier: Optional[Mapping[str, str]] = None,
    parent: str = "current",
    kind: SpanKind = SpanKind.INTERNAL,
    link_attributes: Optional[Mapping[str, Any]] = None,
    attributes: Optional[Mapping[str, Any]] = None,
) -> trace.Span:
    """:func:`create_linked_span` with lens's options, each keyword-only so none can be
    taken for an attribute.

    :param parent: ``"current"`` (default, as NeMo Lens: the local current span),
        ``"remote"`` (a child of the remote span: every rank shares its trace id),
        ``"auto"`` (the current span if there is one, else the remote) or ``"root"``.
    :param kind: the span's :class:`~opentelemetry.trace.SpanKind`.
    :param link_attributes: more attributes on the link.
    :param attributes: the span's attributes, cleaned by :func:`clean_attributes`.
    :raises ValueError: an unknown ``parent``.
    :raises TypeError: a name that is not a str, a remote or kind of the wrong type.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if parent not in _PARENTS:
        raise ValueError(f"parent must be one of {', '.join(_PARENTS)}; got {parent!r}")
    if not isinstance(kind, SpanKind):
        raise TypeError(f"kind must be an opentelemetry SpanKind, not {type(kind).__name__}")
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
    cleaned = clean_attributes(attributes) if attributes else None
    return tracer.start_span(name, context=cx, kind=kind, attributes=cleaned or None, links=links)
