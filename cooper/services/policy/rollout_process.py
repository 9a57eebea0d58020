"""The transformers engine in a process of its own, so that rollouts run while the trainer updates (run.max_staleness
> 0). One Python process cannot do both at once on a small model: `generate`'s token loop holds the GIL between
its short kernels, and measured on 2 cores two threads (one sampling, one training) took 1.03x the time of doing
one after the other.

The process samples from a copy of the policy whose tensors are in shared memory: `load_weights` copies a version's
weights into them from the service's side, while the process is idle (the caller, `BehindSampler`, never overlaps
a load with a `generate`), so no weights are serialised. Requests and completions go over a pipe. The process ends
when the pipe closes, so a service killed with SIGKILL leaves no sampler behind.
"""

from __future__ import annotations

import copy
import logging
import multiprocessing
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

import torch

from cooper.services.policy.engine import Completion, SamplingParams

log = logging.getLogger("cooper.policy")


def _serve(model: Any, tokenizer: Any, batch_size: int, autocast: torch.dtype | None, threads: int | None,
           pipe: Connection) -> None:
    """The rollout process: answer (prompts, sampling) requests with completions until the pipe closes."""
    from cooper.services.policy.hf_engine import TransformersEngine

    if threads:
        torch.set_num_threads(threads)
    engine = TransformersEngine(model, tokenizer, batch_size, autocast)
    while True:
        try:
            prompts, sampling = pipe.recv()
        except (EOFError, OSError):  # the service is gone
            return
        try:
            reply: Any = ("ok", engine.generate(prompts, sampling))
        except ValueError as err:  # a request the engine refuses: the caller's to fix
            reply = ("refused", str(err))
        except Exception as err:  # answered, not raised: the process serves the next request
            reply = ("failed", f"{type(err).__name__}: {err}")
        pipe.send(reply)


class RolloutProcess:
    """A `RolloutEngine` whose sampling runs in a child process, on its own copy of `model`'s weights."""

    name = "transformers"

    def __init__(self, model: Any, tokenizer: Any, batch_size: int, autocast: torch.dtype | None,
                 threads: int | None):
        self.model = copy.deepcopy(model).share_memory()  # the child's weights: written here, read there
        self.model.eval()
        self._weights = dict(self.model.state_dict())
        self._args = (tokenizer, batch_size, autocast, threads)
        self._start()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process that has torch's threads running
        self._pipe, child = context.Pipe()
        self.process = context.Process(target=_serve, name="cooper-rollout", daemon=True,
                                       args=(self.model, *self._args, child))
        self.process.start()
        child.close()

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy `weights` into the shared copy the child samples from; only while no `generate` runs."""
        with torch.no_grad():
            for name, tensor in weights.items():
                self._weights[name].copy_(tensor)

    def sync_weights(self) -> None:
        """Nothing to do: `load_weights` is how this engine's weights change."""

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Completion]]:
        if not self.process.is_alive():  # it died under an earlier call (that call failed): a new one
            log.warning("policy: the rollout process had exited (code %s); starting it again", self.process.exitcode)
            self._start()
        self._pipe.send((list(prompts), sampling))
        try:
            status, value = self._pipe.recv()
        except EOFError:
            self.process.join(timeout=5)
            raise RuntimeError(f"the policy's rollout process died while sampling (exit code "
                               f"{self.process.exitcode}); the next Generate starts it again") from None
        if status == "refused":
            raise ValueError(value)
        if status == "failed":
            raise RuntimeError(f"the policy's rollout process failed: {value}")
        return value

    def close(self) -> None:
        self._pipe.close()
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
