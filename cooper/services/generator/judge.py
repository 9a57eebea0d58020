"""The LLM judge of hybrid annotation: does a completion's final result agree with the reference?

The prompt asks about the final result only (equivalent forms agree; the reasoning is not graded), because
hybrid annotation keeps a triple only where the judge and the rule verifier agree, and the verifier judges final
answers only. The reply must end with `Final Judgment: Yes` or `Final Judgment: No`; the last such line decides.
Anything else (no verdict line, "Final Judgment: Maybe", a reply cut off by max tokens) is UNKNOWN, and the
annotator drops those triples.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from cooper.services.generator.assistant import Assistant, ChatRequest
from cooper.services.generator.messages import Judgment

JUDGE_PROMPT = """You check whether a solution's final result agrees with a reference answer.

Question:
{question}

Reference answer:
{reference}

Solution:
{completion}

Look only at the final result of the solution and decide whether it agrees with the reference answer. \
Equivalent forms agree (for example 0.5 and 1/2, 50% and 0.5, x = 3 and 3, or a simplified and an unsimplified \
expression of the same value). Do not grade the reasoning, the steps or the presentation. If the solution states \
no final result, it does not agree.
Explain briefly, then end your reply with exactly one line: `Final Judgment: Yes` or `Final Judgment: No`."""

# Lenient about decoration models add ("**Final Judgment:** Yes.", "final judgement: \boxed{no}"), strict about
# the word: "Yesterday" or "Not sure" is no verdict.
_VERDICT = re.compile(
    r"final\s+judge?ment\s*[:：]?[\s*_`]*(?:\\boxed\s*\{\s*|\\text\s*\{\s*|\[\s*)*(yes|no)(?![a-z])",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class JudgeTask:
    question: str
    reference: str
    completion: str


def judge_messages(task: JudgeTask) -> list[dict[str, str]]:
    prompt = JUDGE_PROMPT.format(question=task.question, reference=task.reference, completion=task.completion)
    return [{"role": "user", "content": prompt}]


def parse_judgment(reply: str) -> Judgment:
    """The last `Final Judgment: Yes|No` in the reply; UNKNOWN when there is none."""
    matches = _VERDICT.findall(reply)
    if not matches:
        return Judgment.UNKNOWN
    return Judgment.YES if matches[-1].lower() == "yes" else Judgment.NO


async def judge(
    tasks: Sequence[JudgeTask], assistant: Assistant, temperature: float = 0.0, max_tokens: int = 1024
) -> list[tuple[Judgment, str]]:
    """(verdict, raw reply) per task, in order."""
    replies = await assistant.chat([ChatRequest(judge_messages(t), temperature, max_tokens) for t in tasks])
    return [(parse_judgment(r), r) for r in replies]
