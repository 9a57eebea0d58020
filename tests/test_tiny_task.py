"""The tiny task's held-out test set: problems whose arithmetic (operation and operands) no model ever saw."""

from __future__ import annotations

import re
from pathlib import Path

from cooper.orchestrator.data import tiny_splits
from cooper.tiny.task import HELD_OUT_FACTS, HELD_OUT_SPLIT, all_facts, make_split
from cooper.tiny.warm_start import RM_PROBLEMS

ROOT = Path(__file__).resolve().parents[1]


def _facts(problems) -> set:  # type: ignore[no-untyped-def]
    return {p.fact for p in problems}


def test_the_held_out_facts_are_a_fifth_of_each_operation() -> None:
    for op in "+-*":
        facts = [f for f in all_facts() if f[0] == op]
        held = [f for f in facts if f in HELD_OUT_FACTS]
        assert 0.15 * len(facts) <= len(held) <= 0.25 * len(facts), op


def test_no_training_split_holds_a_held_out_fact() -> None:
    # Every split a model learns from, at the sizes and seeds the builders and the runs use: the SFT warm start, the
    # VerifyRM's pretraining, the tokenizer's corpus, the generator's examples, RL's prompts (any run seed), and the
    # in-distribution test set.
    used = [("sft", 4000, 0), ("rm", RM_PROBLEMS, 0), ("corpus", 2000, 0), ("corpus", 200, 1),
            ("generator-examples", 64, 0), ("rm-bench", 512, 0)]
    used += [("train", 2000, seed) for seed in range(30)] + [("test", 256, seed) for seed in range(30)]
    for split, n, seed in used:
        assert not _facts(make_split(n, seed, split)) & HELD_OUT_FACTS, (split, seed)
    # And the builders draw their problems through make_split, nothing else.
    for path in (ROOT / "cooper").rglob("*.py"):
        if path.name != "task.py":
            assert not re.search(r"\bmake_problem\(", path.read_text()), path


def test_the_held_out_set_is_made_of_held_out_facts_only_and_covers_them() -> None:
    train, tests = tiny_splits(seed=21, test_size=256)
    assert list(tests) == ["heldout", "seen"]
    held = make_split(256, 21, HELD_OUT_SPLIT)
    assert _facts(held) <= HELD_OUT_FACTS and len(_facts(held)) >= 0.9 * len(HELD_OUT_FACTS)
    assert [e.question for e in tests["heldout"]] == [p.question for p in held]
    # Not one held-out question's arithmetic is among the run's training prompts, which is what "held out" means,
    # while the in-distribution set's is (nearly) all there.
    assert not _facts(make_split(2000, 21, "train")) & _facts(held)
    seen = _facts(make_split(256, 21, "test"))
    assert len(seen & _facts(make_split(2000, 21, "train"))) >= 0.95 * len(seen)
    assert len(train) == 2000 and {e.data_source for e in tests["seen"]} == {"seen"}
