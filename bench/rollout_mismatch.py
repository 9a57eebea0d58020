"""How far the vLLM engine that samples is from the trainer, per step of a real tiny run, and what truncated
importance sampling does about it.

    python bench/rollout_mismatch.py [--steps 200] [--out runs/rollout-mismatch]

Needs the vLLM environment (README's third line). Four `cooper train` runs of the tiny task in rule mode (the
verifier's reward: no reward model in the way), the same seed and settings, on `tiny-sft-hd32` (the tiny preset's
SFT warm start on the head_dim-32 model that vLLM's CPU attention runs):
- transformers, float32: the baseline engine;
- vLLM, float32: the same arithmetic as the trainer, so the mismatch is rounding;
- vLLM, bfloat16 (`policy.dtype=bfloat16`: vLLM's weights in bf16, the trainer's forward under bf16 autocast with
  float32 weights), the setting of every GPU run;
- the same with truncated importance sampling, `policy.grpo.rollout_is_cap=2`.
Each step logs `policy/rollout/logprob_abs_diff` (mean |log pi_old - log pi_rollout| over the rollout's tokens) and
`policy/rollout/kl` (k3 estimate of KL(pi_rollout || pi_old)). Writes `mismatch.png` (mismatch and training reward
per step, test accuracy) to --out; the last line is one JSON object with each run's medians and test accuracies.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from cooper.metric_names import POLICY, REWARD_MEAN, STEP, TEST, TEST_INITIAL

RUNS = {
    "transformers fp32": [],
    "vLLM fp32": ["policy.engine=vllm"],
    "vLLM bf16": ["policy.engine=vllm", "policy.dtype=bfloat16"],
    "vLLM bf16 + TIS (C=2)": ["policy.engine=vllm", "policy.dtype=bfloat16", "policy.grpo.rollout_is_cap=2"],
}


def moving_average(values: list[float], width: int) -> list[float]:
    return [statistics.fmean(values[max(0, i - width + 1) : i + 1]) for i in range(len(values))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/rollout-mismatch")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    common = ["--no-progress", "run.mode=rule", f"run.steps={args.steps}", f"run.seed={args.seed}",
              "policy.model=tiny-sft-hd32", "policy.vllm_gpu_memory_utilization=0.1", f"run.output_dir={out}"]
    records, seconds = {}, {}
    for index, (label, overrides) in enumerate(RUNS.items()):
        name = f"run{index}"
        started = time.monotonic()
        print(f"{label}: cooper train {' '.join(overrides)}", flush=True)
        subprocess.run([sys.executable, "-m", "cooper.cli", "--log-level", "WARNING", "train", *common,
                        f"run.name={name}", *overrides], check=True)
        seconds[label] = round(time.monotonic() - started, 1)
        records[label] = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (diff_ax, reward_ax, test_ax) = plt.subplots(1, 3, figsize=(16, 4.5))
    summary = {}
    for label, recs in records.items():
        steps = [r[STEP] for r in recs]
        diffs = [r[POLICY + "rollout/logprob_abs_diff"] for r in recs]
        line, = diff_ax.plot(steps, diffs, label=label, linewidth=1)
        rewards = [r[REWARD_MEAN] for r in recs]
        reward_ax.plot(steps, rewards, color=line.get_color(), alpha=0.15, linewidth=0.8)
        reward_ax.plot(steps, moving_average(rewards, 20), color=line.get_color(), label=label)
        heldout = TEST + "heldout"
        tests = [(-1, recs[0][TEST_INITIAL + "heldout"])] + [(r[STEP], r[heldout]) for r in recs if heldout in r]
        test_ax.plot([s + 1 for s, _ in tests], [t for _, t in tests], marker="o", color=line.get_color(), label=label)
        summary[label] = {
            "logprob_abs_diff_median": statistics.median(diffs),
            "kl_median": statistics.median(r[POLICY + "rollout/kl"] for r in recs),
            "is_weight_mean": statistics.fmean(r[POLICY + "rollout/is_weight_mean"] for r in recs)
            if POLICY + "rollout/is_weight_mean" in recs[0] else None,
            "test_start": tests[0][1], "test_end": tests[-1][1],
            "reward_first_20": statistics.fmean(rewards[:20]), "reward_last_20": statistics.fmean(rewards[-20:]),
            "seconds": seconds[label],
        }
    diff_ax.set(yscale="log", xlabel="step", ylabel="mean |log pi_old - log pi_rollout| (nats)",
                title="rollout engine vs trainer, per token")
    reward_ax.set(xlabel="step", ylabel="training reward (verifier)", title="reward (moving average of 20)")
    test_ax.set(xlabel="updates", ylabel="test accuracy (256 problems x 2)", title="test accuracy")
    for ax in (diff_ax, reward_ax, test_ax):
        ax.grid(alpha=0.3)
    diff_ax.legend(fontsize=8)
    fig.suptitle(f"tiny-sft-hd32, rule mode, seed {args.seed}: vLLM's CPU build vs transformers")
    fig.tight_layout()
    fig.savefig(out / "mismatch.png", dpi=110)
    print(json.dumps({"bench": "rollout_mismatch", "steps": args.steps, "seed": args.seed, "runs": summary,
                      "figure": str(out / "mismatch.png")}))


if __name__ == "__main__":
    main()
