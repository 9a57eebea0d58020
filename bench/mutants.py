"""Mutations of Cooper's core promises, each made in a scratch copy of the checkout and run against the tests that
should catch it: a mutant the tests miss is a hole (docs/development.md, "What the tests are checked against").

    python bench/mutants.py                       # every mutant: minutes each on 2 cores, so run by hand, not in CI
    python bench/mutants.py --only batch-target-floor,is-weights-dropped
    python bench/mutants.py --list

Each mutant replaces one exact piece of code (it must occur exactly once, so the table cannot go stale silently)
and names the tests that must fail. The scratch copy is the checkout's tracked files as they are now (`git ls-files`,
uncommitted edits included), with the model cache shared; the named tests must pass on it unmutated first. Prints a line per mutant, then one JSON object: per mutant
whether the tests caught it, and the count of survivors; exits 1 if any survived.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str


README_TEST = "tests/test_docs.py::test_every_figure_readme_quotes_is_in_the_section_it_comes_from"
MUTANTS = [
    Mutant("readme-install-seconds", "README.md", "installing took 52 s", "installing took 47 s", (README_TEST,),
           "a README figure changed to one no doc section holds"),
    Mutant("readme-first-command-seconds", "README.md", "directory, 230 s", "directory, 317 s", (README_TEST,),
           "a README figure changed to one no doc section holds"),
    Mutant("readme-staleness-ratio", "README.md", "takes 0.57x the", "takes 0.61x the", (README_TEST,),
           "a README ratio changed (its section says 0.567x)"),
    Mutant("readme-serving-ratio", "README.md", "it served 0.93x its", "it served 0.81x its", (README_TEST,),
           "a README ratio changed (its section says 0.93x)"),
    Mutant("batch-target-floor", "cooper/services/reward/batcher.py",
           "math.ceil(self._queued_items / self._slot_count)", "math.floor(self._queued_items / self._slot_count)",
           ("tests/reward/test_service.py::test_spreading_cuts_batches_over_the_slots_instead_of_waiting_to_fill_one",),
           "spreading's share of the outstanding items rounded down"),
    Mutant("batch-choice-largest", "cooper/services/reward/serving_defaults.py",
           "size = min(s for s, rate in rates.items() if rate >= GOOD_ENOUGH * best)", "size = max(rates)",
           ("tests/reward/test_serving_defaults.py::test_the_choice_is_what_the_timings_imply",
            "tests/reward/test_serving_defaults.py::test_the_batch_is_the_smallest_within_a_tenth_of_the_best_rate"),
           "the calibration takes the largest batch timed"),
    Mutant("snapshot-shares-live-tensors", "cooper/runtime/checkpoint.py",
           'copies[key] = node.detach().to("cpu", copy=True)', "copies[key] = node.detach()",
           ("tests/policy/test_policy_journal.py::test_a_background_save_writes_the_state_it_was_started_from",
            "tests/reward/test_reward_journal.py::test_a_background_save_writes_the_state_it_was_started_from"),
           "a background checkpoint write reads weights training changes in place"),
    Mutant("is-weights-dropped", "cooper/services/policy/trainer.py",
           "                              token_is_weights(old, batch, self.settings))",
           "                              None)",
           ("tests/policy/test_rollouts_ahead.py::"
            "test_a_rollout_behind_the_trainer_is_trained_with_truncated_importance_weights",),
           "the truncated importance weights left out of the loss (still reported)"),
    Mutant("exploit-check-per-prompt-share", "cooper/evaluation/exploit_check.py",
           "        return sum(math.log1p(stake * (accepted - self.bound * wrong)) for accepted, wrong in groups if wrong)",
           "        p1 = self.bound + 0.15\n"
           "        return sum(accepted / wrong * math.log(p1 * (1 - self.bound) / (self.bound * (1 - p1)))\n"
           "                   + math.log((1 - p1) / (1 - self.bound)) for accepted, wrong in groups if wrong)",
           ("tests/evaluation/test_alarm_exploit_check.py::"
            "test_false_alarms_at_the_bound_stay_within_the_promise_however_a_prompts_rollouts_go_together",),
           "the absolute check back to one trial per prompt, its share accepted as the outcome"),
    Mutant("annotate-judge-always", "cooper/cli.py", "with_judge=not args.without_judge", "with_judge=True",
           ("tests/generator/test_annotation.py::test_without_a_judge_every_triple_the_verifier_labels_is_kept",),
           "cooper annotate --without-judge still starting and asking the judge"),
    Mutant("shipped-hashes-unchecked", "cooper/tiny/models.py",
           "    for file in sorted(expected.keys() | present):", "    for file in []:",
           ("tests/test_tiny_models.py::test_a_shipped_file_that_differs_from_its_manifest_is_an_error_naming_it",),
           "a shipped model's files loaded without their manifest's hashes"),
    Mutant("policy-protocol-without-save", "cooper/orchestrator/services.py",
           "    def save(self, tag: str = ...) -> SavedCheckpoint: ...\n    def restore(",
           "    def restore(",
           ("tests/test_types.py::test_the_seams_type_check_and_a_planted_error_fails",),
           "the policy's protocol without the save the run calls (the seam it was missing before)"),
    Mutant("results-deleted-one-step-early", "cooper/orchestrator/graph.py",
           "        return max(self.max_staleness, self.reward_staleness) + 1\n",
           "        return max(self.max_staleness, self.reward_staleness)\n",
           ("tests/orchestrator/test_graph_and_queue.py::test_no_job_reads_a_result_the_driver_has_deleted",),
           "the driver deleting a logged step's results while a rollout ahead of training may still read them"),
    Mutant("critical-path-earliest-dependency", "cooper/orchestrator/run.py",
           "        stage = max(before, key=lambda s: timed[s].finished_at)",
           "        stage = min(before, key=lambda s: timed[s].finished_at)",
           ("tests/orchestrator/test_critical_path.py",),
           "the critical path following the dependency that ended first, not the one the job waited for"),
    Mutant("critical-path-queue-uncounted", "cooper/orchestrator/run.py",
           "        queued += max(0.0, started - timed[stage].finished_at)", "        queued += 0.0",
           ("tests/orchestrator/test_critical_path.py",),
           "time/critical/queue always 0: the gaps between jobs on the chain not counted"),
    Mutant("learn-online-pairs-across-questions", "cooper/services/reward/learner.py",
           "pairs_within_groups([((i.question, i.reference), i, v)", "pairs_within_groups([(i.reference, i, v)",
           ("tests/reward/test_learn_online.py",),
           "the learning mode pairing a right answer with a wrong one to another question that has the same reference"),
    Mutant("learn-online-every-requests-ignored", "cooper/services/reward/learner.py",
           "        if every and self._requests % every == 0:", "        if False:",
           ("tests/reward/test_learn_online.py",),
           "reward.learn_online.every_requests never starting a learning step"),
    Mutant("trl-reward-never-learns", "cooper/integrations/trl.py",
           "        if self.learn:\n", "        if False:\n",
           ("tests/test_trl_integration.py",),
           "the TRL reward function scoring without asking for the learning step at TRL's step boundary"),
    Mutant("trl-mixed-versions-accepted", "cooper/integrations/trl.py",
           "        if len(versions) > 1:", "        if False:",
           ("tests/test_trl_integration.py",),
           "one TRL batch scored by two VerifyRM versions without an error"),
    Mutant("wandb-resume-resends-nothing", "cooper/orchestrator/trackers.py",
           "        return [step for step in steps if step >= self.run.starting_step]", "        return []",
           ("tests/orchestrator/test_trackers.py::"
            "test_wandb_and_mlflow_hold_every_step_of_metrics_jsonl_across_a_kill_and_resume",),
           "a resumed W&B run not resending the steps a kill cut off from its log"),
]


def scratch_copy(into: Path) -> Path:
    """The checkout's tracked files, as they are in the working tree, under `into`."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        source, target = ROOT / name, into / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


