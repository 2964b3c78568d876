#!/usr/bin/env python3
"""Forms an N-process lens TCP job on 127.0.0.1 (`lens demo --backend tcp`, three steps) and
prints rank 0's peak descriptors and RSS, and how long the job took, every process under
the same descriptor limit.

    cargo build --release -p lens --features tcp
    NOFILE=1024 python3 scripts/scale-tcp.py 1024 4 target/release/lens   # tree, fan-out 4
    NOFILE=4096 python3 scripts/scale-tcp.py 1024 "" target/release/lens  # star

Arguments: ranks, fan-out ("" for the star), the lens binary. Loopback only; every process
is waited for at most 600 s and killed past it."""
import os, socket, subprocess, sys, time, resource
n = int(sys.argv[1]); fan = sys.argv[2] if len(sys.argv) > 2 else ""; binary = sys.argv[3] if len(sys.argv) > 3 else "target/release/lens"
nofile = int(os.environ.get("NOFILE", "1024"))
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
env = dict(os.environ, LENS_TCP_KEY="a scale test job key, 32 bytes!!", LENS_TCP_JOIN_TIMEOUT="300", LENS_TCP_TIMEOUT="60")
if fan: env["LENS_TCP_FAN_OUT"] = fan
def limit(): resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
procs = []
t0 = time.time()
for r in range(n):
    procs.append(subprocess.Popen([binary, "demo", "--backend", "tcp", "--rank", str(r), "--world", str(n), "--addr", f"127.0.0.1:{port}", "--steps", "3", "--quiet"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=limit))
pid0 = procs[0].pid
peak_fd = peak_rss = 0
while procs[0].poll() is None and time.time() - t0 < 600:
    try:
        peak_fd = max(peak_fd, len(os.listdir(f"/proc/{pid0}/fd")))
        with open(f"/proc/{pid0}/status") as f:
            for l in f:
                if l.startswith("VmRSS:"): peak_rss = max(peak_rss, int(l.split()[1]))
    except OSError: pass
    time.sleep(0.02)
t_rank0 = time.time() - t0
fails = 0; first_err = ""
for r, p in enumerate(procs):
    try: out, err = p.communicate(timeout=max(1, 600 - (time.time() - t0)))
    except subprocess.TimeoutExpired:
        p.kill(); out, err = p.communicate(); fails += 1; first_err = first_err or f"rank {r} timed out"; continue
    if p.returncode != 0:
        fails += 1; first_err = first_err or f"rank {r} exit {p.returncode}: {err.decode()[-300:]}"
print(f"n={n} fan_out={fan or 'star'} nofile={nofile}: rank 0 done in {t_rank0:.1f} s, all in {time.time()-t0:.1f} s; rank 0 peak descriptors {peak_fd}, peak RSS {peak_rss} KiB; failed ranks {fails} {first_err}")
