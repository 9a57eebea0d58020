"""Request and response models of the reward service's HTTP API (pydantic only; FastAPI lives in http.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ScoreItemIn(_Strict):
    """One completion; the model sees the DESIGN.md template built from these three texts."""

    question: str
    reference: str
    completion: str


class ScoreRequest(_Strict):
    """Invariant: at most reward.http.max_items items, each text at most reward.http.max_chars (else 413)."""

    items: list[ScoreItemIn]


class ScoreOut(BaseModel):
    score: float = Field(description="sigmoid(logit) in [0, 1]; 1[sigmoid(logit) > 0.5] with reward.discrete")
    logit: float = Field(description="raw model output")


class ScoreResponse(BaseModel):
    """Invariant: `scores` has the length of `items`, in order, and every score came from model `version`."""

    scores: list[ScoreOut]
    version: int


class ModelResponse(BaseModel):
    model: str = Field(description="hub id or local directory of the base model")
    version: int = Field(description="current model version; each applied update adds one")
    parameters: int
    device: str
    last_key: str = Field(description="last applied idempotency key, '<run_id>/<step>', empty if none")
    checkpoint: str = Field(description="latest checkpoint directory, empty if none")


class StatusResponse(BaseModel):
    status: str
    version: int


class OpenRLHFRequest(BaseModel):
    """OpenRLHF's remote reward model request: `query[i]` is `prompts[i]` followed by the completion, `labels[i]`
    the reference answer. Unknown keys are ignored, since OpenRLHF versions send different extras."""

    query: list[str]
    prompts: list[str]
    labels: list[str]


class OpenRLHFResponse(BaseModel):
    """`rewards` and `scores` have the length of `query`, in order; OpenRLHF reads `rewards`."""

    rewards: list[float]
    scores: list[float] = Field(description="sigmoid(logit), whatever reward.discrete says")
    version: int
    extra_logs: dict[str, list[float]] = Field(description="per-sample values OpenRLHF logs: the model version")


class ErrorDetail(BaseModel):
    type: str = Field(description="unauthorized, too_large, invalid_request, overloaded, not_found, "
                                  "method_not_allowed, not_ready, internal")
    message: str = Field(description="what went wrong and what to do")


class ErrorResponse(BaseModel):
    """The one error schema of every non-2xx answer."""

    error: ErrorDetail
