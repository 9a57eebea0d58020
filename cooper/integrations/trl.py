"""A TRL reward function backed by Cooper's reward service: VerifyRM scores each batch, then learns from it.

    from cooper.integrations.trl import CooperReward
    trainer = GRPOTrainer(model=..., reward_funcs=CooperReward("http://127.0.0.1:8000"), train_dataset=data, ...)

with the service started as `cooper serve reward reward.learn_online.enabled=true` and a dataset column holding each
prompt's reference answer (`answer` by default; TRL passes every column beside `prompt` to a reward function). Each
call (one generation batch: TRL's step boundary) sends the batch's (question, reference, completion) triples to
POST /v1/score, then asks for one learning step (POST /v1/learn): the service checks them with the rule verifier,
pairs each question's first right completion against its wrong ones, and updates VerifyRM. The next batch is scored
by the new version: Cooper's order, score(t) with v_t, then v_{t+1}.

Standard library only (urllib): it adds nothing to a trainer's environment. A full queue (503) is retried after the
service's Retry-After; other refusals raise `RewardServiceError` with the service's message.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any


class RewardServiceError(RuntimeError):
    """The reward service refused a request (its HTTP status and message), or could not be reached."""


class CooperReward:
    """A TRL reward function (`reward_funcs=[CooperReward(url)]`): VerifyRM's scores in [0, 1], learning after each
    batch unless `learn=False` (a frozen reward model: the static baseline)."""

    def __init__(self, url: str, reference_key: str = "answer", question_key: str | None = None, learn: bool = True,
                 token: str | None = None, max_items: int = 256, timeout_s: float = 600.0, retries: int = 8):
        """`reference_key`: the dataset column of reference answers. `question_key`: a column holding the bare
        question, when the prompt wraps it in an instruction (else the prompt's text, its last user message for a
        conversational one). `max_items`: items per scoring request, at most the service's reward.http.max_items."""
        self.url, self.reference_key, self.question_key = url.rstrip("/"), reference_key, question_key
        self.learn, self.token, self.max_items = learn, token, max_items
        self.timeout_s, self.retries = timeout_s, retries
        self.__name__ = "cooper_verifyrm"  # TRL names a reward function's logged metrics after it
        self.versions: list[int] = []
        """The VerifyRM version that scored each batch, in call order."""
        self.last_learn: dict[str, Any] | None = None
        """The service's answer to the last learning step (POST /v1/learn)."""
        self.last_logits: list[float] = []
        """VerifyRM's logits for the last batch, in order (its scores are what the trainer gets)."""

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
        if self.reference_key not in columns:
            raise KeyError(f"no dataset column {self.reference_key!r} for the reference answers (columns: "
                           f"{sorted(k for k in columns if not k.startswith('trainer'))}); pass reference_key=")
        references = columns[self.reference_key]
        questions = columns[self.question_key] if self.question_key else [_text(p) for p in prompts]
        items = [{"question": str(q), "reference": str(r), "completion": _text(c)}
                 for q, r, c in zip(questions, references, completions, strict=True)]
        scores: list[float] = []
        self.last_logits = []
        versions = set()
        for start in range(0, len(items), self.max_items):
            reply = self._post("/v1/score", {"items": items[start:start + self.max_items]})
            scores += [float(s["score"]) for s in reply["scores"]]
            self.last_logits += [float(s["logit"]) for s in reply["scores"]]
            versions.add(int(reply["version"]))
        if len(versions) > 1:  # a learning step from elsewhere landed between two chunks of this batch
            raise RewardServiceError(f"one batch was scored by VerifyRM versions {sorted(versions)}: send a trainer's "
                                     "batches to a service that only this trainer's learning steps update")
        self.versions.append(versions.pop() if versions else -1)
        if self.learn:
            self.last_learn = self._post("/v1/learn", {})
        return scores

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        for attempt in range(self.retries + 1):
            request = urllib.request.Request(self.url + path, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                    answer: dict[str, Any] = json.loads(reply.read())
                    return answer
            except urllib.error.HTTPError as err:
                message = _message(err)
                if err.code == 503 and attempt < self.retries:  # a full queue: back off as the service asks
                    time.sleep(min(30.0, float(err.headers.get("Retry-After") or 1)))
                    continue
                raise RewardServiceError(f"{path}: HTTP {err.code}: {message}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
                raise RewardServiceError(f"{path}: the reward service at {self.url} could not be reached: {err}") \
                    from None
        raise AssertionError("unreachable")


def _text(value: Any) -> str:
    """A prompt's or completion's text: a string as is; a conversation (TRL's conversational format) its last user
    message for a prompt, or its assistant message for a completion."""
    if isinstance(value, str):
        return value
    messages = list(value)
    for message in reversed(messages):
        if message.get("role") in ("user", "assistant"):
            return str(message.get("content", ""))
    return str(messages[-1].get("content", "")) if messages else ""


def _message(err: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(err.read())["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return err.reason if isinstance(err.reason, str) else str(err)
