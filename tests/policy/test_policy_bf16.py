"""The policy in bfloat16, on the CPU: the dtype a GPU run gets by default (`policy.dtype: auto`).

An update in bf16 (float32 weights and AdamW state, forward passes under bf16 autocast) must move the weights as the
float32 update does, and the bf16 engine's log-probs of sampled tokens must agree with float32's within a rounding
tolerance.
"""

from __future__ import annotations

from pathlib import Path

import torch
from bf16_checks import assert_update_like_float32, delta, weights

from cooper.config import PolicyConfig
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.engine import SamplingParams
from cooper.services.policy.grpo import token_logprobs
from cooper.services.policy.trainer import RolloutSample

LOGPROB_TOLERANCE = 0.1
"""Largest mean |log-prob_bf16 - log-prob_fp32| per token of a sampled completion (measured: 0.002-0.031)."""


def _policy(tmp_path: Path, dtype: str) -> PolicyCore:
    return PolicyCore(PolicyConfig.model_validate({
        "model": "tiny-sft", "device": "cpu", "dtype": dtype, "checkpoint_dir": str(tmp_path / dtype),
        "torch_threads": 1, "sampling": {"n": 4, "temperature": 1.0, "max_new_tokens": 16},
        "optim": {"lr": 1e-5, "warmup_steps": 0, "weight_decay": 0.0}, "grpo": {"kl_coef": 0.0, "track_kl": False},
        "server": {"metrics_port": None},
    }))


def test_policy_in_bf16_trains_like_float32_and_samples_alike(tmp_path: Path) -> None:
    fp32, bf16 = _policy(tmp_path, "float32"), _policy(tmp_path, "bfloat16")
    assert bf16.autocast == torch.bfloat16 and next(bf16.model.parameters()).dtype == torch.float32
    prompts = ["What is 7 * 8?", "What is 12 - 5?"]
    groups, _ = fp32.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=1))
    completions = [c for g in groups for c in g]

    # Generation: bf16's log-probs of the same sampled tokens, against float32's.
    bf16_groups, _ = bf16.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=1))
    for c in completions:
        ids = torch.tensor([c.prompt_token_ids + c.token_ids])
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            logits = bf16.model(input_ids=ids).logits[:, len(c.prompt_token_ids) - 1 : -1]
        bf16_logp = token_logprobs(logits, torch.tensor([c.token_ids]))[0]
        gap = float((bf16_logp - torch.tensor(c.logprobs)).abs().mean())
        assert gap < LOGPROB_TOLERANCE, f"bf16 log-probs are {gap} per token from float32's"
    assert sum(len(c.token_ids) for g in bf16_groups for c in g) > 0  # and the bf16 engine samples

    samples = [RolloutSample(c.prompt_token_ids, c.token_ids) for c in completions]
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.5, 0.0]
    deltas = {}
    for name, core in (("fp32", fp32), ("bf16", bf16)):
        before = weights(core.model)
        core.train(f"bf16/{name}", samples, rewards, 4)
        deltas[name] = delta(before, core.model)
    assert_update_like_float32(deltas["bf16"], deltas["fp32"])
