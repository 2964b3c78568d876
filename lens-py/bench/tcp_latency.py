"""Per-call latency of lens_trace's broadcast from Python on lens's TCP group.

    python lens-py/bench/tcp_latency.py --ranks 2,4 --iters 5000

For each group size it starts that many rank processes on 127.0.0.1 and measures, on
rank 0 in the same run: ``group.broadcast`` of the same bytes (the transport as Python
sees it) and ``broadcast_trace_context`` (inject from the current span, one collective,
a dict back on every rank). Compare with ``lens bench --backend tcp`` for the Rust figure.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time


def rank_main(iters: int, warmup: int) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    import lens_trace
    from lens_trace.distributed import broadcast_trace_context

    g = lens_trace.tcp_group()
    tracer = TracerProvider().get_tracer("bench")
    payload = lens_trace.encode_carrier({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    out = {}
    with tracer.start_as_current_span("train_step"):
        for name, call in [
            ("raw_broadcast", lambda: g.broadcast(0, payload if g.rank == 0 else None)),
            ("broadcast_trace_context", lambda: broadcast_trace_context(g.rank, 0, group=g)),
        ]:
            for _ in range(warmup):
                call()
            samples = []
            for _ in range(iters):
                t = time.perf_counter()
                call()
                samples.append((time.perf_counter() - t) * 1e6)
            samples.sort()
            out[name] = {"median_us": statistics.median(samples), "p99_us": samples[int(0.99 * (len(samples) - 1))]}
    g.close()
    if g.rank == 0:
        print(json.dumps(out), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--iters", type=int, default=5000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank_main:
        rank_main(a.iters, a.warmup)
        return
    print(f"{'ranks':>5} {'call':>24} {'median_us':>10} {'p99_us':>10}")
    for world in [int(x) for x in a.ranks.split(",")]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for r in range(world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            env.setdefault("LENS_TCP_KEY", "bench-key-0123456789abcdef")
            cmd = [sys.executable, __file__, "--rank-main", "--iters", str(a.iters), "--warmup", str(a.warmup)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
        try:
            outs = [pr.communicate(timeout=600)[0] for pr in procs]
        finally:
            for pr in procs:
                pr.kill()
        if any(pr.returncode for pr in procs):
            sys.exit(f"a rank failed at {world} ranks")
        for name, fig in json.loads(outs[0]).items():
            print(f"{world:>5} {name:>24} {fig['median_us']:>10.1f} {fig['p99_us']:>10.1f}")


if __name__ == "__main__":
    main()
