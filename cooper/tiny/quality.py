"""What the tiny preset's built models measure: the numbers a shipped set documents (manifest.json) and a rebuild
must meet.

- The SFT policy: its sampled accuracy (T = 1, 40 new tokens, the boxed answer against the reference) on problems of
  a split, overall and per answer form: worked solutions, which a 2-layer model computes well, and bare answers
  ("The answer is \\boxed{56}."), which it mostly guesses (warm_start.py says why the SFT mixes the two).
- A VerifyRM: how well its scores rank those same samples (AUROC against the boxed-answer labels), and its mean score
  per answer form, right and wrong: what a frozen copy pays each behaviour of the initial policy.

Not bit-equality: float kernels differ between CPU kinds, so a rebuild on another machine is another model; what must
hold is that it is as good a starting point.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cooper.dataset_formats import last_boxed
from cooper.tiny.task import Problem, make_split

Sample = tuple[Problem, str, bool]
"""(problem, completion, whether its boxed answer is the reference)."""


def is_bare(completion: str) -> bool:
    """An answer with no work shown ("The answer is \\boxed{56}.")."""
    return completion.strip().startswith("The answer is")


def policy_samples(source: str | Path, prompts: int, k: int, split: str = "train", seed: int = 3) -> list[Sample]:
    """`k` completions at T = 1 of each of `prompts` problems of `split`, from the causal LM at `source`, labelled
    by their boxed answer against the reference (the verifier's `answer: boxed` rule)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cooper.config import DataConfig

    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(source).eval()
    template = DataConfig().prompt_template
    problems, samples = make_split(prompts, seed, split), []
    torch.manual_seed(0)
    for start in range(0, len(problems), 64):
        chunk = problems[start : start + 64]
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": template.replace("{question}",
                 p.question)}], tokenize=False, add_generation_prompt=True) for p in chunk]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**encoded, do_sample=True, temperature=1.0, max_new_tokens=40,
                                 num_return_sequences=k, pad_token_id=tokenizer.pad_token_id)
        completions = tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
        for index, text in enumerate(completions):
            problem = chunk[index // k]
            boxed = last_boxed(text)
            samples.append((problem, text, boxed is not None and boxed.strip() == problem.answer))
    return samples


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def policy_quality(samples: list[Sample]) -> dict[str, Any]:
    """Accuracy overall and per answer form, and the share of bare answers."""
    worked = [right for _, text, right in samples if not is_bare(text)]
    bare = [right for _, text, right in samples if is_bare(text)]
    return {"accuracy": _mean([float(right) for _, _, right in samples]), "worked_accuracy": _mean(list(map(float, worked))),
            "bare_accuracy": _mean(list(map(float, bare))), "bare_share": round(len(bare) / len(samples), 4)}


def auroc(scores: list[float], labels: list[bool]) -> float | None:
    """None when every sample is right, or every one wrong: there is nothing to rank."""
    right = [s for s, label in zip(scores, labels, strict=True) if label]
    wrong = [s for s, label in zip(scores, labels, strict=True) if not label]
    if not right or not wrong:
        return None
    return sum((a > b) + 0.5 * (a == b) for a in right for b in wrong) / (len(right) * len(wrong))


def by_form(samples: list[Sample], scores: list[float]) -> dict[str, object]:
    """Mean score per answer form (bare or worked) and right or wrong, each form's mean, and the bare share."""
    groups: dict[tuple[str, bool], list[float]] = {}
    for (_, text, right), score in zip(samples, scores, strict=True):
        groups.setdefault(("bare" if is_bare(text) else "worked", right), []).append(score)
    out: dict[str, object] = {f"{form}/{'right' if right else 'wrong'}": {"n": len(v), "mean": _mean(v)}
                              for (form, right), v in sorted(groups.items())}
    for form in ("bare", "worked"):
        out[f"{form}_mean"] = _mean([x for (f, _), v in groups.items() if f == form for x in v])
    out["bare_share"] = round(sum(len(v) for (f, _), v in groups.items() if f == "bare") / len(samples), 4)
    return out


def reward_model_quality(source: str | Path, samples: list[Sample]) -> dict[str, Any]:
    """The VerifyRM at `source` on `samples`: AUROC over all of them and over the worked solutions alone, and its
    mean score per answer form, right and wrong."""
    from cooper.config import OptimConfig
    from cooper.services.reward.items import ScoreItem
    from cooper.services.reward.verify_rm import VerifyRM

    rm = VerifyRM.load(str(source), OptimConfig(), max_length=256, device="cpu", dtype="float32")
    scores = [s for s, _ in rm.score([ScoreItem(p.question, p.answer, text) for p, text, _ in samples])]
    labels = [right for _, _, right in samples]
    worked = [(s, label) for s, label, (_, text, _) in zip(scores, labels, samples, strict=True) if not is_bare(text)]
    ranked = auroc(scores, labels)
    ranked_worked = auroc([s for s, _ in worked], [label for _, label in worked])
    return {"auroc": None if ranked is None else round(ranked, 4),
            "auroc_worked": None if ranked_worked is None else round(ranked_worked, 4),
            "mean": _mean(scores), **by_form(samples, scores)}
