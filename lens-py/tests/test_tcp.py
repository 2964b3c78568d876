"""Python ranks over lens's TCP group, in separate processes on 127.0.0.1: a rank that never
arrives, a rank with the wrong key, a queued source (at its next call, at flush, at exit)."""

import json
import time

import os

from conftest import KEY, Procs, free_port, python_cmd, rank_env

# How many times the clean-exit test runs its job (the package README gives the result of 50).
EXIT_RUNS = int(os.environ.get("LENS_EXIT_RUNS", "3"))


def last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in:\n{text}")


def test_every_python_rank_gets_the_carrier_over_tcp(procs: Procs):
    world, port = 3, free_port()
    for r in range(world):
        procs.start(python_cmd("tcp_probe.py"), rank_env(r, world, port))
    got = [last_json(text) for _, text in procs.wait_all(60)]
    carriers = [g.get("carrier") for g in got]
    assert carriers[0] and all(c == carriers[0] for c in carriers), got
    assert carriers[0]["traceparent"].startswith("00-")


def test_a_rank_that_never_joins_is_named_by_the_join_timeout(procs: Procs):
    world, port = 3, free_port()
    t0 = time.monotonic()
    for r in range(2):  # rank 2 never starts
        procs.start(python_cmd("tcp_probe.py"), rank_env(r, world, port, LENS_TCP_JOIN_TIMEOUT="2"))
    got = [last_json(text) for _, text in procs.wait_all(60)]
    assert time.monotonic() - t0 < 30
    root = got[0]
    assert (root["stage"], root["error"]) == ("join", "BroadcastTimeout"), root
    assert root["missing"] == [2], root
    assert got[1]["stage"] == "join" and "error" in got[1], got[1]


def two_ranks_and_an_idle_third(procs: Procs, args, env):
    """Ranks 0 and 1 run tcp_probe.py with ``args`` and ``env``; rank 2 joins and never
    broadcasts. Ranks 0 and 1's last JSON lines, once both have exited."""
    world, port = 3, free_port()
    for r in range(2):
        procs.start(python_cmd("tcp_probe.py", *args), rank_env(r, world, port, **env))
    idle = procs.start(python_cmd("tcp_probe.py", "--idle"), rank_env(2, world, port))
    got = []
    for p in procs.procs[:2]:
        text, _ = p.communicate(timeout=60)
        got.append(last_json(text))
    idle.kill()
    return got


def test_a_rank_that_joins_but_never_broadcasts_is_named_within_the_timeout(procs: Procs):
    got = two_ranks_and_an_idle_third(procs, [], {"LENS_TCP_TIMEOUT": "1"})
    root = got[0]
    assert root["stage"] == "broadcast" and root.get("error") == "BroadcastTimeout", root
    assert root["missing"] == [2] and root["waited"] < 10, root
    # Rank 1 heard rank 0 directly: it has the carrier (or, on a tree, the same timeout).
    assert got[1].get("carrier") or got[1].get("error") == "BroadcastTimeout", got[1]


def test_a_queued_source_returns_at_once_and_names_the_missing_rank_at_its_next_call(procs: Procs):
    env = {"LENS_TCP_TIMEOUT": "2", "LENS_TCP_SOURCE_RETURNS": "queued"}
    got = two_ranks_and_an_idle_third(procs, ["--twice", "--flush"], env)
    root = got[0]
    # The first call returned once its data was queued (a delivered source waits 2 s for
    # rank 2 and raises); the second reports the first round's failure.
    assert len(root["done"]) == 1 and root["done"][0]["carrier"], root
    assert root["done"][0]["took"] < 0.5, root
    assert root.get("error") == "BroadcastTimeout" and root["missing"] == [2], root
    # Rank 1 got both carriers: the source's second round took place before it raised.
    assert [d["carrier"]["traceparent"][:2] for d in got[1]["done"]] == ["00", "00"], got[1]
    # The second round is open on the source: flush raises its failure, and close then has
    # nothing left to report. Rank 1 was never a source.
    assert (root["flush"], root["flush_missing"], root["close"]) == ("BroadcastTimeout", [2], "ok"), root
    assert (got[1]["flush"], got[1]["close"]) == ("ok", "ok"), got[1]


def test_an_unknown_source_returns_value_is_refused_naming_the_values():
    import pytest

    import lens_trace

    with pytest.raises(lens_trace.ConfigError, match="delivered"):
        lens_trace.tcp_group(rank=0, world_size=2, addr="127.0.0.1:1", key=KEY, source_returns="later")


