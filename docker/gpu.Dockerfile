# Cooper, GPU image: the policy, reward and generator services (transformers or vLLM on CUDA).
#   docker build -f docker/gpu.Dockerfile -t cooper-gpu:0.1.0 .
# Needs BuildKit (the default since Docker 23; on 20.10 set DOCKER_BUILDKIT=1). deploy/smoke/gpu_image.sh builds it
# on a machine without Docker Hub and checks what it imports.
#
# No CUDA base image: torch 2.13.0 from PyPI is a CUDA 13 build that brings its own CUDA user-space libraries (the
# lock's nvidia-*-cu13 wheels), and vLLM 0.32.0 links those. The NVIDIA container runtime mounts the driver at run
# time (`docker run --gpus all`, compose's `deploy.resources.reservations.devices`, the device plugin on Kubernetes),
# as the two NVIDIA_ variables below ask. The host driver must run CUDA 13: version 580 or newer.
# The base is Debian bookworm's Python 3.11, the Python the lock is made for (requirements/lock.sh): under 3.12,
# vLLM's own requirements (setuptools<81, six) no longer resolve against the lock.
#
# Build arguments for what differs between machines; the defaults are the real world's:
#   BASE_IMAGE  a Debian bookworm image with Python 3.11 and its venv module. Where Docker Hub is out of reach,
#               deploy/smoke/base.sh makes one with debootstrap (cooper-base:bookworm).
# Where TLS to the package indexes is intercepted by a proxy with its own CA, pass that CA bundle as the build secret
# pip_cert, as for docker/cpu.Dockerfile.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# tini as PID 1 (forwards SIGTERM, reaps workers). A C compiler and Python's headers: Triton compiles a small launcher
# for each kernel it loads (vLLM 0.32's sampler runs Triton kernels) and torch.compile builds C++ wrappers; without
# them the first rollout fails. python3-dev is a no-op on python:*-slim, which ships the headers, and needed on a
# Debian python3 base.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini gcc libc6-dev python3-dev \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# The GPU set at the exact versions of the lock (requirements/gpu.txt, made by requirements/lock.sh): torch's CUDA
# build from PyPI and vLLM (policy.engine=vllm, generator assistant.backend=vllm), which pins the torch it was
# built against.
WORKDIR /app
COPY requirements/gpu.txt /tmp/requirements.txt
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    pip install -r /tmp/requirements.txt

COPY pyproject.toml setup.py README.md LICENSE ./
COPY cooper ./cooper
# The presets ship inside the package (setup.py: cooper/configs/).
COPY configs ./configs
# --no-build-isolation: build with the lock's setuptools, already installed, instead of fetching a build backend.
RUN pip install --no-deps --no-build-isolation . && rm -rf /app/build

RUN useradd --uid 10001 --user-group --create-home --home-dir /home/cooper cooper \
    && mkdir -p /data/checkpoints /data/runs /cache /etc/cooper \
    && chown -R 10001:10001 /data /cache
ENV HF_HOME=/cache/huggingface \
    COOPER_CACHE=/cache/cooper \
    TRITON_CACHE_DIR=/cache/triton
USER 10001:10001
WORKDIR /home/cooper

ENTRYPOINT ["tini", "--", "cooper"]
CMD ["serve", "reward", "--ready-file", "/tmp/cooper-ready.json"]
HEALTHCHECK --interval=15s --timeout=15s --start-period=600s --retries=3 \
    CMD ["python", "-m", "cooper.runtime.healthcheck", "--ready-file", "/tmp/cooper-ready.json"]
