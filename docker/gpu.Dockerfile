# syntax=docker/dockerfile:1
# Cooper, GPU image: the policy, reward and generator services (transformers on CUDA; vLLM with COOPER_EXTRAS=gpu).
#   docker build -f docker/gpu.Dockerfile -t cooper-gpu:0.1.0 .
#   docker build -f docker/gpu.Dockerfile --build-arg COOPER_EXTRAS=gpu -t cooper-gpu:0.1.0-vllm .
# The torch wheel carries its own CUDA runtime libraries; the CUDA base adds the NVIDIA container settings
# (NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES) and a driver-compatible userland. The host driver must
# support the CUDA version of the torch build (see `python -c "import torch; print(torch.version.cuda)"`).
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv tini \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

# torch first, CUDA build. PyPI's Linux x86_64 wheel of torch is the CUDA build; set TORCH_INDEX_URL to
# https://download.pytorch.org/whl/cuXYZ to pick a specific CUDA version for older drivers.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://pypi.org/simple
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

WORKDIR /app
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

COPY pyproject.toml README.md ./
COPY cooper ./cooper
# COOPER_EXTRAS=gpu adds vLLM (policy.engine=vllm, generator assistant.backend=vllm). vLLM pins the torch it was
# built against, so with it the torch version is vLLM's, not TORCH_VERSION.
ARG COOPER_EXTRAS=
RUN if [ -n "${COOPER_EXTRAS}" ]; then pip install ".[${COOPER_EXTRAS}]"; else pip install --no-deps .; fi \
    && rm -rf /app/build

RUN useradd --uid 10001 --user-group --create-home --home-dir /home/cooper cooper \
    && mkdir -p /data/checkpoints /data/runs /cache /etc/cooper \
    && chown -R 10001:10001 /data /cache
ENV HF_HOME=/cache/huggingface \
    COOPER_CACHE=/cache/cooper
USER 10001:10001
WORKDIR /home/cooper

ENTRYPOINT ["tini", "--", "cooper"]
CMD ["serve", "reward", "--ready-file", "/tmp/cooper-ready.json"]
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-m", "cooper.runtime.healthcheck", "--ready-file", "/tmp/cooper-ready.json"]
