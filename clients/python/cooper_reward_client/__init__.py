"""A client for Cooper's reward API: `RewardClient(url, token).score(items)`, with typed errors and retries on 503.

The standard library only (urllib and json), so that a platform team can install it beside any stack. The API it
speaks: `POST /v1/score`, `GET /v1/model`, `GET /readyz` (docs/reward-api.md in Cooper's repository).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["InvalidRequest", "Item", "Overloaded", "RewardApiError", "RewardClient", "Scored", "TooLarge",
           "Unauthorized"]


@dataclass(frozen=True)
class Item:
    """One completion to score against its question and reference answer."""

    question: str
    reference: str
    completion: str


@dataclass(frozen=True)
class Scored:
    """One score (VerifyRM's probability that the completion is right) and logit per item, in order, all from model
    `version`."""

    scores: list[float]
    logits: list[float]
    version: int


class RewardApiError(Exception):
    """The API refused a request: its HTTP status, the error's type and message from the body
    `{"error": {"type", "message"}}`."""

    def __init__(self, status: int, type: str, message: str, retry_after_s: float | None = None):
        super().__init__(f"{status} {type}: {message}")
        self.status, self.type, self.message, self.retry_after_s = status, type, message, retry_after_s


class Unauthorized(RewardApiError):
    """401: no token, or the wrong one (reward.http.token)."""


class TooLarge(RewardApiError):
    """413: more items than reward.http.max_items, or a text over reward.http.max_chars."""


class InvalidRequest(RewardApiError):
    """422 (400 on some routes): a body the API does not accept."""


class Overloaded(RewardApiError):
    """503: the service's queue is full (or it is not ready), still so after the client's retries."""


_BY_STATUS = {400: InvalidRequest, 401: Unauthorized, 413: TooLarge, 422: InvalidRequest, 503: Overloaded}


class RewardClient:
    """`url`: the service's HTTP address (e.g. http://localhost:8000); `token`: reward.http.token when it is set.
    A 503 is retried `retries` times, each after the server's Retry-After (1 s when it sends none), at most
    `max_wait_s`; `on_retry(error)` is called before each retry."""

    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0, retries: int = 3,
                 max_wait_s: float = 30.0, on_retry: Callable[[RewardApiError], None] | None = None):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s, self.retries, self.max_wait_s, self.on_retry = timeout_s, retries, max_wait_s, on_retry

    def score(self, items: Sequence[Item]) -> Scored:
        """VerifyRM's scores of `items`, in order."""
        body = {"items": [{"question": i.question, "reference": i.reference, "completion": i.completion}
                          for i in items]}
        reply = self._call("POST", "/v1/score", body)
        return Scored([s["score"] for s in reply["scores"]], [s["logit"] for s in reply["scores"]], reply["version"])

    def info(self) -> dict[str, Any]:
        """The model, its version and role (`GET /v1/model`)."""
        return self._call("GET", "/v1/model")

    def ready(self) -> bool:
        """Whether the service is ready to score (`GET /readyz`); False when it does not answer."""
        try:
            self._request("GET", "/readyz", None)
            return True
        except (RewardApiError, OSError):
            return False

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        for attempt in range(self.retries + 1):
            try:
                return self._request(method, path, body)
            except Overloaded as err:
                if attempt == self.retries:
                    raise
                if self.on_retry is not None:
                    self.on_retry(err)
                time.sleep(min(self.max_wait_s, err.retry_after_s or 1.0))
        raise AssertionError("unreachable")

    def _request(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as err:
            raise _refusal(err) from None


def _refusal(err: urllib.error.HTTPError) -> RewardApiError:
    try:
        error = json.loads(err.read()).get("error", {})
        kind, message = error.get("type", "error"), error.get("message", "")
    except (ValueError, AttributeError):
        kind, message = "error", ""
    retry_after = err.headers.get("Retry-After")
    seconds = float(retry_after) if retry_after and retry_after.replace(".", "", 1).isdigit() else None
    return _BY_STATUS.get(err.code, RewardApiError)(err.code, kind, message or str(err.reason), seconds)
