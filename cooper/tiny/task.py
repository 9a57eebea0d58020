"""A synthetic arithmetic word-problem task, seeded, with worked solutions ending in \\boxed{}.

Small enough for a 2-layer model to learn a little in minutes on a CPU, and varied enough (four operations,
several templates) that rewards differ within a group, which is all GRPO needs to have signal.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = ["Tom", "Ana", "Lee", "Mia", "Sam", "Ivy", "Max", "Zoe"]
THINGS = ["apples", "books", "coins", "pens", "stones", "cards"]


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: str
    solution: str


def make_problem(rng: random.Random, index: int, split: str) -> Problem:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    op = rng.choice("+-*")
    a, b = rng.randint(2, 12), rng.randint(2, 9)  # small enough that a 2-layer model gets some right
    if op == "+":
        question = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have?"
        result, work = a + b, f"{a} + {b} = {a + b}"
    elif op == "-":
        a = a + b
        question = f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?"
        result, work = a - b, f"{a} - {b} = {a - b}"
    else:
        a = rng.randint(2, 9)
        question = f"{name} has {a} bags with {b} {thing} each. How many {thing} are there?"
        result, work = a * b, f"{a} * {b} = {a * b}"
    solution = f"We compute {work}. The answer is \\boxed{{{result}}}."
    return Problem(id=f"{split}-{index}", question=question, answer=str(result), solution=solution)


def make_split(n: int, seed: int, split: str) -> list[Problem]:
    """`n` problems; train and test use different seeds so that they do not share a sequence."""
    rng = random.Random(f"{split}:{seed}")
    return [make_problem(rng, i, split) for i in range(n)]


def wrong_solution(problem: Problem, rng: random.Random) -> str:
    """The worked solution with a plausible wrong result (for warm starts and labelled RM data)."""
    wrong = int(problem.answer) + rng.choice([-3, -2, -1, 1, 2, 3, 10])
    head = problem.solution.rsplit("=", 1)[0]
    return f"{head}= {wrong}. The answer is \\boxed{{{wrong}}}."
