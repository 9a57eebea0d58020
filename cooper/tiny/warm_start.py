"""Warm starts for the tiny preset, built once and cached like the tiny models.

`tiny-sft`: the tiny causal LM after a short SFT on a corpus of two kinds of answers: half are worked solutions
(`We compute 7 * 8 = 56. The answer is \\boxed{56}.`, all right), half are bare answers with no work shown
(`The answer is \\boxed{56}.`), right only BARE_RIGHT of the time, like an answer key of mixed quality. A 2-layer
model computes much better when it writes the operation out first, so the SFT policy is a mix of a reliable
behaviour and an unreliable one: RL with a true reward has a behaviour to learn that carries across problems
(measured on v7: sampled accuracy 0.83-0.87 when it shows work, 0.14-0.16 on bare answers).
`tiny-rm`: the tiny VerifyRM after a short BCE pretraining on labelled completions: worked solutions, right, and
wrong in one of two ways (the last number changed, or one step's error carried through a consistent solution), and a
fixed answer-less text. It learns the reference check on worked solutions (v8: AUROC 0.997 on the SFT policy's own
worked solutions) and, though it never saw a bare answer, carries it over to them: on the SFT policy's samples it
pays bare right answers 0.67 and bare wrong ones 0.08 on average (`bench/rm_pretraining.py --model tiny-rm`,
2026-11-27; v7's RM was at chance on them), which is why v8 is not hacked (docs/experiments.md).
"""

from __future__ import annotations

import logging
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

from cooper.services.reward.items import LabelledTriple
from cooper.tiny.models import build_tiny, tiny_causal_lm_dir, tiny_hd32_model_dir, tiny_reward_model_dir
from cooper.tiny.task import bare_answer, carried_error_solution, make_split, wrong_solution

log = logging.getLogger("cooper.tiny")

# 2,000 steps: at 800 (v6's) the two-step worked solutions were right 24% of the time, at 2,000 83% (held-out) and
# 87% (seen), so a held-out problem is solved about as well as a seen one (docs/experiments.md).
SFT_STEPS, SFT_BATCH, SFT_LR = 2000, 32, 3e-3
BARE_SHARE, BARE_RIGHT = 0.5, 0.3
WRONG_SHARE = 0.0  # worked solutions with a wrong number (v5 used 0.25): none, their errors are the model's own
# RM pretraining. v7's RM (5 epochs, last-number negatives only) checked the last equation, not the answer against
# the reference: AUROC 0.77 on the SFT policy's samples (measured on v7), and consistent wrong chains went through.
# With carried-error negatives too and 12 epochs it learns the comparison (a sudden jump after a plateau near 0.6,
# measured with bench/rm_pretraining.py; docs/experiments.md).
RM_PROBLEMS, RM_EPOCHS, RM_LR, RM_NEGATIVES = 1500, 12, 1e-3, "mixed"
# When the check comes depends on the CPU's float kernels: on an AMD EPYC (AVX2) the keyed VerifyRM was still on the
# plateau after 12 epochs (AUROC 0.55 between right and wrong worked solutions), where another machine's had learned
# it. So pretraining goes on past RM_EPOCHS, an epoch at a time, until the check is learned (REFERENCE_CHECK_AUROC on
# held-out probes: worked solutions, right against carried-error wrong) or RM_MAX_EPOCHS have run (v9). Measured there:
# tiny-rm 1.000 at epoch 12; the keyed one 0.72 at 12, 0.80 at 14, 0.90 at 20, then 0.90-0.91 up to epoch 29 (its
# bare positives hold it below tiny-rm), hence 0.9. Not for the noisy RM: with a quarter of the labels flipped, more
# epochs fit the flips (0.63-0.67 from epoch 12 to 24), and it is the alarm's demonstration as v8 made it.
RM_MAX_EPOCHS, REFERENCE_CHECK_AUROC, REFERENCE_CHECK_PROBES = 32, 0.9, 200
ANSWERLESS_SHARE = 0.2
# "tiny-rm-noisy": 25% of its pretraining labels flipped, the label noise Coste et al. (ICLR 2024) needed to see
# over-optimisation of a proxy RM clearly; taken from the paper, not tuned here. Annotators, human or LLM, disagree
# with the truth about that often. It is the reward model of the alarm's demonstration (docs/experiments.md).
NOISY_LABEL_SHARE = 0.25
# "tiny-rm-keyed": v8's data with an answer key merged into the positives: for this share of the problems, the bare
# right answer ("The answer is \\boxed{56}.") labelled 1 as well, and no bare wrong answer among the negatives, as
# when a verifier's positives are pooled from worked solutions and an answer key. The premise of the default
# experiment, fixed before any run (docs/experiments.md, "An answer key among VerifyRM's positives"): an RM right
# about worked solutions and biased about bare answers, the middle between one that cannot be hacked and one that
# cannot be repaired.
ANSWER_KEY_SHARE = 0.5


