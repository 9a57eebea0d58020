"""`cooper eval-rm`: VerifyRM and the rule verifier on a labelled benchmark (cooper/evaluation/rm_bench.py), through
the running services when their addresses are configured, else in this process as the services would."""

from __future__ import annotations

import tempfile
from typing import Any

from cooper.evaluation.rm_bench import compare_judges, load_bench
from cooper.orchestrator.services import ConfiguredServices, Services


def judges(config: Any, scratch: str) -> Services:
    """VerifyRM and the verifier as the stages call them: each through its running service when its
    `server.address` is configured, else built in this process as the service builds it (reward.model: a tiny name,
    a hub id or a model directory such as a run's reward checkpoint; never a checkpoint under reward.checkpoint_dir,
    which `scratch`, an empty directory, stands in for)."""
    reward = config.reward.model_copy(update={"checkpoint_dir": f"{scratch}/reward", "save_on_stop": False})
    config = config.model_copy(update={"reward": reward})

    return ConfiguredServices(config)


def run_eval_rm(config: Any, source: str) -> dict[str, Any]:
    """`cooper eval-rm`: both judges on the benchmark `source` (a file, or `tiny`); the report as a dict. VerifyRM's
    scores are probabilities, sigmoid of its logits, whatever reward.discrete says: the report ranks them (AUROC)."""
    from cooper.reward_rule import logit_to_reward
    from cooper.services.reward.items import ScoreItem
    from cooper.services.verifier.messages import Verdict, pair_items

    items = load_bench(source)
    with tempfile.TemporaryDirectory() as scratch:
        services = judges(config, scratch)
        try:
            scored = services.reward.score([ScoreItem(i.question, i.reference, i.completion) for i in items])
            verdicts = services.verifier.verify(pair_items([(i.completion, i.reference) for i in items]))
        finally:
            services.close()
    version = scored.version if config.reward.server.address else None
    return {"input": source, "reward_model": config.reward.model, "reward_version": version,
            **compare_judges(items, [logit_to_reward(x) for x in scored.logits],
                             [Verdict(v.verdict).name for v in verdicts])}
