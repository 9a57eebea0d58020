"""A synthetic arithmetic word-problem task, seeded, with worked solutions ending in \\boxed{}.

Small enough for a 2-layer model to learn a little in minutes on a CPU, and varied enough (three operations,
several templates) that rewards differ within a group, which is all GRPO needs to have signal.

The task has only 240 distinct facts (an operation and its two operands: `7 * 8`), so any two large samples share
nearly all of them. HELD_OUT_SHARE of the facts of each operation are held out of every split but `heldout`: no
model (the SFT warm start, the VerifyRM's pretraining, RL) and not the tokenizer ever sees them, and the `heldout`
split is made of them alone. Every other split draws from the rest.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = ["Tom", "Ana", "Lee", "Mia", "Sam", "Ivy", "Max", "Zoe"]
THINGS = ["apples", "books", "coins", "pens", "stones", "cards"]
MAX_ADDEND, MAX_FACTOR = 12, 9
NEAR_MISSES = [-3, -2, -1, 1, 2, 3, 10]
HELD_OUT_SHARE = 0.2
HELD_OUT_SPLIT = "heldout"

Fact = tuple[str, int, int]
"""(operation, first operand as written, second operand): `("-", 15, 7)` is `15 - 7`."""


def all_facts() -> list[Fact]:
    """Every fact `make_problem` can draw."""
    adds = [("+", a, b) for a in range(2, MAX_ADDEND + 1) for b in range(2, 10)]
    subs = [("-", a + b, b) for a in range(2, MAX_ADDEND + 1) for b in range(2, 10)]
    muls = [("*", a, b) for a in range(2, MAX_FACTOR + 1) for b in range(2, 10)]
    return adds + subs + muls


def _held_out() -> frozenset[Fact]:
    rng = random.Random("held-out facts")
    held: set[Fact] = set()
    for op in "+-*":
        facts = [f for f in all_facts() if f[0] == op]
        held.update(rng.sample(facts, round(HELD_OUT_SHARE * len(facts))))
    return frozenset(held)


HELD_OUT_FACTS = _held_out()


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: str
    solution: str
    fact: Fact


def _draw_fact(rng: random.Random) -> Fact:
    op = rng.choice("+-*")
    a, b = rng.randint(2, MAX_ADDEND), rng.randint(2, 9)
    if op == "-":
        return op, a + b, b
    if op == "*":
        return op, rng.randint(2, MAX_FACTOR), b
    return op, a, b


def make_problem(rng: random.Random, index: int, split: str) -> Problem:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    held_out = split == HELD_OUT_SPLIT
    while True:  # each split draws from its side of the held-out line only
        op, a, b = _draw_fact(rng)
        if ((op, a, b) in HELD_OUT_FACTS) == held_out:
            break
    if op == "+":
        question = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have?"
        result, work = a + b, f"{a} + {b} = {a + b}"
    elif op == "-":
        question = f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?"
        result, work = a - b, f"{a} - {b} = {a - b}"
    else:
        question = f"{name} has {a} bags with {b} {thing} each. How many {thing} are there?"
        result, work = a * b, f"{a} * {b} = {a * b}"
    solution = f"We compute {work}. The answer is \\boxed{{{result}}}."
    return Problem(id=f"{split}-{index}", question=question, answer=str(result), solution=solution,
                   fact=(op, a, b))


def make_split(n: int, seed: int, split: str) -> list[Problem]:
    """`n` problems of `split`; the `heldout` split's facts are in no other split (module docstring)."""
    rng = random.Random(f"{split}:{seed}")
    return [make_problem(rng, i, split) for i in range(n)]


def wrong_solution(problem: Problem, rng: random.Random) -> str:
    """The worked solution with a plausible wrong result (for warm starts and labelled RM data)."""
    wrong = int(problem.answer) + rng.choice(NEAR_MISSES)
    head = problem.solution.rsplit("=", 1)[0]
    return f"{head}= {wrong}. The answer is \\boxed{{{wrong}}}."


def bare_answer(problem: Problem, rng: random.Random, right_share: float) -> str:
    """An answer with no work shown, right with probability `right_share`, else a near miss."""
    answer = problem.answer if rng.random() < right_share else str(int(problem.answer) + rng.choice(NEAR_MISSES))
    return f"The answer is \\boxed{{{answer}}}."
