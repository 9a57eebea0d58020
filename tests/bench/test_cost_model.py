"""bench/cost_model.py's arithmetic: the layouts keep the order their definitions give them, whatever the
assumptions (its figures are estimates; these are the relations a change to the model must not break)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("cost_model", Path(__file__).parents[2] / "bench" / "cost_model.py")
cost_model = importlib.util.module_from_spec(_spec)
sys.modules["cost_model"] = cost_model  # its dataclass looks its module up there
_spec.loader.exec_module(cost_model)


@pytest.mark.parametrize("change", [{}, {"decode_ms": 3.0}, {"gpus": 4}, {"pcie_gbps": 5.0, "answer_tokens": 900},
                                    {"assistant_decode_ms": 60.0}, {"pairs": 512}])
def test_layouts_keep_their_order(change):
    a = replace(cost_model.Assumptions(), **change)
    parts, rows = cost_model.parts(a), cost_model.layouts(a)
    step = {name: row["step_s"] for name, row in rows.items()}
    assert step["rule"] == pytest.approx(parts["rollout"] + parts["policy_update"], abs=0.01)
    assert rows["rule"]["vs_rule"] == 1.0
    # scoring only adds; overlapping the negatives and keeping VerifyRM resident only take away
    assert step["rule"] < step["static"] <= step["cooper-colocated"] <= step["cooper-overlapped"] \
        <= step["cooper-released"]
    assert step["cooper-released"] - step["cooper-overlapped"] >= min(parts["negatives"], parts["policy_update"]) - 0.01
    # giving up GPUs to the other services costs the policy their share
    assert step["cooper-colocated-same-gpus"] >= step["cooper-colocated"]
    assert rows["cooper-colocated"]["state_gb_per_gpu"] > rows["static"]["state_gb_per_gpu"]  # VerifyRM's optimizer
    # VerifyRM on one device: never cheaper than sharded over the policy's GPUs, and its whole state on that device
    assert step["cooper-colocated-unsharded"] >= step["cooper-colocated"]
    assert rows["cooper-colocated-unsharded"]["state_gb_per_gpu"] > rows["cooper-colocated"]["state_gb_per_gpu"]
    # the shared GPU's time-slices add up: the step is at least its scoring, negatives and update
    side = parts["rm_score_one_gpu"] + parts["negatives"] + parts["rm_update_one_gpu"]
    assert step["cooper-side-gpu"] >= side - 0.01 and step["cooper-side-gpu"] > step["rule"]


def test_the_layout_the_deployments_ship_is_the_cheapest_they_can_run_at_the_papers_shape():
    """docs/operations.md's claim, at the defaults: of the layouts with VerifyRM on one device, the shared side GPU."""
    step = {name: row["step_s"] for name, row in cost_model.layouts(cost_model.Assumptions()).items()}
    assert step["cooper-side-gpu"] < min(step["cooper-split"], step["cooper-colocated-unsharded"])


def test_fewer_than_three_gpus_is_refused_by_name(capsys):
    argv = sys.argv
    sys.argv = ["cost_model.py", "--gpus", "2"]
    try:
        with pytest.raises(SystemExit) as exit_:
            cost_model.main()
    finally:
        sys.argv = argv
    assert exit_.value.code == 2 and "--gpus must be at least 3" in capsys.readouterr().err
