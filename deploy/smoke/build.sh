#!/usr/bin/env bash
# Build the CPU image (docker/cpu.Dockerfile), and a Redis image for the smoke run (redis.Dockerfile), on a machine
# that reaches neither Docker Hub nor PyTorch's index: on a Debian base made here (base.sh, debootstrap) and with
# torch from a local CPU wheel instead of the index.
#   sudo bash deploy/smoke/build.sh /path/to/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl [TAG]
# TORCH_WHEEL may also come from the environment; TAG defaults to cooper:0.1.0 (what docker-compose.yml runs).
# Rebuilds the base only when its image is missing (COOPER_BASE_IMAGE names another one to use).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
wheel=${1:-${TORCH_WHEEL:-}}
tag=${2:-cooper:0.1.0}
base=${COOPER_BASE_IMAGE:-cooper-base:bookworm}
if [[ ! -f "$wheel" ]]; then
  echo "build.sh: give the CPU torch wheel (torch-2.13.0+cpu-cp311-...whl) as the first argument or TORCH_WHEEL" >&2
  exit 2
fi
source "$repo/deploy/smoke/docker.sh"
"$DOCKER" image inspect "$base" >/dev/null 2>&1 || bash "$repo/deploy/smoke/base.sh" "$base"
# .whl/ is git-ignored and the one extra folder docker/cpu.Dockerfile.dockerignore lets into the context.
mkdir -p "$repo/.whl"
ln -f "$wheel" "$repo/.whl/" 2>/dev/null || cp -f "$wheel" "$repo/.whl/"
# PIP_CERT (pip's own variable: a CA bundle to trust) goes in as the build secret pip_cert, for a machine whose TLS to
# PyPI passes through an intercepting proxy.
secret=()
[[ -n "${PIP_CERT:-}" ]] && secret=(--secret "id=pip_cert,src=$PIP_CERT")
DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain -f "$repo/docker/cpu.Dockerfile" -t "$tag" "${secret[@]}" \
  --build-arg BASE_IMAGE="$base" --build-arg TORCH_FROM=wheelhouse "$repo"
# Redis from Debian's package on the same base, for compose.sh (docker-compose.yml's redis:7.4-alpine is on Docker Hub).
DOCKER_BUILDKIT=1 "$DOCKER" build --progress=plain -f "$repo/deploy/smoke/redis.Dockerfile" -t cooper-redis:bookworm \
  --build-arg BASE_IMAGE="$base" "$repo/deploy/smoke"
