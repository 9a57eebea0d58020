"""The chaos suite on a small scale: `python bench/chaos.py` itself (40 steps, 3 seeds and both recipes by default)
on one seed of the paper's recipe, 16 steps. The run survives the SIGKILL of the CLI inside an evaluation (the
resumed run evaluates again) and between steps (it is resumed), of the policy in the middle of a GRPO update, of the
generator inside a negatives job and of the reward service in the middle of a Bradley-Terry update (the policy and
the reward service come back from their checkpoints plus their update journals), keeps every invariant, and logs the
same records and the same final checkpoints, bit for bit, as the same run without kills (tests/orchestrator/chaos.py);
synchronous, and with rollouts one step ahead of training and VerifyRM's update one step behind its scores
(run.max_staleness=1, run.reward_max_staleness=1), where the restarted policy also rebuilds the version behind its
trainer."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from chaos import ChaosRun, check, reward_versions_problems, schedule

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)  # about a minute on a 2-core EPYC; CI's machines have been 2x slower and more
@pytest.mark.parametrize("behind", [0, 1])
def test_a_run_keeps_its_invariants_through_sigkills(tmp_path, behind):
    # Seed 5's schedule (evaluations after steps -1, 4, 9, 14 and 15): the CLI inside an evaluation and between
    # steps, the policy inside an update, the generator inside negatives, the reward service inside an update; 16 steps
    # leave room for a harness that falls a few steps behind a fast run (a tiny step takes about 0.5 s). A run that
    # logs no step for 180 s is stuck: the harness stops it and its report (stderr) says where every process was.
    args = ["--seeds", "5", "--recipes", "generator", "--steps", "16", "--kills", "1", "--eval-every", "5",
            "--stuck-after", "180", "--max-staleness", str(behind), "--reward-max-staleness", str(behind)]
    assert [k.describe() for k in schedule(5, 16, 1, recipe="generator", eval_every=5)] == [
        "cli@2+0.0s in evaluate", "cli@6+0.51s", "policy@7+0.0s in policy_update", "generator@10+0.0s in negatives",
        "reward@12+0.0s in reward_update"]
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "chaos.py"), *args, "--keep", str(tmp_path)],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=840)
    lines = done.stdout.strip().splitlines()
    assert done.returncode in (0, 1) and len(lines) >= 2, f"exit {done.returncode}:\n{done.stderr[-10000:]}"
    run, summary = json.loads(lines[-2]), json.loads(lines[-1])
    assert done.returncode == 0 and summary["invariants_held"], \
        "\n".join(run["violations"]) + "\n--- stderr:\n" + done.stderr[-60000:]
    assert run["kills_not_landed"] == [] and run["kills_by_target"] == ["cli", "cli", "policy", "generator", "reward"]
    evaluate, policy_update, negatives, reward_update = run["kills_inside"]
    assert evaluate in {"evaluate:4", "evaluate:9"}
    assert policy_update in {f"policy_update:{t}" for t in range(7, 16)}
    assert negatives in {f"negatives:{t}" for t in range(10, 16)}
    assert reward_update in {f"reward_update:{t}" for t in range(12, 16)}
    assert run["kills_survived"] == 5 and run["resumes"] == 2 and run["max_rel_diff"] == 0.0
    assert run["evaluations"] == 5 and summary["generator_kills_in_negatives"] == 1
    # The final policy and VerifyRM checkpoints are the uninterrupted run's, bit for bit (weights and optimizer
    # moments are hundreds of tensors; bookkeeping adds the recorded results).
    assert run["checkpoints_identical"] and run["checkpoint_values_compared"] > 100
    print(f"\nchaos: {lines[-1]}")


def test_the_schedule_kills_every_target_at_seeded_moments():
    kills = schedule(3, 40, 6)
    between = [k.target for k in kills if not k.during]
    # The tiny preset's recipe starts no generator: every other target at least once, one of them twice.
    assert set(between) == {"verifier", "policy", "reward", "cli", "redis"} and len(between) == 6
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


def test_the_reward_versions_check_reads_the_scores_k_updates_back():
    # With run.reward_max_staleness=1 steps 0 and 1 are scored by v_0, step t by the version step t-2's update left.
    behind = [{"step": t, "reward_version_used": max(0, t - 1), "reward_version": t + 1, "pairs": 3} for t in range(4)]
    assert reward_versions_problems(behind, 1) == []
    assert reward_versions_problems(behind, 0) == [f"step {t}: scored by reward version {t - 1}, not {t}"
                                                   for t in (1, 2, 3)]
    twice = [dict(r) for r in behind]
    twice[2]["reward_version"] = 4  # step 2's update applied twice
    assert reward_versions_problems(twice, 1) == ["step 2: reward version 4 after the update of version 2 with 3 pairs",
                                                  "step 3: reward version 4 after the update of version 4 with 3 pairs"]


def _write_final_checkpoints(run_dir, flip_bit_of=None):
    """A run directory's final policy and VerifyRM checkpoints as the services lay them out, optionally with one
    bit of one tensor flipped (`flip_bit_of`: "weights" or "optimizer")."""
    import torch
    from safetensors.torch import save_file

    for service, name, state_file in (("policy", "v00000003", "state.json"),
                                      ("reward", "v00000002-u00000003", "cooper_state.json")):
        path = run_dir / "checkpoints" / service / name
        path.mkdir(parents=True)
        weights = {"w": torch.linspace(-1, 1, 12).reshape(3, 4), "b": torch.zeros(4, dtype=torch.bfloat16)}
        optimizer = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.full((3, 4), 0.25)}},
                     "param_groups": [{"lr": 1e-3, "params": [0]}]}
        if service == "reward" and flip_bit_of == "weights":
            weights["w"].view(torch.int32)[1, 2] ^= 1  # the lowest bit of one float: a difference of ~1e-8
        if service == "policy" and flip_bit_of == "optimizer":
            optimizer["state"][0]["exp_avg"].view(torch.int32)[0, 0] ^= 1
        save_file(weights, path / "model.safetensors")
        torch.save(optimizer, path / "optimizer.pt")
        (path / state_file).write_text(json.dumps({"version": int(name[1:9]), "last_key": f"{run_dir.name}/2",
                                                   "saved_at": os.urandom(4).hex()}))


@pytest.mark.parametrize("flipped", ["weights", "optimizer"])
def test_the_final_checkpoints_are_compared_bit_for_bit(tmp_path, flipped):
    from chaos import final_checkpoint_differences

    calm, same, differing = tmp_path / "calm", tmp_path / "same", tmp_path / "differing"
    for run_dir, flip in ((calm, None), (same, None), (differing, flipped)):
        _write_final_checkpoints(run_dir, flip)
    differences, compared = final_checkpoint_differences(same, calm)
    assert differences == [] and compared == 2 * (1 + 2 + 4 + 2)  # per service: the weight files, 2 weights, optimizer 4, state 2
    differences, _ = final_checkpoint_differences(differing, calm)
    assert differences == [{"weights": "reward model.safetensors.w: not bit for bit the uninterrupted run's tensor",
                            "optimizer": "policy optimizer.state.0.exp_avg: not bit for bit the uninterrupted run's "
                                         "tensor"}[flipped]]
    (differing / "checkpoints" / "reward" / "v00000002-u00000003" / "cooper_state.json").unlink()  # incomplete
    assert "reward: no final checkpoint" in final_checkpoint_differences(differing, calm)[0][-1]
