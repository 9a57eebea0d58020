"""The paper's finding through TRL: TRL's GRPOTrainer on the tiny preset's task and models, rewarded three ways, on
the same seeds, judged by Cooper's own criteria (cooper/experiments/reproduction.py).

    python bench/trl_finding.py --seeds 1201,1202,1203 [--steps 300] [--modes rule,static,cooper] [--smoke]

- `rule`: the verifier's 1/0 (math-verify on the boxed answer, as the preset's verifier reads it);
- `static`: Cooper's reward service scoring with the preset's VerifyRM (`tiny-rm-keyed`), frozen
  (`CooperReward(learn=False)`);
- `cooper`: the same service in its learning mode (reward.learn_online, the preset's reward update settings), one
  learning step after each batch (`CooperReward()`, cooper/integrations/trl.py).

The policy, prompts, sampling and GRPO loss are the tiny preset's as bench/peers/trl_grpo.py maps them onto TRL
(the `tiny-sft` policy, 8 prompts x 4 samples at temperature 1, 40 new tokens, the token-mean loss, lr 1e-4), the
prompts of each step those of Cooper's own run of that seed. Each step's record has Cooper's metric names: the
training reward, the verifier's accuracy on the same rollouts and their gap (proxy minus gold), VerifyRM's AUROC
against the verifier on them; held-out accuracy is measured before the first step and every `--eval-every` steps
(the preset's `heldout` set, 2 samples a problem at temperature 0.7, top-p 0.95), on the model TRL trains.

What differs from a Cooper run: the learning mode pairs each question's first right completion against its wrong
ones (run.negatives=rollouts), without the generator's rewrites the preset adds (negatives=both); the update's
settings (replay, steps, calibration, lr) are the preset's reward section. Prints one JSON line last: per run its
summary, per seed each criterion, and `reproduced`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = ("rule", "static", "cooper")


def reward_service(mode: str, workdir: Path) -> Any:
    from cooper.config import preset_path
    from cooper.runtime.processes import start_service

    return start_service("reward", config_path=preset_path("tiny"), log_dir=workdir / "logs", overrides=[
        "reward.server.port=0", "reward.server.metrics_port=null", "reward.http.port=0",
        f"reward.checkpoint_dir={workdir / 'reward'}", "reward.http.max_items=4096",
        f"reward.learn_online.enabled={'true' if mode == 'cooper' else 'false'}",
        "reward.learn_online.verifier.answer=boxed"])


def run(mode: str, seed: int, args: argparse.Namespace, workdir: Path) -> tuple[list[dict[str, Any]], float, float]:
    """One TRL run: its per-step records, and its held-out accuracy before the first step and after the last."""
    import datasets
    import torch
    import trl
    from transformers import TrainerCallback

    from cooper.config import load_config, preset_path
    from cooper.evaluation.monitor import auroc
    from cooper.integrations.trl import CooperReward
    from cooper.metric_names import REWARD_ACCURACY_GAP, REWARD_MEAN, RM_AUROC, STEP, VERIFIER_ACCURACY
    from cooper.orchestrator.data import StepData, load_data, prompt_text
    from cooper.runtime.models import resolve_model
    from cooper.services.verifier.messages import Verdict
    from cooper.services.verifier.rules import ReferenceCache, check

    torch.set_num_threads(1)
    config = load_config(preset_path("tiny"), [f"run.seed={seed}", f"run.steps={args.steps}"])
    rows, tests = load_data(config)
    heldout = tests["heldout"][: args.test_size]
    data = StepData(rows, config.run.batch_size, seed)
    train = [{"prompt": [{"role": "user", "content": prompt_text(config, e)}], "question": e.question,
              "answer": e.answer} for t in range(args.steps) for e in data.batch(t)]
    cache = ReferenceCache()

    def right(text: str, answer: str) -> bool:
        return check(text, answer, float(config.verifier.timeout_s), cache=cache, answer="boxed").verdict \
            == Verdict.CORRECT

    records: list[dict[str, Any]] = []
    service = reward_service(mode, workdir) if mode != "rule" else None
    scorer = CooperReward(f"http://127.0.0.1:{service.info['http_port']}", question_key="question",
                          learn=mode == "cooper") if service else None

    def reward(prompts: list[Any], completions: list[Any], **columns: Any) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        gold = [right(t, a) for t, a in zip(texts, columns["answer"], strict=True)]
        proxy = scorer(prompts, completions, **columns) if scorer else [float(g) for g in gold]
        accuracy = sum(gold) / len(gold)
        record = {STEP: len(records), REWARD_MEAN: sum(proxy) / len(proxy), VERIFIER_ACCURACY: accuracy}
        record[REWARD_ACCURACY_GAP] = record[REWARD_MEAN] - accuracy
        if scorer:
            record[RM_AUROC] = auroc(scorer.last_logits, gold)
        records.append(record)
        return proxy

    reward.__name__ = mode  # type: ignore[attr-defined]

    def evaluate(model: Any, tokenizer: Any) -> float:
        """Held-out accuracy, as the preset evaluates: k samples a problem at 0.7, top-p 0.95."""
        model.eval()
        tokenizer.padding_side = "left"
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": prompt_text(config, e)}],
                                                 tokenize=False, add_generation_prompt=True) for e in heldout]
        hits = 0
        with torch.no_grad():
            for start in range(0, len(prompts), 64):
                batch = tokenizer(prompts[start:start + 64], return_tensors="pt", padding=True,
                                  add_special_tokens=False)
                out = model.generate(**batch, do_sample=True, temperature=config.eval.temperature,
                                     top_p=config.eval.top_p, max_new_tokens=config.policy.sampling.max_new_tokens,
                                     num_return_sequences=config.eval.k, pad_token_id=tokenizer.pad_token_id)
                texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
                problems = heldout[start:start + 64]
                hits += sum(right(text, problems[i // config.eval.k].answer) for i, text in enumerate(texts))
        model.train()
        return hits / (len(heldout) * config.eval.k)

    tests_at: dict[int, float] = {}

    class Evaluate(TrainerCallback):
        def on_train_begin(self, targs, state, control, model=None, processing_class=None, **kw):  # type: ignore[no-untyped-def]
            tests_at[0] = evaluate(model, processing_class)

        def on_step_end(self, targs, state, control, model=None, processing_class=None, **kw):  # type: ignore[no-untyped-def]
            if state.global_step % args.eval_every == 0 or state.global_step == args.steps:
                tests_at[state.global_step] = evaluate(model, processing_class)
                records[-1]["test/heldout"] = tests_at[state.global_step]

    n = config.policy.sampling.n
    trl_config = trl.GRPOConfig(
        output_dir=str(workdir / "trl"), use_cpu=True, bf16=False, gradient_checkpointing=False,
        max_steps=args.steps, per_device_train_batch_size=config.run.batch_size * n, gradient_accumulation_steps=1,
        num_generations=n, max_completion_length=config.policy.sampling.max_new_tokens, temperature=1.0, top_p=1.0,
        top_k=0, shuffle_dataset=False, loss_type="dapo", scale_rewards="group", epsilon=0.2, delta=3.0, beta=0.001,
        num_iterations=1, learning_rate=config.policy.optim.lr, weight_decay=0.01, lr_scheduler_type="constant_with_warmup",
        warmup_steps=config.policy.optim.warmup_steps, max_grad_norm=1.0, disable_dropout=True, logging_steps=10,
        report_to="none", save_strategy="no", log_completions=False, seed=seed, dataloader_num_workers=0,
        disable_tqdm=True)
    try:
        trainer = trl.GRPOTrainer(model=str(resolve_model(config.policy.model, "causal")), reward_funcs=reward,
                                  args=trl_config, train_dataset=datasets.Dataset.from_list(train),
                                  callbacks=[Evaluate()])
        trainer.train()
    finally:
        if service is not None:
            service.stop()
    return records, tests_at[0], tests_at[max(tests_at)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1201,1202,1203", help="comma-separated; written down before the runs")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--test-size", type=int, default=256, help="held-out problems per evaluation")
    parser.add_argument("--smoke", action="store_true", help="4 steps, 16 held-out problems: the script runs")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.eval_every, args.test_size = 4, 2, 16
    modes = [m for m in args.modes.split(",") if m]
    if unknown := sorted(set(modes) - set(MODES)):
        parser.error(f"unknown mode(s) {unknown}: choose from {', '.join(MODES)}")
    from cooper.experiments.reproduction import judge, summarize

    summaries, started = [], time.monotonic()
    for seed in (int(s) for s in args.seeds.split(",")):
        for mode in modes:
            with tempfile.TemporaryDirectory(prefix=f"trl-{mode}-{seed}-") as workdir:
                began = time.monotonic()
                records, test_start, test_end = run(mode, seed, args, Path(workdir))
                summary = summarize(mode, seed, records, "test/heldout", test_start, kl_key="kl")
                summaries.append(summary)
                print(f"{mode} seed {seed}: held-out {test_start:.3f} -> {test_end:.3f}, reward "
                      f"{summary.reward_start:.3f} -> {summary.reward_end:.3f}, gap {summary.gap_start:.3f} -> "
                      f"{summary.gap_end:.3f} ({time.monotonic() - began:.0f} s)", file=sys.stderr, flush=True)
    result = judge(summaries)
    for run_ in result["runs"]:
        run_.pop("gap", None)  # per step: in the runs' own records, too long for the line
    print(json.dumps({"bench": "trl_finding", "seeds": args.seeds, "steps": args.steps, "modes": modes,
                      "seconds": round(time.monotonic() - started, 1), **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
