"""The model as every peer server runs it: Cooper's own Encoder (VerifyRM template, `split_special_tokens`) and
VerifyRM.logits (right padding, passes sorted by length, the linear layers' kernel chosen as the service chooses it),
so that a peer's scores can only differ from the service's by float rounding, and its speed only by how it serves.

Runs inside a peer's own environment (bench/peers/setup.sh), imported with the repository on PYTHONPATH. The model
directory, the torch thread count and the device come from the environment the bench sets:
COOPER_BENCH_MODEL_DIR, COOPER_BENCH_THREADS, COOPER_BENCH_DEVICE. Any VerifyRM directory: the tokenizer is the
model's own (the tiny models' or a real one's, such as SmolLM2's), read by AutoTokenizer as the service reads it.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from cooper.config import OptimConfig, RewardConfig
from cooper.reward_rule import logit_to_reward
from cooper.services.reward.items import ScoreItem
from cooper.services.reward.serving_defaults import CALIBRATION_TOKENS
from cooper.services.reward.verify_rm import VerifyRM

MAX_LENGTH = RewardConfig.model_fields["max_length"].default  # as the service runs it


class BenchModel:
    def __init__(self) -> None:
        torch.set_num_threads(int(os.environ.get("COOPER_BENCH_THREADS", "1")))
        self.rm = VerifyRM.load(os.environ["COOPER_BENCH_MODEL_DIR"], OptimConfig(), MAX_LENGTH,
                                device=os.environ.get("COOPER_BENCH_DEVICE", "cpu"), dtype="float32")
        self.rm.choose_linear_kernel(CALIBRATION_TOKENS)  # as the service chooses at start-up (reward.cpu_linear)

    def encode(self, items: list[dict[str, str]]) -> list[list[int]]:
        return self.rm.encode([ScoreItem(i["question"], i["reference"], i["completion"]) for i in items])

    def score_tokens(self, token_lists: list[list[int]]) -> list[dict[str, float]]:
        """One {"score", "logit"} per row, in order; one batch, cut into passes of at most 64 rows (the service's
        reward.batching.max_batch_size)."""
        return [{"score": logit_to_reward(x), "logit": x} for x in self.rm.logits(token_lists, 64)]

    def score(self, items: list[dict[str, Any]]) -> list[dict[str, float]]:
        return self.score_tokens(self.encode(items))