def apply(mutant: Mutant, tree: Path) -> None:
    path = tree / mutant.file
    text = path.read_text()
    if text.count(mutant.old) != 1:
        raise SystemExit(f"{mutant.name}: the code it replaces occurs {text.count(mutant.old)} times in "
                         f"{mutant.file}, not once: update bench/mutants.py")
    path.write_text(text.replace(mutant.old, mutant.new))


def run_tests(mutant: Mutant, tree: Path, timeout_s: float) -> tuple[int, float, str]:
    """(pytest's exit code, seconds, its summary line): a mutant is caught when the named tests fail (exit 1)."""
    # PYTEST_ADDOPTS is the caller's (CI runs its suite with -n 2): with xdist, -x ends a failing run as
    # interrupted (exit 2), not failed (exit 1), and a caught mutant would read as a survivor. PYTEST_XDIST_* say
    # the caller is an xdist worker, which this pytest is not (plugins read them: pytest-benchmark warns).
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST_")}
    env.update(PYTHONPATH=str(tree), PYTEST_ADDOPTS="",
               COOPER_CACHE=os.environ.get("COOPER_CACHE", str(ROOT / ".pytest_cache" / "cooper")))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *mutant.tests],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=timeout_s)
    # pytest's summary is stdout's last line; stderr may end with a plugin's warning (pytest-benchmark warns there
    # where it is installed), so it is the tail only when stdout is empty.
    tail = (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:] or [""]
    return done.returncode, round(time.monotonic() - started, 1), tail[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated mutant names (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutants and the tests that must catch them")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds for one mutant's tests")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"no mutant named {', '.join(sorted(unknown))}; --list names them")
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.what} ({m.file}) -> {', '.join(m.tests)}")
        return 0
    # The named tests first pass on an unmutated copy: a mutant "caught" by tests that fail anyway proves nothing.
    union = Mutant("unmutated", "", "", "", tuple(dict.fromkeys(t for m in chosen for t in m.tests)), "")
    with tempfile.TemporaryDirectory(prefix="cooper-mutant-") as scratch:
        code, seconds, tail = run_tests(union, scratch_copy(Path(scratch)), args.timeout)
    if code != 0:
        raise SystemExit(f"the tests fail without a mutant (pytest exit {code}: {tail}): fix them first")
    print(f"unmutated: the {len(union.tests)} tests pass in {seconds} s", flush=True)
    results = {}
    for mutant in chosen:
        with tempfile.TemporaryDirectory(prefix="cooper-mutant-") as scratch:
            tree = scratch_copy(Path(scratch))
            apply(mutant, tree)
            code, seconds, tail = run_tests(mutant, tree, args.timeout)
            caught = code == 1
        results[mutant.name] = {"caught": caught, "seconds": seconds}
        print(f"{mutant.name}: {'caught' if caught else 'SURVIVED'} in {seconds} s ({tail})", flush=True)
    survived = [name for name, r in results.items() if not r["caught"]]
    print(json.dumps({"mutants": results, "survived": survived}))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
