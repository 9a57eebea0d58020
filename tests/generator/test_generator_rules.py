"""Pure core of the generator: perturbation, the rejection rule, judge parsing and its verdict follow-up, the
rewrite request."""

from __future__ import annotations

import asyncio

import pytest

from cooper.services.generator.assistant import ChatRequest
from cooper.services.generator.judge import (
    VERDICT_OPENING,
    VERDICT_TOKENS,
    JudgeTask,
    Judgment,
    judge,
    parse_judgment,
)
from cooper.services.generator.negatives import (
    REWRITE_SYSTEM_PROMPT,
    LLMStrategy,
    NegativeTask,
    clean_rewrite,
    format_reason,
    rejection_reason,
)
from cooper.services.generator.perturb import final_answer, perturb, wrong_number
from cooper.services.verifier.messages import Check, Verdict
from cooper.tiny.examples import example_tasks


def test_perturb_changes_the_answer_and_its_line_only():
    text = "Tom has 3 apples.\nWe compute 3 + 4 = 7. The answer is \\boxed{7}."
    out = perturb(text, 1, seed="a")
    assert out is not None and out != text
    head, line = out.split("\n")
    assert head == "Tom has 3 apples."  # the rest is kept
    new = line.split("\\boxed{")[1].split("}")[0]
    assert new != "7" and new.isdigit()
    assert line == f"We compute 3 + 4 = {new}. The answer is \\boxed{{{new}}}."


def test_perturb_gsm8k_changes_the_calculator_note_and_the_hashes():
    text = "Half is 48/2 = <<48/2=24>>24.\nTotal 48+24 = <<48+24=72>>72 clips.\n#### 72"
    out = perturb(text, 1, seed="x")
    assert out is not None
    new = out.rsplit("#### ", 1)[1]
    assert new != "72"
    assert out.splitlines()[0] == "Half is 48/2 = <<48/2=24>>24."
    assert out.splitlines()[1] == f"Total 48+24 = <<48+24={new}>>{new} clips."


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("So 1,200 + 34 = 1,234.\nThe answer is 1,234.", ","),  # thousands separators survive
        ("Each is 7.5 / 3 = 2.5 m.\nThe answer is 2.5.", "."),  # decimals keep their places
        ("$\\frac{1}{2} \\cdot \\frac{3}{4} = \\frac{3}{8}$.\nThe answer is $\\frac{3}{8}$.", "\\frac{3}{"),
    ],
)
def test_perturb_keeps_the_number_format(text, kept):
    out = perturb(text, 1, seed="s")
    assert out is not None and out != text
    assert kept in out.rsplit("answer is", 1)[1]


def test_attempts_give_different_wrong_values():
    text = "We compute 6 * 7 = 42. The answer is \\boxed{42}."
    values = {perturb(text, k, seed="q") for k in range(1, 6)}
    assert len(values) == 5 and text not in values
    assert perturb(text, 1, seed="q") == perturb(text, 1, seed="q")  # reproducible


def test_wrong_number_is_never_the_number_and_never_negative_for_small_ones():
    for number in ["0", "1", "2", "9", "10", "0.5", "1,000", "100"]:
        for attempt in range(1, 12):
            wrong = wrong_number(number, attempt, seed="z")
            assert wrong != number and not wrong.startswith("-")
            assert float(wrong.replace(",", "")) != float(number.replace(",", ""))


def test_final_answer_prefers_the_last_box_then_hashes_then_answer_is():
    assert final_answer("The answer is 5. \\boxed{6}") is not None
    text = "The answer is 5. \\boxed{\\frac{1}{2}} and more"
    span = final_answer(text)
    assert span is not None and text[span.start : span.end] == "\\frac{1}{2}"
    text = "The answer is 5.\n#### 6"
    span = final_answer(text)
    assert span is not None and text[span.start : span.end] == "6"
    text = "x = 3, so the answer is $-3$."
    span = final_answer(text)
    assert span is not None and text[span.start : span.end] == "-3"


def test_perturb_without_any_answer_gives_none():
    assert perturb("I do not know how to solve this.", 1) is None
    assert perturb("", 1) is None


def test_perturb_symbolic_answers():
    assert perturb("The area is \\boxed{\\pi}.", 1) == "The area is \\boxed{2\\pi}."
    assert perturb("Option B.\nThe answer is (B).", 1) == "Option B.\nThe answer is (C)."


def test_every_example_can_be_perturbed():
    tasks = example_tasks()
    assert len(tasks) >= 50
    styles = {t.id.split("-")[0] for t in tasks}
    assert {"boxed", "hashes", "answer"} <= styles
    for task in tasks:
        out = perturb(task.positive, 1, seed=task.id)
        assert out is not None and out != task.positive, task.id


