"""The verdict of one (completion, reference) pair under math-verify: a pure function, no service code.

Run it on a process's main thread (the worker processes of pool.py do): the time limit is a SIGALRM interval
timer, because math-verify's own `signal.alarm` timeouts only take whole seconds, misbehave with fractions, and
raise in threads. Our timer raises a BaseException so that math-verify's broad `except Exception` cannot swallow
it; a computation stuck in C code (a huge integer power) never sees the signal, which is why the pool also kills
workers from outside.
"""

from __future__ import annotations

import logging
import re
import signal
import time
from collections import OrderedDict
from typing import Any

from math_verify import parse, verify

from cooper.boxed import last_boxed
from cooper.services.verifier.messages import Check, Verdict

# math-verify warns once that its timeouts are off; ours replace them.
logging.getLogger("math_verify").setLevel(logging.ERROR)


class _ItemTimeout(BaseException):
    """Raised by the interval timer; a BaseException so that `except Exception` blocks let it through."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _ItemTimeout


_PROSE_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")


def looks_bare(reference: str) -> bool:
    # A bare answer ("\frac{\sqrt{2}}{2}", "[1,2)") parses to nothing unless it sits in math delimiters;
    # a worked solution carries its own \boxed{} or "The answer is". Prose (three or more words) is never
    # wrapped: inside $...$ it would parse as a product of symbols.
    return (
        "\n" not in reference
        and "$" not in reference
        and "\\boxed" not in reference
        and len(reference) < 200
        and len(_PROSE_WORD.findall(reference)) < 3
    )


def parse_reference(reference: str) -> list[Any]:
    """The reference as math-verify's gold: a bare answer is wrapped in $...$ first, a solution parsed as is."""
    text = reference.strip()
    if looks_bare(text):
        gold = parse(f"${text}$", parsing_timeout=None)  # type: ignore[arg-type]
        if gold:
            return gold
    return parse(text, parsing_timeout=None)  # type: ignore[arg-type]


def parse_completion(completion: str, answer: str = "anywhere") -> list[Any]:
    """math-verify's parse of the completion. answer="boxed" reads only the last \\boxed{}: with math-verify's
    default extraction, the last expression anywhere counts, so `We compute 3 + 5 = }.` is a correct answer to
    "3 + 5" (the expression evaluates to the reference), which a policy learns to write when its prompts contain
    their own answer's expression (docs/experiments.md)."""
    if answer == "boxed":
        content = last_boxed(completion)
        return [] if content is None or not content.strip() else parse(f"${content}$", parsing_timeout=None)  # type: ignore[arg-type]
    return parse(completion, parsing_timeout=None)  # type: ignore[arg-type]


def extracted_text(parsed: list[Any]) -> str:
    return next((x for x in parsed if isinstance(x, str)), "")


class ReferenceCache:
    """Parsed references, most recent last: a GRPO group checks G completions against one reference."""

    def __init__(self, size: int = 1024):
        self.size = size
        self._items: OrderedDict[str, list[Any]] = OrderedDict()

    def get(self, reference: str) -> list[Any]:
        if reference in self._items:
            self._items.move_to_end(reference)
            return self._items[reference]
        gold = parse_reference(reference)
        self._items[reference] = gold
        if len(self._items) > self.size:
            self._items.popitem(last=False)
        return gold


def _tail(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[-max_chars:]


def check(
    completion: str,
    reference: str,
    timeout_s: float,
    max_chars: int = 20000,
    cache: ReferenceCache | None = None,
    answer: str = "anywhere",
) -> Check:
    """Verdict of `completion` against `reference` within `timeout_s` seconds (main thread only)."""
    start = time.perf_counter()
    extracted = ""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        reference = _tail(reference, max_chars)
        gold = cache.get(reference) if cache is not None else parse_reference(reference)
        if not gold:
            return _done(start, Verdict.ERROR, detail="the reference holds no parseable answer")
        pred = parse_completion(_tail(completion, max_chars), answer)
        if not pred:
            return _done(start, Verdict.NO_ANSWER)
        extracted = extracted_text(pred)
        correct = verify(gold, pred, timeout_seconds=None)
        return _done(start, Verdict.CORRECT if correct else Verdict.INCORRECT, extracted)
    except _ItemTimeout:
        return _done(start, Verdict.TIMEOUT, extracted, detail=f"check ran past {timeout_s:g} s")
    except Exception as err:  # one bad item must not fail its batch
        return _done(start, Verdict.ERROR, detail=f"{type(err).__name__}: {err}"[:500])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _done(start: float, verdict: Verdict, extracted: str = "", detail: str = "") -> Check:
    return Check(verdict, extracted, (time.perf_counter() - start) * 1000.0, detail)
