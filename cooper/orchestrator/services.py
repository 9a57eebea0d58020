"""What the stages call: the four services behind one interface, in two implementations.

- `RemoteServices`: each service's gRPC client, opened on first use from its address (a run's usual way).
- `InProcessServices`: the services' cores in this process (`<service>/inprocess.py`): a whole run in one process
  (`cooper train --in-process`) for debugging, tests and benches; the verifier's checks still run in its pool's
  worker processes;
- `ConfiguredServices`: each through its server where the config gives its address, else in this process.

The stages cannot tell the two apart: the same calls, the same message dataclasses back, the same refusals (the
policy's `VersionNotHeld` and `StaleRollout`, which the gRPC client raises for FAILED_PRECONDITION). The protocols
below are each service as the stages use it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, cast

from cooper.config import CooperConfig
from cooper.runtime.ledger import SavedCheckpoint
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
    def save(self, tag: str = ...) -> SavedCheckpoint: ...
    def restore(self, run_id: str, step: int, at_most_version: int) -> RestoreResult: ...
    def close(self) -> None: ...


class Reward(Protocol):
    def score(self, items: Sequence[ScoreItem]) -> ScoreResult: ...
    def update(self, run_id: str, step: int, pairs: Sequence[PreferencePair], optimizer_steps: int = ...
               ) -> UpdateResult: ...
    def info(self) -> ModelInfo: ...
    def save(self, tag: str = ...) -> SavedCheckpoint: ...
    def close(self) -> None: ...


class Verifier(Protocol):
    def verify(self, items: Sequence[VerifyItem], deadline_s: float | None = ...) -> list[VerifyResult]: ...
    def verify_pairs(self, pairs: Sequence[tuple[str, str]], deadline_s: float | None = ...) -> list[VerifyResult]: ...
    def close(self) -> None: ...


class Generator(Protocol):
    def negatives(self, items: Sequence[NegativeItem], deadline_s: float | None = ...) -> list[NegativeResult]: ...
    def close(self) -> None: ...


class Closable(Protocol):
    def close(self) -> None: ...


S = TypeVar("S", bound=Closable)


class Services:
    """Each service opened on first use (by the `_open_<name>` of a subclass); `close()` closes what was opened (last
    opened first), and none opens after it: a job still running while the run stops must not open a service that
    outlives it."""

    def __init__(self) -> None:
        self._opened: dict[str, Closable] = {}
        self._opening = threading.RLock()  # stage jobs run on several threads; each service opens once
        self.closed = False

    def _get(self, name: str, open_service: Callable[[], S]) -> S:
        if self.closed:
            raise RuntimeError(f"the run is stopping; the {name} service is not called any more")
        with self._opening:
            if name not in self._opened:
                self._opened[name] = open_service()
            return cast(S, self._opened[name])  # `name` is only ever opened by the one function for it

    @property
    def policy(self) -> Policy:
        return self._get("policy", self._open_policy)

    @property
    def reward(self) -> Reward:
        return self._get("reward", self._open_reward)

    @property
    def verifier(self) -> Verifier:
        return self._get("verifier", self._open_verifier)

    @property
    def generator(self) -> Generator:
        return self._get("generator", self._open_generator)

    def _open_policy(self) -> Policy:
        raise RuntimeError(f"{type(self).__name__} has no policy service")

    def _open_reward(self) -> Reward:
        raise RuntimeError(f"{type(self).__name__} has no reward service")

    def _open_verifier(self) -> Verifier:
        raise RuntimeError(f"{type(self).__name__} has no verifier service")

    def _open_generator(self) -> Generator:
        raise RuntimeError(f"{type(self).__name__} has no generator service")

    def close(self) -> None:
        self.closed = True
        with self._opening:
            opened, self._opened = list(self._opened.values()), {}
        for service in reversed(opened):
            service.close()


class RemoteServices(Services):
    """The gRPC clients of the services at `addresses` (by service name)."""

    def __init__(self, config: CooperConfig, addresses: dict[str, str]):
        super().__init__()
        self.config, self.addresses = config, addresses

    def _address(self, name: str) -> str:
        if name not in self.addresses:
            raise RuntimeError(f"stage needs the {name} service, but no address is configured for it")
        return self.addresses[name]

    def _open_policy(self) -> Policy:
        from cooper.services.policy.client import PolicyClient

        return PolicyClient(self._address("policy"), self.config.policy.server, self.config.security)

    def _open_reward(self) -> Reward:
        from cooper.services.reward.client import RewardClient

        return RewardClient(self._address("reward"), self.config.reward.server, self.config.security)

    def _open_verifier(self) -> Verifier:
        from cooper.services.verifier.client import VerifierClient

        return VerifierClient(self._address("verifier"), self.config.verifier.server, self.config.security)

    def _open_generator(self) -> Generator:
        from cooper.services.generator.client import GeneratorClient

        return GeneratorClient(self._address("generator"), self.config.generator.server, self.config.security)


class InProcessServices(Services):
    """The services' cores, built in this process on first use from `config` (loading a model takes seconds; the
    imports of torch and math-verify wait until then). The generator checks its negatives with this verifier."""

    def __init__(self, config: CooperConfig):
        super().__init__()
        self.config = config

    def _open_policy(self) -> Policy:
        from cooper.services.policy.inprocess import InProcessPolicy

        return InProcessPolicy(self.config.policy, self.config.run.max_staleness)

    def _open_reward(self) -> Reward:
        from cooper.services.reward.inprocess import InProcessReward

        return InProcessReward(self.config.reward)

    def _open_verifier(self) -> Verifier:
        from cooper.services.verifier.inprocess import InProcessVerifier

        return InProcessVerifier(self.config.verifier)

    def _open_generator(self) -> Generator:
        from cooper.services.generator.inprocess import InProcessGenerator

        return InProcessGenerator(self.config.generator, self.verifier)


class ConfiguredServices(InProcessServices):
    """Each service through its running server where the config gives its `server.address`, else built in this
    process (`cooper eval-rm`'s judges)."""

    def __init__(self, config: CooperConfig):
        super().__init__(config)
        self.remote = RemoteServices(config, {name: address for name in NAMES
                                              if (address := getattr(config, name).server.address)})

    def _open_policy(self) -> Policy:
        return self.remote._open_policy() if "policy" in self.remote.addresses else super()._open_policy()

    def _open_reward(self) -> Reward:
        return self.remote._open_reward() if "reward" in self.remote.addresses else super()._open_reward()

    def _open_verifier(self) -> Verifier:
        return self.remote._open_verifier() if "verifier" in self.remote.addresses else super()._open_verifier()

    def _open_generator(self) -> Generator:
        return self.remote._open_generator() if "generator" in self.remote.addresses else super()._open_generator()