@pytest.mark.parametrize(
    ("vs_positive", "vs_reference", "code"),
    [
        (Check(Verdict.INCORRECT, "8"), Check(Verdict.INCORRECT, "8"), None),
        (Check(Verdict.CORRECT, "7"), Check(Verdict.CORRECT, "7"), "same_as_positive"),
        (Check(Verdict.INCORRECT, "7.0"), Check(Verdict.CORRECT, "7.0"), "same_as_reference"),
        (Check(Verdict.NO_ANSWER), Check(Verdict.NO_ANSWER), "no_answer"),
        (Check(Verdict.TIMEOUT, detail="slow"), Check(Verdict.INCORRECT, "8"), "verifier_timeout"),
        (Check(Verdict.INCORRECT, "8"), Check(Verdict.ERROR, detail="bad reference"), "verifier_error"),
        (Check(Verdict.INCORRECT, "8"), Check(Verdict.TIMEOUT), "verifier_timeout"),
    ],
)
def test_rejection_rule(vs_positive, vs_reference, code):
    reason = rejection_reason(vs_positive, vs_reference)
    if code is None:
        assert reason is None
    else:
        assert reason is not None and reason.startswith(code)


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        ("The result matches.\nFinal Judgment: Yes", Judgment.YES),
        ("It differs.\nFinal Judgment: No", Judgment.NO),
        ("**Final Judgment:** Yes.", Judgment.YES),
        ("final judgement: no", Judgment.NO),
        ("Final Judgment: \\boxed{Yes}", Judgment.YES),
        ("Final Judgment: [No]", Judgment.NO),
        ("Final Judgment:Yes", Judgment.YES),
        ("Final Judgment: No\n...wait, I misread.\nFinal Judgment: Yes", Judgment.YES),  # the last one decides
        ("Final Judgment: Yes\nFinal Judgment: No", Judgment.NO),
        ("Yes, the answers agree.", Judgment.UNKNOWN),  # no verdict line
        ("Final Judgment: Maybe", Judgment.UNKNOWN),
        ("Final Judgment: Yesterday it was right", Judgment.UNKNOWN),
        ("Final Judgment: Not sure", Judgment.UNKNOWN),
        ("Final Judgment:", Judgment.UNKNOWN),  # cut off by max tokens
        ("", Judgment.UNKNOWN),
        ("The answer is yes. Final Answer: No", Judgment.UNKNOWN),
    ],
)
def test_judge_parsing(reply, verdict):
    assert parse_judgment(reply) is verdict


class ScriptedJudge:
    """An assistant that answers each request with the next reply of `script` for the first key found in its
    last message (the pure core's stand-in for the LLM; the real ones are tested in test_generator_server.py and
    test_pretrained.py), and keeps what it was asked."""

    def __init__(self, script: dict[str, list[str]]):
        self.script = script
        self.asked: list[list[ChatRequest]] = []

    async def chat(self, requests):  # type: ignore[no-untyped-def]
        self.asked.append(list(requests))
        return [self.script[next(k for k in self.script if k in r.messages[-1]["content"])].pop(0) for r in requests]

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("ask_verdict", [True, False])
def test_a_reply_without_a_verdict_is_continued_from_one(ask_verdict):
    assistant = ScriptedJudge({"[a]": ["Both say 12.\nFinal Judgment: Yes"], "[b]": ["The solution says 12 [b].", " No."],
                               "[c]": ["12 [c]", " Maybe"]})
    tasks = [JudgeTask(f"[{key}] What is 7 + 5?", "12", "12") for key in "abc"]
    verdicts = asyncio.run(judge(tasks, assistant, temperature=0.5, max_tokens=160, ask_verdict=ask_verdict))
    if not ask_verdict:
        assert [v for v, _ in verdicts] == [Judgment.YES, Judgment.UNKNOWN, Judgment.UNKNOWN]
        assert len(assistant.asked) == 1
        return
    assert [v for v, _ in verdicts] == [Judgment.YES, Judgment.NO, Judgment.UNKNOWN]
    assert verdicts[1][1] == f"The solution says 12 [b].\n\n{VERDICT_OPENING} No."
    first, follow_ups = assistant.asked
    assert len(follow_ups) == 2  # only the replies without a verdict are asked again
    for follow_up, question, reply in zip(follow_ups, first[1:], ["The solution says 12 [b].", "12 [c]"], strict=True):
        assert follow_up.messages[:-1] == question.messages
        assert follow_up.messages[-1] == {"role": "assistant", "content": f"{reply}\n\n{VERDICT_OPENING}"}
        assert (follow_up.temperature, follow_up.max_tokens) == (0.0, VERDICT_TOKENS)


def test_rewrite_request_follows_the_recipe():
    task = NegativeTask("1", "What is 3 + 4?", "7", "We compute 3 + 4 = 7. The answer is \\boxed{7}.")
    request = LLMStrategy(assistant=None, temperature=0.7, extra_tokens=500).request(task)  # type: ignore[arg-type]
    assert request.temperature == 0.7
    assert request.max_tokens == len(task.positive.split()) + 500 == 511
    system, user = request.messages
    assert system == {"role": "system", "content": REWRITE_SYSTEM_PROMPT}
    assert "wrong" in system["content"] and "length" in system["content"]
    assert user["role"] == "user" and task.question in user["content"] and task.positive in user["content"]


def test_clean_rewrite_drops_thoughts():
    assert clean_rewrite("<think>make 7 into 8</think>\n We compute 3 + 4 = 8.") == "We compute 3 + 4 = 8."
    assert clean_rewrite("<think>never finished") == ""
    assert clean_rewrite("  plain  ") == "plain"


@pytest.mark.parametrize(
    ("candidate", "positive", "ok"),
    [
        ("so \\boxed{8}", "so \\boxed{7}", True),
        ("so 8", "so \\boxed{7}", False),  # a stray last number is no answer statement
        ("x\n#### 8", "x\n#### 7", True),
        ("The answer is 8.", "x\n#### 7", False),
        ("\\boxed{8}", "The answer is 7.", True),  # a box is at least as explicit
        ("garbage 8", "7 apples", True),  # the positive states no answer either
    ],
)
def test_candidates_must_state_their_answer_like_the_positive(candidate, positive, ok):
    assert (format_reason(candidate, positive) is None) is ok
