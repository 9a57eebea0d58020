"""Rollout engines: vLLM (its CPU build here) against transformers `generate`, same model, prompts and lengths.

    python bench/rollout.py [--model small] [--prompts 16] [--n 8] [--max-new-tokens 64] [--rounds 7]

Needs the vLLM environment (README's third line). Both engines are the policy service's own (`VLLMEngine`,
`TransformersEngine`), in this process, on the same weights (float32), fed the same GRPO-shaped request: `--prompts`
tiny-task prompts x `--n` samples at temperature 1, top_p 1, at most `--max-new-tokens` each, a new seed every
round. Rounds alternate which engine goes first, so drift in machine load hits both alike; one warm-up request each
is not counted. The figure is generated tokens per second (the tokens each engine actually sampled: a completion
that ends early counts only its tokens). The last line is one JSON object: medians, and vLLM's speed over
transformers' (`ratio`).

`--model small` (4 layers, 256 wide, head_dim 32, ~4M parameters) by default: the tiny models are so small that
either engine measures only its Python overhead. vLLM's CPU attention needs head_dim >= 32, so "tiny" is out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from cooper.config import DataConfig, PolicyConfig
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.engine import SamplingParams
from cooper.services.policy.vllm_engine import VLLMEngine
from cooper.tiny.task import make_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="small, tiny-hd32, tiny-sft-hd32 or a model directory")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--memory-fraction", type=float, default=0.1,
                        help="vLLM's gpu_memory_utilization: on a CPU, the share of RAM for its KV cache")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cfg = PolicyConfig.model_validate({
            "model": args.model, "device": "cpu", "dtype": "float32", "checkpoint_dir": str(Path(tmp) / "ckpt"),
            "generate_batch_size": args.prompts * args.n, "vllm_gpu_memory_utilization": args.memory_fraction,
            "grpo": {"kl_coef": 0.0, "track_kl": False}, "server": {"metrics_port": None},
        })
        core = PolicyCore(cfg)  # the transformers engine, and the weights both engines sample from
        engines = {"transformers": core.engine,
                   "vllm": VLLMEngine(core.model, core.tokenizer, core.initial_path, cfg)}
        template = DataConfig().prompt_template
        prompts = [template.replace("{question}", p.question) for p in make_split(args.prompts, 5, "bench")]

        def run(name: str, seed: int) -> float:
            sampling = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=seed)
            started = time.perf_counter()
            groups = engines[name].generate(prompts, sampling)
            seconds = time.perf_counter() - started
            return sum(len(c.token_ids) for g in groups for c in g) / seconds

        for name in engines:
            run(name, 10_000)  # warm-up: first-call allocations and caches
        rates: dict[str, list[float]] = {name: [] for name in engines}
        for round_ in range(args.rounds):
            order = list(engines) if round_ % 2 == 0 else list(reversed(engines))
            for name in order:
                rates[name].append(run(name, round_))
            print(f"round {round_}: " + ", ".join(f"{n} {rates[n][-1]:,.0f} tok/s" for n in engines), flush=True)

    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(json.dumps({
        "bench": "rollout", "model": args.model, "prompts": args.prompts, "n": args.n,
        "max_new_tokens": args.max_new_tokens, "rounds": args.rounds, "torch_threads": torch.get_num_threads(),
        "tokens_per_s": {name: round(value, 1) for name, value in medians.items()},
        "ratio": round(medians["vllm"] / medians["transformers"], 3),
    }))


if __name__ == "__main__":
    main()
