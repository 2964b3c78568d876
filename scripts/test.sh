#!/usr/bin/env bash
# Runs every check of the project: formatting, clippy with -D warnings, every test (unit,
# integration, doc tests, benches in test mode), the feature matrix, and a run of the demo.
# Installs the system packages the checks need when they are missing (a C++ compiler for
# libzmq, which the lens program's TCP bench and the attack tests use; Open MPI and libclang
# for the MPI backend). MPI tests run under mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export RUST_BACKTRACE=1
# Keep two cores busy without overcommitting memory-hungry link steps.
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"

# Each step's time, printed when the next begins and together at the end, so that a run
# shows where the suite's budget goes.
timings=()
step_name=""
step_from=$SECONDS
step_done() {
  [ -n "$step_name" ] && timings+=("$(printf '%5d s  %s' $((SECONDS - step_from)) "$step_name")")
  step_name=""
}
step() {
  step_done
  step_name="$*"
  step_from=$SECONDS
  printf '\n==> %s\n' "$*"
}

apt_install() {
  # Installs Debian packages that are missing, with `apt-get update` first.
  local missing=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

# The lens program's TCP bench (the raw_zmq baseline, the ranks' directory) and the tests' ZeroMQ
# strangers build libzmq from source (zmq crate): a C++ compiler and make. lens-tcp does not.
# lens-mpi: Open MPI (the tested implementation) and libclang for rsmpi's bindgen.
# The OTLP collector test (rotel-agent) and the Python package: PyPI, in a venv made here.
# The clock test runs one rank under libfaketime; the simulated hosts need ip (iproute2).
apt_install g++ make libopenmpi-dev openmpi-bin libclang-dev clang python3-venv faketime iproute2

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings (all targets)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "feature matrix: every feature of the lens library (lens-trace) and of the program builds alone"
for features in "" local testkit tcp mpi nccl otlp tracing testkit,tracing; do
  cargo clippy -q -p lens-trace --no-default-features --features "$features" -- -D warnings
done
for features in "" tcp mpi nccl; do
  cargo clippy -q -p lens --no-default-features --features "$features" -- -D warnings
done

step "tests (unit, integration, benches in test mode)"
timeout 1500 cargo test --workspace --all-targets --all-features

step "a real clock 2.5 s ahead (faketime): lens measures the offset over TCP"
timeout 300 cargo test -q --workspace --all-features --test clock -- --ignored --exact a_rank_under_faketime_is_measured_2_5_s_ahead
step "a real clock 2.5 s ahead (faketime): the demo exports a rank's spans on rank 0's clock over OTLP (TCP star and tree)"
timeout 300 cargo test -q -p lens --features tcp --test cli_clock -- --ignored --exact a_rank_2_5_s_ahead_is_exported_on_rank_0s_clock

step "simulated hosts (network namespaces, as root): the switch does what its links say, a relay reaches this machine"
timeout 300 cargo test -q -p lens-testkit --all-features --test hosts -- --ignored --test-threads=1
step "lens-tcp across simulated hosts: clock offsets over asymmetric and jittery paths, a straggler behind a slow link, a host cut off, resets"
timeout 300 cargo test -q -p lens-tcp --all-features --test hosts -- --ignored --skip hosts_child --test-threads=1
step "the lens program on simulated hosts: bench and demo across hosts, export from the hosts through a relay, a short soak (knocks, resets, plot)"
timeout 400 cargo test -q -p lens --all-features --test cli_hosts -- --ignored --test-threads=1

step "MPI program tests under mpirun"
timeout 600 cargo test -p lens --all-features --test cli_mpi -- --ignored

# One venv for the Python parts: rotel-agent (an OTLP collector), real torch, NeMo Lens (the
# reference, for the drop-in comparisons) and the lens-trace package. Python 3.13 where the
# machine has it (nemo-lens needs it), else python3. It lives outside the clone, so torch
# (about 5 GB with its CUDA libraries, the only build PyPI has for x86-64) is installed
# once per machine, not once per run.
py=$(command -v python3.13 2>/dev/null || true)
[ -n "$py" ] && "$py" -c pass 2>/dev/null || py=$(ls -d "$HOME"/.pyenv/versions/3.13*/bin/python3.13 2>/dev/null | tail -n 1 || true)
[ -n "$py" ] && [ -x "$py" ] || py=python3
pyver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
venv="${LENS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/lens/venv-$pyver}"
[ -x "$venv/bin/pip" ] || { mkdir -p "$(dirname "$venv")" && "$py" -m venv "$venv"; }
pip_q() { "$venv/bin/pip" install -q --disable-pip-version-check "$@"; }

step "OTLP through a collector lens did not write: rotel-agent (PyPI rotel) in a venv (Python $pyver)"
pip_q "rotel==0.0.1a15"
rotel_agent=$("$venv/bin/python" -c 'import os, rotel; print(os.path.join(os.path.dirname(rotel.__file__), "rotel-agent"))')
[ -x "$rotel_agent" ] || { echo "test.sh: rotel-agent not found at $rotel_agent" >&2; exit 1; }
# rotel-agent links the venv's libpython: where that is not in the loader's path (pyenv's
# Pythons), name its folder.
pylib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR") or "")')
LD_LIBRARY_PATH="$pylib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LENS_ROTEL_AGENT="$rotel_agent" \
  timeout 300 cargo test -p lens --all-features --test cli_rotel -- --ignored

step "Python package lens-trace (lens-py): one wheel built, installed, then pytest"
pip_q "maturin==1.16.0" "pytest==8.4.2" "opentelemetry-sdk==1.45.2" "numpy" "torch==2.15.0"
# NeMo Lens itself, for the drop-in comparisons (it needs Python 3.13; without it those
# tests are skipped, saying why).
if [ "$pyver" = "3.13" ]; then pip_q "nemo-lens==0.1.0"; fi
# One wheel, built once as a release is (maturin, release, abi3), is what every Python test
# below runs against.
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
PATH="$venv/bin:$PATH" "$venv/bin/maturin" build --release --quiet -m lens-py/Cargo.toml -o "$wheels"
wheel=$(ls "$wheels"/lens_trace-*-abi3-*.whl)
pip_q --force-reinstall --no-deps "$wheel"
# A user needs no Rust toolchain: the wheel goes into a fresh venv (its dependencies from
# PyPI) and runs the package's 2-rank example with an empty PATH (no cargo, no rustc, no
# compiler at all) and no environment but HOME.
"$py" -m venv "$wheels/user"
"$wheels/user/bin/pip" install -q --disable-pip-version-check "$wheel"
mkdir "$wheels/empty"
timeout 120 env -i HOME="$HOME" PATH="$wheels/empty" "$wheels/user/bin/python" lens-py/examples/two_ranks.py
# The Rust ranks of the mixed Python/Rust job: cargo puts an example at a fixed path.
cargo build -q -p lens-trace --all-features --example mixed_rank
mixed_rank="$PWD/target/debug/examples/mixed_rank"
[ -x "$mixed_rank" ] || { echo "test.sh: the mixed_rank example was not found at $mixed_rank" >&2; exit 1; }
LENS_MIXED_RANK_BIN="$mixed_rank" timeout 600 "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider lens-py/tests

step "NCCL GPU tests on the fake CUDA driver and NCCL (lens-testkit's fake_gpu.c)"
# Built by the test kit (FakeGpu::build, through its example), the one way it is built.
cargo build -q --workspace --all-features --example fake_gpu
fake_gpu=$(target/debug/examples/fake_gpu)
trap 'rm -rf "$fake_gpu" "$wheels"' EXIT
[ -e "$fake_gpu/libcuda.so" ] || { echo "test.sh: no fake GPU in $fake_gpu" >&2; exit 1; }
# The NCCL tests of the test step above (same flags: nothing rebuilds), with the fake on the
# loader's path; cargo and rustc load neither libcuda nor libnccl.
LD_LIBRARY_PATH="$fake_gpu" LENS_FAKE_GPU_DEVICES=2 LENS_FAKE_GPU_DIR="$fake_gpu" \
  timeout 300 cargo test -q --workspace --all-features --test nccl -- --include-ignored

step "doc tests"
timeout 600 cargo test --workspace --doc --all-features

step "docs build without warnings"
RUSTDOCFLAGS="-D warnings" cargo doc -q --workspace --no-deps --all-features

step "every crate packages alone and builds from its package, as crates.io would"
# lens-py is a Python extension, shipped as a wheel (built above), not a crate. cargo unpacks
# the workspace's packages from its temporary registry into ~/.cargo/registry/src/-<hash>/
# and reuses what is there while the version is unchanged: an earlier run's sources would be
# verified instead of this one's, so they go first.
for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/; do
  [ -d "$d" ] && rm -rf "$d"lens-*-0.* "$d"lens-0.*
done
# Likewise what was built from them: a registry crate's build is never checked against its
# sources again, so each such build's fingerprint goes (the dependencies' builds stay).
target_dir="${CARGO_TARGET_DIR:-target}"
for dfile in "$target_dir"/debug/deps/*.d; do
  grep -q '/registry/src/-[^/]*/lens' "$dfile" 2>/dev/null || continue
  unit=$(basename "$dfile" .d)
  rm -rf "$target_dir/debug/.fingerprint/${unit%-*}-${unit##*-}" "$target_dir/debug/.fingerprint/$(echo "${unit%-*}" | tr _ -)-${unit##*-}" \
    "$target_dir/debug/deps/lib$unit".* "$dfile"
done
timeout 900 cargo package -q --workspace --exclude lens-py --allow-dirty

step "demo smoke run"
timeout 120 cargo run -q -p lens -- demo --ranks 8 --steps 2 --quiet
timeout 180 cargo run -q -p lens --features tcp -- demo --backend tcp --ranks 4 --steps 2 --quiet

step_done
echo
echo "time per step:"
printf '%s\n' "${timings[@]}"
echo
echo "scripts/test.sh: all checks passed in $SECONDS s"
