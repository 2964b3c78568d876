"""Where the time of one ``broadcast_trace_context`` goes, on every rank, by phase.

    python lens-py/bench/phases.py --ranks 2,4 --iters 2000

For each group size it starts that many rank processes on 127.0.0.1 and, on both a
``torch_group`` (gloo) and a ``tcp_group``, runs the steps of ``broadcast_trace_context``
one by one after a gloo barrier, timing each on each rank:

- ``pre``: the argument checks, finding the group, and on the source the span context's
  parts read from the current span (``_w3c_parts``), the result made empty;
- ``round``: the group's native ``broadcast_w3c`` (the carrier written and encoded, the one
  collective, decoded into the result), with the GIL released while it waits;
- ``post``: on the source, how the ranks came written on its span (``record_arrivals``,
  TCP only) and the samplers told (``after_round``);
- ``raw``: the bare collective in the same run: one gloo broadcast of the slab (launched as
  lens launches it) or the TCP group's round of the carrier's bytes.

Prints the median µs of each phase per rank: the README's table of where each
microsecond goes comes from this script.
"""

import argparse
import json
import statistics
import time
from datetime import timedelta

from _ranks import run_ranks


def rank_main(group_kind: str, iters: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist
    from opentelemetry import propagate
    from opentelemetry.sdk.trace import TracerProvider

    import lens_trace
    from lens_trace import distributed as lens
    from lens_trace.observe import record_arrivals
    from lens_trace.sample import after_round

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tcp = lens_trace.tcp_group() if group_kind == "tcp" else None
    if tcp is not None:
        lens.set_group(tcp)
        payload = lens_trace.encode_carrier({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})

        def raw() -> None:
            tcp.broadcast(0, payload if rank == 0 else None)

    else:
        pg = dist.group.WORLD
        tensor = torch.zeros(256, dtype=torch.uint8)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0

        def raw() -> None:
            pg.broadcast([tensor], opts).wait(timeout=timedelta(seconds=30))

    clock = time.perf_counter_ns
    phases = {"pre": [], "round": [], "post": [], "total": [], "raw": []}
    tracer = TracerProvider().get_tracer("bench")
    with tracer.start_as_current_span("train_step"):
        for i in range(warmup + iters):
            dist.barrier()
            t0 = clock()
            lens._check_int("rank", rank)
            lens._check_int("src_rank", 0)
            g = lens._find_group()
            lens._default_textmap(propagate.get_global_textmap())
            parts = lens._w3c_parts(None) if rank == 0 else (None, None, None)
            got = lens._new_remote_carrier(0)
            t1 = clock()
            g.broadcast_w3c(0, *parts, got)
            t2 = clock()
            if rank == 0:
                record_arrivals(g, None)
            after_round(g)
            t3 = clock()
            dist.barrier()
            t4 = clock()
            raw()
            t5 = clock()
            if i >= warmup:
                for name, ns in (("pre", t1 - t0), ("round", t2 - t1), ("post", t3 - t2), ("total", t3 - t0), ("raw", t5 - t4)):
                    phases[name].append(ns / 1000)
    lens.set_group(None)
    if tcp is not None:
        tcp.close()
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({name: statistics.median(v) for name, v in phases.items()}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--rank-main", choices=["torch", "tcp"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank_main:
        rank_main(a.rank_main, a.iters, a.warmup)
        return
    print(f"{'ranks':>5} {'group':>5} {'rank':>4} {'pre':>7} {'round':>7} {'post':>7} {'total':>7} {'raw':>7}  (median µs)")
    for n in [int(x) for x in a.ranks.split(",")]:
        for kind in ("torch", "tcp"):
            args = [__file__, "--rank-main", kind, "--iters", str(a.iters), "--warmup", str(a.warmup)]
            outs = run_ranks(n, args)
            for r, o in enumerate(outs):
                f = json.loads(o.strip().splitlines()[-1])
                print(
                    f"{n:>5} {kind:>5} {r:>4} {f['pre']:>7.1f} {f['round']:>7.1f} {f['post']:>7.1f} {f['total']:>7.1f} {f['raw']:>7.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
