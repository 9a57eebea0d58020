# Sourced by build.sh and gpu_image.sh: sets DOCKER to a client that builds with BuildKit. Docker 23+ clients need
# the buildx plugin for it, older ones (Debian's 20.10) have it built in. DOCKER from the environment wins; else the
# first of `docker` and /usr/bin/docker that can.
if [[ -z "${DOCKER:-}" ]]; then
  for client in docker /usr/bin/docker; do
    version=$("$client" version --format '{{.Client.Version}}' 2>/dev/null || true)
    if "$client" buildx version >/dev/null 2>&1 || [[ $version == 20.* ]]; then
      DOCKER=$client && break
    fi
  done
fi
if [[ -z "${DOCKER:-}" ]]; then
  echo "$(basename "$0"): no docker client here builds with BuildKit: install the buildx plugin, or set DOCKER" >&2
  exit 2
fi
