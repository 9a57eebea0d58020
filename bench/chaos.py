"""Chaos: SIGKILL every part of a real tiny run at seeded random moments; the run must end as if nothing happened.

Per seed: one uninterrupted run, then the same run (same `run.seed`) with `--kills` SIGKILLs, each at a seeded step
plus a seeded delay of 0-2 s: every service (verifier, policy, reward, generator), the `cooper train` CLI and its
embedded Redis, each at least once (tests/orchestrator/chaos.py). Stage workers are threads of the CLI, so the
CLI's kill is theirs too. A kill that ends the CLI (the CLI itself; Redis, which stops the run with RunFailed) is
followed by `cooper train --resume`. Invariants, all checked on every run:

- every step logged exactly once, in order (the raw metrics.jsonl lines, not the de-duplicated reading);
- prompts in data order (`data_offset` = batch_size * step), the policy version and the VerifyRM version rising by
  exactly one per step (every reward update applied once);
- the same records as the uninterrupted run: exact for the prompts, data position, versions, pairs and the
  verifier's and generator's ratios (chaos.EXACT); every other number (rewards, losses, KL, pair accuracies)
  within a relative 1e-4. Measured: those are exactly equal too (`max_rel_diff` printed per seed is 0.0); the
  tolerance only keeps the check off float summation order, which nothing promises;
- nothing left behind: no process of the run and nothing in its TMPDIR after the last exit, but for one known
  gap, reported as `left_in_tmp` and not counted: a SIGKILLed service leaves the temp directory of Python's
  multiprocessing (pymp-*), which only a normal exit removes.

Reported per seed: kills landed, kills survived (the run logged another step after it), resumes, steps redone
(steps with a job run again: re-queued on resume or retried after a failed attempt, from the orchestrator's log),
seconds lost per kill ((wall time with kills - wall time without) / kills). The last line printed is one JSON
object: {"seeds", "kills", "kills_survived", "steps_redone", "seconds_lost_per_kill", "invariants_held", ...}.

    python bench/chaos.py                      # 40 steps, 6 kills, seeds 0,1,2
    python bench/chaos.py --seeds 0 --steps 12 --kills 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "orchestrator"))
sys.path.insert(0, str(ROOT))

from chaos import check, run_with_kills, schedule, uninterrupted  # noqa: E402


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers, e.g. 0,1,2; got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed")
    return seeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=parse_seeds, default=[0, 1, 2], help="comma-separated (default 0,1,2)")
    parser.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    parser.add_argument("--kills", type=int, default=6, help="SIGKILLs per run (default 6: each target once)")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (default: a temp directory)")
    args = parser.parse_args()
    try:
        for seed in args.seeds:
            schedule(seed, args.steps, args.kills)
    except ValueError as err:
        parser.error(str(err))

    per_seed = []
    with tempfile.TemporaryDirectory(prefix="cooper-chaos-") as scratch:
        base = args.keep or Path(scratch)
        for seed in args.seeds:
            tmp = base / f"seed-{seed}"
            tmp.mkdir(parents=True, exist_ok=True)
            started = time.monotonic()
            print(f"seed {seed}: uninterrupted run of {args.steps} steps", flush=True)
            reference, calm_s = uninterrupted(tmp, seed, args.steps)
            kills = schedule(seed, args.steps, args.kills)
            print(f"seed {seed}: {calm_s:.0f} s; now with kills " +
                  ", ".join(f"{k.target}@{k.after_step}+{k.delay_s}s" for k in kills), flush=True)
            try:
                chaos = run_with_kills(tmp, seed, args.steps, kills, say=lambda m: print(m, flush=True))
                check(chaos, tmp / f"chaos-{seed}", reference)
            except AssertionError as err:  # the run got stuck or died: an invariant failed
                from chaos import ChaosRun

                chaos = ChaosRun(seed, args.steps, kills, violations=[f"aborted: {str(err)[:3000]}"])
            landed = chaos.landed
            result = {
                "seed": seed, "kills": len(landed), "kills_by_target": [k.target for k in landed],
                "kills_survived": chaos.survived, "resumes": chaos.resumes, "steps_redone": len(chaos.steps_redone),
                "redone": chaos.steps_redone,
                "seconds_lost_per_kill": round((chaos.wall_s - calm_s) / max(1, len(landed)), 1),
                "seconds_to_next_step": [round(k.seconds_to_next_step, 1) if k.seconds_to_next_step is not None
                                         else None for k in landed],
                "wall_s": round(chaos.wall_s, 1), "uninterrupted_s": round(calm_s, 1),
                "seed_total_s": round(time.monotonic() - started, 1),
                "max_rel_diff": {k: v for k, v in chaos.max_rel_diff.items() if v} or 0.0,
                "left_in_tmp": chaos.left_in_tmp, "invariants_held": not chaos.violations, "violations": chaos.violations[:10],
            }
            per_seed.append(result)
            print(json.dumps(result), flush=True)
    summary = {
        "seeds": args.seeds, "steps": args.steps,
        "kills": sum(r["kills"] for r in per_seed),
        "kills_survived": sum(r["kills_survived"] for r in per_seed),
        "steps_redone": sum(r["steps_redone"] for r in per_seed),
        "seconds_lost_per_kill": round(statistics.fmean(r["seconds_lost_per_kill"] for r in per_seed), 1),
        "invariants_held": all(r["invariants_held"] for r in per_seed),
    }
    print(json.dumps(summary))
    return 0 if summary["invariants_held"] else 1


if __name__ == "__main__":
    sys.exit(main())
