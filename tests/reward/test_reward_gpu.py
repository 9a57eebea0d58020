"""The reward service on CUDA, model in its child process: `gpu`-marked (skipped without CUDA, see tests/conftest.py).

Never run on the CPU machines this was written on; run with `pytest -m gpu tests/reward` where a GPU is lent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from reward_testkit import make_config, tiny_items, tiny_pairs

from cooper.runtime.ledger import idempotency_key
from cooper.services.reward.core import RewardCore
from cooper.services.reward.service import RewardService


@pytest.mark.gpu
def test_cuda_scores_match_cpu_and_updates_run_in_the_child(tmp_path: Path) -> None:
    items = tiny_items(16)
    cpu = RewardCore.load(make_config(tmp_path / "cpu"))
    expected = cpu.score_tokens(cpu.rm.encode(items)).logits

    async def main() -> tuple[list[float], list[float], str]:
        service = await RewardService.create(
            make_config(tmp_path, model_process=True, device="cuda", dtype="float32"))
        float32 = (await service.score(items)).logits
        update = await service.update(idempotency_key("gpu", 0), tiny_pairs(4))
        assert update.version == 1 and not update.skipped
        device = service.info().device
        await service.stop()
        bf16 = await RewardService.create(make_config(tmp_path / "bf16", model_process=True, device="cuda"))
        low = (await bf16.score(items)).logits  # dtype auto = bfloat16 on CUDA
        await bf16.stop()
        return float32, low, device

    float32, bf16, device = asyncio.run(main())
    assert device.startswith("cuda")
    assert max(abs(x - y) for x, y in zip(float32, expected, strict=True)) <= 1e-4
    assert max(abs(x - y) for x, y in zip(bf16, expected, strict=True)) <= 0.1
