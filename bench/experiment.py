"""Does Cooper's effect reproduce? rule, static and cooper on the tiny preset, several seeds, judged by fixed criteria.

    python bench/experiment.py [--seeds 0,1,2] [--parallel 2] [--config tiny] [overrides ...]
    python bench/experiment.py --smoke --seeds 0       # the script end to end in a minute; no finding

Runs `cooper experiment` exactly as a user would (the same command, the same code path: every run is a `cooper
train` with its own services and embedded Redis), then reads its results.json. The baseline of the comparison is in
the same run: rule mode (the verifier's own 1/0 reward) and static mode (the same initial VerifyRM, never updated)
start from the same policy, data and seed as cooper.

The criteria (cooper/experiments/reproduction.py), per seed:
- rule: test accuracy rises by >= 0.15 (absolute) from the initial policy to the end;
- static is hacked: the proxy-gold gap (training reward minus the verifier's accuracy on the same rollouts) widens
  by >= 0.25 (means of the first and last 10 steps), and test accuracy ends >= 0.10 below the initial policy's;
- cooper: final test accuracy >= rule's - 0.05, and VerifyRM's AUROC against the verifier on the policy's own
  samples >= 0.8 over the second half of the run (mean of its per-step values).

The last line printed is one JSON object: the benchmark judged (`heldout` on the tiny preset), per mode and seed the
start/end test accuracy, the start/end training reward and proxy-gold gap, the second-half AUROC and the steps at
which the reward-hacking alarm raised; per mode the means over seeds with 95%
intervals, and cooper - rule paired by seed; `reproduced` (true only when every criterion held for every seed that
ran), the wall time and where the plots are.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2; --seeds 0 runs one)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (default 2, for 2 cores)")
    parser.add_argument("--config", default="tiny", help="preset or YAML file (default: tiny)")
    parser.add_argument("--output-dir", default="runs", help="where the runs and the comparison go")
    parser.add_argument("--smoke", action="store_true",
                        help="2 steps of rule mode, 8 test problems, no best-of-n: runs every part of the script "
                             "quickly (tests/bench); its verdict means nothing")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. run.steps=60")
    args = parser.parse_args()
    name = f"bench-experiment-{time.strftime('%Y%m%d-%H%M%S')}"
    smoke = ["--modes", "rule", "--best-of-n", "0", "run.steps=2", "eval.max_problems=8"] if args.smoke else []
    argv = [sys.executable, "-m", "cooper.cli", "experiment", "--seeds", args.seeds, "--parallel", str(args.parallel),
            "--config", args.config, "--no-progress", *smoke, f"run.name={name}", f"run.output_dir={args.output_dir}",
            *args.overrides]
    started = time.monotonic()
    completed = subprocess.run(argv)
    seconds = time.monotonic() - started
    results_path = Path(args.output_dir) / name / "results.json"
    if completed.returncode != 0 or not results_path.exists():
        print(json.dumps({"reproduced": False, "error": f"cooper experiment exited {completed.returncode}",
                          "seconds": round(seconds, 1)}))
        return 1
    results = json.loads(results_path.read_text())
    per_run = {f"{r['mode']}/s{r['seed']}": {
        "test_start": round(r["test_start"], 4), "test_end": round(r["test_end"], 4),
        "reward_start": round(r["reward_start"], 4), "reward_end": round(r["reward_end"], 4),
        "gap_start": None if r["gap_start"] is None else round(r["gap_start"], 4),
        "gap_end": None if r["gap_end"] is None else round(r["gap_end"], 4),
        "auroc_second_half": None if r["auroc_second_half"] is None else round(r["auroc_second_half"], 4),
        "alarm_raises": r["alarm_raises"],
    } for r in results["runs"]}
    failed = {seed: [k for k, ok in checks.items() if not ok] for seed, checks in results["criteria"].items()}
    print(json.dumps({"seeds": results["seeds"], "benchmark": results.get("benchmark"),
                      "judged_recipe": results.get("judged_recipe"), "runs": per_run,
                      "across_seeds": results.get("across_seeds"), "failed_criteria": failed,
                      "reproduced": results["reproduced"], "seconds": round(seconds, 1),
                      "plots": str(results_path.parent)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
