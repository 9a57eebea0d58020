"""The chaos suite on a small scale: `python bench/chaos.py` itself (40 steps, 3 seeds and both recipes by default)
on one seed of the paper's recipe, 10 steps. The run survives the SIGKILL of the generator inside a negatives job,
of the CLI inside an evaluation (the resumed run evaluates again) and between steps (it is resumed), of the reward
service in the middle of a Bradley-Terry update and of the policy in the middle of a GRPO update (each comes back
from its checkpoint plus its update journal), keeps every invariant, and logs the same records as the same run
without kills (tests/orchestrator/chaos.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chaos import ChaosRun, check, schedule

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)  # about two minutes on a 2-core EPYC; CI's machines have been 2x slower and more
def test_a_run_keeps_its_invariants_through_sigkills(tmp_path):
    # Seed 6's schedule (evaluations after steps -1, 2, 5, 8 and 9): the generator inside negatives, the CLI inside
    # an evaluation and between steps, the reward service inside an update, the policy inside an update; 10 steps
    # leave a step to run after the last kill. A run that logs no step for 180 s is stuck: the harness stops it and
    # its report (stderr) says where every process was.
    args = ["--seeds", "6", "--recipes", "generator", "--steps", "10", "--kills", "1", "--eval-every", "3",
            "--stuck-after", "180"]
    assert [k.describe() for k in schedule(6, 10, 1, recipe="generator", eval_every=3)] == [
        "generator@1+0.0s in negatives", "cli@4+0.0s in evaluate", "cli@6+1.64s", "reward@7+0.0s in reward_update",
        "policy@8+0.0s in policy_update"]
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "chaos.py"), *args, "--keep", str(tmp_path)],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=840)
    lines = done.stdout.strip().splitlines()
    assert done.returncode in (0, 1) and len(lines) >= 2, f"exit {done.returncode}:\n{done.stderr[-10000:]}"
    run, summary = json.loads(lines[-2]), json.loads(lines[-1])
    assert done.returncode == 0 and summary["invariants_held"], \
        "\n".join(run["violations"]) + "\n--- stderr:\n" + done.stderr[-60000:]
    assert run["kills_not_landed"] == [] and run["kills_by_target"] == ["generator", "cli", "cli", "reward", "policy"]
    negatives, evaluate, reward_update, policy_update = run["kills_inside"]
    assert negatives in {f"negatives:{t}" for t in range(1, 10)} and evaluate in {"evaluate:5", "evaluate:8"}
    assert reward_update in {"reward_update:7", "reward_update:8", "reward_update:9"}
    assert policy_update in {"policy_update:8", "policy_update:9"}
    assert run["kills_survived"] == 5 and run["resumes"] == 2 and run["max_rel_diff"] == 0.0
    assert run["evaluations"] == 5 and summary["generator_kills_in_negatives"] == 1
    print(f"\nchaos: {lines[-1]}")


def test_the_schedule_kills_every_target_at_seeded_moments():
    kills = schedule(3, 40, 6)
    between = [k.target for k in kills if not k.during]
    assert sorted(between) == sorted(["verifier", "policy", "reward", "generator", "cli", "redis"])
    assert [(k.target, k.during) for k in kills if k.during] in (
        [("policy", "policy_update"), ("reward", "reward_update")],
        [("reward", "reward_update"), ("policy", "policy_update")])  # every run: both trainers inside an update
    assert kills == schedule(3, 40, 6) and kills != schedule(4, 40, 6)
    steps = [k.after_step for k in kills]
    assert steps == sorted(steps) and len(set(steps)) == 8 and 1 <= steps[0] and steps[-1] <= 38
    assert all(b - a >= 2 for a, b in zip(steps, steps[1:], strict=False))  # spread over the run
    with pytest.raises(ValueError, match="8 kills need at least 10 steps"):
        schedule(0, 9, 6)


def test_the_paper_recipe_and_evaluations_add_kills_inside_their_jobs():
    kills = schedule(3, 40, 6, recipe="generator", eval_every=5)
    inside = [(k.target, k.during) for k in kills if k.during]
    assert len(kills) == 10 and ("generator", "negatives") in inside and len(inside) == 4
    assert {t for t, d in inside if d == "evaluate"} <= {"policy", "verifier", "cli"}
    steps = [k.after_step for k in kills]
    assert steps == sorted(steps) and len(set(steps)) == 10 and steps[-1] <= 38
    with pytest.raises(ValueError, match="10 kills need at least 12 steps"):
        schedule(0, 11, 6, recipe="generator", eval_every=5)


def test_the_check_reports_a_missing_or_different_number_instead_of_crashing(tmp_path):
    reference = [{"step": t, "policy_version": t + 1, "policy_version_sampled": t, "data_offset": 8 * t,
                  "reward_version_used": t, "reward_version": t + 1, "pairs": 3, "reward_mean": 0.5} for t in range(2)]
    mine = [dict(r) for r in reference]
    del mine[0]["reward_mean"]  # a float field the run did not log
    mine[1]["reward_version"] = 3  # an update applied twice
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mine))
    chaos = ChaosRun(0, 2, [])
    check(chaos, tmp_path, reference)
    assert chaos.violations == [
        "step 1: reward version 3 after the update of version 1 with 3 pairs",
        "step 0: reward_mean is None, the uninterrupted run's 0.5",
        "step 1: reward_version is 3, the uninterrupted run's 2",
    ]
    assert chaos.max_rel_diff["reward_mean"] == math.inf
