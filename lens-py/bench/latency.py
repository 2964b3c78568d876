"""Per-call latency of a trace-context broadcast from Python, measured in one run.

    python lens-py/bench/latency.py --ranks 2,4 --iters 2000

For each group size it starts that many rank processes on 127.0.0.1 (torch.distributed on
gloo, and lens's TCP group on a port of its own) and measures on rank 0, in interleaved
blocks with a gloo barrier before each call:

- ``raw_gloo``: one ``dist.broadcast`` of a 256-byte tensor (one collective: the floor);
- ``nemo_lens``: NeMo Lens's ``broadcast_trace_context`` (where ``nemo-lens`` is installed);
- ``lens_torch``: lens's over ``torch_group`` (the world group, no group set: the drop-in);
- ``lens_tcp``: lens's over ``tcp_group``;
- ``lens_tcp_queued``: the same over ``tcp_group(source_returns="queued")``: the source
  returns once its data is queued (checked at its next call), as a gloo or MPI root does;
- ``raw_tcp``: the TCP group's own round of a carrier's bytes (lens_tcp less its Python).

Rank 0 holds a span, so every broadcast carries a traceparent. Prints median and p99 (µs)
and the ratios the README quotes.
"""

import argparse
import json
import os
import statistics
import time

from _ranks import free_port, run_ranks


def rank_main(iters: int, blocks: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist
    from opentelemetry.sdk.trace import TracerProvider

    import lens_trace
    from lens_trace import distributed as lens

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tcp = lens_trace.tcp_group()
    queued = lens_trace.tcp_group(addr=os.environ["LENS_BENCH_QUEUED_ADDR"], source_returns="queued")
    tensor = torch.zeros(256, dtype=torch.uint8)
    modes = [("raw_gloo", lambda: dist.broadcast(tensor, 0))]
    try:
        from nemo.lens import distributed as nemo

        modes.append(("nemo_lens", lambda: nemo.broadcast_trace_context(rank, 0)))
    except ImportError:
        pass
    modes.append(("lens_torch", lambda: lens.broadcast_trace_context(rank, 0)))
    modes.append(("lens_tcp", lambda: lens.broadcast_trace_context(rank, 0, group=tcp)))
    modes.append(("lens_tcp_queued", lambda: lens.broadcast_trace_context(rank, 0, group=queued)))
    # The TCP group's own round with a carrier's bytes: lens_tcp less the Python around it.
    payload = lens_trace.encode_carrier({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    modes.append(("raw_tcp", lambda: tcp.broadcast(0, payload if rank == 0 else None)))
    samples = {name: [] for name, _ in modes}
    tracer = TracerProvider().get_tracer("bench")
    with tracer.start_as_current_span("train_step"):
        for _, call in modes:
            for _ in range(warmup):
                dist.barrier()
                call()
        per_block = max(1, iters // blocks)
        for _ in range(blocks):
            for name, call in modes:
                for _ in range(per_block):
                    dist.barrier()
                    t = time.perf_counter()
                    call()
                    samples[name].append((time.perf_counter() - t) * 1e6)
    tcp.close()
    queued.close()
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        out = {}
        for name, s in samples.items():
            s.sort()
            out[name] = {"median_us": statistics.median(s), "p99_us": s[int(0.99 * (len(s) - 1))]}
        print(json.dumps(out), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank_main:
        rank_main(a.iters, a.blocks, a.warmup)
        return
    print(f"{'ranks':>5} {'call':>15} {'median_us':>10} {'p99_us':>10}")
    for n in [int(x) for x in a.ranks.split(",")]:
        args = [__file__, "--rank-main", "--iters", str(a.iters), "--blocks", str(a.blocks), "--warmup", str(a.warmup)]
        outs = run_ranks(n, args, LENS_BENCH_QUEUED_ADDR=f"127.0.0.1:{free_port()}")
        res = json.loads(outs[0].strip().splitlines()[-1])
        for name, v in res.items():
            print(f"{n:>5} {name:>15} {v['median_us']:>10.1f} {v['p99_us']:>10.1f}")
        raw = res["raw_gloo"]["median_us"]
        line = f"{n:>5} lens_torch / raw_gloo = {res['lens_torch']['median_us'] / raw:.2f}x"
        if "nemo_lens" in res:
            line += f"; nemo_lens / lens_tcp = {res['nemo_lens']['median_us'] / res['lens_tcp']['median_us']:.1f}x"
            line += f"; nemo_lens / lens_tcp_queued = {res['nemo_lens']['median_us'] / res['lens_tcp_queued']['median_us']:.1f}x"
            line += f"; nemo_lens / lens_torch = {res['nemo_lens']['median_us'] / res['lens_torch']['median_us']:.1f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
