#!/usr/bin/env bash
# GPU check of the NCCL backend.
#
#   scripts/gpu-check.sh --build   on an x86-64 machine with cargo: builds the NCCL test
#                                  binary and the lens program into gpu-bin/
#   scripts/gpu-check.sh           on the GPU machine (no Rust needed): prints the GPU, the
#                                  driver and NCCL, runs the NCCL tests (GPU ones included),
#                                  the NCCL demo on every GPU (one process per GPU) and the
#                                  NCCL bench; exits non-zero on any failure.
#
# The GPU machines have a CUDA 13 driver and NCCL only inside Python (the nvidia-nccl-cu13
# wheel, which ships libnccl.so.2: a libnccl.so link to it is made for cudarc). With one
# GPU, the tests run a group of one rank (NCCL refuses two ranks on one GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=gpu-bin

if [ "${1:-}" = "--build" ]; then
  mkdir -p "$BIN"
  test_exe=$(cargo test -p lens-nccl --release --test nccl --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "nccl" and m.get("executable"):
        print(m["executable"])' | tail -n 1)
  [ -n "$test_exe" ] || { echo "gpu-check: could not build the NCCL tests" >&2; exit 1; }
  cp "$test_exe" "$BIN/nccl-tests"
  cargo build --release -p lens --features nccl,tcp
  cp target/release/lens "$BIN/lens"
  echo "gpu-check: built $BIN/nccl-tests and $BIN/lens"
  exit 0
fi

[ -x "$BIN/nccl-tests" ] && [ -x "$BIN/lens" ] || {
  echo "gpu-check: run 'scripts/gpu-check.sh --build' first (on a machine with cargo)" >&2
  exit 2
}
echo "== GPU"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv || {
  echo "gpu-check: nvidia-smi failed: no GPU here" >&2
  exit 1
}
# NCCL: the nvidia-nccl-cu13 wheel's library (in the package folder or a lib/ below it),
# else any libnccl.so.2 on this machine.
nccl_lib=""
pkg_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
if [ -n "$pkg_dir" ]; then
  nccl_lib=$(find "$pkg_dir" -name 'libnccl.so.2' 2>/dev/null | head -n 1)
fi
if [ -z "$nccl_lib" ]; then
  nccl_lib=$(timeout 30 find / -xdev -name 'libnccl.so.2' 2>/dev/null | head -n 1 || true)
fi
if [ -n "$nccl_lib" ]; then
  nccl_dir=$(dirname "$nccl_lib")
  links=$(mktemp -d)
  ln -sf "$nccl_lib" "$links/libnccl.so"
  export LD_LIBRARY_PATH="$links:$nccl_dir:${LD_LIBRARY_PATH:-}"
  echo "== NCCL: $nccl_lib (wheel $(python3 -c 'import importlib.metadata as m; print(m.version("nvidia-nccl-cu13"))' 2>/dev/null || echo 'not found'))"
else
  echo "== NCCL: no libnccl.so.2 found; relying on the loader path"
fi
ngpu=$(nvidia-smi --list-gpus | grep -c '^GPU' || true)
echo "== NCCL tests (GPU tests: one rank on GPU 0, then one rank per GPU in one process)"
timeout 200 "$BIN/nccl-tests" --include-ignored --test-threads=1 --nocapture
echo "== NCCL demo: $ngpu process(es), one per GPU, bootstrapped over loopback TCP"
timeout 90 "$BIN/lens" demo --backend nccl --ranks "$ngpu" --steps 3 --timeout 20
echo "== NCCL bench (every local GPU, one thread each)"
timeout 90 "$BIN/lens" bench --backend nccl --iters 2000
timeout 90 "$BIN/lens" bench --backend nccl --iters 2000 --json
echo "gpu-check: all passed"
