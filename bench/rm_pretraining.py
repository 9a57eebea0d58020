"""How well the tiny VerifyRM's pretraining ranks the tiny policy's own samples, by budget and by kind of negative.

    python bench/rm_pretraining.py [--problems 1500,3000] [--negatives last,carried,mixed] [--epochs 15]
                                   [--prompts 192] [--k 8]

The samples: `--prompts` training prompts x `--k` completions of the SFT warm start (`tiny-sft`) at T = 1, labelled
right or wrong by their boxed answer against the reference (the verifier's `answer: boxed` rule). For each budget
and kind of negative, a fresh tiny VerifyRM is pretrained exactly as the preset's builder does
(`warm_start.pretrained_rm`: a right and a wrong worked solution per problem, some answer-less texts, --epochs at
RM_LR), then scores every sample. Kinds of negative (`warm_start.NEGATIVE_KINDS`):
- last: `wrong_solution`, the final number changed, which also breaks the last equation;
- carried: an error at a random step carried through every later step, so the solution is consistent and only a
  comparison with the reference rejects it (what the policy's own mistakes look like);
- mixed: either, evenly (the preset's builder, since v8).
The baseline in the same run is chance (AUROC 0.5) and the samples' own accuracy (best-of-1). The last line is one
JSON object: per (kind, budget) the AUROC, the best-of-k verifier accuracy, and the seconds of pretraining.

    python bench/rm_pretraining.py --model tiny-rm-keyed

scores the same samples with a reward model already built (any name `reward.model` takes) instead of pretraining
fresh ones, and adds its mean score per answer form (bare: "The answer is ..." alone; worked: the work shown) and
right or wrong: what a frozen RM pays the initial policy for each behaviour, so the training reward a static run
starts from (the share of bare answers times the bare mean, plus the rest times the worked mean; why no reward
model meets every criterion at once: docs/experiments.md, 2026-11-27).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from cooper.services.reward.items import ScoreItem
from cooper.tiny import quality, warm_start
from cooper.tiny.quality import Sample, auroc


def policy_samples(prompts: int, k: int) -> list[Sample]:
    return quality.policy_samples(warm_start.tiny_sft_policy_dir(), prompts, k)


def score_existing(name: str, samples: list[Sample]) -> dict[str, object]:
    from cooper.runtime.models import resolve_model

    measured = quality.reward_model_quality(resolve_model(name, "reward"), samples)
    measured.pop("auroc_worked")
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", default=str(warm_start.RM_PROBLEMS), help="comma-separated budgets")
    parser.add_argument("--negatives", default="last,carried,mixed",
                        help="comma-separated kinds of warm_start.NEGATIVE_KINDS: last, carried, mixed")
    parser.add_argument("--epochs", type=int, default=warm_start.RM_EPOCHS)
    parser.add_argument("--prompts", type=int, default=192)
    parser.add_argument("--k", type=int, default=8, help="samples per prompt (best-of-k)")
    parser.add_argument("--model", help="score with this reward model (a reward.model name, e.g. tiny-rm-keyed) "
                        "instead of pretraining; adds the mean score per answer form and right/wrong")
    args = parser.parse_args()
    torch.set_num_threads(1)
    samples = policy_samples(args.prompts, args.k)
    labels = [right for _, _, right in samples]
    results: dict[str, object] = {"samples": len(samples), "sample_accuracy": round(sum(labels) / len(labels), 4),
                                  "runs": {}}
    print(f"{len(samples)} samples, accuracy {results['sample_accuracy']}", flush=True)
    if args.model:
        results["model"] = {"name": args.model, **score_existing(args.model, samples)}
        print(json.dumps(results))
        return
    for negatives in args.negatives.split(","):
        for problems in map(int, args.problems.split(",")):
            started = time.perf_counter()
            rm = warm_start.pretrained_rm(problems, negatives, args.epochs)
            seconds = time.perf_counter() - started
            scores = [s for s, _ in rm.score([ScoreItem(p.question, p.answer, text) for p, text, _ in samples])]
            groups = range(0, len(samples), args.k)
            best = [max(zip(scores[i : i + args.k], labels[i : i + args.k], strict=True))[1] for i in groups]
            ranked = auroc(scores, labels)
            run = {"auroc": None if ranked is None else round(ranked, 4), "best_of_k_accuracy": round(sum(best) / len(best), 4),
                   "seconds": round(seconds, 1)}
            results["runs"][f"{negatives}/{problems}"] = run  # type: ignore[index]
            print(f"{negatives} {problems}: {run}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
