"""The drop-in functions on the in-process cluster: results, errors, the GIL."""

import threading
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import lens_trace
from lens_trace.distributed import broadcast_trace_context, create_linked_span, start_linked_span


def tracer_of(exporter=None):
    provider = TracerProvider()
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test")


def test_every_rank_gets_the_source_span_and_links_to_it():
    exporter = InMemorySpanExporter()
    tracer = tracer_of(exporter)
    world = 4

    def rank_main(rank):
        if rank == 0:
            with tracer.start_as_current_span("train_step") as step:
                carrier = broadcast_trace_context(rank, src_rank=0)
                return carrier, step.get_span_context()
        carrier = broadcast_trace_context(rank, src_rank=0)
        span = start_linked_span(tracer, "stage", remote_carrier=carrier, parent="remote", attributes={"stage": rank})
        span.end()
        return carrier, span.get_span_context()

    results = lens_trace.run_local(world, rank_main, timeout=10)
    source = results[0][1]
    tp = f"00-{source.trace_id:032x}-{source.span_id:016x}-{int(source.trace_flags):02x}"
    for rank, (carrier, _) in enumerate(results):
        assert carrier == {"traceparent": tp}, f"rank {rank}: {carrier}"
        assert isinstance(carrier, dict) and carrier.source_rank == 0
    stages = [s for s in exporter.get_finished_spans() if s.name == "stage"]
    assert len(stages) == world - 1
    for s in stages:
        assert s.context.trace_id == source.trace_id, "parent='remote' shares the trace id"
        assert s.parent.span_id == source.span_id
        assert s.attributes["stage"] >= 1
        (link,) = s.links
        assert link.context.span_id == source.span_id
        assert dict(link.attributes) == {"lens.link.source": "broadcast", "lens.link.source_rank": 0}


def test_parents_current_root_auto():
    exporter = InMemorySpanExporter()
    tracer = tracer_of(exporter)
    with tracer.start_as_current_span("remote") as remote:
        carrier = lens_trace.inject_carrier()
    rsc = remote.get_span_context()
    with tracer.start_as_current_span("local") as local:
        cur = create_linked_span(tracer, "current", remote_carrier=carrier)
        auto_with_local = start_linked_span(tracer, "auto", remote_carrier=carrier, parent="auto")
    root = start_linked_span(tracer, "root", remote_carrier=carrier, parent="root")
    auto_alone = start_linked_span(tracer, "auto_alone", remote_carrier=carrier, parent="auto")
    lsc = local.get_span_context()
    for span, trace_id, parent in [
        (cur, lsc.trace_id, lsc.span_id),
        (auto_with_local, lsc.trace_id, lsc.span_id),
        (auto_alone, rsc.trace_id, rsc.span_id),
    ]:
        assert span.get_span_context().trace_id == trace_id, span.name
        assert span.parent.span_id == parent, span.name
    assert root.parent is None and root.get_span_context().trace_id not in (rsc.trace_id, lsc.trace_id)
    for span in (cur, root, auto_alone, auto_with_local):
        assert [link.context.span_id for link in span.links] == [rsc.span_id], span.name
        assert span.links[0].attributes["lens.link.source"] == "carrier"


def test_remote_context_and_span_context_are_accepted_and_an_absent_remote_gives_no_link():
    tracer = tracer_of()
    with tracer.start_as_current_span("remote") as remote:
        sc = remote.get_span_context()
        cx = trace.set_span_in_context(remote)
    by_cx = start_linked_span(tracer, "a", remote_context=cx, parent="remote")
    by_sc = start_linked_span(tracer, "b", remote_context=sc, parent="remote")
    none = start_linked_span(tracer, "c", remote_carrier=None, parent="remote")
    empty = start_linked_span(tracer, "d", remote_carrier={}, parent="remote")
    assert by_cx.links[0].attributes["lens.link.source"] == "context"
    assert by_sc.links[0].attributes["lens.link.source"] == "span_context"
    for s in (by_cx, by_sc):
        assert s.get_span_context().trace_id == sc.trace_id
    for s in (none, empty):
        assert list(s.links) == [] and s.parent is None


def test_no_source_span_gives_an_empty_carrier_on_every_rank():
    # As NeMo Lens: the source's propagator injected nothing, and every rank gets {}.
    got = lens_trace.run_local(3, lambda r: broadcast_trace_context(r, src_rank=1), timeout=10)
    assert got == [{}] * 3 and all(isinstance(c, lens_trace.RemoteCarrier) for c in got)


def test_baggage_travels_with_the_context():
    from opentelemetry import baggage, context

    tracer = tracer_of()

    def rank_main(rank):
        if rank == 0:
            token = context.attach(baggage.set_baggage("nv.dl.step", "7"))
            try:
                with tracer.start_as_current_span("s"):
                    return broadcast_trace_context(rank)
            finally:
                context.detach(token)
        return broadcast_trace_context(rank)

    for carrier in lens_trace.run_local(2, rank_main, timeout=10):
        assert carrier["baggage"] == "nv.dl.step=7"
        assert baggage.get_baggage("nv.dl.step", carrier.context()) == "7"


