"""The stage jobs: plain functions `stage(ctx, step) -> result dict`, keyed by name in STAGES.

Each reads its inputs from the results of the jobs it depends on, calls services through their clients, and
returns a JSON-able result that the worker records in Redis. Re-running a job is harmless: Generate is seeded
by (run seed, step), Train and Update carry the idempotency key (run id, step), the rest are pure reads.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cooper.config import CooperConfig
from cooper.orchestrator import graph
from cooper.orchestrator.data import Example, StepData, prompt_text
from cooper.orchestrator.queue import RunStore
from cooper.protos.policy.v1 import policy_pb2


def step_seed(seed: int, step: int, purpose: str) -> int:
    """A stable 31-bit seed per (run seed, step, purpose), the same in every process and on every re-run."""
    digest = hashlib.sha256(f"{seed}:{step}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


@dataclass
class StageContext:
    """What stage jobs share: config, run id, the store, the data, and lazily opened service clients."""

    config: CooperConfig
    run_id: str
    store: RunStore
    data: StepData
    tests: dict[str, list[Example]]
    addresses: dict[str, str]
    _clients: dict[str, Any] = field(default_factory=dict)

    def client(self, name: str) -> Any:
        if name not in self._clients:
            if name not in self.addresses:
                raise RuntimeError(f"stage needs the {name} service, but no address is configured for it")
            server_config = getattr(self.config, name).server
            if name == "policy":
                from cooper.services.policy.client import PolicyClient as cls
            elif name == "reward":
                from cooper.services.reward.client import RewardClient as cls  # type: ignore[assignment]
            elif name == "verifier":
                from cooper.services.verifier.client import VerifierClient as cls  # type: ignore[assignment]
            else:
                from cooper.services.generator.client import GeneratorClient as cls  # type: ignore[assignment]
            self._clients[name] = cls(self.addresses[name], server_config)
        return self._clients[name]

    def result(self, stage: str, step: int) -> dict[str, Any]:
        return self.store.result(graph.Job(step, stage).id)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def _completion_dict(c: policy_pb2.Completion) -> dict[str, Any]:
    # Plain fields, not json_format: that costs ~0.7 ms a completion, on the critical path of every step.
    return {"prompt_id": c.prompt_id, "index": c.index, "text": c.text, "token_ids": list(c.token_ids),
            "logprobs": list(c.logprobs), "finish_reason": c.finish_reason,
            "prompt_token_ids": list(c.prompt_token_ids)}


def _completions(rollout: dict[str, Any]) -> list[policy_pb2.Completion]:
    return [policy_pb2.Completion(**c) for c in rollout["completions"]]


def _examples_by_id(rollout: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {p["id"]: p for p in rollout["prompts"]}


def rollout(ctx: StageContext, step: int) -> dict[str, Any]:
    examples = ctx.data.batch(step)
    sampling = ctx.config.policy.sampling
    # Prompt ids carry the step and slot, so a prompt that recurs in a later epoch is still a distinct group.
    prompts = [{"id": f"{step}-{k}-{e.id}", "question": e.question, "answer": e.answer, "example": e.id}
               for k, e in enumerate(examples)]
    reply = ctx.client("policy").generate(
        [(p["id"], prompt_text(ctx.config, e)) for p, e in zip(prompts, examples, strict=True)],
        n=sampling.n, temperature=sampling.temperature, top_p=sampling.top_p,
        max_new_tokens=sampling.max_new_tokens, stop=sampling.stop, seed=step_seed(ctx.config.run.seed, step, "rollout"),
    )
    completions = [_completion_dict(c) for c in reply.completions]
    epoch, offset = ctx.data.position(step)
    return {"policy_version": reply.version, "prompts": prompts, "completions": completions,
            "data_position": {"epoch": epoch, "offset": offset}}


def verify(ctx: StageContext, step: int) -> dict[str, Any]:
    from cooper.services.verifier.client import Verdict, VerifyItem

    ro = ctx.result(graph.ROLLOUT, step)
    by_id = _examples_by_id(ro)
    items = [VerifyItem(id=str(k), completion=c.get("text", ""), reference=by_id[c["prompt_id"]]["answer"])
             for k, c in enumerate(ro["completions"])]
    results = ctx.client("verifier").verify(items)
    return {"verdicts": [Verdict.Name(r.verdict) for r in results], "extracted": [r.extracted for r in results]}


def score(ctx: StageContext, step: int) -> dict[str, Any]:
    if ctx.config.run.mode == "rule":  # the verifier's 1/0; the reward service is never called
        verdicts = ctx.result(graph.VERIFY, step)["verdicts"]
        return {"rewards": [1.0 if v == "CORRECT" else 0.0 for v in verdicts], "logits": [], "reward_version": -1}
    from cooper.services.reward.items import ScoreItem

    ro = ctx.result(graph.ROLLOUT, step)
    by_id = _examples_by_id(ro)
    items = [ScoreItem(question=by_id[c["prompt_id"]]["question"], reference=by_id[c["prompt_id"]]["answer"],
                       completion=c.get("text", "")) for c in ro["completions"]]
    result = ctx.client("reward").score(items)
    return {"rewards": list(result.scores), "logits": list(result.logits), "reward_version": result.version}


def policy_update(ctx: StageContext, step: int) -> dict[str, Any]:
    ro, sc = ctx.result(graph.ROLLOUT, step), ctx.result(graph.SCORE, step)
    reply = ctx.client("policy").train(ctx.run_id, step, _completions(ro), sc["rewards"],
                                       ctx.config.policy.sampling.n)
    return {"metrics": dict(reply.metrics), "policy_version": reply.version, "replayed": reply.replayed}


def negatives(ctx: StageContext, step: int) -> dict[str, Any]:
    from cooper.services.generator.client import NegativeItem

    ro, ve = ctx.result(graph.ROLLOUT, step), ctx.result(graph.VERIFY, step)
    # The positive of a prompt is its first completion the verifier marks correct (DESIGN.md section 1, step 6).
    positives: dict[str, str] = {}
    for completion, verdict in zip(ro["completions"], ve["verdicts"], strict=True):
        if verdict == "CORRECT" and completion["prompt_id"] not in positives:
            positives[completion["prompt_id"]] = completion.get("text", "")
    by_id = _examples_by_id(ro)
    items = [NegativeItem(id=pid, question=by_id[pid]["question"], reference=by_id[pid]["answer"], positive=text)
             for pid, text in positives.items()]
    results = ctx.client("generator").negatives(items) if items else []
    pairs = [{"question": by_id[r.id]["question"], "reference": by_id[r.id]["answer"],
              "positive": positives[r.id], "negative": r.negative} for r in results if r.valid]
    return {"pairs": pairs, "prompts": len(ro["prompts"]), "positives": len(items),
            "attempts": sum(r.attempts for r in results), "rejections": [list(r.rejections) for r in results]}


def reward_update(ctx: StageContext, step: int) -> dict[str, Any]:
    from cooper.services.reward.items import PreferencePair

    ng = ctx.result(graph.NEGATIVES, step)
    pairs = [PreferencePair(**p) for p in ng["pairs"]]
    r = ctx.client("reward").update(ctx.run_id, step, pairs)
    return {"loss": r.loss, "grad_norm": r.grad_norm, "pair_accuracy_before": r.pair_accuracy_before,
            "pair_accuracy_after": r.pair_accuracy_after, "reward_version": r.version, "skipped": r.skipped,
            "replayed": r.replayed, "pairs": len(pairs)}


def evaluate(ctx: StageContext, step: int) -> dict[str, Any]:
    """Mean verifier accuracy of k samples per held-out problem, per benchmark."""
    from cooper.services.verifier.client import Verdict, VerifyItem

    ev = ctx.config.eval
    accuracies: dict[str, float] = {}
    version = -1
    for name, rows in ctx.tests.items():
        rows = rows[: ev.max_problems] if ev.max_problems else rows
        reply = ctx.client("policy").generate(
            [(row.id, prompt_text(ctx.config, row)) for row in rows], n=ev.k, temperature=ev.temperature,
            top_p=ev.top_p, max_new_tokens=ctx.config.policy.sampling.max_new_tokens,
            stop=ctx.config.policy.sampling.stop, seed=step_seed(ctx.config.run.seed, step, f"eval:{name}"),
        )
        version = reply.version
        answers = {row.id: row.answer for row in rows}
        items = [VerifyItem(id=str(k), completion=c.text, reference=answers[c.prompt_id])
                 for k, c in enumerate(reply.completions)]
        verdicts = ctx.client("verifier").verify(items)
        accuracies[name] = statistics.fmean(v.verdict == Verdict.CORRECT for v in verdicts) if verdicts else 0.0
    return {"accuracy": accuracies, "policy_version": version}


STAGES: dict[str, Callable[[StageContext, int], dict[str, Any]]] = {
    graph.ROLLOUT: rollout,
    graph.VERIFY: verify,
    graph.SCORE: score,
    graph.POLICY_UPDATE: policy_update,
    graph.NEGATIVES: negatives,
    graph.REWARD_UPDATE: reward_update,
    graph.EVALUATE: evaluate,
}
