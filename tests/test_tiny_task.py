"""The tiny task's held-out test set: problems whose arithmetic (the chain of operations and operands) no model
ever saw, each of whose steps is a fact the training splits teach."""

from __future__ import annotations

import re
from pathlib import Path

from cooper.orchestrator.data import tiny_splits
from cooper.tiny.task import HELD_OUT_CHAINS, HELD_OUT_SPLIT, make_split, one_step_facts, steps, two_step_chains
from cooper.tiny.warm_start import RM_PROBLEMS

ROOT = Path(__file__).resolve().parents[1]


def _keys(problems) -> set:  # type: ignore[no-untyped-def]
    return {p.key for p in problems}


def test_the_held_out_chains_are_a_fifth_of_each_kind_and_their_answers_are_right() -> None:
    for ops in ("+-", "-+"):
        chains = [key for key in two_step_chains() if key[0] == ops]
        held = [key for key in chains if key in HELD_OUT_CHAINS]
        assert len(chains) > 400 and 0.15 * len(chains) <= len(held) <= 0.25 * len(chains), ops
    for p in make_split(200, 3, HELD_OUT_SPLIT):
        ops, a, b, c = p.key
        assert int(p.answer) == eval(f"{a} {ops[0]} {b} {ops[1]} {c}")  # noqa: S307 -- digits and +- only
        assert p.solution.endswith(f"\\boxed{{{p.answer}}}.") and p.solution.count(" = ") == 2


def test_no_training_split_holds_a_held_out_chain() -> None:
    # Every split a model learns from, at the sizes and seeds the builders and the runs use: the SFT warm start, the
    # VerifyRM's pretraining, the tokenizer's corpus, the generator's examples, RL's prompts (any run seed), and the
    # in-distribution test set.
    used = [("sft", 4000, 0), ("rm", RM_PROBLEMS, 0), ("corpus", 2000, 0), ("corpus", 200, 1),
            ("generator-examples", 64, 0), ("rm-bench", 512, 0)]
    used += [("train", 2000, seed) for seed in range(30)] + [("test", 256, seed) for seed in range(30)]
    for split, n, seed in used:
        keys = _keys(make_split(n, seed, split))
        assert not keys & HELD_OUT_CHAINS, (split, seed)
        assert any(len(key[0]) == 2 for key in keys), (split, seed)  # two-step problems are trained on, too
    # And the builders draw their problems through make_split, nothing else.
    for path in (ROOT / "cooper").rglob("*.py"):
        if path.name != "task.py":
            assert not re.search(r"\bmake_problem\(", path.read_text()), path


def test_every_step_of_a_held_out_problem_is_a_fact_training_teaches() -> None:
    trained_facts = {fact for p in make_split(4000, 0, "sft") for fact in steps(p.key)}
    assert {fact for key in HELD_OUT_CHAINS for fact in steps(key)} <= trained_facts <= set(one_step_facts())


def test_the_held_out_set_is_made_of_held_out_chains_only_and_covers_them() -> None:
    train, tests = tiny_splits(seed=21, test_size=256)
    assert list(tests) == ["heldout", "seen"]
    held = make_split(256, 21, HELD_OUT_SPLIT)
    assert _keys(held) <= HELD_OUT_CHAINS and len(_keys(held)) >= 0.5 * len(HELD_OUT_CHAINS)
    assert [e.question for e in tests["heldout"]] == [p.question for p in held]
    # Not one held-out question's arithmetic is among the run's training prompts, which is what "held out" means,
    # while the in-distribution set's one-step problems are (nearly) all there.
    assert not _keys(make_split(2000, 21, "train")) & _keys(held)
    seen = {key for key in _keys(make_split(256, 21, "test")) if len(key[0]) == 1}
    assert len(seen & _keys(make_split(2000, 21, "train"))) >= 0.95 * len(seen)
    assert len(train) == 2000 and {e.data_source for e in tests["seen"]} == {"seen"}


def test_the_noisy_reward_models_labels_are_a_quarter_flipped_and_the_same_each_time() -> None:
    from cooper.tiny.warm_start import NOISY_LABEL_SHARE, rm_pretraining_data

    clean = rm_pretraining_data(600)
    noisy = rm_pretraining_data(600, label_noise=NOISY_LABEL_SHARE)
    assert [(t.question, t.completion) for t in clean] == [(t.question, t.completion) for t in noisy]
    flipped = sum(a.label != b.label for a, b in zip(clean, noisy, strict=True)) / len(clean)
    assert abs(flipped - NOISY_LABEL_SHARE) < 0.04  # ~1,300 examples: the share within about 3 standard errors
    assert noisy == rm_pretraining_data(600, label_noise=NOISY_LABEL_SHARE)  # annotators' mistakes are fixed
    assert sum(t.label for t in clean) == 600  # one worked, right solution per problem, every other text wrong


def test_the_keyed_reward_models_data_adds_bare_right_answers_as_positives_and_changes_nothing_else() -> None:
    from cooper.tiny.warm_start import ANSWER_KEY_SHARE, rm_pretraining_data

    clean = rm_pretraining_data(600)
    keyed = rm_pretraining_data(600, answer_key=ANSWER_KEY_SHARE)
    added = [t for t in keyed if t not in clean]
    assert [t for t in keyed if t in clean] == clean  # v8's examples, in their order: the key draws on its own
    assert abs(len(added) / 600 - ANSWER_KEY_SHARE) < 0.07  # one per keyed problem, about 3 standard errors
    # Every added example is the bare right answer, a positive; no bare answer is ever a negative.
    assert all(t.label and t.completion == f"The answer is \\boxed{{{t.reference}}}." for t in added)
    assert not [t for t in keyed if not t.label and t.completion.startswith("The answer is \\boxed")]
    assert keyed == rm_pretraining_data(600, answer_key=ANSWER_KEY_SHARE)


def test_the_two_step_share_shapes_training_and_seen_and_leaves_the_held_out_set_alone() -> None:
    default_train, default_tests = tiny_splits(seed=5, test_size=128)
    assert tiny_splits(seed=5, test_size=128, two_step_share=0.5) == (default_train, default_tests)
    train, tests = tiny_splits(seed=5, test_size=128, two_step_share=1.0)
    two_step = make_split(2000, 5, "train", two_step_share=1.0)
    assert [e.question for e in train] == [p.question for p in two_step]
    assert all(len(p.key[0]) == 2 for p in two_step) and not _keys(two_step) & HELD_OUT_CHAINS
    assert all(len(p.key[0]) == 2 for p in make_split(128, 5, "test", two_step_share=1.0))
    assert tests["heldout"] == default_tests["heldout"] and tests["seen"] != default_tests["seen"]
    assert all(len(p.key[0]) == 1 for p in make_split(200, 5, "train", two_step_share=0.0))
