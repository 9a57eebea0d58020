"""run.negatives=rollouts: the group's own verifier-rejected completions are paired with its positive."""


from cooper.config import CooperConfig
from cooper.orchestrator import graph
from cooper.orchestrator.stage_results import DataPosition, Prompt, RolloutResult, VerificationResult
from cooper.orchestrator.stages import negatives
from cooper.services.policy.messages import Completion
from cooper.services.verifier.messages import Verdict


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


def _rollout() -> RolloutResult:
    prompts = [Prompt("p0", "q0", "1", "e0"), Prompt("p1", "q1", "2", "e1")]
    texts = ["a", "b", "c", "d", "e", "f"]
    completions = [Completion("p0" if i < 3 else "p1", i % 3, t, [1], [0.0], "stop", [1]) for i, t in enumerate(texts)]
    return RolloutResult(policy_version=0, prompts=prompts, completions=completions, data_position=DataPosition(0, 0))


def _verified(*names: str) -> VerificationResult:
    return VerificationResult(verdicts=[Verdict[name] for name in names], extracted=[""] * len(names))


def test_rollouts_pair_positive_with_rejected_samples_of_its_group():
    config = CooperConfig.model_validate({"run": {"negatives": "rollouts"}})
    verified = _verified("INCORRECT", "CORRECT", "NO_ANSWER",  # p0: positive b; negatives a and c
                         "TIMEOUT", "INCORRECT", "ERROR")  # p1: no positive, so no pairs at all
    ctx = _Ctx(config, {graph.ROLLOUT: _rollout(), graph.VERIFY: verified})
    result = negatives(ctx, 0)
    assert [(p.positive, p.negative) for p in result.pairs] == [("b", "a"), ("b", "c")]
    assert result.positives == 1 and result.prompts == 2
    assert all(p.question == "q0" and p.reference == "1" for p in result.pairs)


def test_timeouts_and_errors_are_never_negatives():
    config = CooperConfig.model_validate({"run": {"negatives": "rollouts"}})
    verified = _verified("CORRECT", "TIMEOUT", "ERROR", "CORRECT", "CORRECT", "CORRECT")
    ctx = _Ctx(config, {graph.ROLLOUT: _rollout(), graph.VERIFY: verified})
    assert negatives(ctx, 0).pairs == []


def test_the_papers_recipe_is_the_default():
    assert CooperConfig().run.negatives == "generator"
