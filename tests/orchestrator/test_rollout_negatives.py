"""run.negatives=rollouts: the group's own verifier-rejected completions are paired with its positive."""


from cooper.config import CooperConfig
from cooper.orchestrator import graph
from cooper.orchestrator.stages import negatives


class _Ctx:
    def __init__(self, config, results):
        self.config, self._results = config, results

    def rollout(self, step):
        return self._results[graph.ROLLOUT]

    def verification(self, step):
        return self._results[graph.VERIFY]

    @property
    def generator(self):  # the variant must never need the generator
        raise AssertionError("called the generator service")


def _rollout():
    prompts = [{"id": "p0", "question": "q0", "answer": "1"}, {"id": "p1", "question": "q1", "answer": "2"}]
    texts = ["a", "b", "c", "d", "e", "f"]
    completions = [{"prompt_id": "p0" if i < 3 else "p1", "text": t} for i, t in enumerate(texts)]
    return {"prompts": prompts, "completions": completions}


def test_rollouts_pair_positive_with_rejected_samples_of_its_group():
    config = CooperConfig.model_validate({"run": {"negatives": "rollouts"}})
    verdicts = ["INCORRECT", "CORRECT", "NO_ANSWER",  # p0: positive b; negatives a and c
                "TIMEOUT", "INCORRECT", "ERROR"]  # p1: no positive, so no pairs at all
    ctx = _Ctx(config, {graph.ROLLOUT: _rollout(), graph.VERIFY: {"verdicts": verdicts}})
    result = negatives(ctx, 0)
    assert [(p["positive"], p["negative"]) for p in result["pairs"]] == [("b", "a"), ("b", "c")]
    assert result["positives"] == 1 and result["prompts"] == 2
    assert all(p["question"] == "q0" and p["reference"] == "1" for p in result["pairs"])


def test_timeouts_and_errors_are_never_negatives():
    config = CooperConfig.model_validate({"run": {"negatives": "rollouts"}})
    verdicts = ["CORRECT", "TIMEOUT", "ERROR", "CORRECT", "CORRECT", "CORRECT"]
    ctx = _Ctx(config, {graph.ROLLOUT: _rollout(), graph.VERIFY: {"verdicts": verdicts}})
    assert negatives(ctx, 0)["pairs"] == []


def test_the_papers_recipe_is_the_default():
    assert CooperConfig().run.negatives == "generator"
