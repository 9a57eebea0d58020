"""Rule-based negatives: change a solution's final answer, and the line that produces it, to a wrong value.

No model, so it runs anywhere and serves as an ablation of the assistant's rewrites. The final answer is the
last `\\boxed{}` (what math-verify extracts first), else the last `#### x`, else the last "The answer is x", else
the last number of the text. The number in it is moved to a plausible wrong value (off by one, two, three, ten, or
doubled; a decimal moves in its last digit), and the same number is changed in every other answer statement and
in the last line before them that holds it ("3 + 4 = 7" becomes "3 + 4 = 8"), so the solution stays
self-consistent apart from its one mistake. Attempt k picks the k-th wrong value, so retries differ.

Left out: answers with no digits get a multiplier ("\\pi" -> "2\\pi") or the next letter ("B" -> "C"), which
math-verify may still call equal for some (infinity); the verifier catches those and the attempt is retried.
"""

from __future__ import annotations

import random
import re

from cooper.boxed import Span, boxed_spans

_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_ANSWER_IS = re.compile(r"answer is[:\s]*([^\n]*)", re.IGNORECASE)
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+(?:\.\d+)?")
_DELTAS: list[int | None] = [1, -1, 2, -2, 3, 10, -10, None, -3, 5]  # None doubles


def _trimmed(text: str, start: int, end: int) -> Span:
    # "The answer is $18$." -> the span of "18": drop trailing punctuation and math delimiters.
    while end > start and text[end - 1] in " \t.,;$":
        end -= 1
    while start < end and text[start] in " \t$":
        start += 1
    return Span(start, end)


def answer_style(text: str) -> str | None:
    """How a solution states its final answer: "boxed", "hashes" (`#### x`), "answer is", or None (a bare number)."""
    if boxed_spans(text):
        return "boxed"
    if _HASHES.search(text):
        return "hashes"
    if _ANSWER_IS.search(text):
        return "answer is"
    return None


def answer_spans(text: str) -> list[Span]:
    """Every final-answer statement's content, in text order; the last one is what a verifier extracts."""
    boxed = boxed_spans(text)
    others = [_trimmed(text, m.start(1), m.end(1)) for rx in (_HASHES, _ANSWER_IS) for m in rx.finditer(text)]
    # "The answer is \boxed{7}." holds a box: keep the box, not the phrase around it.
    others = [s for s in others if s.end > s.start and not any(b.start >= s.start and b.end <= s.end + 1 for b in boxed)]
    return sorted(boxed + others, key=lambda s: s.start)


def final_answer(text: str) -> Span | None:
    """The span the verifier would read: the last box, else the last `####`, else the last "answer is"."""
    boxed = boxed_spans(text)
    if boxed:
        return boxed[-1]
    spans = answer_spans(text)
    if spans:
        return spans[-1]
    numbers = list(_NUMBER.finditer(text))
    return Span(numbers[-1].start(), numbers[-1].end()) if numbers else None


def wrong_number(number: str, attempt: int, seed: str) -> str:
    """The attempt-th plausible wrong value of a number ("1,234", "3.75", "12"); never the number itself."""
    plain = number.replace(",", "")
    decimals = len(plain.split(".")[1]) if "." in plain else 0
    scaled = int(plain.replace(".", ""))
    order = list(_DELTAS)
    random.Random(seed).shuffle(order)
    values: list[int] = []
    for delta in order:
        value = scaled * 2 if delta is None else scaled + delta
        if value >= 0 and value != scaled and value not in values:
            values.append(value)
    value = values[(attempt - 1) % len(values)]
    if decimals:
        text = f"{value:0{decimals + 1}d}"
        return f"{text[:-decimals]}.{text[-decimals:]}"
    return f"{value:,}" if "," in number else str(value)


def _wrong_symbol(content: str, attempt: int) -> str:
    if re.fullmatch(r"\(?[A-Ea-e]\)?", content.strip()):
        letter = content.strip().strip("()")
        base = "a" if letter.islower() else "A"
        shifted = chr(ord(base) + (ord(letter.lower()) - ord("a") + attempt) % 5)
        return content.replace(letter, shifted)
    swaps = {"yes": "no", "no": "yes", "true": "false", "false": "true"}
    if content.strip().lower() in swaps:
        return swaps[content.strip().lower()]
    return f"{attempt + 1}{content}" if not content.startswith("-") else content[1:]


def _standalone(number: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\d.,]){re.escape(number)}(?![\d]|[.,]\d)")


def perturb(text: str, attempt: int = 1, seed: str = "") -> str | None:
    """The solution with its final answer changed to a wrong value; None when it states no answer at all."""
    final = final_answer(text)
    if final is None:
        return None
    content = text[final.start : final.end]
    numbers = list(_NUMBER.finditer(content))
    edits: list[tuple[Span, str]] = []
    if not numbers:
        if not content.strip():
            return None
        wrong = _wrong_symbol(content, attempt)
        edits = [(s, wrong) for s in answer_spans(text) if text[s.start : s.end] == content]
        edits = edits or [(final, wrong)]
        return _apply(text, edits)
    old = numbers[-1].group()
    new = wrong_number(old, attempt, f"{seed}:{old}")
    pattern = _standalone(old)
    # Every answer statement that states the old value gets the new one, so no later mention contradicts it.
    statements = [s for s in answer_spans(text) if pattern.search(text, s.start, s.end)]
    if not any(s.start <= final.start < s.end or s == final for s in statements):
        statements.append(final)
    for span in statements:
        for match in pattern.finditer(text, span.start, span.end):
            if match.end() <= span.end:
                edits.append((Span(match.start(), match.end()), new))
    # The line that produced the answer: the last line before the first statement that holds the old value.
    first = min(s.start for s in statements)
    head = text[:first]
    hits = [m for m in pattern.finditer(head)]
    if hits:
        line_start = head.rfind("\n", 0, hits[-1].start()) + 1
        edits += [(Span(m.start(), m.end()), new) for m in hits if m.start() >= line_start]
    return _apply(text, edits)


def _apply(text: str, edits: list[tuple[Span, str]]) -> str:
    seen: set[tuple[int, int]] = set()
    for span, value in sorted(edits, key=lambda e: e[0].start, reverse=True):
        if (span.start, span.end) in seen:
            continue
        seen.add((span.start, span.end))
        text = text[: span.start] + value + text[span.end :]
    return text
