"""What one policy checkpoint costs: seconds and bytes of `save_checkpoint`, for the tiny model and a
Qwen2.5-0.5B-shaped one, against the seconds of one training step of the tiny preset.

    python bench/checkpoint.py [--repeats 3] [--skip-large] [--dir DIR]

The models are random, built from a config (no hub): the tiny preset's policy, and a Qwen2 with Qwen2.5-0.5B's shape
(24 layers, hidden 896, 14 heads, 2 KV heads, intermediate 4864, vocabulary 151,936; 494M parameters). Each is
saved the way the policy service saves it: float32 weights as safetensors, the tokenizer, and the AdamW state
(two float32 moments per parameter, after one real optimizer step). The baseline in the same run is the tiny
preset's training step (one GRPO update of 8 prompts x 4 samples on the tiny policy), which local runs follow with
a checkpoint every time. Medians of --repeats saves; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from cooper.services.policy.checkpoint import save_checkpoint
from cooper.tiny.models import tiny_tokenizer_dir

QWEN_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(model: Any, tokenizer: Any, root: Path, repeats: int) -> dict[str, float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # the moments exist, as after any update
    state = {"optimizer": optimizer.state_dict(), "updates": 1}
    seconds, size = [], 0
    for version in range(1, repeats + 1):
        started = time.perf_counter()
        path = save_checkpoint(root, model, tokenizer, state, {"version": version}, keep=1)
        seconds.append(time.perf_counter() - started)
        size = size_of(path)
    shutil.rmtree(root, ignore_errors=True)
    return {"parameters": sum(p.numel() for p in model.parameters()), "seconds": statistics.median(seconds),
            "bytes": size}


def tiny_step_seconds(repeats: int) -> float:
    """One GRPO update of the tiny preset's shape (8 prompts x 4 samples, 40 new tokens) on the tiny policy."""
    from cooper.config import PolicyConfig
    from cooper.services.policy.core import PolicyCore
    from cooper.services.policy.engine import SamplingParams
    from cooper.services.policy.trainer import RolloutSample
    from cooper.tiny.task import make_split

    with tempfile.TemporaryDirectory() as tmp:
        core = PolicyCore(PolicyConfig.model_validate({
            "model": "tiny", "device": "cpu", "torch_threads": 1, "checkpoint_dir": tmp,
            "optim": {"lr": 1e-4, "micro_batch_size": 32}, "server": {"metrics_port": None}}))
        prompts = [p.question for p in make_split(8, 0, "bench")]
        times = []
        for step in range(repeats):
            groups, _ = core.generate(prompts, SamplingParams(n=4, max_new_tokens=40, seed=step))
            samples = [RolloutSample(c.prompt_token_ids, c.token_ids) for g in groups for c in g]
            rewards = [float(i % 2) for i in range(len(samples))]
            started = time.perf_counter()
            core.train(f"bench/{step}", samples, rewards, 4)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-large", action="store_true", help="only the tiny model")
    parser.add_argument("--dir", help="where to write (default: a temp directory)")
    args = parser.parse_args()
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir())
    base = Path(args.dir or tempfile.mkdtemp(prefix="cooper-ckpt-bench-"))
    results: dict[str, Any] = {}
    from cooper.tiny.models import resolve_model

    tiny = Qwen2ForCausalLM.from_pretrained(resolve_model("tiny", "causal"))
    results["tiny"] = measure(tiny, tokenizer, base / "tiny", args.repeats)
    step = tiny_step_seconds(args.repeats)
    results["tiny"]["share_of_step"] = results["tiny"]["seconds"] / (results["tiny"]["seconds"] + step)
    print(f"tiny: {results['tiny']}", flush=True)
    if not args.skip_large:
        torch.manual_seed(0)
        large = Qwen2ForCausalLM(Qwen2Config(**QWEN_05B))
        results["qwen2.5-0.5b-shaped"] = measure(large, tokenizer, base / "large", args.repeats)
        print(f"0.5B-shaped: {results['qwen2.5-0.5b-shaped']}", flush=True)
    shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"bench": "checkpoint", "repeats": args.repeats, "tiny_step_seconds": step, **results}))


if __name__ == "__main__":
    main()
