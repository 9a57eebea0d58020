"""Negatives end to end against the real verifier service: perturb, the tiny local LLM, an OpenAI-style endpoint."""

from __future__ import annotations

import asyncio

import pytest

from cooper.config import AssistantConfig
from cooper.services.generator.assistant import AssistantError, ChatRequest, OpenAIAssistant, TransformersAssistant
from cooper.services.generator.judge import JudgeTask, Judgment, judge, parse_judgment
from cooper.services.generator.negatives import (
    LLMStrategy,
    NegativeOutcome,
    NegativeTask,
    RuleStrategy,
    make_negatives,
    valid_rate,
)
from cooper.services.verifier.messages import Verdict
from cooper.tiny.examples import example_tasks


def assert_bookkeeping(outcomes: list[NegativeOutcome], tasks: list[NegativeTask], attempts: int) -> None:
    assert [o.id for o in outcomes] == [t.id for t in tasks]
    for o in outcomes:
        assert 1 <= o.attempts <= attempts
        assert o.attempts == len(o.rejections) + (1 if o.valid else 0)
        assert o.reason == (o.rejections[-1] if o.rejections else "")
        if o.valid:
            assert o.negative
        else:
            assert o.negative == "" and o.attempts == attempts


def recheck(verify_pairs, outcomes, tasks):  # type: ignore[no-untyped-def]
    """Independently verify every kept negative against its positive and its reference."""
    kept = [(o, t) for o, t in zip(outcomes, tasks, strict=True) if o.valid]
    pairs = [p for o, t in kept for p in ((o.negative, t.positive), (o.negative, t.reference))]
    checks = asyncio.run(verify_pairs(pairs))
    return [(checks[2 * k], checks[2 * k + 1]) for k in range(len(kept))]


def test_examples_are_correct_positives(verify_pairs):
    tasks = example_tasks()
    checks = asyncio.run(verify_pairs([(t.positive, t.reference) for t in tasks]))
    assert [c.verdict for c in checks] == [Verdict.CORRECT] * len(tasks)


def test_perturb_negatives_fail_verification_against_the_reference(verify_pairs):
    tasks = example_tasks()
    outcomes = asyncio.run(make_negatives(tasks, RuleStrategy(), verify_pairs, attempts=3))
    assert_bookkeeping(outcomes, tasks, 3)
    valid = [o for o in outcomes if o.valid]
    assert len(valid) >= 50 and valid_rate(outcomes) >= 0.95
    for style in ("boxed", "hashes", "answer-is", "hand"):
        assert sum(o.valid for o in outcomes if o.id.startswith(style)) >= 12, style
    for vs_positive, vs_reference in recheck(verify_pairs, outcomes, tasks):
        assert vs_positive.verdict == Verdict.INCORRECT and vs_reference.verdict == Verdict.INCORRECT
    print(f"perturb valid-negative rate: {valid_rate(outcomes):.3f} on {len(tasks)} solutions")


def test_a_positive_without_an_answer_gets_no_negative(verify_pairs):
    tasks = [NegativeTask("none", "What is 2 + 2?", "4", "I am not sure how to do this one.")]
    [outcome] = asyncio.run(make_negatives(tasks, RuleStrategy(), verify_pairs, attempts=2))
    assert not outcome.valid and outcome.attempts == 2
    assert all(r.startswith("empty: perturb found no final answer") for r in outcome.rejections)


class CountingAssistant:
    """The tiny model behind the real backend, recording the requests it served."""

    def __init__(self, inner: TransformersAssistant):
        self.inner = inner
        self.requests: list[ChatRequest] = []

    async def chat(self, requests):  # type: ignore[no-untyped-def]
        self.requests += list(requests)
        replies = await self.inner.chat(requests)
        assert len(replies) == len(requests)
        return replies

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture(scope="module")
def tiny_assistant():  # type: ignore[no-untyped-def]
    return TransformersAssistant(AssistantConfig(backend="transformers", model="tiny", device="cpu", concurrency=4))


