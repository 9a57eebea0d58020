"""Best-of-n against the initial VerifyRM: the no-training baseline of the over-optimisation picture.

Sample N completions per test problem from the initial policy, score them with the initial VerifyRM (the proxy)
and check them with the rule verifier (the gold). Picking the RM's favourite of n samples moves the policy by
KL_bon = log n - (n - 1) / n nats (Gao et al. 2022), with no training at all: if the gold accuracy of the favourite
rises and then falls as n grows, the RM has blind spots that sampling alone finds, and RL against the frozen RM
will find them too. The curve is the exact expectation over every n-subset of the N samples, not a resampling.

Everything runs in this process through the services' in-process faces (`<service>/inprocess.py`: the cores the
services run, behind their clients' calls), so it measures the same models the run trains, without starting
services.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cooper.config import CooperConfig


@dataclass(frozen=True)
class BestOfN:
    n: int
    kl: float
    """KL(best-of-n || policy) = log n - (n - 1) / n, in nats"""
    gold: float
    """expected verifier accuracy of the RM's favourite of n samples"""
    proxy: float
    """expected RM score (sigmoid) of that favourite"""


def best_of_n_kl(n: int) -> float:
    return math.log(n) - (n - 1) / n


def best_of_n_curve(groups: Sequence[Sequence[tuple[float, bool]]], ns: Sequence[int]) -> list[BestOfN]:
    """Expected gold and proxy of the best of n, per n, from (RM score, verifier-correct) of N samples per problem.

    For N samples ranked by score (highest first), the one at rank i (0-based) is the favourite of a uniformly
    drawn n-subset with probability C(N - 1 - i, n - 1) / C(N, n): it must be drawn, and the other n - 1 must come
    from the N - 1 - i below it. Ties keep the sampling order (a stable sort), as `max` over a list would.
    """
    if not groups:
        raise ValueError("best_of_n_curve needs at least one problem")
    size = len(groups[0])
    if any(len(g) != size for g in groups):
        raise ValueError("every problem needs the same number of samples")
    curve = []
    for n in ns:
        if not 1 <= n <= size:
            raise ValueError(f"n={n} is outside 1..{size} (the samples per problem)")
        weights = [math.comb(size - 1 - i, n - 1) / math.comb(size, n) for i in range(size)]
        gold = proxy = 0.0
        for group in groups:
            ranked = sorted(group, key=lambda sample: -sample[0])
            gold += sum(w * correct for w, (_, correct) in zip(weights, ranked, strict=True))
            proxy += sum(w * score for w, (score, _) in zip(weights, ranked, strict=True))
        curve.append(BestOfN(n, best_of_n_kl(n), gold / len(groups), proxy / len(groups)))
    return curve


Judged = list[tuple[Any, list[tuple[float, bool, str]]]]
"""[(problem, [(initial-RM score, verifier-correct, text) per sample])]"""


def sample_and_judge(config: CooperConfig, policy_models: Sequence[str], samples: int, max_problems: int
                     ) -> tuple[str, dict[str, Judged]]:
    """(benchmark, {policy model: its samples judged}) for `samples` samples of each of `policy_models` (model
    names or directories) on the first test benchmark's first `max_problems` problems. The data and the initial
    VerifyRM are loaded once for all of them."""
    from cooper.orchestrator.data import load_data, prompt_text
    from cooper.reward_rule import logit_to_reward
    from cooper.services.policy.inprocess import InProcessPolicy
    from cooper.services.reward.inprocess import InProcessReward
    from cooper.services.reward.items import ScoreItem
    from cooper.services.verifier.inprocess import InProcessVerifier
    from cooper.services.verifier.messages import Verdict, VerifyItem

    _, tests = load_data(config)
    benchmark, rows = next(iter(tests.items()))
    rows = rows[:max_problems]
    prompts = [(row.id, prompt_text(config, row)) for row in rows]
    sampling = config.policy.sampling
    out: dict[str, Judged] = {}
    with tempfile.TemporaryDirectory() as empty:  # no checkpoint to resume from: the named models themselves
        reward = InProcessReward(config.reward.model_copy(update={"checkpoint_dir": f"{empty}/reward",
                                                                  "save_on_stop": False}))
        verifier = InProcessVerifier(config.verifier)
        try:
            for k, model in enumerate(policy_models):
                policy = InProcessPolicy(config.policy.model_copy(update={
                    "checkpoint_dir": f"{empty}/policy-{k}", "model": model, "save_on_stop": False}))
                try:
                    generated = policy.generate(prompts, n=samples, temperature=sampling.temperature,
                                                top_p=sampling.top_p, max_new_tokens=sampling.max_new_tokens,
                                                stop=sampling.stop, seed=config.run.seed).completions
                finally:
                    policy.close()
                judged = []
                for g, row in enumerate(rows):
                    texts = [c.text for c in generated[g * samples:(g + 1) * samples]]
                    # Probabilities from the logits: with reward.discrete the scores are 0/1, and best-of-n ranks.
                    logits = reward.score([ScoreItem(row.question, row.answer, t) for t in texts]).logits
                    verdicts = verifier.verify([VerifyItem(str(i), t, row.answer) for i, t in enumerate(texts)])
                    judged.append((row, [(logit_to_reward(x), v.verdict == Verdict.CORRECT, t)
                                         for x, v, t in zip(logits, verdicts, texts, strict=True)]))
                out[model] = judged
        finally:
            verifier.close()
            reward.close()
    return benchmark, out


def top_scored_wrong(judged: Judged, k: int = 8) -> list[dict[str, Any]]:
    """The k verifier-wrong samples the initial RM scores highest: what a policy exploiting it would write."""
    wrong = [(score, row, text) for row, group in judged for score, correct, text in group if not correct]
    wrong.sort(key=lambda x: -x[0])
    return [{"score": round(score, 4), "question": row.question, "reference": row.answer, "completion": text}
            for score, row, text in wrong[:k]]


def measure_best_of_n(config: CooperConfig, samples: int = 64, max_problems: int = 48,
                      ns: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)) -> dict[str, Any]:
    """Sample the initial policy on the first test benchmark: the curve, and the initial RM's worst favourites."""
    benchmark, by_model = sample_and_judge(config, [config.policy.model], samples, max_problems)
    judged = by_model[config.policy.model]
    curve = best_of_n_curve([[(s, c) for s, c, _ in group] for _, group in judged], [n for n in ns if n <= samples])
    return {"benchmark": benchmark, "problems": len(judged), "samples": samples, "curve": [c.__dict__ for c in curve],
            "top_scored_wrong": top_scored_wrong(judged)}
