"""The policy's two sampling routes, chosen once when the service starts: from the trainer's own weights under its
lock (`CurrentSampler`, run.max_staleness = 0), or from a version behind the trainer's while the trainer updates
(`BehindSampler`, run.max_staleness = k > 0). Both answer `generate(prompts, sampling, version, current, model)`
with the completions and the version that sampled them, `keep` before each update and `synced` after it.

Which versions are asked for: rollout(t) samples version max(0, t-k) and always runs before policy_update(t)
(cooper/orchestrator/graph.py), so while the trainer is at version W (policy_update(W-1) applied) every rollout
still to come asks for W-k or later, and an evaluation asks for W itself. So before each update, the one taking the
trainer from W to W+1, the weights of W are copied here (`keep`), and the newest k copies are kept.

The engine samples from weights of its own (`RolloutProcess`'s shared copy, or vLLM's) and loads a version into them
when a request asks for another one than it has: from a kept copy, or from the trainer when the trainer is at that
version (under the trainer's lock, so never mid-update). One engine call at a time, loads included; the trainer's
lock is held only for that copy, so sampling and training run at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cooper.services.policy.engine import Completion, SamplingParams
from cooper.services.policy.errors import VersionNotHeld


class CurrentSampler:
    """Samples the trainer's current weights only, from the engine that shares them, under the trainer's lock: a
    Generate waits for a Train under way, and the weights never change under it."""

    behind = 0

    def __init__(self, engine: Any, trainer_lock: threading.Lock):
        self.engine, self._trainer_lock = engine, trainer_lock

    def keep(self, version: int, model: Any) -> None:
        """Nothing: no rollout asks for a version the trainer has left."""

    def synced(self) -> None:
        """The trainer's weights changed: the engine samples the new ones."""
        self.engine.sync_weights()

    def generate(self, prompts: Sequence[str], sampling: SamplingParams, version: int | None,
                 current: Callable[[], int], model: Any) -> tuple[list[list[Completion]], int]:
        with self._trainer_lock:
            if version is not None and version != current():
                raise VersionNotHeld(f"policy version {version} is not held here: the service is at version "
                                     f"{current()} and keeps no other (run.max_staleness 0)")
            return (self.engine.generate(prompts, sampling) if prompts else []), current()


class BehindSampler:
    """Samples `version` from weights of the engine's own, loaded from a kept copy or from the trainer."""

    def __init__(self, engine: Any, behind: int, trainer_lock: threading.Lock):
        if behind < 1:
            raise ValueError(f"a sampler behind the trainer keeps at least one version (got {behind})")
        self.engine, self.behind = engine, behind
        self.engine_version: int | None = None
        """The version the engine's weights hold (None: unknown, e.g. before the first load)."""
        self._kept: dict[int, dict[str, torch.Tensor]] = {}
        self._kept_lock = threading.Lock()
        self._engine_lock = threading.Lock()
        self._trainer_lock = trainer_lock

    def keep(self, version: int, model: Any) -> None:
        """Called under the trainer's lock right before the update that takes it from `version` to `version + 1`:
        a copy of the weights of `version`, and the copies no rollout can ask for any more dropped."""
        with torch.no_grad():
            weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
        with self._kept_lock:
            self._kept[version] = weights
            for old in [v for v in self._kept if v <= version - self.behind]:
                del self._kept[old]

    def kept_versions(self) -> list[int]:
        with self._kept_lock:
            return sorted(self._kept)

    def synced(self) -> None:
        """Nothing: the engine loads a version when a Generate asks for it."""

    def generate(self, prompts: Sequence[str], sampling: SamplingParams, version: int | None,
                 current: Callable[[], int], model: Any) -> tuple[list[list[Completion]], int]:
        """Sample with the weights of `version` (None: the trainer's); `current()` is the trainer's version and
        `model` its weights."""
        wanted = current() if version is None else version
        if not prompts:
            return [], wanted
        with self._engine_lock:
            if wanted != self.engine_version:
                self._load(wanted, current, model)
            return self.engine.generate(prompts, sampling), wanted

    def _load(self, version: int, current: Callable[[], int], model: Any) -> None:
        self.engine_version = None  # until the load below has finished
        with self._kept_lock:
            weights = self._kept.get(version)
        if weights is None:
            with self._trainer_lock:
                with self._kept_lock:  # `keep` may have run while this waited for the trainer
                    weights = self._kept.get(version)
                if weights is None:
                    if current() != version:
                        raise VersionNotHeld(
                            f"policy version {version} is not held here: the trainer is at version {current()} and "
                            f"keeps versions {self.kept_versions() or 'none'} behind it (run.max_staleness "
                            f"{self.behind}); a restarted service keeps only what its checkpoints and update "
                            "journal rebuild")
                    self.engine.load_weights(model.state_dict())
                    self.engine_version = version
                    return
        self.engine.load_weights(weights)
        self.engine_version = version
