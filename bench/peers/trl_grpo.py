"""The tiny preset's rule-mode GRPO as Hugging Face TRL's GRPOTrainer does it: the peer of bench/startup.py.

    python bench/peers/trl_grpo.py --model DIR --data FILE [--eval-data FILE] [--threads 1] [--output-dir DIR]

Runs in an environment of its own (bench/peers/setup.sh trl) with the repository on PYTHONPATH, for the reward
alone: the verifier's rule (`cooper.services.verifier.rules.check`, `answer: boxed`, 1 for CORRECT, else 0), a pure
function over strings that needs math-verify and nothing else of Cooper's. Everything else is TRL's own.

The same work as `cooper train run.mode=rule` on the tiny preset (configs/tiny.yaml): the same model directory
(`tiny-sft`), the prompts of its steps in its order (`--data`, written by bench/startup.py with Cooper's own data
order and prompt template, chat template applied by TRL as Cooper's engine applies it), 8 prompts x 4 samples a
step at temperature 1 with no top-k or top-p, 40 new tokens at most; the loss of docs/design.md 2.1: token mean
over the whole batch (`loss_type="dapo"`), clip 0.2, the dual clip at 3 (`delta`), k3 KL to the initial policy at
0.001, one epoch per rollout; AdamW at lr 1e-4 with weight decay 0.01, a linear warm-up over 2 updates then
constant, gradients clipped at 1.0. TRL's best settings for a tiny model on a CPU: no gradient checkpointing (on in
GRPOConfig by default), float32, no dropout, no logging of completions, no checkpoints, one torch thread by default
(bench/startup.py --trl-threads compares others). With `--eval-data` (the preset's two test sets) it evaluates as
the preset does: before the first step (`eval_on_start`, what Cooper's evaluate(-1) is) with 2 samples per problem,
and after the last; in one batch of all 1024 completions, its fastest (docs/benchmarks.md). Left different: TRL's
evaluation samples at the training temperature (the preset's at 0.7, top-p 0.95) and also computes its loss.

Prints one JSON line per event on stdout, each with `time` (time.time()): "ready" once the trainer is built,
"step" at each `on_step_end` (an optimizer step done), "done" at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "time": time.time(), **fields}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the policy's model directory (tokenizer beside it)")
    parser.add_argument("--data", required=True, help="JSON Lines of prompt and answer, in step order")
    parser.add_argument("--eval-data", help="JSON Lines of prompt and answer to evaluate on (none: no evaluation)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per step")
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--eval-k", type=int, default=2, help="samples per test problem")
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--eval-batch-size", type=int, default=1024,
                        help="completions per evaluation batch (1024: the two test sets at once, its fastest)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--output-dir", default="trl-out")
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from cooper.services.verifier.messages import Verdict
    from cooper.services.verifier.rules import ReferenceCache, check

    torch.set_num_threads(args.threads)
    cache = ReferenceCache()

    def verifier_reward(completions: list, answer: list[str], **_: object) -> list[float]:
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [1.0 if check(t, a, 3.0, cache=cache, answer="boxed").verdict == Verdict.CORRECT else 0.0
                for t, a in zip(texts, answer, strict=True)]

    def rows(path: str) -> Dataset:
        with open(path) as f:
            data = [json.loads(line) for line in f if line.strip()]
        return Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
                                  for r in data])

    evaluating = args.eval_data is not None
    config = GRPOConfig(
        output_dir=args.output_dir, use_cpu=True, bf16=False, gradient_checkpointing=False,
        max_steps=args.steps, per_device_train_batch_size=args.batch_size * args.n, gradient_accumulation_steps=1,
        num_generations=args.n, max_completion_length=40, temperature=1.0, top_p=1.0, top_k=0,
        shuffle_dataset=False, loss_type="dapo", scale_rewards="group", epsilon=0.2, delta=3.0, beta=0.001,
        num_iterations=1, learning_rate=1e-4, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999,
        lr_scheduler_type="constant_with_warmup", warmup_steps=2, max_grad_norm=1.0, disable_dropout=True,
        logging_steps=1, report_to="none", save_strategy="no", log_completions=False, seed=0,
        dataloader_num_workers=0,
        eval_strategy="steps" if evaluating else "no", eval_steps=args.eval_every, eval_on_start=evaluating,
        num_generations_eval=args.eval_k, per_device_eval_batch_size=args.eval_batch_size,
    )

    class StepTimes(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            emit("step", step=state.global_step)

    trainer = GRPOTrainer(model=args.model, reward_funcs=verifier_reward, args=config, train_dataset=rows(args.data),
                          eval_dataset=rows(args.eval_data) if evaluating else None, callbacks=[StepTimes()])
    emit("ready")
    trainer.train()
    if evaluating and args.steps % args.eval_every:
        trainer.evaluate()  # Cooper evaluates after the last step too
    emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