def test_llm_strategy_with_the_tiny_model(tiny_assistant, verify_pairs):
    tasks = example_tasks(per_style=2)[:4]
    assistant = CountingAssistant(tiny_assistant)
    strategy = LLMStrategy(assistant, temperature=0.7, extra_tokens=16)
    outcomes = asyncio.run(make_negatives(tasks, strategy, verify_pairs, attempts=3))
    assert_bookkeeping(outcomes, tasks, 3)
    # One assistant call per attempt of each task, each with max tokens = the positive's words + extra.
    assert len(assistant.requests) == sum(o.attempts for o in outcomes)
    budgets = {len(t.positive.split()) + 16 for t in tasks}
    assert {r.max_tokens for r in assistant.requests} <= budgets
    assert all(r.temperature == 0.7 for r in assistant.requests)
    # The tiny model writes nonsense: every rejection is explained, and any kept text is verifiably wrong.
    codes = {r.split(":")[0] for o in outcomes for r in o.rejections}
    assert codes <= {"empty", "format", "no_answer", "same_as_positive", "same_as_reference"}, codes
    for vs_positive, vs_reference in recheck(verify_pairs, outcomes, tasks):
        assert vs_positive.verdict == Verdict.INCORRECT and vs_reference.verdict == Verdict.INCORRECT
    print(f"llm (tiny) valid-negative rate: {valid_rate(outcomes):.3f} on {len(tasks)} solutions")


def test_tiny_model_applies_the_chat_template_and_respects_max_tokens(tiny_assistant):
    tokenizer = tiny_assistant.tokenizer
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 3 + 4?"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt.startswith("<|im_start|>system\nbe brief<|im_end|>") and prompt.endswith("<|im_start|>assistant\n")
    replies = asyncio.run(tiny_assistant.chat([ChatRequest(messages, 0.0, 5), ChatRequest(messages, 0.0, 12)]))
    lengths = [len(tokenizer(r, add_special_tokens=False)["input_ids"]) for r in replies]
    assert lengths[0] <= 5 + 1 and lengths[1] <= 12 + 1  # +1: re-tokenizing decoded bytes may split a token
    greedy = asyncio.run(tiny_assistant.chat([ChatRequest(messages, 0.0, 12)]))
    assert greedy == [replies[1]]  # temperature 0 is greedy, hence reproducible


def test_tiny_model_answers_an_overlong_prompt_with_nothing_and_the_rest_normally(tiny_assistant):
    long = [{"role": "user", "content": "7 + 7 = 14. " * 2000}]  # far past the tiny model's 2048 positions
    short = [{"role": "user", "content": "What is 3 + 4?"}]
    replies = asyncio.run(tiny_assistant.chat([ChatRequest(long, 0.0, 4), ChatRequest(short, 0.0, 4)]))
    assert replies[0] == "" and replies[1] == asyncio.run(tiny_assistant.chat([ChatRequest(short, 0.0, 4)]))[0]


def test_judge_with_the_tiny_model(tiny_assistant):
    tasks = [JudgeTask("What is 3 + 4?", "7", "3 + 4 = 7. The answer is \\boxed{7}.")]
    [(verdict, raw)] = asyncio.run(judge(tasks, tiny_assistant, temperature=0.0, max_tokens=16))
    assert verdict is parse_judgment(raw) is Judgment.UNKNOWN  # nonsense holds no verdict line


def openai_config(base_url: str, **kw) -> AssistantConfig:  # type: ignore[no-untyped-def]
    return AssistantConfig(backend="openai", base_url=base_url, api_key="sk-test", model_name="judge-7b", **kw)


