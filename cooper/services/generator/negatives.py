"""Verified hard negatives: propose a wrong rewrite of a positive, keep it only when the verifier proves it wrong.

A round proposes one candidate for every item still without a negative (one batched assistant call), verifies all
candidates of the round in one verifier call, and retries the rest, up to `attempts` rounds. A candidate that is
empty, or that does not state its final answer the way the positive does (`\\boxed{}`, `####`, "The answer is"),
is rejected before the verifier sees it: it would be no plausible negative, whatever number it ends with.

A candidate is kept only when BOTH checks come back INCORRECT, i.e. an answer was extracted and it differs:
- against the positive (the positive as the reference): CORRECT means the same answer as the positive;
- against the reference: CORRECT means it is right after all (the positive may be right in another form).
NO_ANSWER rejects it: a negative with no extractable answer teaches the reward model only to punish missing
answers, which the rule verifier already does; it is no hard negative. TIMEOUT and ERROR reject it too: they leave
open whether the answer differs, and a "negative" that is in fact correct poisons the reward model's pairs, while
a missing pair only costs one pair.

Left out: deduplication of candidates across attempts (the assistant samples at temperature 0.7, and perturb picks
a different wrong value per attempt, so repeats are rare and a repeat is rejected the same way anyway).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from cooper.services.generator.assistant import Assistant, ChatRequest
from cooper.services.generator.perturb import answer_style, perturb
from cooper.services.generator.varied import varied
from cooper.services.verifier.messages import Check, Verdict

REWRITE_SYSTEM_PROMPT = (
    "You write wrong solutions to math problems, for training a model that must tell right solutions from wrong "
    "ones. You are given a problem and its correct solution. Rewrite the solution so that its reasoning contains a "
    "plausible mistake (a miscalculation, a wrong formula, a misread quantity, or a flawed step) and, because of "
    "it, reaches a different, wrong final answer. Keep the style, the format and about the length of the original, "
    "and state the final answer the same way it does (for example inside \\boxed{}). The result must look like a "
    "genuine attempt: do not mention or hint that it is wrong, do not point out the mistake, add no commentary. "
    "Reply with the rewritten solution only."
)


def rewrite_messages(question: str, positive: str) -> list[dict[str, str]]:
    """The chat that asks the assistant for a wrong version of `positive`."""
    user = f"Problem:\n{question}\n\nCorrect solution:\n{positive}\n\nWrite the wrong solution."
    return [{"role": "system", "content": REWRITE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


@dataclass(frozen=True)
class NegativeTask:
    id: str
    question: str
    reference: str
    positive: str


@dataclass
class NegativeOutcome:
    """Invariant: attempts == len(rejections) + (1 if valid else 0); negative is empty unless valid."""

    id: str
    negative: str = ""
    attempts: int = 0
    valid: bool = False
    reason: str = ""
    """The last rejection; empty when the first candidate was kept."""
    rejections: list[str] = field(default_factory=list)
    """One reason per rejected candidate, in order."""


VerifyPairs = Callable[[list[tuple[str, str]]], Awaitable[list[Check]]]
"""Checks (completion, reference) pairs with the verifier; results in the same order."""


@dataclass(frozen=True)
class Candidate:
    text: str
    why_empty: str = ""
    """Why no text was proposed, when text is empty."""


class Strategy(Protocol):
    """Proposes one candidate negative per task; `attempt` counts from 1."""

    async def propose(self, tasks: Sequence[NegativeTask], attempt: int) -> list[Candidate]: ...


RuleName = Literal["perturb", "varied"]

REWRITES: dict[RuleName, Callable[[str, int, str], str | None]] = {"perturb": perturb, "varied": varied}
"""The strategies that need no model (generator.strategy), each a rewrite of the positive: `perturb` changes its
final answer (perturb.py); `varied` writes the kinds of wrong solutions an assistant writes (varied.py). The one
other strategy, `llm`, needs the assistant."""

RULE_STRATEGIES: tuple[RuleName, ...] = tuple(REWRITES)


def rule_name(strategy: str) -> RuleName | None:
    """`strategy` as a rule strategy's name; None for one that needs a model."""
    return next((name for name in REWRITES if name == strategy), None)


class RuleStrategy:
    """Rule-based, no model: one of REWRITES."""

    def __init__(self, name: RuleName = "perturb"):
        self.name = name
        self.rewrite = REWRITES[name]

    async def propose(self, tasks: Sequence[NegativeTask], attempt: int) -> list[Candidate]:
        out = []
        for task in tasks:
            text = self.rewrite(task.positive, attempt, task.id)
            out.append(Candidate(text) if text else Candidate("", f"{self.name} found no final answer in the positive"))
        return out


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def clean_rewrite(text: str) -> str:
    """The assistant's answer without reasoning-model thoughts and surrounding whitespace."""
    text = _THINK.sub("", text)
    if "<think>" in text:  # thoughts cut off by max tokens: there is no solution after them
        return ""
    return text.strip()


