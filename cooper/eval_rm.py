"""`cooper eval-rm`: VerifyRM and the rule verifier on a labelled benchmark (cooper/evaluation/rm_bench.py), through
the running services when their addresses are configured, else in this process as the services would."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cooper.evaluation.rm_bench import BenchItem, compare_judges, load_bench


def score_with_reward_model(config: Any, items: Sequence[BenchItem]) -> tuple[list[float], int | None]:
    """(sigmoid scores in item order, the model version or None). Through the running reward service when
    reward.server.address names one (its current version), else reward.model loaded here the way the service
    loads it (a tiny name, a hub id or a model directory such as a run's reward checkpoint)."""
    from cooper.services.reward.items import ScoreItem

    score_items = [ScoreItem(i.question, i.reference, i.completion) for i in items]
    reward = config.reward
    if reward.server.address:
        from cooper.services.reward.client import RewardClient

        with RewardClient(reward.server.address, reward.server, config.security) as client:
            result = client.score(score_items)
        return list(result.scores), result.version
    import torch

    from cooper.reward_rule import logit_to_reward
    from cooper.runtime.models import resolve_model
    from cooper.services.reward.verify_rm import VerifyRM

    if reward.torch_threads:
        torch.set_num_threads(reward.torch_threads)
    rm = VerifyRM.load(resolve_model(reward.model, "reward"), reward.optim, reward.max_length, reward.device,
                       reward.dtype)
    logits = rm.logits(rm.encode(score_items), reward.batching.max_batch_size, reward.batching.max_tokens)
    return [logit_to_reward(x) for x in logits], None


def verify_with_rules(config: Any, items: Sequence[BenchItem]) -> list[str]:
    """Verdict names in item order: through the running verifier service when verifier.server.address names one,
    else math-verify in worker processes started here (the service's own pool, same time limits)."""
    pairs = [(i.completion, i.reference) for i in items]
    verifier = config.verifier
    if verifier.server.address:
        from cooper.services.verifier.client import Verdict, VerifierClient

        with VerifierClient(verifier.server.address, verifier.server, config.security) as client:
            return [Verdict.Name(r.verdict) for r in client.verify_pairs(pairs)]
    from cooper.services.verifier.pool import VerifierPool

    pool = VerifierPool(verifier.workers, verifier.timeout_s, verifier.chunk_size, verifier.max_chars)
    try:
        return [check.verdict.name for check in pool.check_all(pairs)]
    finally:
        pool.close()


def run_eval_rm(config: Any, source: str) -> dict[str, Any]:
    """`cooper eval-rm`: both judges on the benchmark `source` (a file, or `tiny`); the report as a dict."""
    items = load_bench(source)
    scores, version = score_with_reward_model(config, items)
    verdicts = verify_with_rules(config, items)
    return {"input": source, "reward_model": config.reward.model, "reward_version": version,
            **compare_judges(items, scores, verdicts)}