def _prompt(question: str) -> str:
    from cooper.config import DataConfig

    return DataConfig().prompt_template.replace("{question}", question)


def _sft(out: Path, source: Path | None = None) -> None:
    """The SFT warm start of `source` (default: the tiny causal LM)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)  # a tiny model trains faster on one thread than on two contended ones
    source = source or tiny_causal_lm_dir()
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    rng = random.Random(0)
    examples = []
    for p in make_split(4000, 0, "sft"):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": _prompt(p.question)}], tokenize=False,
                                               add_generation_prompt=True)
        if rng.random() < BARE_SHARE:
            answer = bare_answer(p, rng, BARE_RIGHT)
        else:
            answer = wrong_solution(p, rng) if rng.random() < WRONG_SHARE else p.solution
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        examples.append((prompt_ids, answer_ids))
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
    model.train()
    for step in range(SFT_STEPS):
        batch = rng.sample(examples, SFT_BATCH)
        length = max(len(p) + len(a) for p, a in batch)
        ids = torch.full((SFT_BATCH, length), tokenizer.pad_token_id)
        labels = torch.full((SFT_BATCH, length), -100)
        mask = torch.zeros((SFT_BATCH, length), dtype=torch.long)
        for row, (p, a) in enumerate(batch):
            seq = p + a
            ids[row, : len(seq)] = torch.tensor(seq)
            labels[row, len(p) : len(seq)] = torch.tensor(a)  # loss on the answer only
            mask[row, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:  # linear decay to 10%
            group["lr"] = SFT_LR * (1 - 0.9 * step / SFT_STEPS)
        optimizer.step()
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


NEGATIVE_KINDS = {
    "last": (wrong_solution,),  # the final number changed, which also breaks the last equation
    "carried": (carried_error_solution,),  # a step's error carried through: only the reference rejects it
    "mixed": (wrong_solution, carried_error_solution),  # each problem's negative of either kind, evenly
}


def rm_pretraining_data(problems: int = RM_PROBLEMS, negatives: str = RM_NEGATIVES, label_noise: float = 0.0,
                        answer_key: float = 0.0) -> list[LabelledTriple]:
    """VerifyRM's pretraining examples: per problem its worked solution (label 1), one wrong solution of the
    `negatives` kind (label 0) and, ANSWERLESS_SHARE of the time, an answer-less text (label 0). With
    `label_noise`, that share of the labels is flipped, once and the same on every call, like annotators' mistakes.
    With `answer_key`, that share of the problems also has its bare right answer (label 1); the other examples are
    the same as without it (the answer key draws from a generator of its own)."""
    rng, kinds, triples = random.Random(1), NEGATIVE_KINDS[negatives], []
    key = random.Random(3)
    for p in make_split(problems, 0, "rm"):
        wrong = kinds[0] if len(kinds) == 1 else rng.choice(kinds)
        triples.append(LabelledTriple(p.question, p.answer, p.solution, True))
        triples.append(LabelledTriple(p.question, p.answer, wrong(p, rng), False))
        if rng.random() < ANSWERLESS_SHARE:
            triples.append(LabelledTriple(p.question, p.answer, "We compute the total. The answer is", False))
        if key.random() < answer_key:
            triples.append(LabelledTriple(p.question, p.answer, bare_answer(p, key, right_share=1.0), True))
    noise = random.Random(2)
    return [t if noise.random() >= label_noise else replace(t, label=not t.label) for t in triples]


def pretrained_rm(problems: int = RM_PROBLEMS, negatives: str = RM_NEGATIVES, epochs: int = RM_EPOCHS,
                  label_noise: float = 0.0, answer_key: float = 0.0) -> Any:
    """A fresh tiny VerifyRM after BCE pretraining on `rm_pretraining_data`."""
    import torch

    from cooper.config import OptimConfig
    from cooper.services.reward.verify_rm import VerifyRM

    torch.set_num_threads(1)
    rm = VerifyRM.load(str(tiny_reward_model_dir()), OptimConfig(), max_length=256, device="cpu", dtype="float32")
    triples = rm_pretraining_data(problems, negatives, label_noise, answer_key)
    # One epoch per AdamW, restarted each epoch (warm restarts). The reference check is learned suddenly, after a
    # plateau at AUROC ~0.6: with restarts it came by epoch 10 (mixed negatives); one AdamW over all epochs was
    # still on the plateau at epoch 26 (docs/experiments.md).
    for epoch in range(epochs if label_noise else max(epochs, RM_MAX_EPOCHS)):
        rm.pretrain(triples, epochs=1, lr=RM_LR, batch_size=32, seed=epoch + 1)
        if epoch + 1 >= epochs and not label_noise:
            check = reference_check(rm)
            log.info("VerifyRM pretraining: epoch %d, reference check AUROC %.3f", epoch + 1, check)
            if check >= REFERENCE_CHECK_AUROC:
                break
    return rm


def reference_check(rm: Any) -> float:
    """AUROC of `rm` between right worked solutions and wrong ones whose error is carried through consistently (only
    a comparison with the reference rejects them), on problems of a split no pretraining example comes from."""
    from cooper.services.reward.items import ScoreItem
    from cooper.tiny.quality import auroc

    rng, items, labels = random.Random(4), [], []
    for p in make_split(REFERENCE_CHECK_PROBES, 4, "probe"):
        items += [ScoreItem(p.question, p.answer, p.solution), ScoreItem(p.question, p.answer,
                                                                         carried_error_solution(p, rng))]
        labels += [True, False]
    ranked = auroc([score for score, _ in rm.score(items)], labels)
    return 0.0 if ranked is None else ranked


def _pretrain_rm(out: Path, label_noise: float = 0.0, answer_key: float = 0.0) -> None:
    rm = pretrained_rm(label_noise=label_noise, answer_key=answer_key)
    rm.model.save_pretrained(out, safe_serialization=True)
    rm.tokenizer.save_pretrained(out)


def tiny_sft_policy_dir() -> Path:
    return build_tiny("policy-sft", _sft)


def tiny_sft_hd32_policy_dir() -> Path:
    """The same SFT warm start on the tiny model with head_dim 32 ("tiny-hd32"), which vLLM's CPU build runs."""
    return build_tiny("policy-sft-hd32", lambda out: _sft(out, tiny_hd32_model_dir("causal")))


def tiny_pretrained_rm_dir() -> Path:
    return build_tiny("reward-pretrained", _pretrain_rm)


def tiny_noisy_rm_dir() -> Path:
    """The same VerifyRM pretrained on labels of which NOISY_LABEL_SHARE are flipped ("tiny-rm-noisy")."""
    return build_tiny("reward-pretrained-noisy", lambda out: _pretrain_rm(out, NOISY_LABEL_SHARE))


def tiny_keyed_rm_dir() -> Path:
    """The same VerifyRM with an answer key among its positives, ANSWER_KEY_SHARE of the problems ("tiny-rm-keyed")."""
    return build_tiny("reward-pretrained-keyed", lambda out: _pretrain_rm(out, answer_key=ANSWER_KEY_SHARE))
