"""Span and trace ids differ across ranks even when every rank seeds ``random`` alike, and
across fork."""

import json
import os
import subprocess
import sys

import pytest

import lens_trace
from conftest import TESTS


def ids_of_two_ranks(*flags):
    out = []
    for _ in range(2):
        res = subprocess.run([sys.executable, str(TESTS / "ids_probe.py"), *flags], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        out.append(tuple(json.loads(res.stdout)))
    return out


def test_the_sdk_default_repeats_ids_when_ranks_seed_random_alike():
    # The trap the generator avoids; if this stops holding, the next test proves nothing.
    a, b = ids_of_two_ranks("--sdk-default")
    assert a == b


def test_rank_id_generator_ids_differ_when_ranks_seed_random_alike():
    a, b = ids_of_two_ranks()
    assert a[0] != b[0] and a[1] != b[1], (a, b)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_parent_and_forked_child_make_different_ids():
    gen = lens_trace.RankIdGenerator()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write its next ids and leave at once
        os.close(r)
        os.write(w, json.dumps([gen.generate_trace_id(), gen.generate_span_id()]).encode())
        os._exit(0)
    os.close(w)
    mine = [gen.generate_trace_id(), gen.generate_span_id()]
    with os.fdopen(r) as f:
        child = json.loads(f.read())
    _, status = os.waitpid(pid, 0)
    assert status == 0
    assert child[0] != mine[0] and child[1] != mine[1]


def test_ids_are_valid_and_the_provider_carries_the_rank_resource():
    gen = lens_trace.RankIdGenerator()
    assert all(0 < gen.generate_span_id() < 2**64 for _ in range(1000))
    assert all(0 < gen.generate_trace_id() < 2**128 for _ in range(1000))
    provider = lens_trace.tracer_provider(3, 8, 1, job_id="job-9", service_name="trainer")
    attrs = provider.resource.attributes
    assert (attrs["nv.dl.rank"], attrs["nv.dl.world_size"], attrs["nv.dl.local_rank"]) == (3, 8, 1)
    assert (attrs["nv.dl.job_id"], attrs["service.name"], attrs["service.instance.id"]) == ("job-9", "trainer", "rank-3")
    with pytest.raises(ValueError):
        lens_trace.tracer_provider(8, 8)
