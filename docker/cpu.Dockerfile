# Cooper, CPU image: the verifier and the orchestrator (and every service of the tiny preset, which needs no GPU).
#   docker build -f docker/cpu.Dockerfile -t cooper:0.1.0 .
# Needs BuildKit (the default since Docker 23; on 20.10 set DOCKER_BUILDKIT=1): it filters the context with
# docker/cpu.Dockerfile.dockerignore and bind-mounts a build stage for the torch step. No `# syntax=` line: BuildKit
# would pull that frontend from Docker Hub, and the built-in one reads this file.
# The GPU services use docker/gpu.Dockerfile: same package, same `cooper` entry point, a CUDA base.
#
# Build arguments for what differs between machines; the defaults are the real world's:
#   BASE_IMAGE       a Debian bookworm image with Python 3.11 and its venv module. Where Docker Hub is out of reach,
#                    deploy/smoke/base.sh makes one with debootstrap (cooper-base:bookworm).
#   TORCH_INDEX_URL  the index pip takes the CPU build of torch from.
#   TORCH_FROM       `index` (TORCH_INDEX_URL), or `wheelhouse`: the torch wheel in .whl/ of the build context
#                    (git-ignored), installed offline (deploy/smoke/build.sh puts a local wheel there).
# Where TLS to the package indexes is intercepted by a proxy with its own CA, pass that CA bundle as the build secret
# pip_cert (`--secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt`): pip trusts it while building, and it
# lands in no layer, so the image trusts only the usual CAs.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# The optional wheelhouse, .whl/ of the context (nothing when there is none: the wildcard may match nothing), in a
# stage of its own that the torch step mounts: its wheel never lands in a layer of the image, and the torch layer's
# cache depends on it and the lock only, never on the code.
FROM scratch AS wheelhouse
COPY requirements/cpu.txt .whl* /

FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# tini as PID 1: forwards SIGTERM to cooper (which drains in-flight calls) and reaps the verifier's worker processes.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && apt-get clean && rm -rf /var/lib/apt/lists/*

# A venv on either base: Debian's own python3 refuses pip installs outside one (PEP 668), python:*-slim's does not care.
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# torch first, the pinned CPU build (a 190 MB wheel, 760 MB installed) instead of the CUDA wheels PyPI would pick, in a
# layer of its own that survives code changes. --no-deps: its dependencies come from the lock below, at exact
# versions.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_FROM=index
RUN --mount=type=bind,from=wheelhouse,target=/wheels --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    case "${TORCH_FROM}" in \
        index) pip install --no-deps "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}" ;; \
        wheelhouse) pip install --no-deps --no-index --find-links /wheels "torch==${TORCH_VERSION}" ;; \
        *) echo "TORCH_FROM is index or wheelhouse, not ${TORCH_FROM}" >&2; exit 2 ;; \
    esac

# The other dependencies at the exact versions of the lock (requirements/lock.sh), before the code, so that editing
# the code does not reinstall them; `pip check` fails the build if torch and the lock disagree.
WORKDIR /app
COPY requirements/cpu.txt /tmp/requirements.txt
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    pip install -r /tmp/requirements.txt && pip check

COPY pyproject.toml setup.py README.md LICENSE ./
COPY cooper ./cooper
# The presets ship inside the package (setup.py: cooper/configs/).
COPY configs ./configs
# --no-build-isolation: build with the lock's setuptools, already installed, instead of fetching a build backend.
RUN pip install --no-deps --no-build-isolation . && rm -rf /app/build

# A non-root user; /data (checkpoints, runs) and /cache (models) are created here, owned by it, so that named volumes
# mounted there start writable.
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/cooper cooper \
    && mkdir -p /data/checkpoints /data/runs /cache /etc/cooper \
    && chown -R 10001:10001 /data /cache
ENV HF_HOME=/cache/huggingface \
    COOPER_CACHE=/cache/cooper
USER 10001:10001
WORKDIR /home/cooper

# One image, a command per service: `serve verifier`, `serve reward`, ..., or `train`. The default healthcheck
# reads the port from the ready file that `cooper serve --ready-file` writes once the service serves; compose
# overrides it with the service's address, Kubernetes uses its native gRPC probes instead.
ENTRYPOINT ["tini", "--", "cooper"]
CMD ["serve", "verifier", "--ready-file", "/tmp/cooper-ready.json"]
HEALTHCHECK --interval=15s --timeout=15s --start-period=60s --retries=3 \
    CMD ["python", "-m", "cooper.runtime.healthcheck", "--ready-file", "/tmp/cooper-ready.json"]
