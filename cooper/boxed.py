"""LaTeX boxes (`\\boxed{...}`) in a text: the one scanner, for the dataset converters, the verifier and the
rule-based negatives.

Their rules differ on purpose, so they are options here rather than three scanners:

- `fbox`: `\\fbox{...}` is a box too (datasets, negatives); the verifier reads `\\boxed{}` only.
- `spaced`: `\\boxed {x}` is a box too (negatives, which must find every box a reader might take for the answer).
- `strict` (last_boxed): a last box that never closes means no answer, rather than half of one (datasets); without
  it the box before counts (the verifier: a completion cut off in a second box still answered in the first).
- `strip` (last_boxed): the content without surrounding whitespace (datasets).

Braces nest: a box's content ends at the brace that closes its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A stretch of a text, text[start:end]."""

    start: int
    end: int
    closed: bool = True
    """False for a box whose braces never close: its span runs to the end of the text."""


def boxed_spans(text: str, fbox: bool = True, spaced: bool = True, closed_only: bool = True) -> list[Span]:
    """The content of every box in `text`, in order of where the box starts (a box inside a box comes after it);
    with `closed_only`, the boxes whose braces close."""
    opener = re.compile((r"\\(?:boxed|fbox)" if fbox else r"\\boxed") + (r"\s*\{" if spaced else r"\{"))
    spans = []
    for match in opener.finditer(text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            spans.append(Span(match.end(), i - 1))
        elif not closed_only:
            spans.append(Span(match.end(), len(text), closed=False))
    return spans


def last_boxed(text: str, fbox: bool = False, strict: bool = False, strip: bool = False) -> str | None:
    """The content of the last complete box, or None when there is none (see the module docstring for the
    options; the defaults are the verifier's rule)."""
    spans = boxed_spans(text, fbox, spaced=False, closed_only=False)
    for span in reversed(spans[-1:] if strict else spans):
        if span.closed:
            content = text[span.start : span.end]
            return content.strip() if strip else content
    return None