class LLMStrategy:
    """The assistant rewrites the positive at `temperature`, with max tokens = the positive's words + extra_tokens."""

    def __init__(self, assistant: Assistant, temperature: float = 0.7, extra_tokens: int = 500):
        self.assistant = assistant
        self.temperature = temperature
        self.extra_tokens = extra_tokens

    def request(self, task: NegativeTask) -> ChatRequest:
        max_tokens = len(task.positive.split()) + self.extra_tokens
        return ChatRequest(rewrite_messages(task.question, task.positive), self.temperature, max(1, max_tokens))

    async def propose(self, tasks: Sequence[NegativeTask], attempt: int) -> list[Candidate]:
        replies = await self.assistant.chat([self.request(t) for t in tasks])
        return [Candidate(clean_rewrite(r), "the assistant wrote nothing") for r in replies]


_STYLE_MARKERS = {"boxed": "\\boxed{}", "hashes": "`#### x`", "answer is": "\"The answer is x\""}


def format_reason(candidate: str, positive: str) -> str | None:
    """None when the candidate states its final answer the way the positive does (a box also does for "answer
    is"); else why not. Without this, any text ending in a stray number would pass as a negative: the verifier
    extracts a last number when there is no answer statement, and it would differ from the positive's."""
    style = answer_style(positive)
    if style is None:
        return None
    found = answer_style(candidate)
    if found == style or (style == "answer is" and found == "boxed"):
        return None
    return f"format: the positive states its answer with {_STYLE_MARKERS[style]}, the candidate does not"


def rejection_reason(vs_positive: Check, vs_reference: Check) -> str | None:
    """None when the candidate is a valid negative; else why not (a short code, then details)."""
    for name, check in (("positive", vs_positive), ("reference", vs_reference)):
        if check.verdict == Verdict.NO_ANSWER:
            return "no_answer: the verifier found no final answer"
        if check.verdict == Verdict.CORRECT:
            return f"same_as_{name}: its answer {check.extracted!r} equals the {name}'s"
        if check.verdict in (Verdict.TIMEOUT, Verdict.ERROR):
            detail = f": {check.detail}" if check.detail else ""
            return f"verifier_{Verdict(check.verdict).name.lower()} against the {name}{detail}"
        if check.verdict != Verdict.INCORRECT:
            return f"verifier_error against the {name}: unexpected verdict {check.verdict}"
    return None


def _precheck(candidate: Candidate, positive: str) -> str | None:
    if not candidate.text:
        return f"empty: {candidate.why_empty or 'no candidate text'}"
    return format_reason(candidate.text, positive)


async def make_negatives(
    tasks: Sequence[NegativeTask], strategy: Strategy, verify: VerifyPairs, attempts: int = 3
) -> list[NegativeOutcome]:
    """One outcome per task, in order: a verified negative within `attempts` candidates, or why there is none."""
    outcomes = [NegativeOutcome(t.id) for t in tasks]
    pending = list(range(len(tasks)))
    for attempt in range(1, attempts + 1):
        if not pending:
            break
        candidates = await strategy.propose([tasks[i] for i in pending], attempt)
        if len(candidates) != len(pending):
            raise RuntimeError(f"strategy returned {len(candidates)} candidates for {len(pending)} tasks")
        early = {i: _precheck(c, tasks[i].positive) for i, c in zip(pending, candidates, strict=True)}
        to_check = [(i, c.text) for i, c in zip(pending, candidates, strict=True) if early[i] is None]
        pairs = [pair for i, text in to_check for pair in ((text, tasks[i].positive), (text, tasks[i].reference))]
        checks = await verify(pairs) if pairs else []
        verdicts = {i: (checks[2 * k], checks[2 * k + 1]) for k, (i, _) in enumerate(to_check)}
        still = []
        for i, candidate in zip(pending, candidates, strict=True):
            outcome = outcomes[i]
            outcome.attempts = attempt
            reason = early[i] if early[i] is not None else rejection_reason(*verdicts[i])
            if reason is None:
                outcome.valid, outcome.negative = True, candidate.text
            else:
                outcome.rejections.append(reason)
                outcome.reason = reason
                still.append(i)
        pending = still
    return outcomes


def valid_rate(outcomes: Sequence[NegativeOutcome]) -> float:
    """Share of tasks that got a verified negative."""
    return sum(o.valid for o in outcomes) / len(outcomes) if outcomes else 0.0
