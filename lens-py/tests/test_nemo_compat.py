"""The same results as NeMo Lens for the same calls, in one process: keywords as attributes
(compared with the real ``nemo.lens`` where it is installed), redaction, a wrong rank,
baggage without a span, the global propagator."""

import importlib.util
import warnings

import pytest
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import lens_trace
from lens_trace import distributed
from lens_trace.distributed import REDACT_KEYS, broadcast_trace_context, clean_attributes, create_linked_span

HAS_NEMO = importlib.util.find_spec("nemo") is not None and importlib.util.find_spec("nemo.lens") is not None

#: (keyword, value, what NeMo Lens records or None for nothing, why)
ATTRIBUTE_ROWS = [
    ("kind", "forward", "forward", "kind is an attribute, not the span kind"),
    ("parent", "remote", "remote", "parent is an attribute"),
    ("link_attributes", "x", "x", "link_attributes is an attribute"),
    ("microbatch", 3, 3, "an int"),
    ("loss", 0.5, 0.5, "a float"),
    ("ok", True, True, "a bool"),
    ("token", "abc", "[REDACTED]", "a redacted key"),
    ("password", "abc", "[REDACTED]", "a redacted key"),
    ("prompt", "tell me", "[REDACTED]", "a redacted key"),
    ("text", "hello", "[REDACTED]", "a redacted key"),
    ("key", "k", "[REDACTED]", "a redacted key"),
    ("secret", "s", "[REDACTED]", "a redacted key"),
    ("input_text", "i", "[REDACTED]", "a redacted key"),
    ("output_text", "o", "[REDACTED]", "a redacted key"),
    ("key_id", "k", "k", "only the exact key is redacted"),
    ("token_count", 7, 7, "a number under a redacted name is kept"),
    ("shape", (2, 3), [2, 3], "a tuple of scalars becomes a list"),
    ("names", ["a", "b"], ["a", "b"], "a list of scalars"),
    ("nothing", None, None, "None is dropped"),
    ("config", {"lr": 1}, None, "a dict is dropped"),
    ("blob", b"xy", None, "bytes are dropped"),
    ("mixed", [1, {"a": 2}], None, "a list with a non-scalar is dropped"),
    ("obj", object(), None, "an object is dropped"),
]


def tracer_of(exporter):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("compat")


def recorded(make_span, **attributes):
    exporter = InMemorySpanExporter()
    tracer = tracer_of(exporter)
    with tracer.start_as_current_span("remote") as remote:
        carrier = lens_trace.inject_carrier()
    with tracer.start_as_current_span("local"):
        make_span(tracer, "stage", remote_carrier=carrier, **attributes).end()
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "stage"]
    parent_is_local = span.parent is not None and span.parent.span_id == next(
        s for s in exporter.get_finished_spans() if s.name == "local"
    ).context.span_id
    links_to_remote = [link.context.span_id for link in span.links] == [remote.get_span_context().span_id]
    return span, parent_is_local and links_to_remote


@pytest.mark.parametrize("key, value, want, why", ATTRIBUTE_ROWS, ids=[r[3] + ":" + r[0] for r in ATTRIBUTE_ROWS])
def test_every_keyword_is_an_attribute_cleaned_as_nemo_lens_cleans_it(key, value, want, why):
    span, parent_is_local = recorded(create_linked_span, **{key: value})
    assert span.kind == SpanKind.INTERNAL, why
    assert parent_is_local, f"{why}: the parent is the current span, the link the remote"
    got = span.attributes.get(key)
    assert (list(got) if isinstance(got, tuple) else got) == want, why
    assert clean_attributes({key: value}).get(key) == want, why


def test_the_redacted_keys_are_nemo_lens_s():
    assert REDACT_KEYS == {"prompt", "input_text", "output_text", "text", "password", "token", "secret", "key"}


@pytest.mark.skipif(not HAS_NEMO, reason="nemo-lens is not installed (it needs Python 3.13; scripts/test.sh installs it there)")
def test_nemo_lens_records_the_same_attributes_kind_parent_and_link():
    from nemo.lens import distributed as nemo
    from nemo.lens.helpers import DEFAULT_REDACT_KEYS

    assert REDACT_KEYS == DEFAULT_REDACT_KEYS
    attributes = {k: v for k, v, _, _ in ATTRIBUTE_ROWS}
    ours, ours_local = recorded(create_linked_span, **attributes)
    theirs, theirs_local = recorded(nemo.create_linked_span, **attributes)
    norm = lambda s: {k: list(v) if isinstance(v, tuple) else v for k, v in s.attributes.items()}  # noqa: E731
    assert norm(ours) == norm(theirs)
    assert ours.kind == theirs.kind and ours_local and theirs_local


def test_a_wrong_rank_uses_the_group_s_rank_and_warns_once(monkeypatch):
    monkeypatch.setattr(distributed, "_warned_rank", False)
    warned = []
    monkeypatch.setattr(warnings, "warn", lambda message, category=None, stacklevel=1: warned.append((message, category)))
    tracer = tracer_of(InMemorySpanExporter())

    def rank_main(rank):
        got = []
        for _ in range(2):
            if rank == 0:
                with tracer.start_as_current_span("s"):
                    got.append(broadcast_trace_context(0, src_rank=0))
            else:
                got.append(broadcast_trace_context(0, src_rank=0))  # says 0, is 1
        return got

    results = lens_trace.run_local(2, rank_main, timeout=10)
    assert results[0] == results[1] and "traceparent" in results[1][0]
    # One warning in the process, naming both ranks.
    warned = [(m, c) for m, c in warned if c is RuntimeWarning]
    assert len(warned) == 1, warned
    message, category = warned[0]
    assert category is RuntimeWarning and "rank 0 was passed" in message and "rank 1" in message, message


