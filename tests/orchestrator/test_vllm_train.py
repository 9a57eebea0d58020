"""`cooper train policy.engine=vllm`: the whole local run (embedded Redis, the services, the stage graph) with vLLM's
CPU build doing the rollouts, as a user would start it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_cooper_train_with_vllm_rollouts(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "cooper.cli", "train", "--no-progress", "run.steps=3", "run.mode=rule",
         "policy.engine=vllm", "policy.model=tiny-hd32", "policy.vllm_gpu_memory_utilization=0.1",
         "policy.grpo.rollout_is_cap=2", f"run.output_dir={tmp_path}", "run.name=vllm"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "vllm" / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in records] == [1, 2, 3]
    assert [r["policy_version_sampled"] for r in records] == [0, 1, 2]  # each rollout from the previous update
    for record in records:
        # vLLM and the trainer compute in float32 on the same weights: every update reached the engine.
        assert record["policy/rollout/tokens_compared"] > 0
        assert record["policy/rollout/logprob_abs_diff"] < 1e-4
        assert record["policy/rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert "test/heldout" in records[-1]  # the final evaluation sampled through vLLM too
    assert "Initializing a V1 LLM engine" in (tmp_path / "vllm" / "logs" / "policy.log").read_text()
