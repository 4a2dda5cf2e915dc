#!/usr/bin/env bash
# Make sure `uv` is on PATH, installing it from PyPI if needed. Sourced by demo.sh and
# test.sh. Works on a fresh Debian/Ubuntu machine that has only Python 3.11+.
set -euo pipefail

export PATH="$HOME/.local/bin:$PATH"
if ! command -v uv >/dev/null 2>&1; then
  echo "keel: installing uv from PyPI ..." >&2
  if ! python3 -m pip --version >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null
    else
      echo "keel: need pip for python3 (apt-get install python3-pip) or uv on PATH" >&2
      exit 1
    fi
  fi
  python3 -m pip install --user --quiet uv 2>/dev/null \
    || python3 -m pip install --user --quiet --break-system-packages uv
fi

# llama-cpp-python (the embedded model server) compiles from source on first install:
# it needs a C/C++ compiler. uv caches the built wheel, so this happens once.
if ! command -v c++ >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "keel: installing a C/C++ compiler (build-essential) ..." >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential >/dev/null
  else
    echo "keel: need a C/C++ compiler to build llama-cpp-python (apt-get install build-essential)" >&2
    exit 1
  fi
fi

# The console's browser tests drive Debian's Chromium (Playwright never downloads a
# browser here). Installed once; a machine that has it keeps it.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "keel: installing Chromium for the console's browser tests ..." >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "keel: the console's browser tests need /usr/bin/chromium (apt-get install chromium chromium-driver)" >&2
  fi
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Bytecode is compiled once, here. uv installs without it, and where Python may not write
# it (PYTHONDONTWRITEBYTECODE=1, as on our development machines, or a read-only tree) every process
# compiled every module it imports from source, every time: `import temporalio.client`
# took 1.5 s instead of 0.5 s, `import litellm` 10.6 s instead of 5.2 s, and each CLI call,
# worker, Ray worker and test subprocess paid the same. With nothing new to compile this
# step takes about 2 s.
#
# llama.cpp builds for the CPU it compiles on (-march=native). Where that CPU has AMX
# (Sapphire Rapids and later Xeons), its AMX matmul kernels are compiled in, and in this
# release they crash the server on its first request (general protection fault at
# ldtilecfg in ggml_backend_amx_mul_mat: the tile config is built on the stack, and
# the worker threads never ask the kernel for the tile state; llama.cpp PR 26954). GCC
# keeps an explicit -mno-* over what -march=native turns on, so these build without AMX
# and use AVX-512 there. A build that has the AMX kernels is rebuilt once.
llama_env=(CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}")
no_amx=""
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  llama_env+=(CFLAGS="${CFLAGS:+$CFLAGS }$no_amx" CXXFLAGS="${CXXFLAGS:+$CXXFLAGS }$no_amx")
fi
llama_has_amx() {
  local lib
  lib=$(ls .venv/lib/python3*/site-packages/llama_cpp/lib/libggml-cpu.so 2>/dev/null | head -1)
  [ -n "$no_amx" ] && [ -n "$lib" ] && nm -D "$lib" 2>/dev/null | grep ggml_backend_amx_mul_mat >/dev/null
}
if [ ! -x .venv/bin/python ] || ! uv sync --frozen --all-extras --check >/dev/null 2>&1; then
  echo "keel: installing Python packages with uv (first run builds llama-cpp-python: minutes) ..." >&2
  env "${llama_env[@]}" uv sync --frozen --all-extras --compile-bytecode
else
  uv sync --frozen --all-extras --compile-bytecode --quiet
fi
# A build with the AMX kernels: an earlier setup's, or a wheel uv had cached from one.
if llama_has_amx; then
  echo "keel: rebuilding llama-cpp-python without its AMX kernels (they crash on this CPU) ..." >&2
  uv cache clean -q llama-cpp-python
  env "${llama_env[@]}" uv sync --frozen --all-extras --compile-bytecode --reinstall-package llama-cpp-python
fi
# Keel's own packages (installed editable, so uv leaves them to Python): stale files are
# recompiled by their timestamps, and a file edited later is compiled on import as usual.
.venv/bin/python -m compileall -q -j 0 keel workflows activities workers client services api sandbox store cli operators >/dev/null

# checkov (the Terraform scanner of the design validators) lives in its own environment:
# its current releases need versions of shared packages that conflict with Keel's pins
# (in .venv uv can only resolve checkov 3.0.34, from 2023). The validator finds it at
# .tools/checkov/bin/checkov; without it that validator reports not_run.
CHECKOV_VERSION="3.3.30"
if [ ! -x .tools/checkov/bin/checkov ] || ! .tools/checkov/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('checkov') != '$CHECKOV_VERSION')" 2>/dev/null; then
  echo "keel: installing checkov $CHECKOV_VERSION into .tools/checkov ..." >&2
  uv venv -q --allow-existing --python .venv/bin/python .tools/checkov
  uv pip install -q --compile-bytecode --python .tools/checkov/bin/python "checkov==$CHECKOV_VERSION"
fi

# The design validators' warm mypy cache (activities/design/mypy_seed.py): built once per
# machine and checkout, here at setup rather than inside the first design run's validators
# (about a minute of CPU: the README's first command on a fresh machine paid it, and so
# did the suite's first validator test, 120.3 s against 19.4 s warm). Nothing to build:
# about 1 s. A failed warm-up is not a failed setup: the first mypy run builds it then.
.venv/bin/python -m activities.design.seed_warmup \
  || echo "keel: the mypy cache warm-up failed; the design validators build it at first use" >&2
