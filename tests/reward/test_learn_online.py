"""The reward service learning from what it scores (reward.learn_online; cooper/services/reward/learner.py): real
HTTP through uvicorn, the rule verifier's worker processes, VerifyRM's Bradley-Terry update, checkpoints."""

from __future__ import annotations

import random
import time

import httpx
import pytest
from reward_testkit import make_config, serve_http

from cooper.config import ConfigError, LearnOnlineConfig, load_config
from cooper.services.reward.items import PreferencePair, ScoreItem, pairs_within_groups
from cooper.services.verifier.messages import Verdict
from cooper.tiny.task import make_split, wrong_solution


def batch(seed: int = 0) -> list[dict[str, str]]:
    """Per problem: its worked solution (right), a near miss (wrong) and no answer at all."""
    rng, items = random.Random(seed), []
    for p in make_split(6, seed, "learn-online"):
        for completion in (p.solution, wrong_solution(p, rng), "I am not sure how to do this."):
            items.append({"question": p.question, "reference": p.answer, "completion": completion})
    return items


def score(url: str, items: list[dict[str, str]]) -> dict:  # type: ignore[type-arg]
    reply = httpx.post(f"{url}/v1/score", json={"items": items}, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def margin(scored: dict) -> float:  # type: ignore[type-arg]
    """Mean logit of the right completions minus that of the others (every third item is right)."""
    logits = [s["logit"] for s in scored["scores"]]
    right = logits[0::3]
    others = logits[1::3] + logits[2::3]
    return sum(right) / len(right) - sum(others) / len(others)


@pytest.mark.slow
def test_a_learning_step_trains_on_what_was_scored_and_the_next_scores_name_the_new_version(tmp_path):
    items = batch()
    config = make_config(tmp_path, learn_online=LearnOnlineConfig(enabled=True))
    # Another question with the first one's reference, answered wrongly and never rightly: a group is a question
    # with its reference, so this answer has no right one to be paired against (not the first question's).
    same_reference = {"question": "A question of its own with the same answer.", "reference": items[0]["reference"],
                      "completion": items[1]["completion"]}
    with serve_http(config) as served:
        before = score(served.url, items)
        assert before["version"] == 0
        score(served.url, [same_reference])
        step = httpx.post(f"{served.url}/v1/learn", timeout=120).json()
        # 6 questions: each one right, one wrong and one without an answer -> 12 pairs, all against the right one
        assert step | {"pair_accuracy_before": None, "pair_accuracy_after": None} == {
            "version": 1, "completions": 19, "correct": 6, "rejected": 13, "unchecked": 0, "pairs": 12,
            "dropped": 0, "pair_accuracy_before": None, "pair_accuracy_after": None}
        assert step["pair_accuracy_after"] >= step["pair_accuracy_before"]
        after = score(served.url, items)
        assert after["version"] == 1  # every score names the version that produced it
        assert margin(after) > margin(before)  # it learnt the comparison it was shown
        again = httpx.post(f"{served.url}/v1/learn", timeout=120).json()
        assert (again["completions"], again["version"]) == (18, 2)  # the second scoring's completions
        idle = httpx.post(f"{served.url}/v1/learn", timeout=120).json()
        assert (idle["completions"], idle["pairs"], idle["version"]) == (0, 0, 2)  # nothing new: no update
    with serve_http(config) as restarted:  # journaled and checkpointed as a Cooper run's updates are
        assert httpx.get(f"{restarted.url}/v1/model", timeout=30).json()["version"] == 2


@pytest.mark.slow
def test_every_n_requests_learns_by_itself_through_the_model_process(tmp_path):
    config = make_config(tmp_path, model_process=True,
                         learn_online=LearnOnlineConfig(enabled=True, every_requests=2))
    with serve_http(config) as served:
        items = batch(1)
        assert score(served.url, items[:9])["version"] == 0
        assert score(served.url, items[9:])["version"] == 0  # the second request starts a learning step
        deadline = time.monotonic() + 120
        while httpx.get(f"{served.url}/v1/model", timeout=30).json()["version"] != 1:
            assert time.monotonic() < deadline, "no learning step after every_requests=2 requests"
            time.sleep(0.1)
        assert score(served.url, items)["version"] == 1


def test_learning_off_is_a_clear_409(tmp_path):
    with serve_http(make_config(tmp_path)) as served:
        reply = httpx.post(f"{served.url}/v1/learn", timeout=30)
        assert reply.status_code == 409
        assert "reward.learn_online.enabled=true" in reply.json()["error"]["message"]


def test_a_replica_cannot_learn():
    with pytest.raises(ConfigError, match="needs reward.role=trainer"):
        load_config(None, ["reward.role=replica", "reward.learn_online.enabled=true"])


def test_the_pair_rule_takes_the_first_right_answer_against_every_rejected_one_of_its_group():
    def item(text: str, question: str = "q1") -> ScoreItem:
        return ScoreItem(question, "7", text)

    verified = [("a", item("wrong 1"), Verdict.INCORRECT), ("a", item("right 1"), Verdict.CORRECT),
                ("a", item("none"), Verdict.NO_ANSWER), ("a", item("right 2"), Verdict.CORRECT),
                ("a", item("slow"), Verdict.TIMEOUT), ("b", item("wrong b", "q2"), Verdict.INCORRECT)]
    assert pairs_within_groups(verified) == [PreferencePair("q1", "7", "right 1", "wrong 1"),
                                             PreferencePair("q1", "7", "right 1", "none")]
