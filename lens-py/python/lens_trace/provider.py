"""A tracer provider per rank: the rank resource, and span ids that differ across ranks.

Training frameworks seed Python's ``random`` with the same value on every rank, and the
OpenTelemetry SDK's default id generator draws from ``random``: every rank then makes the
same trace and span ids. :class:`RankIdGenerator` draws from a generator of its own, seeded
from the operating system and reseeded in every forked child.
"""

from __future__ import annotations

import os
import random
import threading
import weakref
from typing import Any, Iterable, Mapping, Optional

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator

__all__ = ["RankIdGenerator", "rank_resource", "tracer_provider"]

_generators: "weakref.WeakSet[RankIdGenerator]" = weakref.WeakSet()
_generators_lock = threading.Lock()


def _reseed_all_after_fork() -> None:
    # A child of fork() has its parent's generator state: without this, parent and child
    # would make the same ids from here on.
    for g in list(_generators):
        g._reseed()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_all_after_fork)


class RankIdGenerator(IdGenerator):
    """Random trace and span ids independent of ``random.seed`` and safe across ``fork``."""

    def __init__(self) -> None:
        self._rng = random.Random()
        self._reseed()
        with _generators_lock:
            _generators.add(self)

    def _reseed(self) -> None:
        self._rng.seed(os.urandom(32))

    def _nonzero(self, bits: int) -> int:
        while True:
            v = self._rng.getrandbits(bits)
            if v:  # zero is the invalid id
                return v

    def generate_span_id(self) -> int:
        return self._nonzero(64)

    def generate_trace_id(self) -> int:
        return self._nonzero(128)

    def is_trace_id_random(self) -> bool:
        """Trace ids are random: the SDK sets the W3C random flag (``-03``) where it knows
        the flag, as for its own generator."""
        return True


def rank_resource(
    rank: int,
    world_size: int,
    local_rank: Optional[int] = None,
    *,
    job_id: Optional[str] = None,
    service_name: Optional[str] = None,
    attributes: Optional[Mapping[str, Any]] = None,
) -> Resource:
    """The resource lens's Rust ranks also write: ``nv.dl.rank``, ``nv.dl.world_size``,
    ``nv.dl.local_rank``, ``nv.dl.job_id``, ``service.instance.id`` (``rank-N``), and
    ``service.name`` (argument, else ``OTEL_SERVICE_NAME`` as the SDK reads it)."""
    if not (0 <= rank < world_size):
        raise ValueError(f"rank {rank} is outside a world of {world_size}")
    attrs: dict = {
        "nv.dl.rank": rank,
        "nv.dl.world_size": world_size,
        "service.instance.id": f"rank-{rank}",
    }
    if local_rank is not None:
        attrs["nv.dl.local_rank"] = local_rank
    if job_id is not None:
        attrs["nv.dl.job_id"] = job_id
    if service_name is not None:
        attrs["service.name"] = service_name
    attrs.update(attributes or {})
    return Resource.create(attrs)


def tracer_provider(
    rank: int,
    world_size: int,
    local_rank: Optional[int] = None,
    *,
    job_id: Optional[str] = None,
    service_name: Optional[str] = None,
    span_processors: Iterable[SpanProcessor] = (),
    track_open_spans: bool = True,
    **kwargs: Any,
) -> TracerProvider:
    """A ``TracerProvider`` for this rank: :func:`rank_resource` and a
    :class:`RankIdGenerator`; ``span_processors`` are added to it, after an
    :class:`~lens_trace.OpenSpans` (unless ``track_open_spans`` is false) so that a hang
    report names the spans open then. Other keyword arguments go to ``TracerProvider`` (a
    sampler, say)."""
    from .observe import OpenSpans

    provider = TracerProvider(
        resource=rank_resource(rank, world_size, local_rank, job_id=job_id, service_name=service_name),
        id_generator=RankIdGenerator(),
        **kwargs,
    )
    if track_open_spans:
        provider.add_span_processor(OpenSpans())
    for p in span_processors:
        provider.add_span_processor(p)
    return provider
