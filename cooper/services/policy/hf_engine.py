"""Rollouts with transformers `generate` (the default engine; CPU or GPU).

The engine samples from the very module the trainer updates, so there is nothing to sync after an update.
Sampling log-probs come from a logits processor that sees the raw logits before transformers' temperature and
top-p warpers (custom processors run first) and records log_softmax(logits / temperature) of the token that was
then chosen -- O(batch x vocab) memory instead of keeping every step's logits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from cooper.services.policy.engine import (
    Completion,
    SamplingParams,
    encode_prompt,
    eos_token_ids,
    finish_completion,
)


class _SampledLogprobs(LogitsProcessor):
    """Records, per step, the log-prob of the token sampled at the previous step; `finish` adds the last one."""

    def __init__(self, temperature: float):
        self.temperature = temperature if temperature > 0 else 1.0
        self.previous: torch.Tensor | None = None  # [B, V] log-probs of the last step
        self.values: list[torch.Tensor] = []  # per step, [B]

    def _take(self, chosen: torch.Tensor) -> None:
        assert self.previous is not None
        self.values.append(self.previous.gather(-1, chosen.unsqueeze(-1)).squeeze(-1))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self._take(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """[B, steps] log-probs of the generated tokens."""
        self._take(sequences[:, -1])
        self.previous = None
        return torch.stack(self.values, dim=1)


class TransformersEngine:
    """`generate` on the policy module itself, in chunks of `batch_size` sequences."""

    name = "transformers"

    def __init__(self, model: Any, tokenizer: Any, batch_size: int = 64, autocast_dtype: torch.dtype | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.autocast_dtype = autocast_dtype
        self.eos_ids = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        # A hub model's generation_config.json (e.g. Qwen2.5-Instruct: top_k 20, repetition_penalty 1.05) would
        # fill every knob we leave unset; the request alone must decide how we sample, so start from a blank one.
        model.generation_config = GenerationConfig(eos_token_id=self.eos_ids, pad_token_id=self.pad_id)

    def close(self) -> None:
        """Nothing runs beside it: it samples from the trainer's own module, in this process."""

    def sync_weights(self) -> None:
        """Nothing to do: the engine samples from the module the trainer updates."""

    def load_weights(self, weights: Mapping[str, Any]) -> None:
        """Never asked: with weights of its own (rollouts ahead), the transformers engine runs in the rollout
        process (build_engine's `own_weights`), whose engine takes them."""
        raise RuntimeError("the transformers engine samples the trainer's own module and holds no weights of its own; "
                           "rollouts from another version go through the rollout process (build_engine(own_weights))")

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Completion]]:
        prompt_ids = [encode_prompt(self.tokenizer, text) for text in prompts]
        rows = [ids for ids in prompt_ids for _ in range(sampling.n)]  # prompt-major, n copies each
        device = next(self.model.parameters()).device
        flat: list[Completion] = []
        # The seed drives the global RNG that `generate` samples from; fork it so that a request's seed does not
        # leak into anything else in the process (initialisation, other requests).
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(sampling.seed)
            for start in range(0, len(rows), self.batch_size):
                flat += self._generate_chunk(rows[start : start + self.batch_size], sampling, device)
        return [flat[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]

    def _generate_chunk(
        self, rows: list[list[int]], sampling: SamplingParams, device: torch.device
    ) -> list[Completion]:
        width = max(len(r) for r in rows)
        # Left padding: every row's next token is then predicted at the same column.
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, ids in enumerate(rows):
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, width - len(ids) :] = 1
        recorder = _SampledLogprobs(sampling.temperature)
        greedy = sampling.temperature == 0
        config = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p,
            top_k=None if greedy else 0,  # transformers' default top_k is 50; 0 turns it off
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            stop_strings=list(sampling.stop) or None,
            return_dict_in_generate=True,
        )
        autocast = torch.autocast(device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None)
        with autocast:
            out = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=config,
                logits_processor=LogitsProcessorList([recorder]),
                tokenizer=self.tokenizer if sampling.stop else None,
            )
        generated = out.sequences[:, width:].cpu()
        logprobs = recorder.finish(out.sequences).cpu()
        return [
            finish_completion(self.tokenizer, generated[i].tolist(), logprobs[i].tolist(), self.eos_ids,
                              sampling.stop, rows[i])
            for i in range(len(rows))
        ]
