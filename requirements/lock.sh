#!/usr/bin/env bash
# Refresh the locks of exact versions from pyproject.toml's ranges:   bash requirements/lock.sh
#
#   requirements/cpu.txt  what `cooper` needs at run time, CPU (README, docker/cpu.Dockerfile)
#   requirements/dev.txt  cpu.txt plus the test tools (README's test line, .ci/run)
#   requirements/gpu.txt  the GPU image's set: torch's CUDA build from PyPI and vLLM (docker/gpu.Dockerfile)
#
# The locks are for Linux x86_64 and CPython 3.11 (CI, the images). torch is not in cpu.txt or dev.txt: it is
# installed first, on its own, as the CPU build (README), and its CPU build's own dependencies are what these locks
# pin. That build is resolved from the PyTorch CPU index, or from a folder of wheels given as
# TORCH_CPU_WHEELS=/path (a machine without that index, such as a CI box with the wheel on disk).
# tests/test_lock.py fails when a lock no longer satisfies pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
TORCH_VERSION=2.13.0
uv_dir=$(mktemp -d)
trap 'rm -rf "$uv_dir"' EXIT
python3 -m venv "$uv_dir" && "$uv_dir/bin/pip" install --quiet "uv==${UV_VERSION}"
uv="$uv_dir/bin/uv"

if [ -n "${TORCH_CPU_WHEELS:-}" ]; then
  torch_source=(--find-links "$TORCH_CPU_WHEELS")
else
  torch_source=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
fi
echo "torch==${TORCH_VERSION}+cpu" > "$uv_dir/torch-cpu.txt"
common=(--python-version 3.11 --python-platform x86_64-manylinux_2_28 --quiet --annotation-style line
        --custom-compile-command "bash requirements/lock.sh")

"$uv" pip compile pyproject.toml --extra dev "${common[@]}" "${torch_source[@]}" \
    --constraint "$uv_dir/torch-cpu.txt" --no-emit-package torch -o requirements/dev.txt
# The run-time set is the dev set less the test tools, at the same versions.
"$uv" pip compile pyproject.toml "${common[@]}" "${torch_source[@]}" \
    --constraint "$uv_dir/torch-cpu.txt" --constraint requirements/dev.txt --no-emit-package torch \
    -o requirements/cpu.txt
# vLLM pins the torch (CUDA build, from PyPI) it was built against; that torch is in this lock.
"$uv" pip compile pyproject.toml --extra gpu "${common[@]}" -o requirements/gpu.txt
echo "locked: requirements/cpu.txt dev.txt gpu.txt (uv ${UV_VERSION}, torch ${TORCH_VERSION} CPU build)"
