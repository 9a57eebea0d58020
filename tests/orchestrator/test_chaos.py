"""The chaos suite on a small scale (bench/chaos.py runs it at 40 steps, 3 seeds and both recipes): a real run
survives SIGKILLs of its embedded Redis and of the policy inside an evaluation, keeps every invariant, and logs the
same records as the same run without kills (tests/orchestrator/chaos.py)."""

from __future__ import annotations

import json
import math

import pytest
from chaos import ChaosRun, Kill, check, run_with_kills, schedule, uninterrupted


@pytest.mark.slow
def test_a_run_keeps_its_invariants_through_sigkills(tmp_path):
    steps, eval_every = 6, 2  # evaluations after steps -1, 1, 3 and 5; steps left after the last kill
    reference, _ = uninterrupted(tmp_path, 0, steps, eval_every=eval_every)
    # The embedded Redis (the run stops; it is resumed), then the policy while it samples an evaluation (restarted
    # by the watchdog; the evaluation waits for it).
    kills = [Kill("redis", 1, 0.0), Kill("policy", 2, 0.0, during="evaluate")]
    chaos = run_with_kills(tmp_path, 0, steps, kills, eval_every=eval_every)
    check(chaos, tmp_path / "chaos-0", reference)
    assert not chaos.violations, "\n".join(chaos.violations)
    assert chaos.not_landed == [] and kills[1].inside in ("evaluate:3", "evaluate:5")
    assert chaos.survived == 2 and chaos.resumes == 1
    assert chaos.evaluations == 4 and all(v == 0.0 for v in chaos.max_rel_diff.values())


def test_the_schedule_kills_every_target_at_seeded_moments():
    kills = schedule(3, 40, 6)
    assert sorted(k.target for k in kills) == sorted(["verifier", "policy", "reward", "generator", "cli", "redis"])
    assert kills == schedule(3, 40, 6) and kills != schedule(4, 40, 6)
    steps = [k.after_step for k in kills]
    assert steps == sorted(steps) and len(set(steps)) == 6 and 1 <= steps[0] and steps[-1] <= 38
    assert all(b - a >= 3 for a, b in zip(steps, steps[1:], strict=False))  # spread over the run
    with pytest.raises(ValueError, match="6 kills need at least 8 steps"):
        schedule(0, 7, 6)


def test_the_paper_recipe_and_evaluations_add_kills_inside_their_jobs():
    kills = schedule(3, 40, 6, recipe="generator", eval_every=5)
    inside = [(k.target, k.during) for k in kills if k.during]
    assert len(kills) == 8 and ("generator", "negatives") in inside and len(inside) == 2
    assert {t for t, d in inside if d == "evaluate"} <= {"policy", "verifier", "cli"}
    steps = [k.after_step for k in kills]
    assert steps == sorted(steps) and len(set(steps)) == 8 and steps[-1] <= 38
    with pytest.raises(ValueError, match="8 kills need at least 10 steps"):
        schedule(0, 9, 6, recipe="generator", eval_every=5)


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
