"""The reward modes, in one place: what each means for the services a run needs and the stages it runs.

A mode answers two questions, and everything else follows from them (graph.py, stages.py, local.py, the alarm):
does VerifyRM score the rollouts (else the rule verifier's 1/0 is the reward), and does VerifyRM learn every step
from verified positives and generated negatives (Cooper's co-optimisation). A new mode is one entry here, and stage
functions for whatever it does differently. No torch, no config: the CLI and the config import this.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewardMode:
    name: str
    reward_model_scores: bool
    """The policy's reward is VerifyRM's score; else the verifier's 1 (CORRECT) or 0."""
    reward_model_learns: bool
    """VerifyRM is updated every step (negatives, reward_update), so score(t) waits for the update of step t-1."""
    summary: str

    @property
    def reward_source(self) -> str:
        """Where the policy's reward comes from while the reward-hacking alarm does not act."""
        return "reward_model" if self.reward_model_scores else "verifier"

    def services(self, negatives: str) -> list[str]:
        """The services a run calls, given where its negatives come from (run.negatives): the generator only when
        it writes them."""
        names = ["verifier", "policy"]
        if self.reward_model_scores:
            names.append("reward")
        if self.reward_model_learns and negatives in ("generator", "both"):
            names.append("generator")
        return names


RULE = RewardMode("rule", reward_model_scores=False, reward_model_learns=False,
                  summary="the verifier's 1/0; no reward model")
STATIC = RewardMode("static", reward_model_scores=True, reward_model_learns=False,
                    summary="VerifyRM scores and is never updated")
COOPER = RewardMode("cooper", reward_model_scores=True, reward_model_learns=True,
                    summary="VerifyRM scores and is updated every step (the paper's method)")

MODES = {mode.name: mode for mode in (RULE, STATIC, COOPER)}


def reward_mode(name: str) -> RewardMode:
    """The mode called `name` (run.mode); ValueError naming the modes there are."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"unknown reward mode {name!r}: one of {', '.join(MODES)}") from None


# The recipes of cooper mode, as `cooper experiment --modes` names them beside the reward modes.

PAPER_RECIPE = ("run.negatives=generator", "reward.replay_updates=0", "reward.update_steps=1",
                "reward.calibration_weight=0")
"""Overrides that make cooper mode's reward-model update the paper's rule: negatives written by the generator, one
Bradley-Terry step per update on that step's pairs, no replay, no calibration term. The tiny preset's default is a
variant of it (negatives from the policy's rejected rollouts and the generator, replay, calibration: configs/tiny.yaml
says why)."""

EXPERIMENT_LABELS = {"rule": ("rule", ()), "static": ("static", ()), "cooper": ("cooper", ()),
                     "cooper-rollouts": ("cooper", ("run.negatives=rollouts",)),
                     "cooper-paper": ("cooper", (*PAPER_RECIPE, "generator.strategy=varied"))}
"""What `cooper experiment --modes` takes: label -> (run.mode, the overrides beside it). `cooper-paper` runs the
paper's recipe beside the preset's cooper, `cooper-rollouts` the variant with negatives from the rejected rollouts
alone (the tiny preset's cooper takes the generator's too); on the tiny preset the `varied` generator stands in for
the paper's assistant LLM (cooper/services/generator/varied.py)."""