def test_openai_endpoint_negatives_bookkeeping(chat_server, verify_pairs):
    base_url, script = chat_server
    right = "We compute 6 * 7 = 42. The answer is \\boxed{42}."
    tasks = [
        NegativeTask("a", "[qa] What is 6 * 7?", "42", right),
        NegativeTask("b", "[qb] What is 6 * 7?", "42", right),
        NegativeTask("c", "[qc] What is 6 * 7?", "42", right),
    ]
    script.reset(
        replies={
            # a: unchanged, then no answer, then a real wrong one -> valid on attempt 3
            "[qa]": [right, "We compute six times seven, so \\boxed{}.", "We compute 6 * 7 = 48. The answer is \\boxed{48}."],
            # b: wrong at once, after one HTTP 503 that the client retries
            "[qb]": ["We compute 6 * 7 = 36. The answer is \\boxed{36}."],
            # c: an equivalent form of the right answer, a bare number, thoughts only -> no negative
            "[qc]": ["So 6 * 7 = 42.0, \\boxed{42.0}", "6 * 7 = 41", "<think>hmm</think>"],
        },
        fail_first={"[qb]"},
    )
    assistant = OpenAIAssistant(openai_config(base_url, retries=2))
    strategy = LLMStrategy(assistant, temperature=0.7, extra_tokens=500)
    outcomes = asyncio.run(make_negatives(tasks, strategy, verify_pairs, attempts=3))
    assert_bookkeeping(outcomes, tasks, 3)
    a, b, c = outcomes
    assert a.valid and a.attempts == 3 and a.negative.endswith("\\boxed{48}.")
    assert [r.split(":")[0] for r in a.rejections] == ["same_as_positive", "no_answer"]
    assert b.valid and b.attempts == 1 and b.reason == "" and b.rejections == []
    assert script.calls["[qb]"] == 2  # the 503, then the retry
    assert not c.valid and [r.split(":")[0] for r in c.rejections] == ["same_as_positive", "format", "empty"]
    body = script.requests[0]
    assert body["model"] == "judge-7b" and body["temperature"] == 0.7
    assert body["max_tokens"] == len(right.split()) + 500
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert all(h["authorization"] == "Bearer sk-test" for h in script.headers)


def test_openai_concurrency_is_bounded(chat_server):
    base_url, script = chat_server
    script.reset(delay_s=0.1)
    assistant = OpenAIAssistant(openai_config(base_url, concurrency=3))
    requests = [ChatRequest([{"role": "user", "content": f"q{i}"}], 0.0, 8) for i in range(12)]

    async def two_callers() -> list[list[str]]:
        return await asyncio.gather(assistant.chat(requests[:6]), assistant.chat(requests[6:]))

    replies = asyncio.run(two_callers())
    assert [len(r) for r in replies] == [6, 6] and len(script.requests) == 12
    assert script.max_in_flight == 3  # bounded across callers, and the bound is reached


def test_openai_judge_and_errors(chat_server):
    base_url, script = chat_server
    script.reset(replies={"[j1]": ["They match.\nFinal Judgment: Yes"], "[j2]": ["Final Judgment: No"],
                          "[j3]": ["I refuse."]})
    assistant = OpenAIAssistant(openai_config(base_url))
    tasks = [JudgeTask(f"[j{i}] What is 1/2?", "0.5", "\\boxed{\\frac{1}{2}}") for i in (1, 2, 3)]
    results = asyncio.run(judge(tasks, assistant, temperature=0.0, max_tokens=64))
    assert [v for v, _ in results] == [Judgment.YES, Judgment.NO, Judgment.UNKNOWN]
    assert results[0][1] == "They match.\nFinal Judgment: Yes"
    prompt = script.requests[0]["messages"][-1]["content"]
    assert "0.5" in prompt and "\\frac{1}{2}" in prompt and "Final Judgment: Yes" in prompt
    assert script.requests[0]["temperature"] == 0.0 and script.requests[0]["max_tokens"] == 64

    dead = OpenAIAssistant(openai_config("http://127.0.0.1:9/v1", retries=1))
    with pytest.raises(AssistantError, match="unreachable after 2 tries"):
        asyncio.run(dead.chat([ChatRequest([{"role": "user", "content": "hi"}], 0.0, 4)]))


@pytest.mark.gpu
def test_vllm_assistant_on_gpu():
    """Needs CUDA and the `gpu` extra (vLLM); cannot run on the CPU machines."""
    from cooper.services.generator.assistant import VLLMAssistant

    assistant = VLLMAssistant(AssistantConfig(backend="vllm", model="tiny", gpu_memory_utilization=0.2))
    requests = [ChatRequest([{"role": "user", "content": "What is 3 + 4?"}], 0.7, 8) for _ in range(4)]
    replies = asyncio.run(assistant.chat(requests))
    assert len(replies) == 4 and all(isinstance(r, str) for r in replies)
