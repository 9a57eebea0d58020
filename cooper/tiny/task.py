"""A synthetic arithmetic word-problem task, seeded, with worked solutions ending in \\boxed{}.

Small enough for a 2-layer model to learn a little in minutes on a CPU, and varied enough (four operations,
several templates) that rewards differ within a group, which is all GRPO needs to have signal.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = ["Tom", "Ana", "Lee", "Mia", "Sam", "Ivy", "Max", "Zoe"]
THINGS = ["apples", "books", "coins", "pens", "stones", "cards"]
MAX_ADDEND, MAX_FACTOR = 12, 9
NEAR_MISSES = [-3, -2, -1, 1, 2, 3, 10]


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: str
    solution: str


def make_problem(rng: random.Random, index: int, split: str) -> Problem:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    op = rng.choice("+-*")
    a, b = rng.randint(2, MAX_ADDEND), rng.randint(2, 9)
    if op == "+":
        question = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have?"
        result, work = a + b, f"{a} + {b} = {a + b}"
    elif op == "-":
        a = a + b
        question = f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?"
        result, work = a - b, f"{a} - {b} = {a - b}"
    else:
        a = rng.randint(2, MAX_FACTOR)
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
    wrong = int(problem.answer) + rng.choice(NEAR_MISSES)
    head = problem.solution.rsplit("=", 1)[0]
    return f"{head}= {wrong}. The answer is \\boxed{{{wrong}}}."


def bare_answer(problem: Problem, rng: random.Random, right_share: float) -> str:
    """An answer with no work shown, right with probability `right_share`, else a near miss."""
    answer = problem.answer if rng.random() < right_share else str(int(problem.answer) + rng.choice(NEAR_MISSES))
    return f"The answer is \\boxed{{{answer}}}."
