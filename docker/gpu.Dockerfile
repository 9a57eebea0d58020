# Cooper, GPU image: the policy, reward and generator services (transformers or vLLM on CUDA).
#   docker build -f docker/gpu.Dockerfile -t cooper-gpu:0.1.0 .
# The torch wheel carries its own CUDA runtime libraries; the CUDA base adds the NVIDIA container settings
# (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES) and a driver-compatible userland. The host driver must
# support the CUDA version of the torch build (see `python -c "import torch; print(torch.version.cuda)"`).
# Build arguments for what differs between machines (defaults: the real world's): CUDA_IMAGE, the base; TORCH_INDEX_URL,
# an extra index for torch's CUDA build (below). Where TLS to the package indexes is intercepted by a proxy with its
# own CA, pass that CA bundle as the build secret pip_cert, as for docker/cpu.Dockerfile. Needs BuildKit (the default
# since Docker 23; on 20.10 set DOCKER_BUILDKIT=1).
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv tini \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# The GPU set at the exact versions of the lock (requirements/gpu.txt, made by requirements/lock.sh): torch's CUDA
# build from PyPI and vLLM (policy.engine=vllm, generator assistant.backend=vllm), which pins the torch it was built
# against. For an older driver, point TORCH_INDEX_URL at https://download.pytorch.org/whl/cuXYZ: pip then takes the
# locked torch version's build for that CUDA version from there.
ARG TORCH_INDEX_URL=https://pypi.org/simple
WORKDIR /app
COPY requirements/gpu.txt /tmp/requirements.txt
RUN --mount=type=secret,id=pip_cert \
    if [ -f /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert; fi; \
    pip install -r /tmp/requirements.txt --extra-index-url "${TORCH_INDEX_URL}"

COPY pyproject.toml README.md ./
COPY cooper ./cooper
# --no-build-isolation: build with the lock's setuptools, already installed, instead of fetching a build backend.
RUN pip install --no-deps --no-build-isolation . && rm -rf /app/build

RUN useradd --uid 10001 --user-group --create-home --home-dir /home/cooper cooper \
    && mkdir -p /data/checkpoints /data/runs /cache /etc/cooper \
    && chown -R 10001:10001 /data /cache
ENV HF_HOME=/cache/huggingface \
    COOPER_CACHE=/cache/cooper
USER 10001:10001
WORKDIR /home/cooper

ENTRYPOINT ["tini", "--", "cooper"]
CMD ["serve", "reward", "--ready-file", "/tmp/cooper-ready.json"]
HEALTHCHECK --interval=15s --timeout=15s --start-period=600s --retries=3 \
    CMD ["python", "-m", "cooper.runtime.healthcheck", "--ready-file", "/tmp/cooper-ready.json"]
