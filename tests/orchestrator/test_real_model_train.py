"""The smol-* presets end to end, short: `cooper train` on SmolLM2-135M-Instruct in cooper mode, as a user runs it, with the sizes that decide the time shrunk (steps, batch, samples, tokens, test sets). Everything else is
the presets': the real model through its chat template, the verifier reading answers anywhere, and in cooper mode
VerifyRM (here the untrained head: pretraining one is bench/real_model.py's work) updated on the run's pairs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cooper import metric_names as names
from cooper.orchestrator.outputs import read_metrics

pytestmark = pytest.mark.slow

# Sixteen samples a step: the update over them is most of the run's time (about 40 s a step on a 2-core Zen 3), and
# fewer would risk a step with no right sample, so no pair (the presets' one-step problems keep that risk small). Two
# problems per test set: the evaluations only have to run.
SHORT = ["run.steps=2", "run.batch_size=4", "policy.sampling.n=4", "policy.sampling.max_new_tokens=48",
         "data.tiny_test_size=2", "eval.every=2"]


def train(preset: str, tmp_path, *extra: str) -> list[dict]:
    argv = [sys.executable, "-m", "cooper.cli", "train", "--config", preset, "--no-progress", "run.name=smoke",
            f"run.output_dir={tmp_path}", *SHORT, *extra]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return read_metrics(tmp_path / "smoke")


# One run, not one per mode: each start of the real model costs minutes on a slow 2-core machine. smol-rule differs
# from smol-cooper only in run.mode (configs/), and rule mode's own path is tested on the tiny models.
@pytest.mark.timeout(1800)
def test_cooper_mode_updates_verify_rm_beside_the_real_policy(tmp_path) -> None:
    steps = train("smol-cooper", tmp_path, "run.seed=3")
    assert [s[names.STEP] for s in steps] == [0, 1]
    assert [s[names.POLICY_VERSION] for s in steps] == [1, 2]  # an update each step
    assert all(s[f"{names.POLICY}{names.POLICY_RESPONSE_LENGTH}"] > 0 for s in steps)
    assert 0.0 <= steps[-1][f"{names.TEST}heldout"] <= 1.0 and f"{names.TEST_INITIAL}heldout" in steps[0]
    assert sum(s[names.PAIRS] for s in steps) > 0  # verified positives against rejected rollouts and negatives
    assert steps[-1][names.REWARD_VERSION] >= 1  # VerifyRM took at least one Bradley-Terry update
    assert all(s[names.REWARD_SOURCE] == "reward_model" for s in steps)
