"""The exact prompt a policy receives: the paper's instruction, single braces (DESIGN.md section 1)."""

from pathlib import Path

import pytest

from cooper.config import load_config
from cooper.orchestrator.data import Example, prompt_text

ROOT = Path(__file__).resolve().parents[2]
PAPER = "What is 2 + 3?\nPlease reason step by step, and put your final answer within \\boxed{}."


@pytest.mark.parametrize("preset", ["tiny.yaml", "qwen2.5-1.5b-cooper.yaml"])
def test_prompt_is_the_papers_exact_text(preset):
    config = load_config(ROOT / "configs" / preset, [], environ={})
    assert prompt_text(config, Example("x", "What is 2 + 3?", "5")) == PAPER


def test_prompt_keeps_braces_in_the_question():
    config = load_config(None, [], environ={})
    text = prompt_text(config, Example("x", "Let f(x) = {1, 2}. Find \\frac{1}{2}.", "1"))
    assert text.startswith("Let f(x) = {1, 2}. Find \\frac{1}{2}.\n") and text.endswith("within \\boxed{}.")


def test_tiny_policy_sees_the_prompt_in_its_chat_template():
    from transformers import AutoTokenizer

    from cooper.services.policy.engine import encode_prompt
    from cooper.tiny.models import tiny_tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir())
    rendered = tokenizer.decode(encode_prompt(tokenizer, PAPER))
    assert rendered == f"<|im_start|>user\n{PAPER}<|im_end|>\n<|im_start|>assistant\n"