def test_baggage_without_a_span_travels_as_nemo_lens_sends_it():
    def rank_main(rank):
        if rank == 0:
            token = context.attach(baggage.set_baggage("job", "j-7"))
            try:
                return broadcast_trace_context(rank, src_rank=0)
            finally:
                context.detach(token)
        return broadcast_trace_context(rank, src_rank=0)

    got = lens_trace.run_local(3, rank_main, timeout=10)
    assert got == [{"baggage": "job=j-7"}] * 3, got
    assert baggage.get_baggage("job", got[2].context()) == "j-7"


class HeaderPropagator(TextMapPropagator):
    """A propagator of another format (as B3 or Jaeger are): one header of its own."""

    def inject(self, carrier, context=None, setter=None):
        sc = trace.get_current_span(context).get_span_context()
        if sc.is_valid:
            carrier["x-test-trace"] = f"{sc.trace_id:032x}:{sc.span_id:016x}"

    def extract(self, carrier, context=None, getter=None):
        value = carrier.get("x-test-trace")
        if not value:
            return context or context_api_empty()
        t, s = value.split(":")
        sc = trace.SpanContext(int(t, 16), int(s, 16), is_remote=True, trace_flags=trace.TraceFlags(1))
        return trace.set_span_in_context(trace.NonRecordingSpan(sc), context)

    @property
    def fields(self):
        return {"x-test-trace"}


def context_api_empty():
    return context.Context()


def test_the_global_propagator_is_honoured():
    exporter = InMemorySpanExporter()
    tracer = tracer_of(exporter)
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(HeaderPropagator())
    try:

        def rank_main(rank):
            if rank == 0:
                with tracer.start_as_current_span("s") as s:
                    return broadcast_trace_context(rank, 0), s.get_span_context()
            carrier = broadcast_trace_context(rank, 0)
            create_linked_span(tracer, "stage", remote_carrier=carrier).end()
            return carrier, None

        results = lens_trace.run_local(2, rank_main, timeout=10)
    finally:
        propagate.set_global_textmap(before)
    sc = results[0][1]
    assert results[1][0] == {"x-test-trace": f"{sc.trace_id:032x}:{sc.span_id:016x}"}
    (stage,) = [s for s in exporter.get_finished_spans() if s.name == "stage"]
    assert [link.context.span_id for link in stage.links] == [sc.span_id]


def test_lens_errors_are_the_builtin_exceptions_callers_catch():
    assert issubclass(lens_trace.BroadcastTimeout, TimeoutError)
    assert issubclass(lens_trace.InvalidArgument, ValueError)
    assert issubclass(lens_trace.ConfigError, ValueError)
    assert issubclass(lens_trace.DecodeError, ValueError)
    assert issubclass(lens_trace.TransportError, ConnectionError)
    assert issubclass(lens_trace.UnavailableError, RuntimeError)


def w3c_cases():
    """Each kind of context by name, with the carrier the default propagator pair (W3C
    trace context, then baggage) writes from it: what lens's fast paths must write too."""
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from opentelemetry.trace.span import TraceState

    w3c = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
    tracer = tracer_of(InMemorySpanExporter())

    def remote(trace_id, span_id, flags, state):
        sc = trace.SpanContext(
            trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags), trace_state=TraceState(state)
        )
        return trace.set_span_in_context(trace.NonRecordingSpan(sc))

    contexts = {
        "empty": context.Context(),
        "a span": trace.set_span_in_context(tracer.start_span("s")),
        "a remote span with tracestate": remote(0x1234, 0x5678, 3, [("vendor", "x=1")]),
        "the largest ids, every flag, two tracestate entries": remote(2**128 - 1, 1, 0xFF, [("a", "b"), ("c", "d")]),
        "baggage only": baggage.set_baggage("k", "v w", context.Context()),
        "a span and baggage": baggage.set_baggage("a", "1", trace.set_span_in_context(tracer.start_span("t"))),
    }
    for why, cx in contexts.items():
        want: dict = {}
        w3c.inject(want, context=cx)
        yield why, cx, want


def test_the_fast_path_writes_what_the_default_propagators_write():
    from opentelemetry.propagators.composite import CompositePropagator

    assert type(propagate.get_global_textmap()) is CompositePropagator, "the default global propagator"
    for why, cx, want in w3c_cases():
        assert lens_trace.inject_carrier(cx) == want, why


def test_the_broadcast_sends_what_the_default_propagators_write():
    # The broadcast writes the default pair's carrier natively from the span context's
    # parts: every rank must get what the propagators themselves would have written, keys
    # in their order, from every kind of context.
    for why, cx, want in w3c_cases():

        def rank_fn(rank):
            got = broadcast_trace_context(rank, 0, context=cx if rank == 0 else None)
            return list(got.items()), got.source_rank

        got = lens_trace.run_local(3, rank_fn)
        assert got == [(list(want.items()), 0)] * 3, why
