#!/usr/bin/env bash
# Build the GPU image (docker/gpu.Dockerfile) on a machine without Docker Hub or a GPU, and check what can be checked
# without one: that torch's CUDA build, vLLM and Cooper's vLLM engine import in it, and that `cooper serve reward`
# accepts the GPU preset. Prints one JSON line last: built, imports, check_config, seconds, size_mb.
#   sudo bash deploy/smoke/gpu_image.sh [TAG]        # default tag cooper-gpu:0.1.0; not part of CI (minutes, GBs)
# The base is a Debian bookworm image made here (base.sh, debootstrap; COOPER_BASE_IMAGE names another one).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
tag=${1:-cooper-gpu:0.1.0}
base=${COOPER_BASE_IMAGE:-cooper-base:bookworm}
source "$repo/deploy/smoke/docker.sh"
docker=$DOCKER
started=$(date +%s)
"$docker" image inspect "$base" >/dev/null 2>&1 || bash "$repo/deploy/smoke/base.sh" "$base"
secret=()
[[ -n "${PIP_CERT:-}" ]] && secret=(--secret "id=pip_cert,src=$PIP_CERT")
built=false
if DOCKER_BUILDKIT=1 "$docker" build --progress=plain -f "$repo/docker/gpu.Dockerfile" -t "$tag" "${secret[@]}" \
    --build-arg BASE_IMAGE="$base" "$repo"; then
  built=true
fi
imports=false check_config=false size_mb=null
if $built; then
  # No GPU here: vLLM imports and picks no platform; torch reports its CUDA build and finds no device.
  if "$docker" run --rm --entrypoint python "$tag" -c \
      "import torch, vllm, cooper.services.policy.vllm_engine as e; print(torch.__version__, torch.version.cuda, vllm.__version__, e.__name__)"; then
    imports=true
  fi
  if "$docker" run --rm -v "$repo/configs:/etc/cooper:ro" "$tag" serve reward --check-config \
      --config /etc/cooper/qwen2.5-1.5b-cooper.yaml >/dev/null; then
    check_config=true
  fi
  size_mb=$(( $("$docker" image inspect -f '{{.Size}}' "$tag") / 1000000 ))
fi
printf '{"built": %s, "imports": %s, "check_config": %s, "seconds": %d, "size_mb": %s, "tag": "%s"}\n' \
  "$built" "$imports" "$check_config" $(( $(date +%s) - started )) "$size_mb" "$tag"
