"""The generator with `strategy=llm` and a vLLM assistant (vLLM's CPU build): real vLLM writes the rewrites and
the real verifier keeps the wrong ones, and a judge's reply cut before its verdict is continued from the verdict line.

A random tiny model writes no answer at all, so the assistant here is the tiny head_dim-32 Qwen2 (what vLLM's CPU
attention runs) trained in the test, for a few seconds, to answer the rewrite prompt of one question with one
wrong solution, and the judge prompt of one triple with a short reply and its verdict; greedy decoding then writes
them. Nothing else is staged: vLLM, the chat template, the generator's prompts and the verifier's checks are the
production ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cooper.config import ServerConfig
from cooper.services.generator.client import GeneratorClient, JudgeItem, Judgment, NegativeItem
from cooper.services.generator.judge import JudgeTask, judge_messages
from cooper.services.generator.negatives import rewrite_messages

pytestmark = pytest.mark.vllm

QUESTION = "What is 5 + 6?"
POSITIVE = "We compute 5 + 6 = 11. The answer is \\boxed{11}."
WRONG = "We compute 5 + 6 = 12. The answer is \\boxed{12}."
JUDGED = JudgeTask(QUESTION, "11", POSITIVE)
JUDGE_REPLY = "Both say 11."  # the reply is cut here (judge_max_tokens); the verdict line comes on the follow-up
VERDICT = "\n\nFinal Judgment: Yes"


def train_assistant(out: Path) -> tuple[Path, int]:
    """The tiny-hd32 causal LM fitted to answer the rewrite prompt of QUESTION with WRONG and the judge prompt of
    JUDGED with JUDGE_REPLY + VERDICT; saved to `out`, with the tokens of JUDGE_REPLY."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cooper.runtime.models import resolve_model

    path = resolve_model("tiny-hd32", "causal")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    batches = []
    for messages, answer in ((rewrite_messages(QUESTION, POSITIVE), WRONG),
                             (judge_messages(JUDGED), JUDGE_REPLY + VERDICT)):
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        target_ids = tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt_ids + target_ids])
        labels = ids.clone()
        labels[0, : len(prompt_ids)] = -100  # learn the answer, not the prompt
        batches.append((ids, labels))
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(300):
        losses = [model(input_ids=ids, labels=labels).loss for ids, labels in batches]
        loss = max(losses)
        optimizer.zero_grad()
        sum(losses).backward()
        optimizer.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.05, f"the assistant did not fit its answers (loss {loss.item():.3f})"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, len(tokenizer(JUDGE_REPLY, add_special_tokens=False)["input_ids"])


@pytest.mark.slow
def test_vllm_assistant_writes_verified_negatives_and_continues_a_verdict(cooper_serve, verifier_address, tmp_path):
    model_dir, reply_tokens = train_assistant(tmp_path / "assistant")
    info = cooper_serve(
        ["generator", "--port", "0", f"verifier.server.address={verifier_address}",
         "generator.server.metrics_port=null", "generator.strategy=llm", "generator.assistant.backend=vllm",
         f"generator.assistant.model={model_dir}", "generator.assistant.device=cpu",
         "generator.assistant.gpu_memory_utilization=0.1", "generator.temperature=0", "generator.extra_tokens=40",
         f"generator.judge_max_tokens={reply_tokens}"],
    )
    with GeneratorClient(f"127.0.0.1:{info['grpc_port']}", ServerConfig(deadline_s=120)) as client:
        results = client.negatives([NegativeItem(id=f"q{i}", question=QUESTION, reference="11", positive=POSITIVE)
                                    for i in range(3)])
        [verdict] = client.judge([JudgeItem(question=QUESTION, reference="11", completion=POSITIVE)])
    # Cut after JUDGE_REPLY, the reply was continued in the same turn from "Final Judgment:", where the model goes
    # on with " Yes"; a new turn would have begun the reply again ("Both say ...") and given no verdict.
    assert verdict.raw == JUDGE_REPLY + VERDICT and verdict.verdict == Judgment.Value("YES")
    assert [r.id for r in results] == ["q0", "q1", "q2"]
    for result in results:
        assert result.valid, (result.reason, result.negative)
        assert result.negative == WRONG and result.attempts == 1
