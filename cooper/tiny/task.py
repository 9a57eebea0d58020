"""A synthetic arithmetic word-problem task, seeded, with worked solutions ending in \\boxed{}.

Small enough for a 2-layer model to learn a little in minutes on a CPU, and varied enough (one- and two-step
problems, three operations) that rewards differ within a group, which is all GRPO needs to have signal.

**What is held out.** A one-step problem is one fact (`7 * 8`): there are only 240, so any two large samples share
nearly all of them, and a test set of one-step problems can only measure recall. A two-step problem chains two of
those facts (`7 + 5 = 12, then 12 - 3 = 9`); there are about 1,300 such chains. HELD_OUT_SHARE of the chains are
held out of every split but `heldout`: no model (the SFT warm start, the VerifyRM's pretraining, RL) and not the
tokenizer ever sees one of them, and the `heldout` split is made of them alone. What the held-out set asks is the
held-out part of real math tests: a problem never seen, solved by composing steps that were (every step of a
held-out chain is a one-step fact of the training splits; tests/test_tiny_task.py checks both).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

NAMES = ["Tom", "Ana", "Lee", "Mia", "Sam", "Ivy", "Max", "Zoe"]
THINGS = ["apples", "books", "coins", "pens", "stones", "cards"]
MAX_ADDEND, MAX_FACTOR, MAX_SECOND = 12, 9, 9
NEAR_MISSES = [-3, -2, -1, 1, 2, 3, 10]
TWO_STEP_SHARE = 0.5  # of the problems of every split but `heldout`, which is all two-step
HELD_OUT_SHARE = 0.2
HELD_OUT_SPLIT = "heldout"

Fact = tuple[str, int, int]
"""(operation, first operand as written, second operand): `("-", 15, 7)` is `15 - 7`."""

Key = tuple[str, int, int, int]
"""A problem's arithmetic: one step `("*", 7, 8, 0)`, or a chain `("+-", 7, 5, 3)`: `7 + 5 = 12, then 12 - 3`."""

_SECOND = range(2, MAX_SECOND + 1)


def one_step_facts() -> list[Fact]:
    """Every fact a one-step problem can ask: each result of `+` and `-`, and each first operand, is 2..MAX_ADDEND."""
    adds = [("+", a, b) for a in range(2, MAX_ADDEND + 1) for b in _SECOND]
    subs = [("-", a + b, b) for a in range(2, MAX_ADDEND + 1) for b in _SECOND]
    muls = [("*", a, b) for a in range(2, MAX_FACTOR + 1) for b in _SECOND]
    return adds + subs + muls


def apply_step(op: str, a: int, b: int) -> int:
    """The result of one step, `a op b`."""
    return a + b if op == "+" else a - b if op == "-" else a * b


def steps(key: Key) -> list[Fact]:
    """The facts a problem's worked solution writes, in order."""
    ops, a, b, c = key
    if len(ops) == 1:
        return [(ops, a, b)]
    middle = apply_step(ops[0], a, b)
    return [(ops[0], a, b), (ops[1], middle, c)]


def answer_of(key: Key) -> int:
    op, a, b = steps(key)[-1]
    return apply_step(op, a, b)


def two_step_chains() -> list[Key]:
    """Every chain whose two steps are one-step facts: gets-then-gives (`+-`) and gives-then-gets (`-+`)."""
    facts = set(one_step_facts())
    chains = [("+-", a, b, c) for a in range(2, MAX_ADDEND + 1) for b in _SECOND for c in _SECOND]
    chains += [("-+", a + b, b, c) for a in range(2, MAX_ADDEND + 1) for b in _SECOND for c in _SECOND]
    return [key for key in chains if all(step in facts for step in steps(key))]


def _held_out() -> frozenset[Key]:
    rng = random.Random("held-out chains")
    held: set[Key] = set()
    for ops in ("+-", "-+"):
        chains = [key for key in two_step_chains() if key[0] == ops]
        held.update(rng.sample(chains, round(HELD_OUT_SHARE * len(chains))))
    return frozenset(held)


HELD_OUT_CHAINS = _held_out()
_ONE_STEP = [(op, a, b, 0) for op, a, b in one_step_facts()]
_TRAINING_CHAINS = [key for key in two_step_chains() if key not in HELD_OUT_CHAINS]


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: str
    solution: str
    key: Key


def _question(key: Key, name: str, thing: str) -> str:
    ops, a, b, c = key
    return {
        "+": f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have?",
        "-": f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?",
        "*": f"{name} has {a} bags with {b} {thing} each. How many {thing} are there?",
        "+-": f"{name} has {a} {thing}, gets {b} more and gives away {c}. How many {thing} are left?",
        "-+": f"{name} has {a} {thing}, gives away {b} and gets {c} more. How many {thing} does {name} have?",
    }[ops]


def _draw_key(rng: random.Random, split: str, two_step_share: float) -> Key:
    if split == HELD_OUT_SPLIT:
        return rng.choice(sorted(HELD_OUT_CHAINS))
    return rng.choice(_TRAINING_CHAINS if rng.random() < two_step_share else _ONE_STEP)


def make_problem(rng: random.Random, index: int, split: str, two_step_share: float = TWO_STEP_SHARE) -> Problem:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    key = _draw_key(rng, split, two_step_share)
    work = ", then ".join(f"{a} {op} {b} = {apply_step(op, a, b)}" for op, a, b in steps(key))
    result = answer_of(key)
    solution = f"We compute {work}. The answer is \\boxed{{{result}}}."
    return Problem(id=f"{split}-{index}", question=_question(key, name, thing), answer=str(result),
                   solution=solution, key=key)


def make_split(n: int, seed: int, split: str, two_step_share: float | None = None) -> list[Problem]:
    """`n` problems of `split`; the `heldout` split's chains are in no other split (module docstring), and of the
    other splits' problems `two_step_share` are two-step (None: TWO_STEP_SHARE), the rest one-step (`heldout` is all
    two-step)."""
    rng = random.Random(f"{split}:{seed}")
    share = TWO_STEP_SHARE if two_step_share is None else two_step_share
    return [make_problem(rng, i, split, share) for i in range(n)]


def wrong_solution(problem: Problem, rng: random.Random) -> str:
    """The worked solution with a plausible wrong result (for warm starts and labelled RM data)."""
    wrong = int(problem.answer) + rng.choice(NEAR_MISSES)
    head = problem.solution.rsplit("=", 1)[0]
    return f"{head}= {wrong}. The answer is \\boxed{{{wrong}}}."


def carried_error_solution(problem: Problem, rng: random.Random) -> str:
    """The worked solution with one step's result wrong and every later step computed from it: a consistent
    solution that only a comparison with the reference rejects (what a model's own mistakes look like)."""
    chain = steps(problem.key)
    wrong_at, previous, parts = rng.randrange(len(chain)), None, []
    for index, (op, a, b) in enumerate(chain):
        a = a if previous is None else previous
        value = apply_step(op, a, b)
        if index == wrong_at:
            value += rng.choice(NEAR_MISSES)
        parts.append(f"{a} {op} {b} = {value}")
        previous = value
    return f"We compute {', then '.join(parts)}. The answer is \\boxed{{{previous}}}."


def bare_answer(problem: Problem, rng: random.Random, right_share: float) -> str:
    """An answer with no work shown, right with probability `right_share`, else a near miss."""
    answer = problem.answer if rng.random() < right_share else str(int(problem.answer) + rng.choice(NEAR_MISSES))
    return f"The answer is \\boxed{{{answer}}}."
