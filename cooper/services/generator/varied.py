"""Rule-based negatives of the kinds an assistant LLM writes when asked for a wrong solution, with no model.

`perturb` alone changes one number and keeps all the work, so a reward model trained on its negatives only ever
sees wrong solutions that look like right ones. An assistant asked for "a plausible mistake" writes more kinds
than that; three of them are written here from the positive alone (nothing about the policy being trained):
- arithmetic: a wrong number in the last step, carried to the answer (perturb.py);
- early stop: the work cut after an intermediate result, which is then given as the answer (skipped work);
- bare: the answer statement alone, with a wrong value (no work shown at all).
Attempt k of a task takes the kinds in an order seeded by the task, so retries try another kind and another value.
"""

from __future__ import annotations

import random
import re

from cooper.services.generator.perturb import final_answer, perturb, wrong_number

KINDS = ("arithmetic", "early_stop", "bare")
_RESULT = re.compile(r"=\s*(-?\d+(?:\.\d+)?)")
_SENTENCE_START = re.compile(r"(?:^|(?<=[.!?\n]))\s*")


def _answer_sentence(text: str) -> tuple[int, int, int] | None:
    """(start of the final answer's sentence, start of the answer, end of the answer), or None without an answer."""
    final = final_answer(text)
    if final is None:
        return None
    starts = [m.end() for m in _SENTENCE_START.finditer(text, 0, final.start)]
    return (starts[-1] if starts else 0), final.start, final.end


def bare(text: str, attempt: int, seed: str) -> str | None:
    """The answer statement's sentence alone ("The answer is \\boxed{9}."), with a wrong number in it."""
    where = _answer_sentence(text)
    if where is None:
        return None
    start, answer_start, answer_end = where
    content = text[answer_start:answer_end]
    if not re.fullmatch(r"\s*-?\d+(?:\.\d+)?\s*", content):
        return None
    wrong = wrong_number(content.strip(), attempt, f"{seed}:bare")
    return (text[start:answer_start] + wrong + text[answer_end:]).strip()


def early_stop(text: str, attempt: int, seed: str) -> str | None:
    """The work up to an intermediate result ("7 + 5 = 12"), then the answer statement giving that result; None
    when the work has no intermediate result that differs from the final answer."""
    where = _answer_sentence(text)
    if where is None:
        return None
    start, answer_start, answer_end = where
    work, final = text[:start], text[answer_start:answer_end].strip()
    results = [m for m in _RESULT.finditer(work) if m.group(1) != final]
    if not results:
        return None
    cut = results[(attempt - 1) % len(results)]
    head = work[: cut.end()].rstrip(" ,;") + "."
    return f"{head} {text[start:answer_start].lstrip()}{cut.group(1)}{text[answer_end:].rstrip()}".strip()


def varied(text: str, attempt: int = 1, seed: str = "") -> str | None:
    """The attempt-th kind of wrong solution for this positive (module docstring); None when no kind applies."""
    order = list(KINDS)
    random.Random(f"{seed}:kinds").shuffle(order)
    for offset in range(len(order)):
        kind = order[(attempt - 1 + offset) % len(order)]
        rewrite = {"arithmetic": perturb, "early_stop": early_stop, "bare": bare}[kind](text, attempt, seed)
        if rewrite:
            return rewrite
    return None
