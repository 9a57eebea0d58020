"""Scoring passes of a VerifyRM with its linear layers run by torch's own kernel (MKL on x86 builds) and by oneDNN's
(reward.cpu_linear), paired: which wins on this CPU, and by how much.

    python bench/linear_kernel.py [--models tiny-hd32,smollm2-135m-instruct] [--batch 16] [--rounds 5]

For each model (any name reward.model takes, or a model directory): the bench's own items (bench/reward_http.py's,
tokenized with the model's tokenizer), one forward pass of --batch of them at a time in the order they come, as a
server's batches run, at --threads torch threads. Each round times --passes passes with torch's kernel, then the same
passes with oneDNN's (the order alternating from round to round); the ratio of the two times is taken per round, and
its median over rounds is reported with its range. Also: what `VerifyRM.choose_linear_kernel` (the service's start-up
choice) picks here, and the largest logit difference between the kernels. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from cooper.config import OptimConfig
from cooper.runtime.models import resolve_model
from cooper.services.reward.items import ScoreItem
from cooper.services.reward.serving_defaults import CALIBRATION_TOKENS
from cooper.services.reward.verify_rm import VerifyRM
from cooper.tiny.ship import cpu_name

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench.reward_http's items


def measure(model: str, batch: int, passes: int, rounds: int) -> dict:
    from bench.reward_http import make_items

    rm = VerifyRM.load(str(resolve_model(model, "reward")), OptimConfig(), device="cpu", dtype="float32")
    tokens = rm.encode([ScoreItem(**item) for item in make_items(batch * passes)])
    batches = [tokens[start : start + batch] for start in range(0, len(tokens), batch)]

    def timed(kernel: str) -> tuple[float, list[float]]:
        rm.use_linear_kernel(kernel)
        start = time.perf_counter()
        logits = [x for rows in batches for x in rm.logits(rows, batch)]
        return time.perf_counter() - start, logits

    timed("torch"), timed("onednn")  # warm-up, not counted
    seconds: dict[str, list[float]] = {"torch": [], "onednn": []}
    largest_difference = 0.0
    for round_ in range(rounds):
        readings = {}
        for kernel in ("torch", "onednn") if round_ % 2 == 0 else ("onednn", "torch"):
            seconds_taken, readings[kernel] = timed(kernel)
            seconds[kernel].append(seconds_taken)
        largest_difference = max(largest_difference, *(abs(a - b) for a, b in
                                                        zip(readings["torch"], readings["onednn"], strict=True)))
    speedups = [t / o for t, o in zip(seconds["torch"], seconds["onednn"], strict=True)]
    items = batch * len(batches)
    chosen, why = rm.choose_linear_kernel(CALIBRATION_TOKENS)
    return {"items_per_s": {kernel: round(items / statistics.median(s), 2) for kernel, s in seconds.items()},
            "onednn_speedup": round(statistics.median(speedups), 3),
            "onednn_speedup_range": [round(min(speedups), 3), round(max(speedups), 3)],
            "max_logit_difference": largest_difference, "chosen_at_start_up": chosen, "why": why}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny-hd32,smollm2-135m-instruct",
                        help="comma-separated: names reward.model takes, or model directories")
    parser.add_argument("--batch", type=int, default=16, help="items in one forward pass")
    parser.add_argument("--passes", type=int, default=4, help="forward passes timed per kernel and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the reward bench's default)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    for model in args.models.split(","):
        results[model] = measure(model, args.batch, args.passes, args.rounds)
        print(f"linear_kernel: {model}: {json.dumps(results[model])}", flush=True)
    print(json.dumps({"bench": "linear_kernel", "cpu": cpu_name(), "torch": torch.__version__, "threads": args.threads,
                      "batch": args.batch, "passes": args.passes, "rounds": args.rounds, "models": results}))


if __name__ == "__main__":
    main()