def test_a_missing_rank_raises_the_timeout_naming_it_within_the_timeout():
    groups = lens_trace.local_cluster(3, timeout=0.5)
    got = {}

    def call(g):
        try:
            got[g.rank] = broadcast_trace_context(g.rank, group=g)
        except lens_trace.LensError as e:
            got[g.rank] = e

    # Rank 2 never calls.
    threads = [threading.Thread(target=call, args=(g,)) for g in groups[:2]]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    elapsed = time.monotonic() - t0
    assert elapsed < 5, f"took {elapsed:.1f} s with a 0.5 s timeout"
    root_err = got[0]
    assert isinstance(root_err, lens_trace.BroadcastTimeout), repr(root_err)
    assert isinstance(root_err, TimeoutError)
    assert 2 in root_err.missing_ranks, root_err.missing_ranks
    assert "2" in str(root_err)


def test_the_gil_is_released_while_a_broadcast_waits():
    groups = lens_trace.local_cluster(2, timeout=10)
    ticks = 0
    done = threading.Event()

    def counter():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    result = {}
    waiter = threading.Thread(target=lambda: result.setdefault("r", groups[1].broadcast(0)))
    t = threading.Thread(target=counter)
    waiter.start()
    t.start()
    time.sleep(0.3)  # rank 1 waits in Rust all this time
    before = ticks
    assert waiter.is_alive()
    assert before > 50, f"only {before} ticks while rank 1 waited: the GIL was held"
    assert groups[0].broadcast(0, b"go") == b"go"
    waiter.join(timeout=10)
    done.set()
    t.join(timeout=10)
    assert result["r"] == b"go"


@pytest.mark.parametrize(
    "call, exc",
    [
        (lambda g: broadcast_trace_context(0, src_rank=5, group=g), ValueError),
        (lambda g: broadcast_trace_context("0", group=g), TypeError),
        (lambda g: broadcast_trace_context(0, src_rank=1.0, group=g), TypeError),
        (lambda g: broadcast_trace_context(-1, group=g), ValueError),
        (lambda g: g.broadcast(7, b"x"), lens_trace.InvalidArgument),
        (lambda g: g.broadcast_carrier(0, {"traceparent": "00-bad"}), lens_trace.ConfigError),
        (lambda g: g.broadcast_carrier(0, {"traceparent": 3}), TypeError),
        (lambda g: start_linked_span(tracer_of(), "x", parent="sideways"), ValueError),
        (lambda g: start_linked_span(tracer_of(), "x", kind="forward"), TypeError),
        (lambda g: create_linked_span(tracer_of(), 3), TypeError),
        (lambda g: create_linked_span(tracer_of(), "x", remote_carrier="00-ab"), TypeError),
        (lambda g: create_linked_span(tracer_of(), "x", remote_context="00-ab"), TypeError),
        (lambda g: lens_trace.local_cluster(0), ValueError),
        (lambda g: lens_trace.local_cluster(2, timeout=-1), ValueError),
        (lambda g: lens_trace.set_group(object()), TypeError),
    ],
)
def test_bad_arguments_raise_value_or_type_errors(call, exc):
    (g,) = lens_trace.local_cluster(1, timeout=1)
    with pytest.raises(exc):
        call(g)


def test_without_a_group_the_broadcast_returns_none_as_nemo_lens_does():
    # No group set and torch.distributed not initialised (a single-process run).
    lens_trace.set_group(None)
    assert broadcast_trace_context(0) is None
    with pytest.raises(lens_trace.ConfigError, match="set_group"):
        lens_trace.get_group()


def test_a_rank_thread_finds_its_own_group_and_other_threads_the_process_one():
    # Under run_local each rank's thread has its own group; a thread that never ran a rank
    # (the main one, a new one) finds the one set_group chose, before, during and after.
    import threading

    (process_group,) = lens_trace.local_cluster(1, timeout=1)
    lens_trace.set_group(process_group)
    try:
        seen_outside = []

        def rank_main(rank):
            t = threading.Thread(target=lambda: seen_outside.append(lens_trace.get_group()))
            t.start()
            t.join()
            return lens_trace.get_group().rank, lens_trace.get_group() is process_group

        assert lens_trace.get_group() is process_group
        assert lens_trace.run_local(2, rank_main, timeout=5) == [(0, False), (1, False)]
        assert seen_outside == [process_group, process_group]
        assert lens_trace.get_group() is process_group
    finally:
        lens_trace.set_group(None)
        process_group.close()


def test_a_closed_group_refuses_calls():
    (g,) = lens_trace.local_cluster(1, timeout=1)
    with g:
        assert g.broadcast(0, b"x") == b"x"
    assert g.closed
    with pytest.raises(lens_trace.GroupClosed):
        g.broadcast(0, b"x")
    g.close()  # idempotent


def test_ranks_that_disagree_on_the_root_are_told_what_about():
    def rank_main(rank):
        g = lens_trace.distributed.get_group()
        try:
            g.broadcast(rank, b"x")  # each rank names itself the root
        except lens_trace.ConfigError as e:
            return e.disagreement
        except lens_trace.LensError as e:  # the other rank may time out waiting instead
            return e.kind
        return "no error"

    got = lens_trace.run_local(2, rank_main, timeout=1)
    assert "root" in got and "no error" not in got, got
