"""Shared helpers: processes with deadlines, free loopback ports, the Rust rank program."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent
TESTDATA = REPO.parent / "shared" / "testdata" / "python-lens-carriers.json"
KEY = "lens-py-test-key-0123456789abcdef"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int, key: str = KEY, **extra: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        LENS_TCP_KEY=key,
        LENS_TCP_TIMEOUT="10",
        LENS_TCP_JOIN_TIMEOUT="30",
    )
    env.pop("LENS_TCP_KEY_FILE", None)
    env.update(extra)
    return env


class Procs:
    """Processes started together, each with the same deadline; all are killed on exit."""

    def __init__(self) -> None:
        self.procs: List[subprocess.Popen] = []

    def start(self, cmd: Sequence[str], env: Dict[str, str]) -> subprocess.Popen:
        p = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.procs.append(p)
        return p

    def wait_all(self, deadline_s: float) -> List[tuple]:
        """(returncode, output) per process in start order; kills the lot past the deadline."""
        end = time.monotonic() + deadline_s
        out = []
        for p in self.procs:
            try:
                text, _ = p.communicate(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"{p.args} did not finish within {deadline_s} s")
            out.append((p.returncode, text))
        return out

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


@pytest.fixture
def procs():
    ps = Procs()
    yield ps
    ps.kill()


def python_cmd(script: str, *args: str) -> List[str]:
    return [sys.executable, str(TESTS / script), *args]


@pytest.fixture(scope="session")
def mixed_rank_bin() -> str:
    """The Rust rank program (lens-trace/examples/mixed_rank.rs): LENS_MIXED_RANK_BIN, else built
    here with cargo."""
    given = os.environ.get("LENS_MIXED_RANK_BIN")
    if given:
        return given
    cmd = ["cargo", "build", "-q", "-p", "lens-trace", "--all-features", "--example", "mixed_rank", "--message-format=json"]
    try:
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    except FileNotFoundError:
        pytest.skip("cargo is not installed and LENS_MIXED_RANK_BIN is not set")
    if res.returncode != 0:
        pytest.fail(f"building mixed_rank failed:\n{res.stderr[-3000:]}")
    for line in res.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["target"]["name"] == "mixed_rank":
            return msg["executable"]
    pytest.fail("cargo did not report the mixed_rank executable")


def read_spans(paths: Sequence[Path]) -> List[dict]:
    spans = []
    for p in paths:
        with open(p) as f:
            spans.extend(json.loads(line) for line in f if line.strip())
    return spans


def check_one_trace_per_step(spans: List[dict], world: int, sources: List[int], steps: int) -> None:
    """Each step: the source's train_step, every other rank's pp.stage in its trace as its
    child, linked to it with the source rank on the link."""
    for step in range(steps):
        src = sources[step % len(sources)]
        of_step = [s for s in spans if s["step"] == step]
        roots = [s for s in of_step if s["name"] == "train_step"]
        assert len(roots) == 1, f"step {step}: expected one train_step, got {roots}"
        root = roots[0]
        assert root["rank"] == src, f"step {step}: train_step on rank {root['rank']}, expected {src}"
        stages = {s["rank"]: s for s in of_step if s["name"] == "pp.stage"}
        assert sorted(stages) == [r for r in range(world) if r != src], f"step {step}: stages from {sorted(stages)}"
        for r, s in stages.items():
            why = f"step {step}, rank {r} ({s['lang']})"
            assert s["trace_id"] == root["trace_id"], f"{why}: not in the source's trace"
            assert s["parent_span_id"] == root["span_id"], f"{why}: not a child of the source's span"
            assert len(s["links"]) == 1, f"{why}: links {s['links']}"
            link = s["links"][0]
            assert (link["trace_id"], link["span_id"]) == (root["trace_id"], root["span_id"]), f"{why}: link"
            assert link["attributes"].get("lens.link.source_rank") == str(src), f"{why}: link attrs {link}"
    assert len({s["trace_id"] for s in spans}) == steps, "one trace per step"
