"""What a checkpoint of the policy and of VerifyRM costs, and the share of an update the training path spends on
it, before and after the update journal with background checkpoints (cooper/runtime/durability.py; docs/design.md,
section 5.3).

    python bench/checkpoint.py [--repeats 3] [--skip-large] [--every 10] [--dir DIR]

Before: a full checkpoint written on the training path after every update (what local runs did for both services;
`<service>.save_every=1 <service>.save_in_background=false <service>.journal=false`). After (the defaults, the same
for both services): every update appends a journal entry (the policy's rollout, VerifyRM's preference pairs;
fsynced), and every `--every` (K, save_every) updates the training path copies the state to host memory
(`snapshot_state`) while a background thread writes the copy.

The models are random, built from a config (no hub): the tiny preset's policy and VerifyRM, and a Qwen2 with
Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads, 2 KV heads, intermediate 4864, vocabulary 151,936; 494M
parameters), as a causal LM (the policy) and as a one-output sequence classifier (VerifyRM). Each is saved the way
its service saves it (float32 safetensors, tokenizer, AdamW state, fsynced). The update is one real
GRPO `train_step` on a synthetic rollout: the tiny preset's shape for the tiny model (8 prompts x 4 samples, 32
prompt and 40 completion tokens); for the 0.5B-shaped one a rollout this CPU can afford (2 x 2, 16 + 16 tokens), so
its update is far shorter than a real step and its shares are upper bounds. The journal entry is measured for the
tiny preset's rollout and for the 1.5B preset's (64 prompts x 16 samples, 256 prompt tokens, 1,024 completion
tokens with log-probs: its largest). A VerifyRM update is one real Bradley-Terry `VerifyRM.update`: 16 pairs of
the tiny task for the tiny model, 2 pairs for the 0.5B-shaped one; its journal entry holds the pairs' text (at the
1.5B preset's scale, 64 x 16 completions of up to 1,024 tokens, as pairs of about 4,000 characters a side).
Measured per model, medians of --repeats:

- save_s, bytes: one synchronous checkpoint (before: every update);
- copy_s: `snapshot_state` (after: on the training path every K updates);
- write_s: the background write of that copy, and update_during_write_s: an update running beside it (this 2-core
  CPU shares its cores and disk with the writer; on a GPU the update barely competes);
- update_s: one update with no checkpointing.

Shares of an update spent on checkpointing, on the training path:
  before:   save_s / (update_s + save_s)
  after(K): on / (update_s + on),  on = journal_s + (copy_s + update_during_write_s - update_s) / K
The tiny models are also measured end to end through `PolicyCore.train` and `RewardCore.apply_update` (mean seconds
per update over 2K updates in each configuration). The last line is one JSON object: the policy's figures under
"tiny", "qwen2.5-0.5b-shaped" and "qwen2.5-1.5b_estimate", VerifyRM's under "reward".
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from cooper.runtime.checkpoint import POLICY, REWARD, BackgroundSave, CheckpointLayout, save_checkpoint, snapshot_state
from cooper.runtime.journal import UpdateJournal
from cooper.runtime.models import resolve_model
from cooper.services.policy.core import journal_record
from cooper.services.policy.grpo import LossSettings
from cooper.services.policy.trainer import GRPOTrainer, RolloutSample
from cooper.tiny.models import tiny_tokenizer_dir

QWEN_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
            "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}
QWEN_15B = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
            "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}
TINY_ROLLOUT = {"prompts": 8, "n": 4, "prompt_tokens": 32, "completion_tokens": 40}
SMALL_ROLLOUT = {"prompts": 2, "n": 2, "prompt_tokens": 16, "completion_tokens": 16}
PRESET_15B_ROLLOUT = {"prompts": 64, "n": 16, "prompt_tokens": 256, "completion_tokens": 1024}
TINY_PAIRS, SMALL_PAIRS = 16, 2
PRESET_15B_PAIRS = {"pairs": 64 * 16 // 2, "chars": 4000}
"""At most one pair per two completions; 1,024 tokens of a Qwen2.5 tokenizer are about 4,000 characters."""


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def synthetic_rollout(vocab: int, prompts: int, n: int, prompt_tokens: int, completion_tokens: int
                      ) -> tuple[list[RolloutSample], list[float]]:
    """Random token ids in the layout Train receives (n completions per prompt, with the engine's log-probs)."""
    generator = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(prompts):
        prompt = torch.randint(4, vocab, (prompt_tokens,), generator=generator).tolist()
        for _ in range(n):
            completion = torch.randint(4, vocab, (completion_tokens,), generator=generator).tolist()
            logprobs = (-torch.rand(completion_tokens, generator=generator) * 5).tolist()
            samples.append(RolloutSample(prompt, completion, logprobs))
    return samples, [float(i % 2) for i in range(len(samples))]


def journal_cost(root: Path, rollout: dict[str, int], repeats: int) -> dict[str, float]:
    """Seconds and bytes of one journal append (what Train now writes before it answers) for a rollout shape."""
    samples, rewards = synthetic_rollout(151936, **rollout)
    journal = UpdateJournal(root)
    seconds = [timed(lambda v=v: journal.append(v, "bench/prev", journal_record(
        "bench/0", samples, rewards, rollout["n"], {"loss": 0.0}))) for v in range(1, repeats + 1)]
    size = journal.path(repeats).stat().st_size
    shutil.rmtree(root, ignore_errors=True)
    return {"seconds": statistics.median(seconds), "bytes": size}


def reward_pairs(count: int, chars: int | None = None) -> list[Any]:
    """`count` preference pairs of the tiny task (each side cut or padded to `chars` characters when given)."""
    import random

    from cooper.services.reward.items import PreferencePair
    from cooper.tiny.task import make_split, wrong_solution

    rng = random.Random(0)
    pairs = [PreferencePair(p.question, p.answer, p.solution, wrong_solution(p, rng))
             for p in make_split(count, 0, "bench")]
    if chars is None:
        return pairs
    return [PreferencePair(p.question, p.reference, (p.positive * chars)[:chars], (p.negative * chars)[:chars])
            for p in pairs]


def reward_journal_cost(root: Path, repeats: int, pairs: int, chars: int | None = None) -> dict[str, float]:
    """Seconds and bytes of one VerifyRM journal append (what Update writes before it answers) for `pairs` pairs."""
    from dataclasses import astuple

    record = {"key": "bench/0", "pairs": [astuple(p) for p in reward_pairs(pairs, chars)], "optimizer_steps": 1,
              "result": {"loss": 0.0}}
    journal = UpdateJournal(root)
    seconds = [timed(lambda v=v: journal.append(v, "bench/prev", record)) for v in range(1, repeats + 1)]
    size = journal.path(repeats).stat().st_size
    shutil.rmtree(root, ignore_errors=True)
    return {"seconds": statistics.median(seconds), "bytes": size}


def copy_and_write_beside(update: Callable[[], float], model: Any, tokenizer: Any,
                          optimizer_state: Callable[[], dict[str, Any]], root: Path, version: int,
                          layout: CheckpointLayout) -> tuple[float, float, float]:
    """What the training path does after: copy the state, start its background write, run the next update. Returns
    (copy seconds, write seconds, seconds of the update that ran beside the write)."""
    started = time.perf_counter()
    weights, optimizer_copy = snapshot_state(model, optimizer_state())
    copy_s = time.perf_counter() - started
    write_s: list[float] = []

    def write() -> None:
        write_s.append(timed(lambda: save_checkpoint(root, model, tokenizer, optimizer_copy,
                                                     {"version": version, "updates": version}, keep=1,
                                                     weights=weights, layout=layout)))

    writer = BackgroundSave("bench", logging.getLogger("bench"))
    writer.start(write)
    beside = update()
    writer.wait()
    return copy_s, write_s[0], beside


def measure(model: Any, tokenizer: Any, root: Path, repeats: int, rollout: dict[str, int], micro_batch: int
            ) -> dict[str, float]:
    """The policy: one GRPO update of `rollout`'s shape, and its checkpoint before and after."""
    trainer = GRPOTrainer(model, None, LossSettings(kl_coef=0.0), lr=1e-6, micro_batch_size=micro_batch,
                          pad_id=tokenizer.pad_token_id)
    samples, rewards = synthetic_rollout(model.config.vocab_size, **rollout)
    return measure_saves(model, tokenizer, root, repeats, lambda: trainer.train_step(samples, rewards, rollout["n"]),
                         trainer.optimizer_state, POLICY)


def measure_reward(model: Any, tokenizer: Any, root: Path, repeats: int, pairs: int) -> dict[str, float]:
    """VerifyRM: one Bradley-Terry update over `pairs` pairs, and its checkpoint before and after."""
    from cooper.config import OptimConfig
    from cooper.services.reward.verify_rm import VerifyRM

    rm = VerifyRM(model, tokenizer, OptimConfig(lr=1e-5, micro_batch_size=8), 1024)
    data = reward_pairs(pairs)
    return measure_saves(model, tokenizer, root, repeats, lambda: rm.update(data), rm.optimizer_state, REWARD)


def measure_saves(model: Any, tokenizer: Any, root: Path, repeats: int, step: Callable[[], Any],
                  optimizer_state: Callable[[], dict[str, Any]], layout: CheckpointLayout) -> dict[str, float]:
    def update() -> float:
        return timed(step)

    update()  # warm-up; the AdamW moments exist from here on, as after any update
    updates, saves, after = [], [], []
    for version in range(1, repeats + 1):
        updates.append(update())
        saves.append(timed(lambda v=version: save_checkpoint(root / "sync", model, tokenizer, optimizer_state(),
                                                             {"version": v, "updates": v}, keep=1, layout=layout)))
        after.append(copy_and_write_beside(update, model, tokenizer, optimizer_state, root / "background", version,
                                           layout))
    size = size_of(layout.path(root / "sync", {"version": repeats, "updates": repeats}))
    shutil.rmtree(root, ignore_errors=True)
    copies, writes, beside = zip(*after, strict=True)
    return {"parameters": sum(p.numel() for p in model.parameters()), "bytes": size,
            "update_s": statistics.median(updates), "save_s": statistics.median(saves),
            "copy_s": statistics.median(copies), "write_s": statistics.median(writes),
            "update_during_write_s": statistics.median(beside)}


def shares(m: dict[str, float], journal_s: float, every: int) -> dict[str, float]:
    """The share of an update spent checkpointing on the training path, before and after (K = 1 and K = every)."""
    out = {"before": m["save_s"] / (m["update_s"] + m["save_s"])}
    slowdown = max(0.0, m["update_during_write_s"] - m["update_s"])
    for k in sorted({1, every}):
        on = journal_s + (m["copy_s"] + slowdown) / k
        out[f"after_every_{k}"] = on / (m["update_s"] + on)
    return out


def tiny_end_to_end(every: int) -> dict[str, float]:
    """Mean seconds per `PolicyCore.train` on the tiny policy, no checkpoints / before / after, over 2 * every
    updates of the tiny preset's rollout shape (sampled by its own engine). The three cores train in turn on the same
    rollouts, so the machine's noise falls on all three alike."""
    from cooper.config import PolicyConfig
    from cooper.services.policy.core import PolicyCore
    from cooper.services.policy.engine import SamplingParams
    from cooper.tiny.task import make_split

    settings = {"none": {"save_every": 0, "journal": False},
                "before": {"save_every": 1, "save_in_background": False, "journal": False},
                "after": {"save_every": every}}
    prompts = [p.question for p in make_split(8, 0, "bench")]
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        cores = {name: PolicyCore(PolicyConfig.model_validate({
            "model": "tiny", "device": "cpu", "torch_threads": 1, "checkpoint_dir": f"{tmp}/{name}",
            "optim": {"lr": 1e-4, "micro_batch_size": 32}, "server": {"metrics_port": None}, **extra}))
            for name, extra in settings.items()}
        for step in range(2 * every):
            groups, _ = cores["none"].generate(prompts, SamplingParams(n=4, max_new_tokens=40, seed=step))
            samples = [RolloutSample(c.prompt_token_ids, c.token_ids, c.logprobs) for g in groups for c in g]
            rewards = [float(i % 2) for i in range(len(samples))]
            for name, core in cores.items():
                seconds[name].append(timed(lambda c=core, k=f"bench/{step}", s=samples, r=rewards: c.train(k, s, r, 4)))
        cores["after"].wait_for_saves()
    return end_to_end_shares(seconds)


def end_to_end_shares(seconds: dict[str, list[float]]) -> dict[str, float]:
    out = {name: statistics.mean(values) for name, values in seconds.items()}
    out["share_before"] = max(0.0, out["before"] - out["none"]) / out["before"]
    out["share_after"] = max(0.0, out["after"] - out["none"]) / out["after"]
    return out


def reward_end_to_end(every: int) -> dict[str, float]:
    """Mean seconds per `RewardCore.apply_update` on the tiny VerifyRM, no checkpoints / before / after, over
    2 * every updates of 16 pairs each, the three cores in turn on the same pairs."""
    from cooper.config import RewardConfig
    from cooper.services.reward.core import RewardCore

    settings = {"none": {"save_every": 0, "journal": False},
                "before": {"save_every": 1, "save_in_background": False, "journal": False},
                "after": {"save_every": every}}
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        cores = {name: RewardCore.load(RewardConfig.model_validate({
            "model": "tiny-rm", "device": "cpu", "torch_threads": 1, "checkpoint_dir": f"{tmp}/{name}",
            "server": {"metrics_port": None}, **extra})) for name, extra in settings.items()}
        for step in range(2 * every):
            pairs = reward_pairs(TINY_PAIRS * (step + 1))[-TINY_PAIRS:]
            for name, core in cores.items():
                seconds[name].append(timed(lambda c=core, k=f"bench/{step}", p=pairs: c.apply_update(k, p)))
        for core in cores.values():
            core.close()
    return end_to_end_shares(seconds)


def reward_figures(base: Path, repeats: int, every: int, large: bool) -> dict[str, Any]:
    """VerifyRM's figures: the tiny model (and, with `large`, the 0.5B-shaped classifier and the 1.5B estimate)."""
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        Qwen2Config,
        Qwen2ForSequenceClassification,
    )

    tiny_dir = resolve_model("tiny-rm", "reward")
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    journal = {"tiny_preset": reward_journal_cost(base / "journal", repeats, TINY_PAIRS),
               "qwen2.5-1.5b_preset": reward_journal_cost(base / "journal", repeats, **PRESET_15B_PAIRS)}
    out: dict[str, Any] = {"journal": journal}
    torch.set_num_threads(1)
    tiny = AutoModelForSequenceClassification.from_pretrained(tiny_dir)
    out["tiny"] = measure_reward(tiny, tokenizer, base / "tiny", repeats, TINY_PAIRS)
    out["tiny"]["share"] = shares(out["tiny"], journal["tiny_preset"]["seconds"], every)
    out["tiny"]["end_to_end_s_per_update"] = reward_end_to_end(every)
    print(f"reward tiny: {out['tiny']}", flush=True)
    if large:
        torch.set_num_threads(2)
        torch.manual_seed(0)
        shape = {**QWEN_05B, "num_labels": 1, "pad_token_id": tokenizer.pad_token_id}
        m = measure_reward(Qwen2ForSequenceClassification(Qwen2Config(**shape)), tokenizer, base / "large", repeats,
                           SMALL_PAIRS)
        m["share"] = shares(m, journal["qwen2.5-1.5b_preset"]["seconds"], every)
        out["qwen2.5-0.5b-shaped"] = m
        print(f"reward 0.5B-shaped: {m}", flush=True)
        out["qwen2.5-1.5b_estimate"] = scaled(m, parameters_of(QWEN_15B) / m["parameters"])
    return out


