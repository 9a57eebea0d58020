"""The `varied` rule strategy: the kinds of wrong solutions an assistant writes, each checked by the real verifier."""

from __future__ import annotations

import asyncio
from collections import Counter

from cooper.services.generator.negatives import RuleStrategy, make_negatives, valid_rate
from cooper.services.generator.varied import bare, early_stop, varied
from cooper.services.verifier.messages import Verdict
from cooper.tiny.examples import example_tasks
from cooper.tiny.task import make_split

WORKED = "We compute 7 + 5 = 12, then 12 - 3 = 9. The answer is \\boxed{9}."


def kind_of(negative: str, positive: str) -> str:
    if "=" not in negative:
        return "bare"
    return "early_stop" if len(negative) < len(positive) - 4 else "arithmetic"


def test_each_kind_rewrites_the_positive_as_an_assistant_would() -> None:
    assert early_stop(WORKED, 1, "s") == "We compute 7 + 5 = 12. The answer is \\boxed{12}."
    short = bare(WORKED, 1, "s")
    assert short.startswith("The answer is \\boxed{") and short != "The answer is \\boxed{9}."
    assert early_stop("We compute 7 * 8 = 56. The answer is \\boxed{56}.", 1, "s") is None  # no intermediate result
    assert early_stop("First, 3 + 4 = 7.\nThen 7 * 2 = 14.\n#### 14", 1, "s") == "First, 3 + 4 = 7. #### 7"
    assert varied("I am not sure how to do this one.", 1, "s") is None
    # Retries of one task try other kinds, so three attempts give three different texts.
    assert len({varied(WORKED, attempt, "task-1") for attempt in (1, 2, 3)}) == 3


def test_varied_negatives_on_the_tiny_task_are_wrong_and_of_every_kind(verify_pairs) -> None:
    from cooper.services.generator.negatives import NegativeTask

    problems = make_split(60, 0, "generator-examples")
    tasks = [NegativeTask(p.id, p.question, p.answer, p.solution) for p in problems]
    outcomes = asyncio.run(make_negatives(tasks, RuleStrategy("varied"), verify_pairs, attempts=3))
    assert valid_rate(outcomes) == 1.0
    kinds = Counter(kind_of(o.negative, t.positive) for o, t in zip(outcomes, tasks, strict=True))
    assert min(kinds[k] for k in ("arithmetic", "early_stop", "bare")) >= 5, kinds
    checks = asyncio.run(verify_pairs([(o.negative, t.reference) for o, t in zip(outcomes, tasks, strict=True)]))
    assert {c.verdict for c in checks} == {Verdict.INCORRECT}


def test_varied_negatives_keep_the_answer_style_of_general_solutions(verify_pairs) -> None:
    tasks = example_tasks()
    outcomes = asyncio.run(make_negatives(tasks, RuleStrategy("varied"), verify_pairs, attempts=3))
    assert valid_rate(outcomes) >= 0.9
