"""The HTTP API's logic without FastAPI: auth, limits, and translation to and from the service core.

Routes in http.py only call these methods; every refusal is an ApiError that http.py renders in the one error
schema (protocol.ErrorResponse).
"""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict

import prometheus_client

from cooper.config import HttpConfig
from cooper.reward_rule import logit_to_reward
from cooper.services.reward.errors import REFUSED, refusal, retry_after_s
from cooper.services.reward.items import ScoreItem, ScoreResult
from cooper.services.reward.service import RewardService
from cooper.services.reward.serving import protocol
from cooper.services.reward.verify_rm import parse_input


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

    def stale_headers(self) -> dict[str, str]:
        """On a stale replica that still serves (reward.replica.on_stale=serve): X-Cooper-Stale, saying how stale."""
        staleness = self.service.staleness()
        return {"X-Cooper-Stale": staleness.describe()} if staleness is not None and staleness.stale else {}

    async def _score(self, items: list[ScoreItem]) -> ScoreResult:
        try:
            self.service.check_fresh()
            result = await self.service.score(items)
        except REFUSED as err:
            row = refusal(err)
            raise ApiError(row.http_status, row.http_type, str(err), retry_after_s(err)) from None
        self.service.observe(items)  # the learning mode's material, when it is on
        return result

    async def learn(self) -> protocol.LearnResponse:
        """One learning step now (reward.learn_online): a trainer's step boundary."""
        if self.service.learner is None:
            raise ApiError(409, "learning_off", "this reward service does not learn from what it scores: start it "
                           "with reward.learn_online.enabled=true (docs/reward-api.md)")
        try:
            result = await self.service.learner.learn()
        except REFUSED as err:
            row = refusal(err)
            raise ApiError(row.http_status, row.http_type, str(err), retry_after_s(err)) from None
        return protocol.LearnResponse(**asdict(result))

    async def score(self, request: protocol.ScoreRequest) -> protocol.ScoreResponse:
        self._check_limits([(i.question, i.reference, i.completion) for i in request.items])
        result = await self._score([ScoreItem(i.question, i.reference, i.completion) for i in request.items])
        return protocol.ScoreResponse(
            scores=[protocol.ScoreOut(score=s, logit=x) for s, x in zip(result.scores, result.logits, strict=True)],
            version=result.version,
        )

    async def get_reward(self, request: protocol.OpenRLHFRequest) -> protocol.OpenRLHFResponse:
        """OpenRLHF's remote RM: question = prompt, reference = label, completion = query after its prompt; without
        labels, or for an empty label (OpenRLHF sends "" when --label_key is not set), all three from the VerifyRM
        template text in the query: an empty reference is no reference, and scoring against it would be a silent
        default."""
        if request.labels is None:
            items = [self._item_from_query(i, query) for i, query in enumerate(request.query)]
            self._check_limits([(i.question, i.reference, i.completion) for i in items])
        else:
            prompts = request.prompts
            if prompts is None or not len(request.query) == len(prompts) == len(request.labels):
                raise ApiError(422, "invalid_request", "query, prompts and labels must have one entry per sample; "
                               f"got {len(request.query)}, {'no' if prompts is None else len(prompts)} and "
                               f"{len(request.labels)}")
            self._check_limits(list(zip(request.query, prompts, request.labels, strict=True)))
            items = [ScoreItem(prompt, label, self._completion(i, query, prompt)) if label.strip()
                     else self._item_from_query(i, query, empty_label=True)
                     for i, (query, prompt, label) in enumerate(zip(request.query, prompts, request.labels,
                                                                    strict=True))]
        result = await self._score(items)
        probabilities = [logit_to_reward(x) for x in result.logits]
        return protocol.OpenRLHFResponse(
            rewards=result.scores, scores=probabilities, version=result.version,
            extra_logs={"reward_version": [float(result.version)] * len(items)},
        )

    def _item_from_query(self, index: int, query: str, empty_label: bool = False) -> ScoreItem:
        item = parse_input(self._strip_special(query), anywhere=True)
        if item is None:
            why = f"labels[{index}] is empty (OpenRLHF sends \"\" without --label_key)" if empty_label else "no labels"
            raise ApiError(422, "invalid_request", f"query {index} has no reference answer ({why}): send labels "
                           "(one reference per query, with prompts), or queries that hold the VerifyRM template "
                           "'<question>Q</question>\\n<reference_answer>R</reference_answer>\\n<completion>C' "
                           "(docs/reward-api.md, Score with curl)")
        return item

    def _strip_special(self, query: str) -> str:
        """OpenRLHF decodes left-padded sequences with special tokens kept: drop leading pads, trailing eos/pads."""
        info = self.service.info()
        while info.pad_token and query.startswith(info.pad_token):
            query = query[len(info.pad_token) :]
        for token in (info.eos_token, info.pad_token):
            while token and query.endswith(token):
                query = query[: -len(token)]
        return query

    def _completion(self, index: int, query: str, prompt: str) -> str:
        pad = self.service.info().pad_token
        if pad and not query.startswith(prompt):
            while query.startswith(pad):
                query = query[len(pad) :]
        if not query.startswith(prompt):
            raise ApiError(422, "invalid_request", f"query {index} does not start with prompts[{index}]; "
                           "send query = prompt + completion")
        return self._strip_special(query[len(prompt) :])

    async def classify(self, request: protocol.ClassificationRequest) -> protocol.ClassificationResponse:
        """vLLM's /classify over VerifyRM: each input is a template text; one class, probability sigmoid(logit)."""
        if request.normalize is not None:
            raise ApiError(422, "invalid_request", "Parameter `normalize` was removed; use `use_activation` instead.")
        texts = [request.input] if isinstance(request.input, str) else request.input
        if not texts:
            raise ApiError(422, "invalid_request", "You must pass at least one prompt")  # vLLM's refusal
        items = []
        for index, text in enumerate(texts):
            item = parse_input(text)
            if item is None:
                raise ApiError(422, "invalid_request", f"input {index} is not the VerifyRM template text "
                               "'<question>Q</question>\\n<reference_answer>R</reference_answer>\\n"
                               "<completion>C</completion>' (docs/design.md section 2.5)")
            items.append(item)
        self._check_limits([(i.question, i.reference, i.completion) for i in items])
        result = await self._score(items)
        activation = request.use_activation is not False  # vLLM 0.32 reads only use_activation (default on)
        data = [protocol.ClassificationData(index=index, label=self.service.info().label,
                                            probs=[logit_to_reward(logit) if activation else logit], num_classes=1)
                for index, logit in enumerate(result.logits)]
        return protocol.ClassificationResponse(
            id=f"classify-{uuid.uuid4().hex}", created=int(time.time()), model=self.service.info().model, data=data,
            usage=protocol.UsageInfo(prompt_tokens=result.tokens, total_tokens=result.tokens), version=result.version,
        )

    def model_info(self) -> protocol.ModelResponse:
        info = self.service.info()
        staleness = self.service.staleness()
        return protocol.ModelResponse(model=info.model, version=info.version, parameters=info.parameters,
                                      device=info.device, last_key=info.last_key, checkpoint=info.checkpoint,
                                      role=self.service.config.role,
                                      trainer_version=staleness.trainer_version if staleness else info.version,
                                      lag_s=staleness.lag_s if staleness else 0.0,
                                      stale=staleness.stale if staleness else False,
                                      serving=self._serving_settings())

    def _serving_settings(self) -> protocol.ServingSettings:
        config = self.service.config
        assert config.model_copies is not None and config.batching.max_batch_size is not None
        assert config.batching.max_wait_ms is not None and config.batching.spread is not None  # chosen at start-up
        return protocol.ServingSettings(model_copies=config.model_copies,
                                        max_batch_size=config.batching.max_batch_size,
                                        max_wait_ms=config.batching.max_wait_ms,
                                        max_inflight=config.batching.max_inflight,
                                        spread=config.batching.spread,
                                        spread_waits_ms=self.service.batcher.waits_ms,
                                        tokenize_in_model=config.tokenize_in_model,
                                        cpu_linear=config.cpu_linear)

    def health(self) -> protocol.StatusResponse:
        """503 once the model process has died, so that a supervisor restarts the service (from its checkpoint)."""
        if not self.service.alive:
            raise ApiError(503, "model_unavailable", "the reward model process has exited; restart the service")
        return protocol.StatusResponse(status="ok", version=self.service.version)

    def readiness(self) -> protocol.StatusResponse:
        if not self.service.ready:
            raise ApiError(503, "not_ready", "the reward model is not serving (starting, shutting down, its "
                           "process has exited, or a replica is stale with reward.replica.on_stale=refuse)", 1)
        return protocol.StatusResponse(status="ready", version=self.service.version)

    def metrics(self) -> tuple[bytes, str]:
        return prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST
