"""What a step waited on (`time/critical/*`, run.critical_path): the chain of the step's jobs back from the one that
ended last, each through the dependency it waited for longest."""

from __future__ import annotations

import pytest

from cooper.orchestrator import graph as g
from cooper.orchestrator.graph import StepGraph
from cooper.orchestrator.run import critical_path
from cooper.orchestrator.stage_results import StageResult


def ran(start: float, end: float) -> StageResult:
    return StageResult(seconds=end - start, finished_at=1000.0 + end)


TIMELINE = {  # a cooper step: rollout, then verify and score beside each other, then the two updates beside each other
    g.ROLLOUT: ran(0.0, 2.0), g.VERIFY: ran(2.1, 2.3), g.SCORE: ran(2.2, 2.5), g.NEGATIVES: ran(2.4, 2.6),
    g.POLICY_UPDATE: ran(2.6, 5.0), g.REWARD_UPDATE: ran(2.7, 3.9),
}


def test_the_policy_update_ending_last_puts_the_scoring_branch_on_the_path():
    path = critical_path(StepGraph("cooper", 3, 0), 1, TIMELINE)
    assert path == pytest.approx({"rollout": 2.0, "score": 0.3, "policy_update": 2.4, "queue": 0.3, "verify": 0.0,
                                  "negatives": 0.0, "reward_update": 0.0})
    assert sum(path.values()) == pytest.approx(5.0)  # the step's span, from its rollout's start to its last end


def test_a_reward_update_ending_last_puts_the_negatives_branch_on_the_path():
    slow = {**TIMELINE, g.REWARD_UPDATE: ran(4.0, 6.0)}
    path = critical_path(StepGraph("cooper", 3, 0), 1, slow)
    assert path == pytest.approx({"rollout": 2.0, "verify": 0.2, "negatives": 0.2, "reward_update": 2.0,
                                  "queue": 0.1 + 0.1 + 1.4, "score": 0.0, "policy_update": 0.0})
    assert sum(path.values()) == pytest.approx(6.0)


def test_results_without_their_end_time_give_no_path():
    untimed = {stage: StageResult(seconds=1.0) for stage in TIMELINE}  # recorded before finished_at was kept
    assert critical_path(StepGraph("cooper", 3, 0), 1, untimed) == {}