def test_spin_us_reaches_the_group_and_a_bad_one_is_refused(monkeypatch):
    import pytest

    import lens_trace

    group = dict(rank=0, world_size=2, addr="127.0.0.1:1", key=KEY)
    with pytest.raises(lens_trace.ConfigError, match="LENS_TCP_SPIN_US"):
        lens_trace.tcp_group(spin_us=20_000, **group)
    with pytest.raises(ValueError, match="spin_us must be 0 or more"):
        lens_trace.tcp_group(spin_us=-1, **group)
    monkeypatch.setenv("LENS_TCP_SPIN_US", "fast")
    with pytest.raises(lens_trace.ConfigError) as e:
        lens_trace.tcp_group(**group)
    assert e.value.setting == "LENS_TCP_SPIN_US", e.value
    monkeypatch.setenv("LENS_TCP_SPIN_US", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "0")
    with pytest.raises(lens_trace.ConfigError) as e:
        lens_trace.tcp_group(**group)
    assert e.value.setting == "LOCAL_WORLD_SIZE", e.value


def test_a_rank_with_the_wrong_key_never_gets_a_carrier(procs: Procs):
    world, port = 2, free_port()
    procs.start(python_cmd("tcp_probe.py"), rank_env(0, world, port, LENS_TCP_JOIN_TIMEOUT="3"))
    procs.start(
        python_cmd("tcp_probe.py"),
        rank_env(1, world, port, key="x" * len(KEY), LENS_TCP_JOIN_TIMEOUT="3"),
    )
    got = [last_json(text) for _, text in procs.wait_all(60)]
    for r, g in enumerate(got):
        assert "carrier" not in g, (r, g)
        assert g["stage"] == "join" and "error" in g, (r, g)
    assert got[1]["error"] == "AuthenticationError", got[1]
    assert "key" in got[1]["text"], got[1]


def test_lens_tcp_addr_gives_the_group_its_own_port_beside_a_busy_master_port(procs: Procs):
    """Under torchrun with torch.distributed initialised, torch's store holds MASTER_PORT:
    LENS_TCP_ADDR moves lens's rendezvous elsewhere (the README says so)."""
    import socket

    world = 2
    with socket.socket() as busy:  # stands in for torch's store on MASTER_PORT
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        master_port = busy.getsockname()[1]
        lens_addr = f"127.0.0.1:{free_port()}"
        for r in range(world):
            procs.start(python_cmd("tcp_probe.py"), rank_env(r, world, master_port, LENS_TCP_ADDR=lens_addr))
        got = [last_json(text) for _, text in procs.wait_all(60)]
    assert all(g.get("carrier") for g in got), got


def test_a_queued_source_that_exits_holding_its_group_waits_for_its_last_round(procs: Procs):
    """The interpreter's shutdown drops a group held in a module global: the source's last
    queued round is delivered and waited for within the deadline, not cut off by the exit."""
    world, port = 2, free_port()
    env = {"LENS_TCP_TIMEOUT": "10", "LENS_TCP_SOURCE_RETURNS": "queued"}
    t0 = time.monotonic()
    source = procs.start(python_cmd("queued_exit.py"), rank_env(0, world, port, **env))
    late = procs.start(python_cmd("queued_exit.py"), rank_env(1, world, port, **env))
    text, _ = source.communicate(timeout=60)
    source_lived = time.monotonic() - t0
    late_text, _ = late.communicate(timeout=60)
    assert source.returncode == 0 and last_json(text)["returned_after"] < 1.0, text
    assert last_json(late_text)["carrier"]["traceparent"].startswith("00-"), late_text
    # Rank 1 takes part 1.5 s after it joins: a source that did not wait at exit would have
    # ended well before that.
    assert source_lived >= 1.4, (source_lived, text)



def test_a_tcp_job_exits_with_status_0_every_time(tmp_path):
    """The NeMo loop over lens's TCP group (4 ranks) returns normally on every rank, run
    after run: the group's threads end with the interpreter, no abort, status 0."""
    for i in range(EXIT_RUNS):
        ps = Procs()
        try:
            port = free_port()
            for r in range(4):
                ps.start(python_cmd("nemo_loop.py", "tcp", str(tmp_path / f"{i}-{r}.jsonl")), rank_env(r, 4, port))
            res = ps.wait_all(120)
        finally:
            ps.kill()
        for r, (code, text) in enumerate(res):
            assert code == 0, f"run {i}, rank {r} exited with {code}:\n{text}"


def test_a_variable_that_does_not_parse_is_named_in_the_error(monkeypatch):
    import pytest

    import lens_trace

    monkeypatch.setenv("LENS_TCP_TIMEOUT", "soon")
    with pytest.raises(lens_trace.ConfigError, match="LENS_TCP_TIMEOUT") as e:
        lens_trace.tcp_group(rank=0, world_size=2, addr="127.0.0.1:1", key=KEY)
    assert e.value.setting == "LENS_TCP_TIMEOUT", e.value
    assert e.value.disagreement is None
