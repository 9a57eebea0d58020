"""What the stages call: the four services behind one interface, in two implementations.

- `RemoteServices`: each service's gRPC client, opened on first use from its address (a run's usual way).
- `InProcessServices`: the services' cores in this process (`<service>/inprocess.py`): a whole run in one process
  (`cooper train --in-process`) for debugging, tests and benches; the verifier's checks still run in its pool's
  worker processes.

The stages cannot tell the two apart: the same calls, the same message dataclasses back, the same refusals (the
policy's `VersionNotHeld` and `StaleRollout`, which the gRPC client raises for FAILED_PRECONDITION). The protocols
below are each service as the stages use it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from cooper.config import CooperConfig
from cooper.services.generator.messages import NegativeItem, NegativeResult
from cooper.services.policy.messages import Completion, Generation, PolicyInfo, RestoreResult, TrainResult
from cooper.services.reward.items import ModelInfo, PreferencePair, ScoreItem, ScoreResult, UpdateResult
from cooper.services.verifier.messages import VerifyItem, VerifyResult

NAMES = ("policy", "reward", "verifier", "generator")


class Policy(Protocol):
    def generate(self, prompts: Sequence[tuple[str, str]], *, n: int, temperature: float = ..., top_p: float = ...,
                 max_new_tokens: int = ..., stop: Sequence[str] = ..., seed: int = ..., version: int | None = ...
                 ) -> Generation: ...
    def train(self, run_id: str, step: int, rollout: Sequence[Completion], rewards: Sequence[float], group_size: int,
              sampled_version: int) -> TrainResult: ...
    def info(self) -> PolicyInfo: ...
    def restore(self, run_id: str, step: int, at_most_version: int) -> RestoreResult: ...
    def close(self) -> None: ...


class Reward(Protocol):
    def score(self, items: Sequence[ScoreItem]) -> ScoreResult: ...
    def update(self, run_id: str, step: int, pairs: Sequence[PreferencePair], optimizer_steps: int = ...
               ) -> UpdateResult: ...
    def info(self) -> ModelInfo: ...
    def close(self) -> None: ...


class Verifier(Protocol):
    def verify(self, items: Sequence[VerifyItem], deadline_s: float | None = ...) -> list[VerifyResult]: ...
    def close(self) -> None: ...


class Generator(Protocol):
    def negatives(self, items: Sequence[NegativeItem], deadline_s: float | None = ...) -> list[NegativeResult]: ...
    def close(self) -> None: ...


class Services:
    """Each service opened on first use, by `open(name)`; `close()` closes what was opened (last opened first), and
    none opens after it: a job still running while the run stops must not open a service that outlives it."""

    def __init__(self, open_service: Callable[[str], Any]):
        self._open_service = open_service
        self._opened: dict[str, Any] = {}
        self._opening = threading.RLock()  # stage jobs run on several threads; each service opens once
        self.closed = False

    def _get(self, name: str) -> Any:
        if self.closed:
            raise RuntimeError(f"the run is stopping; the {name} service is not called any more")
        with self._opening:
            if name not in self._opened:
                self._opened[name] = self._open_service(name)
            return self._opened[name]

    @property
    def policy(self) -> Policy:
        return self._get("policy")

    @property
    def reward(self) -> Reward:
        return self._get("reward")

    @property
    def verifier(self) -> Verifier:
        return self._get("verifier")

    @property
    def generator(self) -> Generator:
        return self._get("generator")

    def close(self) -> None:
        self.closed = True
        with self._opening:
            opened, self._opened = list(self._opened.values()), {}
        for service in reversed(opened):
            service.close()


def service_client(config: CooperConfig, name: str, address: str) -> Any:
    """The gRPC client of the `name` service at `address`."""
    from cooper.services.generator.client import GeneratorClient
    from cooper.services.policy.client import PolicyClient
    from cooper.services.reward.client import RewardClient
    from cooper.services.verifier.client import VerifierClient

    client = {"policy": PolicyClient, "reward": RewardClient, "verifier": VerifierClient,
              "generator": GeneratorClient}[name]
    return client(address, getattr(config, name).server, config.security)


class RemoteServices(Services):
    """The gRPC clients of the services at `addresses` (by service name)."""

    def __init__(self, config: CooperConfig, addresses: dict[str, str]):
        self.addresses = addresses

        def open_client(name: str) -> Any:
            if name not in addresses:
                raise RuntimeError(f"stage needs the {name} service, but no address is configured for it")
            return service_client(config, name, addresses[name])

        super().__init__(open_client)


def in_process_service(config: CooperConfig, name: str, services: Services) -> Any:
    """The `name` service's core built in this process from `config` (the generator checks its negatives with
    `services.verifier`)."""
    if name == "policy":
        from cooper.services.policy.inprocess import InProcessPolicy

        return InProcessPolicy(config.policy, config.run.max_staleness)
    if name == "reward":
        from cooper.services.reward.inprocess import InProcessReward

        return InProcessReward(config.reward)
    if name == "verifier":
        from cooper.services.verifier.inprocess import InProcessVerifier

        return InProcessVerifier(config.verifier)
    from cooper.services.generator.inprocess import InProcessGenerator

    return InProcessGenerator(config.generator, services.verifier)


class InProcessServices(Services):
    """The services' cores, built in this process on first use from `config` (loading a model takes seconds; the
    imports of torch and math-verify wait until then)."""

    def __init__(self, config: CooperConfig):
        super().__init__(lambda name: in_process_service(config, name, self))
