"""Cooper's reward model from TRL (cooper/integrations/trl.py): the reward function against a real reward service in
its learning mode (HTTP through uvicorn, the verifier's worker processes, VerifyRM's updates), called as TRL calls
it, and inside TRL's own GRPOTrainer on the tiny models."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from cooper.config import DataConfig, LearnOnlineConfig
from cooper.integrations.trl import CooperReward, RewardServiceError
from cooper.tiny.task import make_split, wrong_solution

sys.path.insert(0, str(Path(__file__).parent / "reward"))
from reward_testkit import make_config, serve_http  # noqa: E402  (the reward tests' kit)


def trl_batch(seed: int = 0) -> dict:  # type: ignore[type-arg]
    """A generation batch as TRL hands it to a reward function, conversational: 4 prompts x 3 completions (right,
    wrong, no answer), the dataset's `answer` column beside them."""
    rng = random.Random(seed)
    prompts, completions, answers = [], [], []
    for p in make_split(4, seed, "trl"):
        for text in (p.solution, wrong_solution(p, rng), "Let me think about it."):
            prompts.append([{"role": "user", "content": p.question}])
            completions.append([{"role": "assistant", "content": text}])
            answers.append(p.answer)
    return {"prompts": prompts, "completions": completions, "answer": answers}


@pytest.mark.slow
def test_each_call_scores_with_one_version_then_learns_from_the_batch(tmp_path):
    with serve_http(make_config(tmp_path, learn_online=LearnOnlineConfig(enabled=True))) as served:
        reward = CooperReward(served.url)
        first = reward(**trl_batch(0))
        assert len(first) == 12 and all(0.0 <= s <= 1.0 for s in first)
        assert reward.versions == [0] and reward.last_learn is not None
        assert (reward.last_learn["version"], reward.last_learn["pairs"]) == (1, 8)  # 4 right, each against 2
        again = reward(**trl_batch(0))
        assert reward.versions == [0, 1]  # the next batch is scored by the version that learnt from the first
        assert again != first

        frozen = CooperReward(served.url, learn=False)  # the static baseline: the same service, never learning
        frozen(**trl_batch(1))
        frozen(**trl_batch(1))
        assert frozen.versions == [2, 2] and frozen.last_learn is None

        class LearntElsewhereMidBatch(CooperReward):
            """Another trainer's learning step lands between the two scoring requests of this batch."""

            def _post(self, path: str, body: dict) -> dict:  # type: ignore[type-arg]
                reply = super()._post(path, body)
                if path == "/v1/score" and reply["version"] == 2:
                    assert CooperReward(served.url)._post("/v1/learn", {})["version"] == 3
                return reply

        with pytest.raises(RewardServiceError, match=r"scored by VerifyRM versions \[2, 3\]"):
            LearntElsewhereMidBatch(served.url, learn=False, max_items=6)(**trl_batch(2))

        with pytest.raises(KeyError, match="reference_key"):
            reward(**{k: v for k, v in trl_batch(0).items() if k != "answer"}, ground_truth=["1"] * 12)


def test_a_service_that_does_not_learn_is_named_in_the_error(tmp_path):
    with serve_http(make_config(tmp_path)) as served:
        with pytest.raises(RewardServiceError, match="409.*reward.learn_online.enabled=true"):
            CooperReward(served.url)(**trl_batch(0))
    with pytest.raises(RewardServiceError, match="could not be reached"):
        CooperReward("http://127.0.0.1:9", retries=0, timeout_s=5)(**trl_batch(0))


@pytest.mark.slow
def test_trls_grpo_trainer_runs_with_the_learning_reward_model(tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from cooper.runtime.models import resolve_model

    # the tiny preset's prompts (its data.prompt_template, the default: the paper's instruction) and sampling
    rows = [{"prompt": [{"role": "user", "content": DataConfig().prompt_template.replace("{question}", p.question)}],
             "question": p.question, "answer": p.answer} for p in make_split(32, 0, "trl-train")]
    config = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, gradient_checkpointing=False, max_steps=3,
        per_device_train_batch_size=8, gradient_accumulation_steps=1, num_generations=4, max_completion_length=40,
        temperature=1.0, learning_rate=1e-4, logging_steps=1, report_to="none", save_strategy="no",
        log_completions=False, seed=0, dataloader_num_workers=0, shuffle_dataset=False)
    with serve_http(make_config(tmp_path, learn_online=LearnOnlineConfig(enabled=True))) as served:
        reward = CooperReward(served.url, question_key="question")
        trainer = trl.GRPOTrainer(model=str(resolve_model("tiny-sft", "causal")), reward_funcs=reward, args=config,
                                  train_dataset=datasets.Dataset.from_list(rows))
        trainer.train()
    # one call per generation batch, each scored by the version the previous batch's learning step made
    assert reward.versions == [0, 1, 2], (reward.versions, reward.last_learn)
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert len(logged) == 3 and len({round(entry["reward"], 6) for entry in logged}) > 1
