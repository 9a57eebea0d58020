# syntax=docker/dockerfile:1
# Cooper, CPU image: the verifier and the orchestrator (and every service of the tiny preset, which needs no GPU).
#   docker build -f docker/cpu.Dockerfile -t cooper:0.1.0 .
# The GPU services use docker/gpu.Dockerfile: same package, same `cooper` entry point, a CUDA base.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# tini as PID 1: forwards SIGTERM to cooper (which drains in-flight calls) and reaps the verifier's worker processes.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/*

# torch first and from the CPU index: the pinned CPU build (~200 MB) instead of the CUDA wheels PyPI would pick,
# in a layer of its own that survives code changes.
ARG TORCH_VERSION=2.13.0
RUN pip install "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu

# The other dependencies at the exact versions of the lock (requirements/lock.sh), before the code, so that editing
# the code does not reinstall them.
WORKDIR /app
COPY requirements/cpu.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt

COPY pyproject.toml README.md ./
COPY cooper ./cooper
RUN pip install --no-deps . && rm -rf /app/build

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
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "cooper.runtime.healthcheck", "--ready-file", "/tmp/cooper-ready.json"]
