"""Two ranks over lens's TCP group, one process each, on 127.0.0.1: rank 0 broadcasts its
span's trace context, rank 1 links a span to it. Run it as is (it starts both ranks with a
fresh job key and a free port, and checks they agree), or as one rank of your own launch
with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LENS_TCP_KEY set.

    python two_ranks.py
"""

import os
import secrets
import socket
import subprocess
import sys

from opentelemetry.sdk.trace import TracerProvider

import lens_trace
from lens_trace.distributed import broadcast_trace_context, create_linked_span


def rank_main() -> None:
    group = lens_trace.tcp_group()  # RANK, WORLD_SIZE, MASTER_ADDR/PORT, LENS_TCP_KEY
    tracer = TracerProvider().get_tracer("two_ranks")
    if group.rank == 0:
        with tracer.start_as_current_span("train_step"):
            carrier = broadcast_trace_context(0, group=group)
    else:
        carrier = broadcast_trace_context(group.rank, group=group)
        create_linked_span(tracer, "pp.recv_forward", remote_carrier=carrier, stage=group.rank).end()
    print(group.rank, carrier["traceparent"], flush=True)


def launch() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LENS_TCP_KEY=secrets.token_hex(32))
    ranks = [
        subprocess.Popen([sys.executable, __file__], env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=60)[0] for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    codes = [p.returncode for p in ranks]
    lines = [o.split() for o in outs]
    print("".join(outs), end="")
    agreed = codes == [0, 0] and len({tuple(line[1:]) for line in lines}) == 1
    print("both ranks have rank 0's trace context" if agreed else f"failed: exit codes {codes}")
    return 0 if agreed else 1


if __name__ == "__main__":
    sys.exit(rank_main() if "RANK" in os.environ else launch())
