"""CUDA paths: the transformers engine under bf16 autocast, and the vLLM engine with in-process weight reloads.

All `gpu`-marked (skipped without CUDA, see tests/conftest.py); the vLLM ones also skip without the `gpu` extra.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from cooper.config import PolicyConfig
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.engine import SamplingParams
from cooper.services.policy.grpo import token_logprobs
from cooper.services.policy.trainer import RolloutSample

PROMPTS = ["Tom has 3 apples.", "Ivy has 12 pens and gives away 2."]


def _train_once(core: PolicyCore, seed: int) -> None:
    groups, _ = core.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=8, seed=seed))
    samples = [RolloutSample(c.prompt_token_ids, c.token_ids) for g in groups for c in g]
    core.train(f"gpu/{seed}", samples, [float(i % 2) for i in range(len(samples))], group_size=4)


@pytest.mark.gpu
def test_cuda_transformers_bf16_autocast_trains_fp32_weights(tmp_path: Path,
                                                             make_config: Callable[..., PolicyConfig]) -> None:
    core = PolicyCore(make_config(tmp_path, device="cuda", dtype="auto", grpo={"kl_coef": 0.001},
                                  optim={"weight_decay": 0.0}))
    assert core.autocast == torch.bfloat16
    assert all(p.dtype == torch.float32 and p.is_cuda for p in core.model.parameters())
    assert core.reference is not None and next(core.reference.parameters()).dtype == torch.bfloat16
    before = {n: p.detach().clone() for n, p in core.model.named_parameters()}
    _train_once(core, 0)
    assert all(not torch.equal(p, before[n]) for n, p in core.model.named_parameters())


def _vllm_core(tmp_path: Path, make_config: Callable[..., PolicyConfig]) -> PolicyCore:
    pytest.importorskip("vllm")
    return PolicyCore(make_config(tmp_path, device="cuda", engine="vllm", vllm_gpu_memory_utilization=0.2,
                                  vllm_max_model_len=512))


def _teacher_forced(core: PolicyCore, prompt: list[int], tokens: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens], device=core.device)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        logits = core.model(ids).logits[:, len(prompt) - 1 : -1]
    return token_logprobs(logits, torch.tensor([tokens], device=core.device), temperature)[0].cpu()


@pytest.mark.gpu
def test_vllm_generates_reproducibly_with_consistent_logprobs(tmp_path: Path,
                                                              make_config: Callable[..., PolicyConfig]) -> None:
    core = _vllm_core(tmp_path, make_config)
    assert core.engine.name == "vllm"
    sampling = SamplingParams(n=3, temperature=0.8, max_new_tokens=12, seed=5)
    groups, _ = core.generate(PROMPTS, sampling)
    again, _ = core.generate(PROMPTS, sampling)
    assert [[c.token_ids for c in g] for g in groups] == [[c.token_ids for c in g] for g in again]
    for c in (c for g in groups for c in g):
        assert 0 < len(c.token_ids) == len(c.logprobs) <= 12
        expected = _teacher_forced(core, c.prompt_token_ids, c.token_ids, 0.8)
        assert torch.allclose(torch.tensor(c.logprobs), expected, atol=0.1)  # bf16 kernels on both sides


@pytest.mark.gpu
def test_vllm_samples_from_the_updated_weights(tmp_path: Path, make_config: Callable[..., PolicyConfig]) -> None:
    core = _vllm_core(tmp_path, make_config)
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=1)
    before, _ = core.generate(PROMPTS, sampling)
    for step in range(3):
        _train_once(core, step)
    after, version = core.generate(PROMPTS, sampling)
    assert version == 3
    c = after[0][0]
    # vLLM's log-probs are those of the trained weights, not of the weights it was started with.
    assert torch.allclose(torch.tensor(c.logprobs), _teacher_forced(core, c.prompt_token_ids, c.token_ids, 1.0),
                          atol=0.1)
    assert [g[0].logprobs for g in after] != [g[0].logprobs for g in before]
