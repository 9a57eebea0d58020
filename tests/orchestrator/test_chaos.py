"""The chaos suite on a small scale (bench/chaos.py runs it at 40 steps and 3 seeds): a real run survives
SIGKILLs of a service and of its embedded Redis, and keeps every invariant (tests/orchestrator/chaos.py)."""

from __future__ import annotations

import pytest
from chaos import Kill, check, run_with_kills, schedule


@pytest.mark.slow
def test_a_run_keeps_its_invariants_through_sigkills(tmp_path):
    steps = 8  # steps left after the last kill, so that it lands mid-run on a fast, quiet machine too
    # The embedded Redis (the run stops; it is resumed), then the policy service (restarted by the watchdog).
    kills = [Kill("redis", 1, 0.0), Kill("policy", 3, 0.0)]
    chaos = run_with_kills(tmp_path, 0, steps, kills)
    check(chaos, tmp_path / "chaos-0", reference=None)
    assert not chaos.violations, "\n".join(chaos.violations)
    assert [k.logged >= 0 for k in kills] == [True, True]  # both landed before the run ended
    assert chaos.survived == 2 and chaos.resumes == 1


def test_the_schedule_kills_every_target_at_seeded_moments():
    kills = schedule(3, 40, 6)
    assert sorted(k.target for k in kills) == sorted(["verifier", "policy", "reward", "generator", "cli", "redis"])
    assert kills == schedule(3, 40, 6) and kills != schedule(4, 40, 6)
    steps = [k.after_step for k in kills]
    assert steps == sorted(steps) and len(set(steps)) == 6 and 1 <= steps[0] and steps[-1] <= 38
    assert all(b - a >= 3 for a, b in zip(steps, steps[1:], strict=False))  # spread over the run
    with pytest.raises(ValueError, match="6 kills need at least 8 steps"):
        schedule(0, 7, 6)
