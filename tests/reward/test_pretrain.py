"""`cooper pretrain-rm`: BCE on labelled triples gives a model directory that the reward service loads."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from reward_testkit import make_config

from cooper.cli import main
from cooper.services.reward.core import RewardCore
from cooper.services.reward.verify_rm import ScoreItem
from cooper.tiny.task import make_split, wrong_solution


def labelled_rows(n: int) -> list[dict]:
    rng = random.Random(0)
    rows = []
    for problem in make_split(n, 3, "pretrain-test"):
        right = rng.random() < 0.5
        completion = problem.solution if right else wrong_solution(problem, rng)
        rows.append({"question": problem.question, "reference": problem.answer, "completion": completion,
                     "label": right})
    return rows


def accuracy(core: RewardCore, rows: list[dict]) -> float:
    items = [ScoreItem(r["question"], r["reference"], r["completion"]) for r in rows]
    logits = core.score_tokens(core.rm.encode(items)).logits
    return sum((x > 0) == r["label"] for x, r in zip(logits, rows, strict=True)) / len(rows)


def test_pretrain_rm_fits_the_labels_and_writes_a_servable_model(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rows = labelled_rows(100)
    labelled = tmp_path / "labelled.jsonl"
    labelled.write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = tmp_path / "models" / "verify-rm"

    # The tiny model memorises 80 triples in 30 epochs; generalising takes thousands (cooper/tiny/warm_start.py).
    code = main(["pretrain-rm", str(labelled), "-o", str(output), "--epochs", "30", "--lr", "1e-3",
                 "--batch-size", "16", "--holdout", "0.2", "reward.model=tiny", "reward.device=cpu",
                 "reward.torch_threads=1"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["train"], result["heldout"], result["positives"]) == (80, 20, sum(r["label"] for r in rows))
    assert result["train_accuracy"] >= 0.9
    assert 0 <= result["heldout_accuracy_before"] <= 1 and 0 <= result["heldout_accuracy_after"] <= 1
    assert not list(output.parent.glob(".verify-rm.*"))  # written under a temporary name, then renamed

    # reward.model can name the directory, and it holds the trained weights, not the base model's.
    trained = RewardCore.load(make_config(tmp_path / "a", model=str(output)))
    base = RewardCore.load(make_config(tmp_path / "b", model="tiny"))
    assert trained.rm.version == 0
    assert accuracy(trained, rows) >= 0.75  # 80 memorised, 20 held out
    assert accuracy(trained, rows) > accuracy(base, rows)
