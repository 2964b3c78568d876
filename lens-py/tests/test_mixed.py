"""A job of Python and Rust processes in one lens TCP group is one trace per step."""

import pytest

from conftest import Procs, check_one_trace_per_step, free_port, python_cmd, rank_env, read_spans

STEPS = 4
# Each step's source: Python and Rust ranks take turns.
SOURCES = [0, 2, 1, 3]


@pytest.mark.parametrize(
    "langs",
    [("python", "python", "rust", "rust"), ("rust", "python", "rust", "python")],
    ids=["python-rendezvous", "rust-rendezvous"],
)
def test_python_and_rust_ranks_share_one_trace_per_step(procs: Procs, mixed_rank_bin: str, tmp_path, langs):
    world = len(langs)
    port = free_port()
    outs = [tmp_path / f"rank{r}.jsonl" for r in range(world)]
    args = ["--steps", str(STEPS), "--sources", ",".join(map(str, SOURCES)), "--out"]
    for r, lang in enumerate(langs):
        cmd = python_cmd("mixed_rank.py", *args, str(outs[r])) if lang == "python" else [mixed_rank_bin, *args, str(outs[r])]
        procs.start(cmd, rank_env(r, world, port))
    for r, (code, text) in enumerate(procs.wait_all(120)):
        assert code == 0, f"rank {r} ({langs[r]}) failed:\n{text}"
    spans = read_spans(outs)
    assert {s["lang"] for s in spans} == {"python", "rust"}
    assert sorted({s["rank"] for s in spans}) == list(range(world))
    check_one_trace_per_step(spans, world, SOURCES, STEPS)
