"""The rollout-engine interface shared by the transformers and vLLM engines, and what both agree on.

Both engines take the same `SamplingParams`, build the prompt the same way (`encode_prompt`: the tokenizer's chat
template when it has one, the plain text otherwise), and return the same `Completion`s.

Sampling log-probs: each engine returns, per completion token, the log-probability of that token under
softmax(logits / temperature) -- the temperature-scaled distribution, *before* top-p truncation (temperature 0,
greedy, uses temperature 1). This is the distribution the trainer evaluates (`grpo.token_logprobs` with the same
temperature), so with top_p = 1 the two agree up to numerics. The trainer still recomputes old log-probs itself
(see trainer.py): these values are for the caller's diagnostics, not for the loss.

Stop strings: a completion ends at the first token whose text completes a stop string; the stop string stays in
`text`, and `token_ids` run up to and including that token. End-of-sequence tokens are kept in `token_ids` (the
policy must learn to stop) but not in `text`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class SamplingParams:
    """How to sample; mirrors policy.v1.Sampling."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"sampling.n must be at least 1 (got {self.n})")
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1] (got {self.top_p})")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be at least 1 (got {self.max_new_tokens})")


@dataclass
class Completion:
    """One sampled completion."""

    text: str
    token_ids: list[int]
    logprobs: list[float]  # same length as token_ids
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    prompt_token_ids: list[int] = field(default_factory=list)


class RolloutEngine(Protocol):
    """What the policy service needs from an engine."""

    name: str

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Completion]]:
        """One list of `sampling.n` completions per prompt, in prompt order."""
        ...

    def sync_weights(self) -> None:
        """Make the next `generate` use the trainer's current weights."""
        ...

    def load_weights(self, weights: Mapping[str, Any]) -> None:
        """Sample from `weights` (a state dict of the policy) from the next `generate` on; only engines with weights
        of their own (vLLM's, the rollout process's) are asked to (run.max_staleness > 0)."""
        ...

    def close(self) -> None:
        """Stop what the engine runs beside the service (the rollout process); as the service stops."""
        ...


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """The prompt's token ids: the chat template (one user turn, generation prompt) when the tokenizer has one."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        # The template already holds any BOS/special tokens; adding them again would duplicate them.
        ids = list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    else:
        ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    if not ids:
        raise ValueError("a prompt is empty (no tokens and no chat template); send non-empty prompt text")
    return ids


def eos_token_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """Every token id that ends a completion: the tokenizer's EOS and the model's generation-config EOS ids."""
    ids: list[int] = []
    for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        for token in source if isinstance(source, (list, tuple)) else [source]:
            if token is not None and int(token) not in ids:
                ids.append(int(token))
    if not ids:
        raise ValueError("the tokenizer has no EOS token; set one so that completions can end")
    return ids


def finish_completion(
    tokenizer: Any,
    token_ids: Sequence[int],
    logprobs: Sequence[float],
    eos_ids: Sequence[int],
    stop: Sequence[str],
    prompt_token_ids: Sequence[int],
) -> Completion:
    """Cut raw generated tokens at the first EOS or stop string and build the Completion."""
    tokens = [int(t) for t in token_ids]
    cut, reason = len(tokens), "length"
    eos = set(eos_ids)
    for i, token in enumerate(tokens):
        if token in eos:
            cut, reason = i + 1, "stop"
            break
    text = tokenizer.decode(tokens[:cut], skip_special_tokens=True)
    hits = [(text.find(s), s) for s in stop if s and s in text]
    if hits:
        pos, first = min(hits)
        end = pos + len(first)
        # The shortest token prefix whose text holds the stop string (once a prefix holds it, longer ones do).
        lo, hi = 1, cut
        while lo < hi:
            mid = (lo + hi) // 2
            if tokenizer.decode(tokens[:mid], skip_special_tokens=True)[pos:end] == first:
                hi = mid
            else:
                lo = mid + 1
        cut, reason, text = lo, "stop", text[:end]
    return Completion(
        text=text,
        token_ids=tokens[:cut],
        logprobs=[float(x) for x in logprobs[:cut]],
        finish_reason=reason,
        prompt_token_ids=list(prompt_token_ids),
    )