def scaled(m: dict[str, float], scale: float) -> dict[str, float]:
    """A larger model's checkpoint figures, proportional to its parameters (they are all bytes to copy or write)."""
    return {"parameters_ratio": scale, "bytes": m["bytes"] * scale, "save_s": m["save_s"] * scale,
            "copy_s": m["copy_s"] * scale, "write_s": m["write_s"] * scale}


def parameters_of(shape: dict[str, Any]) -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    with torch.device("meta"):  # shapes only, no memory
        return sum(p.numel() for p in Qwen2ForCausalLM(Qwen2Config(**shape)).parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--every", type=int, default=10, help="K, save_every after (default 10)")
    parser.add_argument("--skip-large", action="store_true", help="only the tiny models")
    parser.add_argument("--dir", help="where to write (default: a temp directory)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the tiny preset's policy.torch_threads
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir())
    base = Path(args.dir or tempfile.mkdtemp(prefix="cooper-ckpt-bench-"))
    journal = {"tiny_preset": journal_cost(base / "journal", TINY_ROLLOUT, args.repeats),
               "qwen2.5-1.5b_preset": journal_cost(base / "journal", PRESET_15B_ROLLOUT, args.repeats)}
    print(f"journal entry: {journal}", flush=True)
    results: dict[str, Any] = {"journal": journal}
    tiny = Qwen2ForCausalLM.from_pretrained(resolve_model("tiny", "causal"))
    results["tiny"] = measure(tiny, tokenizer, base / "tiny", args.repeats, TINY_ROLLOUT, 32)
    results["tiny"]["share"] = shares(results["tiny"], journal["tiny_preset"]["seconds"], args.every)
    results["tiny"]["end_to_end_s_per_update"] = tiny_end_to_end(args.every)
    print(f"tiny: {results['tiny']}", flush=True)
    if not args.skip_large:
        torch.set_num_threads(2)  # every core of this machine
        torch.manual_seed(0)
        large = Qwen2ForCausalLM(Qwen2Config(**QWEN_05B))
        # A 0.5B update journals a rollout of the 1.5B preset's shape at most: the journal cost does not grow with
        # the model, only with the rollout.
        m = measure(large, tokenizer, base / "large", args.repeats, SMALL_ROLLOUT, 2)
        m["share"] = shares(m, journal["qwen2.5-1.5b_preset"]["seconds"], args.every)
        results["qwen2.5-0.5b-shaped"] = m
        print(f"0.5B-shaped: {m}", flush=True)
        results["qwen2.5-1.5b_estimate"] = scaled(m, parameters_of(QWEN_15B) / m["parameters"])
    results["reward"] = reward_figures(base / "reward", args.repeats, args.every, not args.skip_large)
    shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"bench": "checkpoint", "repeats": args.repeats, "every": args.every, **results}))


if __name__ == "__main__":
    main()
