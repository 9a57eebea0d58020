"""The policy service's requests and replies as plain dataclasses: what `PolicyClient` takes and returns, and what
`PolicyCore.train` answers.

No grpc and no torch here, so that callers that only build or read these (the orchestrator's stages) load neither.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Completion:
    """One sampled completion, as Generate returns it and Train takes it back (a rollout is these, grouped by
    prompt, `n` per prompt, `index` ascending)."""

    prompt_id: str
    index: int  # 0..n-1 within its prompt's group
    text: str
    token_ids: list[int]  # completion tokens only
    logprobs: list[float]  # the sampling log-prob of each token; the length of token_ids
    finish_reason: str  # "stop" or "length"
    prompt_token_ids: list[int]  # the prompt as the engine tokenized it (chat template applied)


@dataclass(frozen=True)
class Generation:
    """Generate's reply: the completions and the policy version that sampled them."""

    completions: list[Completion]
    version: int


@dataclass
class TrainResult:
    """Train's reply: the update's metrics, the version after it, and whether the key had been applied before
    (then these are the recorded metrics and nothing was trained)."""

    metrics: dict[str, float]
    version: int
    replayed: bool


@dataclass(frozen=True)
class RestoreResult:
    """Restore's reply: the version whose weights serve now, the service's version after the restore (one more than
    before it), the checkpoint written of the restored state, and whether the key had been applied before."""

    restored_version: int
    version: int
    checkpoint: str
    replayed: bool


@dataclass(frozen=True)
class PolicyInfo:
    model: str
    version: int
    parameters: int
    device: str
    engine: str  # "transformers" or "vllm"
    last_key: str
    checkpoint: str

