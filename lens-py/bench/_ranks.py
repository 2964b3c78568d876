"""What the benchmarks share: N rank processes of a script on 127.0.0.1, torch's and lens's
rendezvous on free ports, each rank's output back, a failed rank's stderr shown."""

import os
import socket
import subprocess
import sys
from typing import List, Sequence

KEY = "lens-py-bench-key-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(n: int, args: Sequence[str], timeout: float = 900, **extra: str) -> List[str]:
    """Runs ``python <args>`` as ranks 0..n-1 (torch's variables, lens's TCP address and
    key, and ``extra`` set) and returns each rank's stdout; exits when one fails."""
    torch_port, lens_port = free_port(), free_port()
    procs = []
    for r in range(n):
        env = dict(
            os.environ,
            RANK=str(r),
            WORLD_SIZE=str(n),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(torch_port),
            LENS_TCP_ADDR=f"127.0.0.1:{lens_port}",
            LENS_TCP_KEY=KEY,
            GLOO_SOCKET_IFNAME="lo",
            **extra,
        )
        env.pop("LENS_TCP_KEY_FILE", None)
        cmd = [sys.executable, *args]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [pr.communicate(timeout=timeout) for pr in procs]
    finally:
        for pr in procs:
            pr.kill()
    if any(pr.returncode for pr in procs):
        for r, (_, e) in enumerate(outs):
            print(f"rank {r} exited {procs[r].returncode}:\n{e[-2000:]}", file=sys.stderr)
        sys.exit(1)
    return [o for o, _ in outs]
