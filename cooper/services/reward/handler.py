"""The HTTP API's logic without FastAPI: auth, limits, and translation to and from the service core.

Routes in http.py only call these methods; every refusal is an ApiError that http.py renders in the one error
schema (protocol.ErrorResponse).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

import prometheus_client

from cooper.config import HttpConfig
from cooper.services.reward import protocol
from cooper.services.reward.batcher import QueueFull, QueueTimeout, RequestTooLarge
from cooper.services.reward.items import ScoreItem, ScoreResult
from cooper.services.reward.runner import ModelUnavailable
from cooper.services.reward.service import RewardService
from cooper.services.reward.verify_rm import sigmoid


class ApiError(Exception):
    """A refusal with its HTTP status; `retry_after_s` becomes a Retry-After header."""

    def __init__(self, status: int, type: str, message: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.status = status
        self.type = type
        self.message = message
        self.retry_after_s = retry_after_s

    def body(self) -> protocol.ErrorResponse:
        return protocol.ErrorResponse(error=protocol.ErrorDetail(type=self.type, message=self.message))


class RewardHttpHandler:
    def __init__(self, service: RewardService, config: HttpConfig):
        self.service = service
        self.config = config
        self._token = config.token.get_secret_value().encode() if config.token else None

    def authorize(self, bearer: str | None) -> None:
        """401 unless the bearer token matches (constant-time compare); open when no token is configured."""
        if self._token is None:
            return
        if bearer is None or not hmac.compare_digest(bearer.encode(), self._token):
            raise ApiError(401, "unauthorized", "missing or wrong bearer token: send 'Authorization: Bearer <token>' "
                           "with the token of reward.http.token")

    def _check_limits(self, texts_per_item: Sequence[Sequence[str]]) -> None:
        if len(texts_per_item) > self.config.max_items:
            raise ApiError(413, "too_large", f"{len(texts_per_item)} items in one request; at most "
                           f"{self.config.max_items} (reward.http.max_items): split the request")
        for index, texts in enumerate(texts_per_item):
            longest = max((len(t) for t in texts), default=0)
            if longest > self.config.max_chars:
                raise ApiError(413, "too_large", f"item {index} has a text of {longest} characters; at most "
                               f"{self.config.max_chars} (reward.http.max_chars)")

    async def _score(self, items: list[ScoreItem]) -> ScoreResult:
        try:
            return await self.service.score(items)
        except QueueFull as err:
            raise ApiError(503, "overloaded", f"{err}; retry after {err.retry_after_s} s", err.retry_after_s) from None
        except QueueTimeout as err:
            raise ApiError(503, "overloaded", str(err), retry_after_s=1) from None
        except RequestTooLarge as err:
            raise ApiError(413, "too_large", str(err)) from None
        except ModelUnavailable as err:
            raise ApiError(503, "model_unavailable", str(err)) from None

    async def score(self, request: protocol.ScoreRequest) -> protocol.ScoreResponse:
        self._check_limits([(i.question, i.reference, i.completion) for i in request.items])
        result = await self._score([ScoreItem(i.question, i.reference, i.completion) for i in request.items])
        return protocol.ScoreResponse(
            scores=[protocol.ScoreOut(score=s, logit=x) for s, x in zip(result.scores, result.logits, strict=True)],
            version=result.version,
        )

    async def get_reward(self, request: protocol.OpenRLHFRequest) -> protocol.OpenRLHFResponse:
        """OpenRLHF's remote RM: question = prompt, reference = label, completion = query after its prompt."""
        if not len(request.query) == len(request.prompts) == len(request.labels):
            raise ApiError(422, "invalid_request", f"query, prompts and labels must have one entry per sample; got "
                           f"{len(request.query)}, {len(request.prompts)} and {len(request.labels)}")
        self._check_limits(list(zip(request.query, request.prompts, request.labels, strict=True)))
        items = [ScoreItem(prompt, label, self._completion(i, query, prompt))
                 for i, (query, prompt, label) in enumerate(zip(request.query, request.prompts, request.labels, strict=True))]
        result = await self._score(items)
        probabilities = [sigmoid(x) for x in result.logits]
        return protocol.OpenRLHFResponse(
            rewards=result.scores, scores=probabilities, version=result.version,
            extra_logs={"reward_version": [float(result.version)] * len(items)},
        )

    def _completion(self, index: int, query: str, prompt: str) -> str:
        info = self.service.info()
        pad = info.pad_token
        # OpenRLHF decodes left-padded sequences with special tokens kept: drop leading pads and trailing eos/pads.
        if pad and not query.startswith(prompt):
            while query.startswith(pad):
                query = query[len(pad) :]
        if not query.startswith(prompt):
            raise ApiError(422, "invalid_request", f"query {index} does not start with prompts[{index}]; "
                           "send query = prompt + completion")
        completion = query[len(prompt) :]
        for token in (info.eos_token, pad):
            while token and completion.endswith(token):
                completion = completion[: -len(token)]
        return completion

    def model_info(self) -> protocol.ModelResponse:
        info = self.service.info()
        return protocol.ModelResponse(model=info.model, version=info.version, parameters=info.parameters,
                                      device=info.device, last_key=info.last_key, checkpoint=info.checkpoint)

    def health(self) -> protocol.StatusResponse:
        """503 once the model process has died, so that a supervisor restarts the service (from its checkpoint)."""
        if not self.service.alive:
            raise ApiError(503, "model_unavailable", "the reward model process has exited; restart the service")
        return protocol.StatusResponse(status="ok", version=self.service.version)

    def readiness(self) -> protocol.StatusResponse:
        if not self.service.ready:
            raise ApiError(503, "not_ready", "the reward model is not serving (starting, shutting down, or its "
                           "process has exited)", 1)
        return protocol.StatusResponse(status="ready", version=self.service.version)

    def metrics(self) -> tuple[bytes, str]:
        return prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST
