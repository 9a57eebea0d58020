"""The LLM judge of hybrid annotation: does a completion's final result agree with the reference?

The prompt asks about the final result only (equivalent forms agree; the reasoning is not graded), because
hybrid annotation keeps a triple only where the judge and the rule verifier agree, and the verifier judges final
answers only. The reply must end with `Final Judgment: Yes` or `Final Judgment: No`; the last such line decides.
A reply without one (a small model explains and stops, or writes "The final judgment is no.") is, unless the
caller turns it off, continued once, greedily, from a `Final Judgment:` line appended to it, and the few words the
model writes after that line decide. Anything still without a verdict ("Final Judgment: Maybe", "Final Judgment: The
solution") is UNKNOWN, and the annotator drops those triples.
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

VERDICT_OPENING = "Final Judgment:"
VERDICT_TOKENS = 4
"""Enough for " Yes" or " No" and decoration ("**", a full stop) in any tokenizer."""

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


def verdict_request(question: ChatRequest, reply: str) -> ChatRequest:
    """The judge's conversation with its reply as the assistant's turn, ending in an open `Final Judgment:` line
    for the model to go on from (greedy, a few tokens)."""
    opening = f"{reply.rstrip()}\n\n{VERDICT_OPENING}" if reply.strip() else VERDICT_OPENING
    return ChatRequest([*question.messages, {"role": "assistant", "content": opening}], 0.0, VERDICT_TOKENS)


async def judge(
    tasks: Sequence[JudgeTask], assistant: Assistant, temperature: float = 0.0, max_tokens: int = 1024,
    ask_verdict: bool = True,
) -> list[tuple[Judgment, str]]:
    """(verdict, raw reply) per task, in order. With `ask_verdict`, a reply without a verdict line is continued
    from one, and the raw reply is the whole of it: the first reply, the line and the model's words after it."""
    questions = [ChatRequest(judge_messages(t), temperature, max_tokens) for t in tasks]
    replies = await assistant.chat(questions)
    unanswered = [i for i, reply in enumerate(replies) if parse_judgment(reply) is Judgment.UNKNOWN]
    if ask_verdict and unanswered:
        follow_ups = [verdict_request(questions[i], replies[i]) for i in unanswered]
        endings = await assistant.chat(follow_ups)
        for i, follow_up, ending in zip(unanswered, follow_ups, endings, strict=True):
            replies[i] = follow_up.messages[-1]["content"] + ending
    return [(parse_judgment(r), r) for r in replies]
