"""The transformers rollout engine on the tiny model: seeds, templates, stop strings, log-probs."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from cooper.services.policy.engine import SamplingParams, encode_prompt, finish_completion
from cooper.services.policy.grpo import token_logprobs
from cooper.services.policy.hf_engine import TransformersEngine

PROMPTS = ["Tom has 3 apples and gets 2 more.", "Ivy has 12 pens."]


@pytest.fixture(scope="module")
def model(tiny_path: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(model: Any, tokenizer: Any) -> TransformersEngine:
    return TransformersEngine(model, tokenizer, batch_size=5)  # 5 < 2 x 4 rows: exercises chunking


def _ids(groups: list) -> list[list[list[int]]]:
    return [[c.token_ids for c in group] for group in groups]


def test_same_seed_same_completions_other_seed_other(engine: TransformersEngine) -> None:
    sampling = SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=7)
    first = engine.generate(PROMPTS, sampling)
    again = engine.generate(PROMPTS, sampling)
    assert [len(g) for g in first] == [4, 4]
    assert _ids(first) == _ids(again)
    assert [[c.logprobs for c in g] for g in first] == [[c.logprobs for c in g] for g in again]
    other = engine.generate(PROMPTS, SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=8))
    assert _ids(other) != _ids(first)
    # Within a group the n samples differ (they are not n copies of one draw).
    assert len({tuple(ids) for ids in _ids(first)[0]}) > 1


def test_greedy_samples_are_identical(engine: TransformersEngine) -> None:
    groups = engine.generate(PROMPTS[:1], SamplingParams(n=3, temperature=0.0, max_new_tokens=6, seed=1))
    assert len({tuple(c.token_ids) for c in groups[0]}) == 1


def test_sampling_logprobs_match_a_teacher_forced_forward(engine: TransformersEngine, model: Any) -> None:
    temperature = 0.7
    groups = engine.generate(PROMPTS, SamplingParams(n=2, temperature=temperature, top_p=0.9, max_new_tokens=10))
    for completion in (c for g in groups for c in g):
        assert len(completion.logprobs) == len(completion.token_ids) > 0
        ids = torch.tensor([completion.prompt_token_ids + completion.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[:, len(completion.prompt_token_ids) - 1 : -1]
        # Documented: log softmax(logits / temperature), before the top-p cut.
        expected = token_logprobs(logits, torch.tensor([completion.token_ids]), temperature)[0]
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)


def test_chat_template_when_present_plain_prompt_otherwise(engine: TransformersEngine, tokenizer: Any,
                                                           model: Any) -> None:
    text = PROMPTS[0]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>assistant\n")
    templated = engine.generate([text], SamplingParams(n=1, max_new_tokens=2))[0][0]
    assert templated.prompt_token_ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]

    plain_tokenizer = copy.deepcopy(tokenizer)
    plain_tokenizer.chat_template = None
    assert encode_prompt(plain_tokenizer, text) == tokenizer(text)["input_ids"]
    with pytest.raises(ValueError, match="empty"):
        encode_prompt(plain_tokenizer, "")
    plain = TransformersEngine(model, plain_tokenizer).generate([text], SamplingParams(n=1, max_new_tokens=2))
    assert plain[0][0].prompt_token_ids == tokenizer(text)["input_ids"]


def test_length_finish_and_stop_strings(engine: TransformersEngine, tokenizer: Any) -> None:
    groups = engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=6, seed=3))
    for c in (c for g in groups for c in g):
        assert c.finish_reason in ("stop", "length")
        if c.finish_reason == "length":
            assert len(c.token_ids) == 6

    stop = "e"  # frequent in the tiny vocabulary, so most completions hit it
    groups = engine.generate(PROMPTS, SamplingParams(n=4, max_new_tokens=40, stop=(stop,), seed=3))
    stopped = [c for g in groups for c in g if stop in c.text]
    assert stopped, "no completion produced the stop string; pick another one"
    for c in stopped:
        assert c.finish_reason == "stop"
        assert c.text.index(stop) == len(c.text) - len(stop)  # the first occurrence ends the text
        # The last token completes the stop string; without it there is none.
        assert stop not in tokenizer.decode(c.token_ids[:-1], skip_special_tokens=True)
        assert stop in tokenizer.decode(c.token_ids, skip_special_tokens=True)
        assert len(c.logprobs) == len(c.token_ids)


def test_eos_is_kept_in_tokens_but_not_in_text(tokenizer: Any) -> None:
    hello = tokenizer("We compute", add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    raw = [*hello, eos, tokenizer.pad_token_id, tokenizer.pad_token_id]
    c = finish_completion(tokenizer, raw, [-0.5] * len(raw), [eos], (), [1, 2])
    assert c.token_ids == [*hello, eos] and c.logprobs == [-0.5] * (len(hello) + 1)
    assert c.text == "We compute" and c.finish_reason == "stop" and c.prompt_token_ids == [1, 2]
    capped = finish_completion(tokenizer, hello, [0.0] * len(hello), [eos], (), [1])
    assert capped.finish_reason == "length" and capped.token_ids == hello


def test_sampling_params_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="n must"):
        SamplingParams(n=0)
