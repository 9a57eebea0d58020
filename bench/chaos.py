"""Chaos: SIGKILL every part of a real tiny run at seeded random moments; the run must end as if nothing happened.

Per seed and recipe, one uninterrupted run, then the same run (same `run.seed`) with `--kills` SIGKILLs, each at a
seeded step plus a seeded delay of 0-2 s (at most the uninterrupted run's seconds per step): every service the run has
(verifier, policy, reward, and the generator in the paper's recipe), the `cooper train` CLI and its embedded Redis,
each at least once (tests/orchestrator/chaos.py). Stage workers are threads of the CLI, so the CLI's kill is theirs
too. A kill that ends the CLI (the CLI itself; Redis, which stops the run with RunFailed) is followed by `cooper train
--resume`. Two recipes: the tiny preset's variant (`rollouts`: negatives from the policy's own rejected rollouts, so
no generator runs) and the paper's (`generator`: the generator writes every negative), where one more kill SIGKILLs
the generator inside a `negatives` job. Evaluations run every `--eval-every` steps, and one more kill lands inside one
(the policy, the verifier or the CLI, seeded). A kill meant to land inside a job is counted only if that job was
running when it was sent and still was just after it (and, for the generator, the job then waited for the restarted
generator). Invariants, all checked on every run:

- every kill landed (`kills_not_landed` 0: a kill that never came, or missed its job, is a failure);
- every step logged exactly once, in order (the raw metrics.jsonl lines, not the de-duplicated reading);
- prompts in data order (`data_offset` = batch_size * step), the policy version rising by exactly one per step and
  the VerifyRM version by one per applied update, each scoring step t on the version step t-1 left;
- the same records as the uninterrupted run, evaluations included: exact for the prompts, data position,
  versions, pairs and the verifier's and generator's ratios (chaos.EXACT); every other number (rewards, losses, KL,
  pair accuracies, test accuracies) within a relative 1e-4. Measured: those are exactly equal too (`max_rel_diff`
  printed per run is 0.0); the tolerance only keeps the check off float summation order, which nothing promises;
- the same final checkpoints as the uninterrupted run, bit for bit: the newest policy and VerifyRM checkpoints:
  their names (version, update count), every weight, the optimizer state and the bookkeeping (last key, recorded
  results; all but `saved_at`) (`checkpoints_identical`, with `checkpoint_values_compared`);
- nothing left behind: no process of the run, nothing in its TMPDIR and no service's TMPDIR (the pymp-* directory
  a SIGKILLed service's multiprocessing leaves) after the last exit.

Reported per run: kills landed, kills survived (the run logged another step after it), resumes, steps redone
(steps with a job run again: re-queued on resume or retried after a failed attempt, from the orchestrator's log),
seconds lost per kill ((wall time with kills - wall time without) / kills), evaluations. The last line printed is one
JSON object: {"seeds", "recipes", "kills", "kills_survived", "kills_not_landed", "generator_kills_in_negatives",
"evaluations", "steps_redone", "checkpoints_identical", "checkpoint_values_compared", "seconds_lost_per_kill",
"invariants_held", ...}.

    python bench/chaos.py                      # 40 steps, 6 kills (+2), seeds 0,1,2, both recipes
    python bench/chaos.py --seeds 0 --steps 12 --kills 6 --recipes generator
    python bench/chaos.py --max-staleness 1    # rollouts one step ahead of training (run.max_staleness)
    python bench/chaos.py --max-staleness 1 --reward-max-staleness 1   # and VerifyRM's update beside the policy's
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

from chaos import RECIPES, STUCK_S, ChaosRun, check, run_with_kills, schedule, uninterrupted  # noqa: E402


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes comma-separated integers, e.g. 0,1,2; got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed")
    return seeds


def parse_recipes(text: str) -> list[str]:
    recipes = [r.strip() for r in text.split(",") if r.strip()]
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown or not recipes:
        raise argparse.ArgumentTypeError(f"--recipes takes a comma-separated list of {', '.join(RECIPES)}; "
                                         f"got {text!r}")
    return recipes


def run_one(base: Path, seed: int, recipe: str, args: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    """The uninterrupted run and the run with kills of one seed and recipe, checked; its JSON record."""
    tmp = base / f"{recipe}-seed-{seed}"
    tmp.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    kills = schedule(seed, args.steps, args.kills, recipe=recipe, eval_every=args.eval_every)
    calm_s = 0.0
    try:
        print(f"{recipe} seed {seed}: uninterrupted run of {args.steps} steps", flush=True)
        reference, calm_s = uninterrupted(tmp, seed, args.steps, recipe, args.eval_every, args.stuck_after,
                                          args.max_staleness, args.reward_max_staleness)
        print(f"{recipe} seed {seed}: {calm_s:.0f} s; now with kills " + ", ".join(k.describe() for k in kills),
              flush=True)
        chaos = run_with_kills(tmp, seed, args.steps, kills, say=lambda m: print(f"{recipe} {m}", flush=True),
                               recipe=recipe, eval_every=args.eval_every, stuck_s=args.stuck_after,
                               max_staleness=args.max_staleness, step_s=calm_s / args.steps,
                               reward_max_staleness=args.reward_max_staleness)
        check(chaos, tmp / f"chaos-{seed}", reference, reference_dir=tmp / f"calm-{seed}")
    except AssertionError as err:  # a run got stuck or died: an invariant failed; the whole report goes to stderr
        print(f"{recipe} seed {seed}: aborted: {err}", file=sys.stderr, flush=True)
        chaos = ChaosRun(seed, args.steps, kills, recipe, args.max_staleness, args.reward_max_staleness,
                         violations=[f"aborted: {str(err)[:3000]}"])
    landed = chaos.landed
    return {
        "seed": seed, "recipe": recipe, "kills": len(landed), "kills_by_target": [k.target for k in landed],
        "kills_inside": [k.inside for k in landed if k.inside],
        "kills_not_landed": [k.describe() for k in chaos.not_landed],
        "generator_kills_in_negatives": chaos.generator_kills_in_negatives, "evaluations": chaos.evaluations,
        "kills_survived": chaos.survived, "resumes": chaos.resumes, "steps_redone": len(chaos.steps_redone),
        "redone": chaos.steps_redone,
        "seconds_lost_per_kill": round((chaos.wall_s - calm_s) / max(1, len(landed)), 1),
        "seconds_to_next_step": [round(k.seconds_to_next_step, 1) if k.seconds_to_next_step is not None else None
                                 for k in landed],
        "wall_s": round(chaos.wall_s, 1), "uninterrupted_s": round(calm_s, 1),
        "run_total_s": round(time.monotonic() - started, 1),
        "max_rel_diff": {k: v for k, v in chaos.max_rel_diff.items() if v} or 0.0,
        "checkpoint_values_compared": chaos.checkpoint_values_compared,
        "checkpoints_identical": chaos.checkpoint_values_compared > 0 and not chaos.checkpoint_differences,
        "invariants_held": not chaos.violations, "violations": chaos.violations[:10],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=parse_seeds, default=[0, 1, 2], help="comma-separated (default 0,1,2)")
    parser.add_argument("--recipes", type=parse_recipes, default=list(RECIPES),
                        help=f"comma-separated, of {', '.join(RECIPES)} (default both)")
    parser.add_argument("--steps", type=int, default=40, help="steps per run (default 40)")
    parser.add_argument("--kills", type=int, default=6,
                        help="SIGKILLs per run at seeded moments (default 6: each target once), besides the one "
                             "inside an evaluation and, in the paper's recipe, the generator's inside negatives")
    parser.add_argument("--eval-every", type=int, default=10, help="evaluate every N steps (default 10; 0: never)")
    parser.add_argument("--max-staleness", type=int, default=0, metavar="K",
                        help="run.max_staleness of every run (default 0: synchronous; 1: rollouts one step ahead)")
    parser.add_argument("--reward-max-staleness", type=int, default=0, metavar="K",
                        help="run.reward_max_staleness of every run (default 0: VerifyRM's update before the next "
                             "score; 1: beside the policy's update)")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (default: a temp directory)")
    parser.add_argument("--stuck-after", type=float, default=STUCK_S, metavar="S",
                        help=f"a run that logs no step for S seconds is stuck: it is stopped and the error shows "
                             f"where each process was (default {STUCK_S:.0f})")
    args = parser.parse_args()
    try:
        for seed in args.seeds:
            for recipe in args.recipes:
                schedule(seed, args.steps, args.kills, recipe=recipe, eval_every=args.eval_every)
    except ValueError as err:
        parser.error(str(err))

    runs = []
    with tempfile.TemporaryDirectory(prefix="cooper-chaos-") as scratch:
        base = args.keep or Path(scratch)
        for seed in args.seeds:
            for recipe in args.recipes:
                runs.append(run_one(base, seed, recipe, args))
                print(json.dumps(runs[-1]), flush=True)
    summary = {
        "seeds": args.seeds, "recipes": args.recipes, "steps": args.steps, "max_staleness": args.max_staleness,
        "reward_max_staleness": args.reward_max_staleness,
        "kills": sum(r["kills"] for r in runs),
        "kills_survived": sum(r["kills_survived"] for r in runs),
        "kills_not_landed": sum(len(r["kills_not_landed"]) for r in runs),
        "generator_kills_in_negatives": sum(r["generator_kills_in_negatives"] for r in runs),
        "evaluations": sum(r["evaluations"] for r in runs),
        "steps_redone": sum(r["steps_redone"] for r in runs),
        "checkpoint_values_compared": sum(r["checkpoint_values_compared"] for r in runs),
        "checkpoints_identical": all(r["checkpoints_identical"] for r in runs),
        "seconds_lost_per_kill": round(statistics.fmean(r["seconds_lost_per_kill"] for r in runs), 1),
        "invariants_held": all(r["invariants_held"] for r in runs),
    }
    print(json.dumps(summary))
    return 0 if summary["invariants_held"] else 1


if __name__ == "__main__":
    sys.exit(main())
